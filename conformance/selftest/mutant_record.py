"""The mutant registry: a mutant is a deliberately broken reference, registered with `mutant` under
its name with the invariants that must catch it. Apart from the mutants themselves so that the
mutants of every flow (`mutants`, `mutants_v1`, `mutants_async`, `mutants_specdec`,
`mutants_sglang`) register here without importing one another."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spec.config import SchedulerConfig


@dataclass(frozen=True)
class Mutant:
    name: str
    summary: str
    catches: tuple[str, ...]
    factory: Callable[[SchedulerConfig], Any]
    # Mutants of another reference (conformance/selftest/mutants_v1.py): the reference it breaks, the
    # traces that reach it, and the profile whose invariants apply to that reference.
    reference: Callable[[SchedulerConfig], Any] | None = None
    trace_strategy: Callable[[], Any] | None = None
    profile: str | None = None


MUTANTS: dict[str, Mutant] = {}


def mutant(name: str, summary: str, catches: tuple[str, ...], **extra: Any):
    def register(cls: type) -> type:
        MUTANTS[name] = Mutant(name, summary, catches, cls, **extra)
        cls.mutant_name = name  # type: ignore[attr-defined]
        return cls

    return register
