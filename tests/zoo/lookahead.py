"""Take the next token's block when a token is sampled (one step before vLLM V0 does).

1. After each outcome, every running single-sequence request whose table does not yet cover
   the slot of the token after the one just sampled takes that block now, if one is free (if
   none is, the decode takes it at schedule(), as in vLLM V0).
2. Everything else is the reference (vLLM V0's flow), except that a swap-in counts every block
   the request holds, its lookahead block included.

Correct, and between steps it holds a block more than CAP-001's exact count; it declares
`Reservation(lookahead_tokens=1)`. Forked groups (n > 1) are left to the decode path, whose
copy-on-write looks at the last block of the table.
"""

from __future__ import annotations

from reference_impl.block_manager import BlockManager
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.reservation import Reservation
from spec.types import Finished, StepOutcome
from zoo._adapter import zoo_adapter

LOOKAHEAD = 1


class LookaheadBlocks(BlockManager):
    def reserve_ahead(self, seq: Sequence, tokens_ahead: int) -> None:
        table = self.gpu_tables[seq.seq_id]
        while len(table) < self.config.blocks_for(seq.num_tokens + tokens_ahead) and self.gpu.num_free:
            table.append(self.gpu.allocate())

    def blocks_to_swap_in(self, group: SequenceGroup) -> int:
        return len(self._distinct_blocks(group, self.cpu_tables)) + len(group.live_seqs())


class ReserveAtSampling(Scheduler):
    tokens_ahead = LOOKAHEAD

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.block_manager = LookaheadBlocks(config)

    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished = super().update(outcome)
        for group in self.running:
            if group.request.n == 1:
                for seq in group.live_seqs():
                    self.block_manager.reserve_ahead(seq, self.tokens_ahead)
        return finished


class BrokenReserveAtSampling(ReserveAtSampling):
    tokens_ahead = LOOKAHEAD + 8  # bug: takes blocks further ahead than the one it declares


def make():
    return zoo_adapter("zoo-lookahead", ReserveAtSampling, reservation=Reservation(lookahead_tokens=LOOKAHEAD))


def make_broken():
    return zoo_adapter("zoo-lookahead-broken", BrokenReserveAtSampling, reservation=Reservation(lookahead_tokens=LOOKAHEAD))
