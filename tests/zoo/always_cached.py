"""Prefix caching always on, and one preemption mode only (recompute, as every engine without
swap space): an engine that has no switch for either.

The V1 reference with prefix caching that cannot be turned off; its domain says so
(``ConfigDomain(prefix_caching=True, uncached=False, preemption_mode="recompute")``), so every
config has ``enable_prefix_caching`` on and ``preemption_mode`` "recompute".
"""

from __future__ import annotations

from typing import Any

from reference_impl.v1_scheduler import CAPABILITIES, V1Scheduler
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from spec.types import StepOutcome
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, chunked_prefill=True, prefix_caching=True,
                      uncached=False, preemption_mode="recompute", budget_covers_model_len=True,
                      cache_holds_model_len=True)


class AlwaysCached(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        assert config.enable_prefix_caching and config.preemption_mode == "recompute", "no switch for either"
        super().__init__(config)


class StopToNextRequest(AlwaysCached):
    def update(self, outcome: StepOutcome):
        output = self._last_output if hasattr(self, "_last_output") else None
        order = [s.seq_id for s in output.scheduled] if output is not None else []
        if order and outcome.stopped:  # bug: each stop lands on the next sequence in the batch
            outcome = StepOutcome(frozenset(order[(order.index(s) + 1) % len(order)] if s in order else s
                                            for s in outcome.stopped), outcome.drafts)
        return super().update(outcome)


def traces() -> Any:
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-always-cached", AlwaysCached, capabilities=CAPABILITIES, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-always-cached-broken", StopToNextRequest, capabilities=CAPABILITIES, domain=DOMAIN)
