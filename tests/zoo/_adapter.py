"""The adapter every zoo member uses: the standard `SchedulerAdapter`, claiming safety and liveness."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from conformance.runner.adapter import SchedulerAdapter
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from spec.observation import ALL_CAPABILITIES, Capability
from spec.reservation import Reservation


def zoo_adapter(
    name: str,
    make: Callable[[SchedulerConfig], Any],
    capabilities: frozenset[Capability] = ALL_CAPABILITIES,
    reservation: Reservation | None = None,
    domain: ConfigDomain | None = None,
) -> SchedulerAdapter:
    return SchedulerAdapter(name, make, profiles=("safety", "liveness"), capabilities=capabilities,
                            domain=domain, reservation=reservation)
