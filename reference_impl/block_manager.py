"""Block tables over two pools (GPU and CPU): allocate, append with copy-on-write, fork, swap, free.

Each sequence's block table lives in exactly one of ``gpu_tables`` / ``cpu_tables``: that is its
residency. Every entry holds one reference on the block it names, so a block's reference count
is the number of table entries that point at it.
"""

from __future__ import annotations

from enum import Enum

from reference_impl.block_pool import BlockPool
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig


class AllocStatus(Enum):
    OK = "ok"
    LATER = "later"  # not now; blocks may free up
    NEVER = "never"  # can never fit: the request is finished as ignored


class BlockManager:
    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.gpu = BlockPool("gpu", config.num_gpu_blocks)
        self.cpu = BlockPool("cpu", config.num_cpu_blocks)
        self.gpu_tables: dict[str, list[int]] = {}
        self.cpu_tables: dict[str, list[int]] = {}

    # -- admission ----------------------------------------------------------------------------
    def blocks_to_allocate(self, group: SequenceGroup) -> int:
        """Blocks a waiting group's prefill needs: every live sequence's tokens, unshared."""
        return sum(self.config.blocks_for(s.num_tokens) for s in group.live_seqs())

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        """vLLM's rule: NEVER if it could not fit even in an empty cache above the watermark;
        OK if it fits leaving the watermark free; LATER otherwise."""
        need = self.blocks_to_allocate(group)
        watermark = self.config.watermark_blocks
        if self.config.num_gpu_blocks - need < watermark:
            return AllocStatus.NEVER
        if self.gpu.num_free - need >= watermark:
            return AllocStatus.OK
        return AllocStatus.LATER

    def allocate(self, group: SequenceGroup) -> None:
        """All of the group's prefill blocks at once (the caller checked `can_allocate`)."""
        for seq in group.live_seqs():
            self.gpu_tables[seq.seq_id] = [self.gpu.allocate() for _ in range(self.config.blocks_for(seq.num_tokens))]

    # -- decode -------------------------------------------------------------------------------
    def can_append_slots(self, group: SequenceGroup) -> bool:
        """One free block per running sequence, as vLLM's BlockSpaceManager counts "touched"
        blocks: conservative (the new token may fit in the last block), but it guarantees
        that the append, copy-on-write included, cannot run out of blocks."""
        return self.gpu.num_free >= len(group.live_seqs())

    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        """Make room for the sequence's next token; returns a copy-on-write (src, dst) if one was needed."""
        table = self.gpu_tables[seq.seq_id]
        position = seq.num_computed  # the slot the next token's KV is written to
        if position // self.config.block_size == len(table):
            table.append(self.gpu.allocate())
            return ()
        last = table[-1]
        if self.gpu.ref_counts[last] > 1:
            fresh = self.gpu.allocate()
            self.gpu.decref(last)
            table[-1] = fresh
            return ((last, fresh),)
        return ()

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (reference counts go up, nothing is copied)."""
        table = list(self.gpu_tables[parent.seq_id])
        for block in table:
            self.gpu.incref(block)
        self.gpu_tables[child.seq_id] = table

    # -- swapping -----------------------------------------------------------------------------
    def _distinct_blocks(self, group: SequenceGroup, tables: dict[str, list[int]]) -> list[int]:
        seen: dict[int, None] = {}
        for seq in group.live_seqs():
            for block in tables[seq.seq_id]:
                seen.setdefault(block, None)
        return list(seen)

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return self.cpu.num_free >= len(self._distinct_blocks(group, self.gpu_tables))

    def _full_blocks(self, group: SequenceGroup, tables: dict[str, list[int]]) -> list[int]:
        """The group's distinct blocks that hold ``block_size`` tokens: entry ``i`` of a sequence
        with ``c`` computed tokens is full iff ``(i + 1) * block_size <= c`` (all but the last
        entry, and the last one iff ``c % block_size == 0``)."""
        bs = self.config.block_size
        seen: dict[int, None] = {}
        for seq in group.live_seqs():
            for i, block in enumerate(tables[seq.seq_id]):
                if (i + 1) * bs <= seq.num_computed:
                    seen.setdefault(block, None)
        return list(seen)

    def blocks_to_swap_in(self, group: SequenceGroup) -> int:
        """vLLM's swap-in count (vllm/core/block_manager.py: SelfAttnBlockSpaceManager._can_swap):
        the distinct FULL blocks the group holds on CPU (block/naive_block.py:
        get_num_full_blocks_touched), plus, per sequence, the blocks its next token's append
        touches (block/block_table.py: get_num_blocks_touched_by_append_slots, 1 for one token).
        A partial last block is covered by its sequence's append term, so it is counted once."""
        return len(self._full_blocks(group, self.cpu_tables)) + len(group.live_seqs())

    def can_swap_in(self, group: SequenceGroup) -> AllocStatus:
        """NEVER if the need could not fit above the watermark even in an empty cache, OK if it
        fits leaving the watermark free, LATER otherwise. vLLM's swap-in NEVER is
        ``total GPU blocks < need`` (no watermark, _can_swap); the two agree whenever the
        watermark is 0 blocks, which it is for every pool under 100 blocks at vLLM's fixed 0.01,
        and the lockstep campaign saw no divergence from it. Kept with the watermark (as in
        `can_allocate`) because vLLM's rule leaves a group with ``total - watermark < need <=
        total`` waiting for ever."""
        need = self.blocks_to_swap_in(group)
        watermark = self.config.watermark_blocks
        if self.config.num_gpu_blocks - need < watermark:
            return AllocStatus.NEVER
        if self.gpu.num_free - need >= watermark:
            return AllocStatus.OK
        return AllocStatus.LATER

    def swap_out(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        return self._move(group, self.gpu, self.gpu_tables, self.cpu, self.cpu_tables)

    def swap_in(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        return self._move(group, self.cpu, self.cpu_tables, self.gpu, self.gpu_tables)

    def _move(
        self,
        group: SequenceGroup,
        src_pool: BlockPool,
        src_tables: dict[str, list[int]],
        dst_pool: BlockPool,
        dst_tables: dict[str, list[int]],
    ) -> tuple[tuple[int, int], ...]:
        """Move a group's blocks to the other device: each distinct block gets one fresh block
        (so sharing survives the move), in order of first appearance."""
        mapping = {block: dst_pool.allocate() for block in self._distinct_blocks(group, src_tables)}
        for seq in group.live_seqs():
            table = src_tables.pop(seq.seq_id)
            dst_tables[seq.seq_id] = [mapping[b] for b in table]
            for block in table:
                dst_pool.incref(mapping[block])
                src_pool.decref(block)
        for fresh in mapping.values():
            dst_pool.decref(fresh)  # drop allocate()'s own reference: one per table entry remains
        return tuple(mapping.items())

    # -- release ------------------------------------------------------------------------------
    def free(self, seq: Sequence) -> None:
        """Drop every reference the sequence holds, wherever its table lives."""
        for tables, pool in ((self.gpu_tables, self.gpu), (self.cpu_tables, self.cpu)):
            table = tables.pop(seq.seq_id, None)
            if table is not None:
                for block in table:
                    pool.decref(block)
