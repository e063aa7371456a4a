"""Mutated references, one per encoding mutant in `spec.proofs.encoding.MUTANTS`.

Each overrides one method of the reference with the same deliberate bug the encoding's mutant
has, so a counterexample found by ``prove`` on the mutated encoding can be replayed on the
mutated code.
"""

from __future__ import annotations

from reference_impl.block_manager import AllocStatus, BlockManager
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.status import Status
from spec.types import Finished


class ForkNoIncref(BlockManager):
    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.gpu_tables[child.seq_id] = list(self.gpu_tables[parent.seq_id])


class SwapInBusyBlock(BlockManager):
    def swap_in(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        src_pool, dst_pool = self.cpu, self.gpu
        mapping: dict[int, int] = {}
        for k, block in enumerate(self._distinct_blocks(group, self.cpu_tables)):
            mapping[block] = k  # the lowest ids not taken by this move, free or not
            if k in dst_pool._free:
                dst_pool._free.remove(k)  # the free list stays sorted
            dst_pool.ref_counts[k] = 1
        for seq in group.live_seqs():
            table = self.cpu_tables.pop(seq.seq_id)
            self.gpu_tables[seq.seq_id] = [mapping[b] for b in table]
            for block in table:
                dst_pool.incref(mapping[block])
                src_pool.decref(block)
        for fresh in mapping.values():
            dst_pool.decref(fresh)
        return tuple(mapping.items())


class AdmitIgnoresWatermark(BlockManager):
    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        need = self.blocks_to_allocate(group)
        if need > self.config.num_gpu_blocks:
            return AllocStatus.NEVER
        return AllocStatus.OK if self.gpu.num_free >= need else AllocStatus.LATER


class DecodeNoCow(BlockManager):
    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        table = self.gpu_tables[seq.seq_id]
        if seq.num_computed // self.config.block_size == len(table):
            table.append(self.gpu.allocate())
        return ()


class _WithBlockManager(Scheduler):
    manager: type[BlockManager] = BlockManager

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.block_manager = self.manager(config)


class RecomputeKeepsComputed(Scheduler):
    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        for seq in victim.live_seqs():
            self.block_manager.free(seq)
        victim.set_status(Status.WAITING)
        self._enqueue(self.waiting, victim)


class AbortNoFree(Scheduler):
    def abort_request(self, request_id: str) -> Finished | None:
        group = self.groups.get(request_id)
        if group is None or group.status.is_finished:
            return None
        self._queue_of(group).remove(group)
        for seq in group.live_seqs():
            seq.status = Status.FINISHED_ABORTED
        group.status = Status.FINISHED_ABORTED
        return Finished(request_id, Status.FINISHED_ABORTED)


def _with(manager: type[BlockManager]) -> type[Scheduler]:
    return type(f"SchedulerWith{manager.__name__}", (_WithBlockManager,), {"manager": manager})


# mutant name -> (mutated scheduler class, the actions the mutation touches)
MUTATED_REFERENCES: dict[str, tuple[type[Scheduler], tuple[str, ...]]] = {
    "fork-no-incref": (_with(ForkNoIncref), ("fork",)),
    "swapin-busy-block": (_with(SwapInBusyBlock), ("swap_in",)),
    "admit-ignores-watermark": (_with(AdmitIgnoresWatermark), ("admit",)),
    "decode-no-cow": (_with(DecodeNoCow), ("decode",)),
    "recompute-keeps-computed": (RecomputeKeepsComputed, ("preempt_recompute",)),
    "abort-no-free": (AbortNoFree, ("abort",)),
}


# ------------------------------------------------------------------ flow v1 (chunked prefill)
def _v1_mutants() -> dict[str, tuple[type, tuple[str, ...], str]]:
    import conformance.selftest.mutants_v1  # noqa: F401  (registers the V1 mutants)
    from conformance.selftest.mutants import MUTANTS
    from reference_impl.v1_scheduler import TrackedRequest, V1Scheduler

    class ChunkNoAlloc(V1Scheduler):
        """A running request's chunk takes no new block (the encoding's ``chunk-no-alloc``)."""

        def _allocate(self, tracked: TrackedRequest, tokens: int, *, hits: list[int], watermark: bool) -> bool:
            if watermark:
                return super()._allocate(tracked, tokens, hits=hits, watermark=watermark)
            return True

    def ref(name: str) -> type:
        return MUTANTS[name].factory  # type: ignore[return-value]

    return {
        "chunk-past-end": (ref("v1-decode-two-tokens"), ("admit", "chunk"), "CHK-002"),
        "chunk-no-alloc": (ChunkNoAlloc, ("chunk",), "CAP-001"),
        "preempt-keeps-computed": (ref("v1-preempt-keeps-computed"), ("preempt_recompute",), "CHK-003"),
        "chunk-counts-as-whole": (ref("v1-chunk-counts-as-whole"), ("admit", "chunk"), "CHK-004"),
        "chunk-ignores-threshold": (ref("v1-ignores-long-prefill-threshold"), ("admit", "chunk"), "CHK-005"),
        "admit-ignores-partial-limit": (ref("v1-ignores-partial-prefill-limit"), ("admit",), "CHK-006"),
    }


# encoding mutant of the v1 flow (`spec.proofs.chunked.V1_MUTANTS`) ->
# (mutated V1 reference, the actions the mutation touches, the catalogue invariant whose cell catches it)
V1_MUTATED_REFERENCES = _v1_mutants()
