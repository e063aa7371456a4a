"""No CPU pool: an engine without swap space, whatever num_cpu_blocks says.

1. Its CPU pool is empty (it reports zero CPU blocks), so it never swaps.
2. Every preemption is by recompute, whatever preemption_mode asks for (vLLM V1 and nano-vllm
   work this way).

Correct: safety holds it to an empty CPU pool (BLK-002) and no CPU table (BLK-004).
"""

from __future__ import annotations

from reference_impl.block_pool import BlockPool
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import SequenceGroup
from spec.config import SchedulerConfig
from spec.status import PreemptionMode
from spec.types import Finished, StepOutcome
from zoo._adapter import zoo_adapter


class NoCpuPool(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.block_manager.cpu = BlockPool("cpu", 0)

    def _preemption_mode(self, group: SequenceGroup) -> PreemptionMode:
        return PreemptionMode.RECOMPUTE


class StopToWrongRequest(NoCpuPool):
    def update(self, outcome: StepOutcome) -> list[Finished]:
        output = self._last_output
        if output is not None and outcome.stopped:
            order = [s.seq_id for s in output.scheduled]
            moved = {order[(order.index(sid) + 1) % len(order)] if sid in order else sid for sid in outcome.stopped}
            outcome = StepOutcome(frozenset(moved))  # bug: each stop lands on the next sequence in the batch
        return super().update(outcome)


def make():
    return zoo_adapter("zoo-no-cpu-pool", NoCpuPool)


def make_broken():
    return zoo_adapter("zoo-no-cpu-pool-broken", StopToWrongRequest)
