"""Mutants: deliberately broken variants of the reference scheduler.

Each mutant changes one rule, in one overridden method, and names the invariants that must
catch it. They are the catalogue's teeth: for every invariant there is a mutant that its check
(and, where noted, only its check) flags on some trace, while the reference passes the same
trace. The bug museum builds on these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from conformance.selftest.mutant_record import MUTANTS, Mutant, mutant  # noqa: F401  (the registry; Mutant is read by importers)
from reference_impl.block_manager import AllocStatus, BlockManager
from reference_impl.block_pool import BlockPool
from reference_impl.scheduler import Scheduler, _StepBuilder
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.reasons import Reason
from spec.status import PreemptionMode, Status
from spec.types import Finished, ScheduledSeq, SchedulerOutput, StepOutcome


def _with_block_manager(manager: type[BlockManager]) -> type[Scheduler]:
    class _Scheduler(Scheduler):
        def __init__(self, config: SchedulerConfig) -> None:
            super().__init__(config)
            self.block_manager = manager(config)

    return _Scheduler


# ---------------------------------------------------------------------------------- pools
class _FreeOnEveryDecref(BlockPool):
    def decref(self, block: int) -> None:
        self.ref_counts[block] -= 1
        self._release(block)  # bug: back on the free list while others still hold it


class _FreeTwice(BlockPool):
    def decref(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._release(block)
            self._release(block)  # bug: listed twice


class _GpuFreeOnEveryDecref(BlockManager):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.gpu = _FreeOnEveryDecref("gpu", config.num_gpu_blocks)


class _CpuFreeTwice(BlockManager):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.cpu = _FreeTwice("cpu", config.num_cpu_blocks)


mutant("gpu-free-while-shared", "a GPU block returns to the free list on every decref, even while still shared",
       ("BLK-001", "BLK-005", "STR-001"))(_with_block_manager(_GpuFreeOnEveryDecref))
mutant("cpu-double-free", "a CPU block reaching zero references is put on the free list twice",
       ("BLK-002", "BLK-005"))(_with_block_manager(_CpuFreeTwice))


# ---------------------------------------------------------------------------------- block manager rules
class _ForkWithoutIncref(BlockManager):
    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.gpu_tables[child.seq_id] = list(self.gpu_tables[parent.seq_id])  # bug: no incref


mutant("fork-without-incref", "fork copies the parent's table without raising reference counts (double free)",
       ("BLK-003",))(_with_block_manager(_ForkWithoutIncref))


class _SwapOutFlattensSharing(BlockManager):
    def swap_out(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        pairs = super().swap_out(group)
        for _, cpu in pairs:
            self.cpu.ref_counts[cpu] = 1  # bug: one reference per block, however many tables share it
        return pairs


mutant("swap-out-flattens-sharing", "swap-out gives each CPU block one reference, forgetting forked sharing",
       ("BLK-004",))(_with_block_manager(_SwapOutFlattensSharing))


class _AppendRepeatsBlock(BlockManager):
    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        table = self.gpu_tables[seq.seq_id]
        if seq.num_computed // self.config.block_size == len(table) and table:
            table.append(table[-1])  # bug: the "new" block is the last one again
            self.gpu.incref(table[-1])
            return ()
        return super().append_slot(seq)


mutant("append-repeats-block", "a decode that needs a new block appends the last block again",
       ("BLK-006",))(_with_block_manager(_AppendRepeatsBlock))


class _AllocateOneShort(BlockManager):
    def allocate(self, group: SequenceGroup) -> None:
        for seq in group.live_seqs():
            count = self.config.blocks_for(seq.num_tokens) - 1  # bug: one block short
            self.gpu_tables[seq.seq_id] = [self.gpu.allocate() for _ in range(count)]

    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        table = self.gpu_tables[seq.seq_id]
        while (seq.num_computed // self.config.block_size) >= len(table) + 1:
            table.append(self.gpu.allocate())
        if not table:
            table.append(self.gpu.allocate())
            return ()
        return super().append_slot(seq)


mutant("admission-one-block-short", "admission allocates one block fewer than the prompt needs",
       ("RES-001", "CAP-002", "ADM-001", "CAP-004", "CAP-005", "ADM-003"))(_with_block_manager(_AllocateOneShort))


class _AppendEveryStep(BlockManager):
    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        copies = super().append_slot(seq)
        if self.gpu.num_free and seq.num_computed % self.config.block_size:
            self.gpu_tables[seq.seq_id].append(self.gpu.allocate())  # bug: a spare block each decode
        return copies


mutant("append-spare-block", "every decode grabs a spare block it does not need",
       ("CAP-001", "CAP-002", "CAP-006"))(_with_block_manager(_AppendEveryStep))


class _WriteSharedInPlace(BlockManager):
    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        table = self.gpu_tables[seq.seq_id]
        if seq.num_computed // self.config.block_size == len(table):
            table.append(self.gpu.allocate())
        return ()  # bug: never copies a shared last block before writing it


mutant("no-copy-on-write", "a decode writes into a shared last block instead of copying it",
       ("COW-001",))(_with_block_manager(_WriteSharedInPlace))


class _CopyReversed(BlockManager):
    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        return tuple((dst, src) for src, dst in super().append_slot(seq))  # bug: copy map reversed


mutant("copy-map-reversed", "the copy-on-write map is reported destination first",
       ("COW-002",))(_with_block_manager(_CopyReversed))


class _AdmitIgnoringWatermark(BlockManager):
    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        need = self.blocks_to_allocate(group)
        if need > self.config.num_gpu_blocks:
            return AllocStatus.NEVER
        return AllocStatus.OK if need <= self.gpu.num_free else AllocStatus.LATER  # bug: no watermark


mutant("admission-ignores-watermark", "admission lets free blocks fall below the watermark",
       ("ADM-002",))(_with_block_manager(_AdmitIgnoringWatermark))


class _PartialAllocation(BlockManager):
    """The allocation seed 000 §3.4 narrates: take what is free, wait for the rest."""

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        status = super().can_allocate(group)
        if status is AllocStatus.LATER:
            seq = group.live_seqs()[0]
            table = self.gpu_tables.setdefault(seq.seq_id, [])
            while self.gpu.num_free and len(table) < self.config.blocks_for(seq.num_tokens):
                table.append(self.gpu.allocate())  # bug: keeps a partial allocation while waiting
        return status

    def allocate(self, group: SequenceGroup) -> None:
        for seq in group.live_seqs():
            table = self.gpu_tables.setdefault(seq.seq_id, [])
            while len(table) < self.config.blocks_for(seq.num_tokens):
                table.append(self.gpu.allocate())

    def blocks_to_allocate(self, group: SequenceGroup) -> int:
        return sum(
            self.config.blocks_for(s.num_tokens) - len(self.gpu_tables.get(s.seq_id, ())) for s in group.live_seqs()
        )


mutant("partial-allocation", "a waiting prompt keeps the blocks that were free and waits for the rest (seed 000 §3.4)",
       ("ADM-001", "RES-003"))(_with_block_manager(_PartialAllocation))


class _SwapOutMapDropsOne(BlockManager):
    def swap_out(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        return super().swap_out(group)[:-1]  # bug: the last block's copy is never issued


mutant("swap-out-map-drops-block", "the swap-out map omits one of the victim's blocks",
       ("SWP-001",))(_with_block_manager(_SwapOutMapDropsOne))


class _SwapInOntoBusyBlock(BlockManager):
    def swap_in(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        pairs = super().swap_in(group)
        busy = [b for sid, t in self.gpu_tables.items() for b in t if not sid.startswith(group.request_id + "#")]
        if busy and pairs:
            return ((pairs[0][0], busy[0]),) + pairs[1:]  # bug: the copy lands on a busy block
        return pairs


mutant("swap-in-onto-busy-block", "the swap-in map sends a block onto a GPU block another request holds",
       ("SWP-002",))(_with_block_manager(_SwapInOntoBusyBlock))


class _SwapOutScrambles(BlockManager):
    def swap_out(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        pairs = super().swap_out(group)
        for seq in group.live_seqs():
            self.cpu_tables[seq.seq_id].reverse()  # bug: the CPU table is not the image of the GPU one
        return pairs


mutant("swap-out-scrambles-table", "a swapped-out table is not the image of the old one under the swap map",
       ("SWP-003",))(_with_block_manager(_SwapOutScrambles))


class _SwapKeepsGpuTables(BlockManager):
    def swap_out(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        return ()  # bug: the victim is marked swapped but its blocks stay on the GPU

    def blocks_to_swap_in(self, group: SequenceGroup) -> int:
        return len(group.live_seqs())

    def swap_in(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        return ()


mutant("swap-keeps-gpu-blocks", "a swapped victim keeps its GPU blocks",
       ("RES-002",))(_with_block_manager(_SwapKeepsGpuTables))


class _SwapDropsKv(BlockManager):
    """A "swap" that moves the tables but copies no KV, then resumes decoding on blocks that
    hold nothing: every count stays right, only the swap maps tell."""

    def swap_out(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        super().swap_out(group)
        return ()  # bug: the victim's KV is never copied to its CPU blocks

    def swap_in(self, group: SequenceGroup) -> tuple[tuple[int, int], ...]:
        super().swap_in(group)
        return ()  # bug: nor back to the GPU


mutant("swap-drops-kv", "a swap moves the block tables but copies no KV, and decoding resumes on empty blocks",
       ("SWP-001", "SWP-002"))(_with_block_manager(_SwapDropsKv))


# ---------------------------------------------------------------------------------- scheduler rules
@mutant("recompute-keeps-blocks", "a recompute victim keeps its blocks while it waits", ("RES-003",))
class _RecomputeKeepsBlocks(Scheduler):
    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        for seq in victim.live_seqs():
            seq.num_computed = 0  # bug: its blocks are not freed
        victim.set_status(Status.WAITING)
        self._enqueue(self.waiting, victim)


@mutant("finished-keeps-blocks", "a finished sequence's blocks are never released", ("RES-004", "RES-005"))
class _FinishedKeepsBlocks(Scheduler):
    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id in stopped:
            seq.status = Status.FINISHED_STOPPED
        elif seq.num_generated >= group.request.max_tokens or seq.num_tokens > self.config.max_model_len:
            seq.status = Status.FINISHED_LENGTH_CAPPED  # bug: no block_manager.free(seq)


@mutant("caps-after-one-token", "every sequence is finished length-capped after its first generated token",
        ("LEN-004",))
class _CapsAfterOneToken(Scheduler):
    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id in stopped:
            seq.status = Status.FINISHED_STOPPED
        elif seq.num_generated >= 1 or seq.num_tokens >= self.config.max_model_len:  # bug: max_tokens ignored
            seq.status = Status.FINISHED_LENGTH_CAPPED
        else:
            return
        self.block_manager.free(seq)


@mutant("recompute-keeps-computed", "preemption by recompute does not reset the computed-token count",
        ("CAP-003", "BUD-004"))
class _RecomputeKeepsComputed(Scheduler):
    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        for seq in victim.live_seqs():
            kept = seq.num_computed
            self.block_manager.free(seq)
            seq.num_computed = kept - 1 if kept > 0 else 0  # bug: a stale count survives
        victim.set_status(Status.WAITING)
        self._enqueue(self.waiting, victim)


@mutant("recompute-drops-tokens", "preemption by recompute forgets the tokens generated so far", ("REQ-004",))
class _RecomputeDropsTokens(Scheduler):
    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        super()._preempt_by_recompute(victim)
        for seq in victim.live_seqs():
            seq.num_tokens = seq.prompt_len  # bug: generated tokens lost


@mutant("victim-stays-in-running", "a recompute victim is queued in waiting but never leaves running",
        ("QUE-001",))
class _VictimStaysInRunning(Scheduler):
    def _preempt(self, victim, step, *, needed_by, need, free):
        super()._preempt(victim, step, needed_by=needed_by, need=need, free=free)
        if victim.status is Status.WAITING:
            self.running.append(victim)  # bug: still listed as running

    def schedule(self) -> SchedulerOutput:
        self.running = [g for g in self.running if g.status is Status.RUNNING]
        return super().schedule()


@mutant("swap-victim-status-running", "a swapped-out victim keeps the RUNNING status", ("QUE-002",))
class _SwapVictimStatusRunning(Scheduler):
    def _preempt(self, victim, step, *, needed_by, need, free):
        super()._preempt(victim, step, needed_by=needed_by, need=need, free=free)
        if victim.status is Status.SWAPPED:
            victim.status = Status.RUNNING  # bug: status disagrees with the queue

    def schedule(self) -> SchedulerOutput:
        for g in self.swapped:
            g.status = Status.SWAPPED
        return super().schedule()


@mutant("admission-ignores-token-budget", "admission does not check the step's token budget", ("BUD-001",))
class _AdmitIgnoringTokens(Scheduler):
    def _schedule_prefills(self, budget, step):
        budget.token_budget = 10**9  # bug
        super()._schedule_prefills(budget, step)


@mutant("admission-ignores-seats", "admission does not check max_num_seqs", ("BUD-002", "BUD-003"))
class _AdmitIgnoringSeats(Scheduler):
    def _schedule_prefills(self, budget, step):
        budget.max_num_seqs = 10**9  # bug
        super()._schedule_prefills(budget, step)


class _OneSeatPerGroup(SequenceGroup):
    def max_running_seqs(self) -> int:
        return 1 if not self.forked else len(self.live_seqs())  # bug: n > 1 counted as one seat


@mutant("best-of-one-seat", "a group with n > 1 takes one seat until it forks (vLLM PR #1068)", ("BUD-003", "STR-002"))
class _BestOfOneSeat(Scheduler):
    def add_request(self, request) -> None:
        super().add_request(request)
        group = self.groups[request.request_id]
        group.__class__ = _OneSeatPerGroup


@mutant("length-cap-off-by-one", "a sequence may reach max_model_len tokens and keep running", ("LEN-001",))
class _LengthOffByOne(Scheduler):
    def _check_stop(self, group, seq, stopped):
        if seq.seq_id in stopped:
            seq.status = Status.FINISHED_STOPPED
        elif seq.num_generated >= group.request.max_tokens or seq.num_tokens > self.config.max_model_len:
            seq.status = Status.FINISHED_LENGTH_CAPPED
        else:
            return
        self.block_manager.free(seq)


@mutant("prompt-limit-ignores-budget", "over-long prompts are checked against max_model_len + 1 only",
        ("LEN-002",))
class _PromptLimitLoose(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        loose = SchedulerConfig(**{**config.to_dict(), "max_num_batched_tokens": 10**6, "max_model_len": config.max_model_len + 1})
        self.config = loose  # bug: the limit checked is looser than the spec's
        self.block_manager.config = config


@mutant("ignored-not-reported", "an ignored request is finished but left out of the step's output", ("LEN-003",))
class _IgnoredNotReported(Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        self._last_output = SchedulerOutput(**{**out.__dict__, "ignored": ()})
        return self._last_output


@mutant("abort-finished-again", "aborting a finished request reports it finished a second time", ("REQ-001",))
class _AbortFinishedAgain(Scheduler):
    def abort_request(self, request_id: str) -> Finished | None:
        group = self.groups.get(request_id)
        if group is not None and group.status.is_finished:
            return Finished(request_id, Status.FINISHED_ABORTED, Reason.of("finished_aborted", request_id))
        return super().abort_request(request_id)


@mutant("length-capped-not-reported", "a request finished by its length cap is never reported", ("REQ-002",))
class _LengthCappedNotReported(Scheduler):
    def update(self, outcome: StepOutcome) -> list[Finished]:
        return [f for f in super().update(outcome) if f.status is not Status.FINISHED_LENGTH_CAPPED]


@mutant("finish-leaves-a-sequence-running",
        "finishing an n > 1 group finishes its first live sequence only; the others keep running and their blocks",
        ("REQ-006",))
class _FinishLeavesASequenceRunning(Scheduler):
    def _finish(self, group: SequenceGroup, status: Status) -> None:
        live = group.live_seqs()
        for seq in live[:1]:
            self.block_manager.free(seq)
            seq.status = status
        group.status = status  # bug: live[1:] stay RUNNING (or SWAPPED) and hold their blocks


@mutant("abort-leaves-waiting", "aborting a waiting request reports it finished but leaves it queued",
        ("REQ-003",))
class _AbortLeavesWaiting(Scheduler):
    def abort_request(self, request_id: str) -> Finished | None:
        group = self.groups.get(request_id)
        if group is not None and group.status is Status.WAITING:
            group.status = Status.FINISHED_ABORTED  # bug: still in self.waiting, sequences untouched
            return Finished(request_id, Status.FINISHED_ABORTED, Reason.of("finished_aborted", request_id))
        return super().abort_request(request_id)

    def _schedule_prefills(self, budget, step):
        for group in self.waiting:
            if group.status.is_finished:
                group.status = Status.WAITING  # the queue forgets the abort
        super()._schedule_prefills(budget, step)


@mutant("stop-to-wrong-request", "a stop token is delivered to the next sequence in the batch, not its own",
        ("REQ-005",))
class _StopToWrongRequest(Scheduler):
    def update(self, outcome: StepOutcome) -> list[Finished]:
        output = self._last_output
        if output is not None and outcome.stopped:
            order = [s.seq_id for s in output.scheduled]
            moved = {order[(order.index(sid) + 1) % len(order)] if sid in order else sid for sid in outcome.stopped}
            outcome = StepOutcome(frozenset(moved))  # bug: each stop lands on the next sequence in the batch
        return super().update(outcome)


@mutant("decode-scheduled-twice", "a decode group's first sequence is put in the batch twice", ("OUT-001",))
class _DecodeTwice(Scheduler):
    def _schedule_running(self, budget, step):
        super()._schedule_running(budget, step)
        if step.decodes:
            step.decodes.append(step.decodes[0])


@mutant("silent-preemption", "a recompute victim is moved to waiting without being reported", ("OUT-002",))
class _SilentPreemption(Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        kept = tuple(p for p in out.preempted if p.mode is not PreemptionMode.RECOMPUTE)
        self._last_output = SchedulerOutput(**{**out.__dict__, "preempted": kept})
        return self._last_output


@mutant("admission-skips-blocked-head", "admission passes over a request that does not fit and admits later ones",
        ("POL-001",))
class _SkipBlockedHead(Scheduler):
    def _schedule_prefills(self, budget, step):
        passed_over: list[SequenceGroup] = []
        while True:
            super()._schedule_prefills(budget, step)
            if not self.waiting:
                break
            passed_over.append(self.waiting.pop(0))  # bug: set the blocked head aside, keep admitting
        for group in reversed(passed_over):
            self.waiting.insert(0, group)


@mutant("prefill-while-swapped", "new prefills are admitted while requests are swapped out", ("POL-002",))
class _PrefillWhileSwapped(Scheduler):
    def schedule(self) -> SchedulerOutput:
        swapped, self.swapped = self.swapped, []
        try:
            step = _StepBuilder(self._step)
            from reference_impl.budget import Budget

            budget = Budget(self.config.max_num_batched_tokens, self.config.max_num_seqs)
            for group in self.running:
                budget.seqs += group.max_running_seqs()
            self._schedule_prefills(budget, step)  # bug: before (and regardless of) swapped
        finally:
            self.swapped = swapped
        if step.prefills:
            self._step += 1
            self._last_output = step.build()
            return self._last_output
        return super().schedule()


@mutant("victim-from-head", "the most urgent running request is preempted instead of the tail", ("POL-003",))
class _VictimFromHead(Scheduler):
    def _schedule_running(self, budget, step):
        self.running.reverse()  # bug: the decode loop walks (and preempts) in reverse order
        try:
            super()._schedule_running(budget, step)
        finally:
            self.running.sort(key=lambda g: g.key(self.config.policy))


@mutant("recompute-to-back", "a recompute victim re-enters waiting at the back", ("POL-004", "POL-006"))
class _RecomputeToBack(Scheduler):
    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        super()._preempt_by_recompute(victim)
        self.waiting.remove(victim)
        self.waiting.append(victim)  # bug


@mutant("decodes-in-prefill-steps", "decodes are scheduled in the same step as prefills", ("POL-005",))
class _MixedSteps(Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if not any(s.is_prefill for s in out.scheduled):
            return out
        admitted = {s.request_id for s in out.scheduled}
        extra = []
        for group in self.running:
            if group.request_id in admitted or not self.block_manager.can_append_slots(group):
                continue
            for seq in group.live_seqs():
                self.block_manager.append_slot(seq)
                extra.append(ScheduledSeq(seq.seq_id, group.request_id, 1, False))
        self._last_output = SchedulerOutput(**{**out.__dict__, "scheduled": out.scheduled + tuple(extra)})
        return self._last_output


@mutant("running-in-admission-order", "running keeps admission order, so swapped-in requests go to the tail",
        ("POL-006",))
class _RunningAdmissionOrder(Scheduler):
    def _enqueue(self, queue, group) -> None:
        if queue is self.running:
            queue.append(group)  # bug for the spec's order (this is vLLM V0's behaviour)
        else:
            super()._enqueue(queue, group)


@mutant("never-fits-waits-forever", "a prompt that can never fit waits at the head forever (vLLM PR #2163)",
        ("LIV-001", "LIV-002", "LIV-003"))
class _NeverFitsWaits(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        manager = self.block_manager
        original = manager.can_allocate

        def can_allocate(group: SequenceGroup) -> AllocStatus:
            status = original(group)
            return AllocStatus.LATER if status is AllocStatus.NEVER else status  # bug

        manager.can_allocate = can_allocate  # type: ignore[method-assign]


def violated(
    factory: Callable[[SchedulerConfig], object], trace, max_steps: int | None = None, invariants: Iterable[Any] | None = None
) -> set[str]:
    """Run ``trace`` on a scheduler made by ``factory`` and return the IDs of the invariants it
    violates (among ``invariants``, default the whole catalogue). A crash ends the run; what was
    found before it counts."""
    from reference_impl.engine import StepFailed, iter_steps
    from spec.catalogue import Checker

    scheduler = factory(trace.config)
    # A scheduler may say what it reserves (the async reference: its in-flight tokens' slots).
    checker = Checker(trace.config, scheduler.capabilities, invariants,  # type: ignore[attr-defined]
                      reservation=getattr(scheduler, "reservation", None))
    found: set[str] = set()
    steps = iter_steps(trace, scheduler)  # type: ignore[arg-type]
    try:
        for record in steps:
            found.update(v.invariant_id for v in checker.check_step(record))
    except StepFailed as failed:  # a failure an invariant names (PIP-005) counts as its violation
        found.update(v.invariant_id for v in checker.check_failure(failed.failure))
        return found
    except Exception:  # noqa: BLE001 - a broken scheduler may crash; its violations so far stand
        return found
    arrived = {a.request.request_id for a in trace.arrivals}
    drained = arrived <= set(checker.context.finished)
    found.update(v.invariant_id for v in checker.check_end(drained, not drained))
    return found


__all__ = ["MUTANTS", "Mutant", "violated"]

from conformance.selftest import (  # noqa: E402,F401  (register the mutants of today's engines)
    mutants_async,
    mutants_budgets,
    mutants_connector,
    mutants_hybrid,
    mutants_sglang,
    mutants_specdec,
    mutants_v1,
)


# ---------------------------------------------------------------------- engine-initiated ends
class _EndsVictims(Scheduler):
    """Ends a preemption victim instead of preempting it (issue 34's engine, which aborts every
    request of a pass when its pool runs out)."""

    with_reason = False

    def _preempt(self, victim: SequenceGroup, step: _StepBuilder, *, needed_by: str, need: int, free: int) -> None:
        self.running.remove(victim)
        self._finish(victim, Status.FINISHED_ABORTED)
        reason = Reason.of("engine_error", victim.request_id, error="out of KV blocks") if self.with_reason else None
        self._ignored.append(Finished(victim.request_id, Status.FINISHED_ABORTED, reason))


@mutant("aborts-victims", "ends a preemption victim as aborted, though the client never aborted it",
        ("REQ-007", "LIV-004"))
class _AbortsVictims(_EndsVictims):
    with_reason = False


@mutant("errors-victims", "ends a preemption victim with an engine_error though it fits the cache",
        ("LIV-004",))
class _ErrorsVictims(_EndsVictims):
    with_reason = True


@mutant("caps-one-early", "finishes a sequence as length-capped one token before max_tokens", ("LEN-004",))
class _CapsOneEarly(Scheduler):
    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id not in stopped and seq.num_generated >= group.request.max_tokens - 1 \
                and group.request.max_tokens > 1:
            seq.status = Status.FINISHED_LENGTH_CAPPED  # bug: one token short
            self.block_manager.free(seq)
            return
        super()._check_stop(group, seq, stopped)
