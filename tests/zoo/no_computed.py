"""No computed-token tracking: an engine that knows each sequence's tokens, not its KV count.

Its adapter reports `num_computed=None` and leaves `computed_tokens` out of its capabilities;
the invariants that read the count are `not_applicable`, and the others (block tables against
token counts, admission, reservations, residency, requests) still judge it. The scheduling is
the reference's (a decode writes the slot of its last token, tokens - 1).
"""

from __future__ import annotations

from dataclasses import replace

from reference_impl.block_manager import BlockManager
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.observation import ALL_CAPABILITIES, Capability, Snapshot
from zoo._adapter import zoo_adapter

CAPABILITIES = ALL_CAPABILITIES - {Capability.COMPUTED_TOKENS}


class NoComputedCount(Scheduler):
    capabilities = CAPABILITIES

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        assert snap.seqs is not None
        seqs = {sid: v._replace(num_computed=None) for sid, v in snap.seqs.items()}
        return replace(snap, seqs=seqs, base=None, changed_seqs=None, changed_requests=None)


class OneShortBlocks(BlockManager):
    def allocate(self, group: SequenceGroup) -> None:
        for seq in group.live_seqs():
            count = self.config.blocks_for(seq.num_tokens) - 1  # bug: one block short
            self.gpu_tables[seq.seq_id] = [self.gpu.allocate() for _ in range(count)]

    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        table = self.gpu_tables[seq.seq_id]
        while seq.num_computed // self.config.block_size > len(table):
            table.append(self.gpu.allocate())
        return super().append_slot(seq)


class BrokenNoComputedCount(NoComputedCount):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.block_manager = OneShortBlocks(config)


def make():
    return zoo_adapter("zoo-no-computed", NoComputedCount, capabilities=CAPABILITIES)


def make_broken():
    return zoo_adapter("zoo-no-computed-broken", BrokenNoComputedCount, capabilities=CAPABILITIES)
