"""Free a sequence's blocks in the schedule() of the step that samples its last token.

1. schedule() builds the step as the reference does; then, for each scheduled sequence whose
   token sampled in this step reaches max_tokens or max_model_len, it frees the blocks at once
   (the step's tables are taken before, as tokasaurus' ``schedule_steps`` does).
2. update() finishes those sequences without freeing them again.

Correct where steps run in order on one stream (it claims ``ordered_steps``): the blocks go to a
later step, which runs after this one. RES-001, CAP-005 and ADM-003 allow it under that claim.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.observation import ALL_CAPABILITIES, Capability
from spec.status import Status
from spec.types import SchedulerOutput
from zoo._adapter import zoo_adapter


class FreeAtLastStep(Scheduler):
    ahead = 1  # tokens this step samples: a sequence is freed when num_generated + ahead reaches the cap

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._freed: set[str] = set()

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        for item in out.scheduled:
            group = self.groups[item.request_id]
            seq = self._seq(group, item.seq_id)
            if seq is None or group.request.n > 1 or seq.num_computed + item.num_tokens < seq.num_tokens:
                continue  # a fork or a partial chunk samples nothing it could end on
            if (seq.num_generated + self.ahead >= group.request.max_tokens
                    or seq.num_tokens + self.ahead >= self.config.max_model_len):
                self.block_manager.free(seq)
                self._freed.add(seq.seq_id)
        return out

    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id not in self._freed:
            super()._check_stop(group, seq, stopped)
        elif seq.seq_id in stopped:
            seq.status = Status.FINISHED_STOPPED
        elif seq.num_generated >= group.request.max_tokens or seq.num_tokens >= self.config.max_model_len:
            seq.status = Status.FINISHED_LENGTH_CAPPED


class FreesOneStepEarly(FreeAtLastStep):
    ahead = 2  # bug: frees a sequence one step before its last, then runs it with an empty table


CLAIMS = ALL_CAPABILITIES | {Capability.ORDERED_STEPS}


def make():
    return zoo_adapter("zoo-early-free", FreeAtLastStep, capabilities=CLAIMS)


def make_broken():
    return zoo_adapter("zoo-early-free-broken", FreesOneStepEarly, capabilities=CLAIMS)
