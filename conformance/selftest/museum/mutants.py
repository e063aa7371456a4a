"""The museum's own mutants: each re-creates one public scheduler bug in the reference.

Every class here subclasses the reference's `Scheduler` or `BlockManager` and overrides one
method. Where the override had to repeat a method of the reference, the body is the reference's
own, with the changed line marked ``# bug:``; the docs (`conformance.selftest.museum.docs`) quote those
lines. Mutants that already existed in `conformance.selftest.mutants` are reused from there, not copied.
"""

from __future__ import annotations

from reference_impl.block_manager import BlockManager
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.reasons import Reason
from spec.status import Status
from spec.types import Finished, Request, ScheduledSeq, SchedulerOutput, StepOutcome


def with_block_manager(manager: type[BlockManager], name: str) -> type[Scheduler]:
    """The reference scheduler over a mutated block manager."""

    class _Scheduler(Scheduler):
        def __init__(self, config: SchedulerConfig) -> None:
            super().__init__(config)
            self.block_manager = manager(config)

    _Scheduler.__name__ = _Scheduler.__qualname__ = name
    return _Scheduler


# ------------------------------------------------------------------ nano-vllm PR #265
class AdmissionCountsOnlyThisStep(Scheduler):
    """Waiting admission counts the seats it hands out in this step, not the running ones."""

    def _schedule_prefills(self, budget, step) -> None:
        budget.seqs = 0  # bug: seats already held by running requests are not counted
        super()._schedule_prefills(budget, step)


# ------------------------------------------------------------------ vLLM PR #8824
class SwapInCountsFullBlocks(BlockManager):
    """can_swap_in counts only the swapped group's full blocks (vLLM's get_num_full_blocks_touched)."""

    def blocks_to_swap_in(self, group: SequenceGroup) -> int:
        bs = self.config.block_size
        full = {b for s in group.live_seqs() for b in self.cpu_tables[s.seq_id][: s.num_computed // bs]}
        return len(full)  # bug: the partial last block and the next token's slot are not counted


# ------------------------------------------------------------------ vLLM issue #787
class SwapOutWithoutCheck(BlockManager):
    """A swap victim is swapped out whether or not the CPU pool can hold it."""

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return True  # bug: no check of the free CPU blocks, so no fallback to recompute


# ------------------------------------------------------------------ SGLang issue #18701
class AbortSwappedKeepsBlocks(Scheduler):
    """Aborting a swapped-out request drops it from its queue without releasing its CPU blocks."""

    def abort_request(self, request_id: str) -> Finished | None:
        group = self.groups.get(request_id)
        if group is None or group.status is not Status.SWAPPED:
            return super().abort_request(request_id)
        self.swapped.remove(group)
        group.set_status(Status.FINISHED_ABORTED)  # bug: was self._finish(...), which frees the blocks
        return Finished(request_id, Status.FINISHED_ABORTED, Reason.of("finished_aborted", request_id))


# ------------------------------------------------------------------ vLLM PR #7391
class DecodesJoinPrefillSteps(Scheduler):
    """The running queue is decoded in prefill steps too (as V0's chunked-prefill flow does), and
    `_schedule_running` charges decodes to the token budget without asking it first."""

    def _schedule_prefills(self, budget, step) -> None:
        super()._schedule_prefills(budget, step)
        admitted = [g for g in self.running if g.request_id in {s.request_id for s in step.prefills}]
        self.running = [g for g in self.running if g not in admitted]
        if admitted:
            self._schedule_running(budget, step)  # bug: decodes after the prefills, never checked against the budget
        for group in admitted:
            self._enqueue(self.running, group)


# ------------------------------------------------------------------ Avarok atlas PR #373
class CowDropsWrongReference(BlockManager):
    """Copy-on-write drops a reference from the wrong block: the writer's new private block."""

    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        table = self.gpu_tables[seq.seq_id]
        position = seq.num_computed
        if position // self.config.block_size == len(table):
            table.append(self.gpu.allocate())
            return ()
        last = table[-1]
        if self.gpu.ref_counts[last] > 1:
            fresh = self.gpu.allocate()
            self.gpu.decref(fresh)  # bug: was decref(last); the live block is freed, the shared one keeps a stale reference
            table[-1] = fresh
            return ((last, fresh),)
        return ()


# ------------------------------------------------------------------ vLLM PR #32173
class VictimsRequeuedReversed(Scheduler):
    """The recompute victims of one step go back to the head of waiting in the order they were
    taken (least urgent first), which reverses them."""

    def schedule(self) -> SchedulerOutput:
        self._requeued = 0  # victims put back at the head in this step
        return super().schedule()

    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        for seq in victim.live_seqs():
            self.block_manager.free(seq)
            seq.num_computed = 0
        victim.set_status(Status.WAITING)
        self.waiting.insert(self._requeued, victim)  # bug: was self._enqueue(self.waiting, victim)
        self._requeued += 1


# ------------------------------------------------------------------ nano-vllm issue #274
class LastGroupNeitherRunNorPreempted(Scheduler):
    """When the last running group cannot get a block, it is neither preempted nor scheduled."""

    def _schedule_running(self, budget, step) -> None:
        bm = self.block_manager
        queue = list(self.running)
        while queue:
            group = queue.pop(0)
            while not bm.can_append_slots(group):
                if not queue:
                    break  # bug: was "preempt the group itself"; the step schedules nothing for it, forever
                need, free = len(group.live_seqs()), bm.gpu.num_free
                victim = queue.pop()
                budget.seqs -= victim.max_running_seqs()
                self._preempt(victim, step, needed_by=group.request_id, need=need, free=free)
            else:
                new_blocks = bm.gpu.num_free
                copies: list[tuple[int, int]] = []
                for seq in group.live_seqs():
                    copies.extend(bm.append_slot(seq))
                    step.decodes.append(ScheduledSeq(seq.seq_id, group.request_id, 1, False))
                step.copies.extend(copies)
                budget.tokens += len(group.live_seqs())
                step.reason(
                    "decode", group.request_id, tokens=len(group.live_seqs()),
                    new_blocks=new_blocks - bm.gpu.num_free, copies=len(copies),
                )


# ------------------------------------------------------------------ SGLang-JAX PR #982
class FinishReleasesLastBlockTwice(Scheduler):
    """A finished sequence's last block is released by two paths."""

    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        table = list(self.block_manager.gpu_tables.get(seq.seq_id, ()))
        super()._check_stop(group, seq, stopped)
        if table and seq.status.is_finished:
            self.block_manager.gpu.decref(table[-1])  # bug: a second release path frees the last block again


# ------------------------------------------------------------------ TensorRT-LLM PR #10943
class TokenAppendedAfterPause(Scheduler):
    """The step's sampled token is appended to a request preempted by recompute in that step."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        output: SchedulerOutput | None = self._last_output
        for preempted in output.preempted if output else ():
            group = self.groups[preempted.request_id]
            if group.status is Status.WAITING:
                for seq in group.live_seqs():
                    seq.num_tokens += 1  # bug: the overlap step's token lands on a request already paused
        return super().update(outcome)


# ------------------------------------------------------------------ vLLM issue #53130
class SwappedHoldSeats(Scheduler):
    """Seat accounting for max_num_seqs counts swapped requests, which hold no seat."""

    def _schedule_swapped(self, budget, step) -> None:
        budget.seqs += sum(g.max_running_seqs() for g in self.swapped)  # bug: swapped requests counted as seated
        super()._schedule_swapped(budget, step)


# ------------------------------------------------------------------ TensorRT-LLM issue #13318
class _EstimatedTokens(SequenceGroup):
    def uncomputed_tokens(self) -> int:
        return self.request.prompt_len  # bug: the estimate (the original prompt), not what the prefill computes


class BudgetChargedWithEstimate(Scheduler):
    """Admission charges the token budget with an estimate of a prefill's tokens (the original
    prompt length), which differs from what the prefill computes for a recompute victim."""

    def add_request(self, request: Request) -> None:
        super().add_request(request)
        self.groups[request.request_id].__class__ = _EstimatedTokens


# ------------------------------------------------------------------ vLLM PR #10013
class RecomputeFreesFirstTableOnly(Scheduler):
    """Preemption by recompute frees one of the group's block tables and forgets the others."""

    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        for seq in victim.live_seqs():
            if seq is victim.live_seqs()[0]:  # bug: only the first table is freed (vLLM: not the cross-attention one)
                self.block_manager.free(seq)
            seq.num_computed = 0
        victim.set_status(Status.WAITING)
        self._enqueue(self.waiting, victim)


SwapInUndercount = with_block_manager(SwapInCountsFullBlocks, "SwapInUndercount")
CowWrongReference = with_block_manager(CowDropsWrongReference, "CowWrongReference")
SwapWithoutCpuSpace = with_block_manager(SwapOutWithoutCheck, "SwapWithoutCpuSpace")
