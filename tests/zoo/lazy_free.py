"""Free finished requests' blocks lazily, at the next schedule().

1. A sequence that stops, hits its length cap or is aborted keeps its blocks for now.
2. schedule() first frees every sequence that finished since the last one, then schedules as
   the reference does.

Correct: a finished request's blocks are free by the end of the next step (RES-005); freeing in
the finishing step itself (RES-004) is vLLM's policy.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.status import Status
from spec.types import SchedulerOutput
from zoo._adapter import zoo_adapter


class FreeAtNextSchedule(Scheduler):
    delay = 1  # schedule() calls a finished sequence keeps its blocks through, the freeing one included

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._pending: list[tuple[Sequence, int]] = []  # (finished sequence, schedule() calls left)

    def schedule(self) -> SchedulerOutput:
        due = [seq for seq, left in self._pending if left <= 1]
        self._pending = [(seq, left - 1) for seq, left in self._pending if left > 1]
        for seq in due:
            self.block_manager.free(seq)
        return super().schedule()

    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id in stopped:
            seq.status = Status.FINISHED_STOPPED
        elif seq.num_generated >= group.request.max_tokens or seq.num_tokens >= self.config.max_model_len:
            seq.status = Status.FINISHED_LENGTH_CAPPED
        else:
            return
        self._pending.append((seq, self.delay))

    def _finish(self, group: SequenceGroup, status: Status) -> None:
        for seq in group.live_seqs():
            self._pending.append((seq, self.delay))
            seq.status = status
        group.status = status


class FreesTooLate(FreeAtNextSchedule):
    delay = 2  # bug: a finished request's blocks outlive the next step


def make():
    return zoo_adapter("zoo-lazy-free", FreeAtNextSchedule)


def make_broken():
    return zoo_adapter("zoo-lazy-free-broken", FreesTooLate)
