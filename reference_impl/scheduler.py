"""The reference scheduler: vLLM V0's default flow, written to be read top to bottom.

One call of `schedule()` is, in order (vLLM's ``Scheduler._schedule_default``):

1. Seats: every running group's sequences are counted against ``max_num_seqs`` first.
2. Prefills, only when nothing is swapped (swapped groups resume before any new prefill):
   take waiting groups in policy order; finish as ignored a prompt longer than the prompt
   limit or one that could never fit above the watermark; stop at the first group that does
   not fit the free blocks, the watermark, the token budget or the seats. Admission takes all
   of a group's blocks at once or none.
3. Priority preemption (policy ``priority`` only, nothing swapped): while the waiting head is
   more urgent than the running tail and cannot be admitted, preempt the tail.
4. If no prefill was scheduled: decodes. Each running group, in policy order, needs one free
   block per sequence; while it lacks them, the running tail (the least urgent group) is
   preempted, or the group itself when it is the last. Survivors get one token per sequence
   (copy-on-write where a last block is shared).
5. If nothing was preempted: swap-ins, in policy order, while the blocks (above the watermark),
   the token budget and the seats allow.

Prefill steps and decode steps never mix (V0 without chunked prefill). All queues are kept in
policy order (FCFS: arrival; priority: priority then arrival), so a recompute victim re-enters
waiting ahead of every request that arrived after it: the front, under FCFS.

`update()` feeds back one token per scheduled sequence: a freshly prefilled group with
``n > 1`` forks its ``n - 1`` other sequences (sharing the prompt's blocks) before the tokens
are appended; a sequence stops when the environment says so, at ``max_tokens`` generated, or
once it holds ``max_model_len`` tokens (vLLM's stop checker: ``get_len() >= max_model_len``);
finished sequences free their blocks at once.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from itertools import filterfalse
from operator import attrgetter, is_

from reference_impl.block_manager import AllocStatus, BlockManager
from reference_impl.budget import Budget
from reference_impl.sequence import Sequence, SequenceGroup
from spec import observation
from spec.config import SchedulerConfig
from spec.observation import ALL_CAPABILITIES, SeqView, Snapshot
from spec.reasons import Reason
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, Request, ScheduledSeq, SchedulerOutput, StepOutcome, request_of, seq_id


@dataclass
class _StepBuilder:
    """Collects one step's decisions; `build()` freezes them into a `SchedulerOutput`."""

    step: int
    prefills: list[ScheduledSeq] = field(default_factory=list)
    decodes: list[ScheduledSeq] = field(default_factory=list)
    swapped_in_decodes: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Preempted] = field(default_factory=list)
    swapped_in: list[str] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)

    def reason(self, kind: str, request_id: str, **numbers: int | str) -> None:
        self.reasons.append(Reason.of(kind, request_id, **numbers))

    def build(self) -> SchedulerOutput:
        return SchedulerOutput(
            step=self.step,
            scheduled=tuple(self.prefills + self.decodes + self.swapped_in_decodes),
            preempted=tuple(self.preempted),
            swapped_in=tuple(self.swapped_in),
            swap_out=tuple(self.swap_out),
            swap_in=tuple(self.swap_in),
            copies=tuple(self.copies),
            ignored=tuple(self.ignored),
            reasons=tuple(self.reasons),
        )


_REQUEST_ID, _STATUS = attrgetter("request_id"), attrgetter("status")  # observation: read at C speed


class Scheduler:
    """The executable reference (the oracle). Implements `spec.protocol.SchedulerLike`."""

    capabilities = ALL_CAPABILITIES

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.block_manager = BlockManager(config)
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.groups: dict[str, SequenceGroup] = {}
        self.num_preemptions_total = 0
        self._step = 0
        self._arrivals = 0
        self._last_output: SchedulerOutput | None = None
        self._ignored: list[Finished] = []
        self._last_snapshot: Snapshot | None = None
        self._settled: set[str] = set()  # finished groups holding nothing: their views are final
        self._unsettled_finished: set[str] = set()  # finished groups last seen still holding blocks
        self._added_since_snapshot: list[str] = []
        # Observation only: the waiting queue's groups and ids as the last snapshot saw them, so
        # that a snapshot of an unchanged backlog reuses its tuple and visits none of it.
        self._observed_waiting: tuple[list[SequenceGroup], tuple[str, ...]] = ([], ())
        self._waiting_sets: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}  # `_waiting_set`

    # ---------------------------------------------------------------- client side
    def add_request(self, request: Request) -> None:
        if request.request_id in self.groups:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        group = SequenceGroup.new(request, self._arrivals)
        self._arrivals += 1
        self.groups[request.request_id] = group
        self._added_since_snapshot.append(request.request_id)
        self._enqueue(self.waiting, group)

    def abort_request(self, request_id: str) -> Finished | None:
        group = self.groups.get(request_id)
        if group is None or group.status.is_finished:
            return None
        self._queue_of(group).remove(group)
        self._finish(group, Status.FINISHED_ABORTED)
        return Finished(request_id, Status.FINISHED_ABORTED, Reason.of("finished_aborted", request_id))

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        step = _StepBuilder(self._step)
        budget = Budget(self.config.max_num_batched_tokens, self.config.max_num_seqs)
        for group in self.running:
            budget.seqs += group.max_running_seqs()

        if self.swapped:
            if self.waiting:
                step.reason("wait_swapped_first", self.waiting[0].request_id, swapped=len(self.swapped))
        else:
            if self.config.policy == "priority":
                self._schedule_priority_preemption(budget, step)
            self._schedule_prefills(budget, step)

        if step.prefills:
            for group in self.running:
                if group.request_id not in {s.request_id for s in step.prefills}:
                    step.reason("wait_prefill_step", group.request_id)
        else:
            self._schedule_running(budget, step)
            if not step.preempted:
                self._schedule_swapped(budget, step)
            elif self.swapped:
                step.reason("wait_after_preemption", self.swapped[0].request_id)

        self._step += 1
        self._last_output = step.build()
        return self._last_output

    def _schedule_prefills(self, budget: Budget, step: _StepBuilder) -> None:
        bm = self.block_manager
        while self.waiting:
            group = self.waiting[0]
            tokens = group.uncomputed_tokens()
            if tokens > self.config.prompt_limit:
                step.reason("ignored_too_long", group.request_id, tokens=tokens, limit=self.config.prompt_limit)
                self._ignore(self.waiting, group, step)
                continue
            if group.max_running_seqs() > self.config.max_num_seqs:
                step.reason("ignored_too_many_seqs", group.request_id, seqs=group.max_running_seqs(),
                            limit=self.config.max_num_seqs)
                self._ignore(self.waiting, group, step)
                continue
            need = bm.blocks_to_allocate(group)
            status = bm.can_allocate(group)
            if status is AllocStatus.NEVER:
                capacity = self.config.num_gpu_blocks - self.config.watermark_blocks
                step.reason("ignored_never_fits", group.request_id, blocks=need, capacity=capacity)
                self._ignore(self.waiting, group, step)
                continue
            if status is AllocStatus.LATER:
                free, watermark = bm.gpu.num_free, self.config.watermark_blocks
                kind = "wait_blocks" if need > free else "wait_watermark"
                step.reason(kind, group.request_id, blocks=need, free=free, watermark=watermark)
                break
            seqs = group.max_running_seqs()
            if not budget.can_schedule(tokens, seqs):
                if budget.tokens + tokens > budget.token_budget:
                    step.reason("wait_token_budget", group.request_id, tokens=tokens, left=budget.tokens_left)
                else:
                    step.reason("wait_seq_budget", group.request_id, seqs=seqs, left=budget.seqs_left)
                break
            self.waiting.pop(0)
            bm.allocate(group)
            group.set_status(Status.RUNNING)
            self._enqueue(self.running, group)
            for seq in group.live_seqs():
                step.prefills.append(ScheduledSeq(seq.seq_id, group.request_id, seq.num_uncomputed, True))
            budget.tokens += tokens
            budget.seqs += seqs
            step.reason(
                "admitted", group.request_id, tokens=tokens, blocks=need,
                free_after=bm.gpu.num_free, watermark=self.config.watermark_blocks,
            )

    def _schedule_priority_preemption(self, budget: Budget, step: _StepBuilder) -> None:
        """Make room for a waiting head that is more urgent than the running tail (vLLM's
        ``_schedule_priority_preemption``). Victims are preempted by the usual mode rule."""
        if not self.waiting:
            return
        head = self.waiting[0]
        policy = self.config.policy
        while self.running and self.running[-1].key(policy) > head.key(policy):
            fits = (
                self.block_manager.can_allocate(head) is AllocStatus.OK
                and budget.can_schedule(head.uncomputed_tokens(), head.max_running_seqs())
            )
            if fits:
                return
            victim = self.running[-1]
            budget.seqs -= victim.max_running_seqs()
            step.reason("preempted_priority", victim.request_id, needed_by=head.request_id)
            need = self.block_manager.blocks_to_allocate(head)
            self._preempt(victim, step, needed_by=head.request_id, need=need, free=self.block_manager.gpu.num_free)

    def _schedule_running(self, budget: Budget, step: _StepBuilder) -> None:
        bm = self.block_manager
        queue = list(self.running)
        while queue:
            group = queue.pop(0)
            while not bm.can_append_slots(group):
                need, free = len(group.live_seqs()), bm.gpu.num_free
                victim = queue.pop() if queue else group  # the least urgent running group
                budget.seqs -= victim.max_running_seqs()
                self._preempt(victim, step, needed_by=group.request_id, need=need, free=free)
                if victim is group:
                    break
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

    def _schedule_swapped(self, budget: Budget, step: _StepBuilder) -> None:
        bm = self.block_manager
        while self.swapped:
            group = self.swapped[0]
            need = bm.blocks_to_swap_in(group)
            status = bm.can_swap_in(group)
            if status is AllocStatus.NEVER:
                capacity = self.config.num_gpu_blocks - self.config.watermark_blocks
                step.reason("ignored_swap_never_fits", group.request_id, need=need, capacity=capacity)
                self._ignore(self.swapped, group, step)
                continue
            if status is AllocStatus.LATER:
                step.reason(
                    "wait_swap_in", group.request_id, need=need, free=bm.gpu.num_free,
                    watermark=self.config.watermark_blocks,
                )
                break
            seqs = len(group.live_seqs())
            if not budget.can_schedule(seqs, group.max_running_seqs()):
                if budget.tokens + seqs > budget.token_budget:
                    step.reason("wait_token_budget", group.request_id, tokens=seqs, left=budget.tokens_left)
                else:
                    step.reason("wait_seq_budget", group.request_id, seqs=seqs, left=budget.seqs_left)
                break
            self.swapped.pop(0)
            moved = bm.swap_in(group)
            step.swap_in.extend(moved)
            group.set_status(Status.RUNNING)
            self._enqueue(self.running, group)
            step.swapped_in.append(group.request_id)
            for seq in group.live_seqs():
                step.copies.extend(bm.append_slot(seq))
                step.swapped_in_decodes.append(ScheduledSeq(seq.seq_id, group.request_id, 1, False))
            budget.tokens += seqs
            budget.seqs += group.max_running_seqs()
            step.reason("swapped_in", group.request_id, blocks=len(moved), free_after=bm.gpu.num_free)

    # ---------------------------------------------------------------- preemption
    def _preemption_mode(self, group: SequenceGroup) -> PreemptionMode:
        mode = self.config.preemption_mode
        if mode == "auto":  # vLLM V0 default
            return PreemptionMode.RECOMPUTE if group.max_running_seqs() == 1 else PreemptionMode.SWAP
        return PreemptionMode(mode)

    def _preempt(self, victim: SequenceGroup, step: _StepBuilder, *, needed_by: str, need: int, free: int) -> None:
        self.running.remove(victim)
        mode = self._preemption_mode(victim)
        if mode is PreemptionMode.SWAP and not self.block_manager.can_swap_out(victim):
            # Documented rule (vLLM raises "Aborted due to the lack of CPU swap space"): fall back
            # to recompute, which needs no CPU space and loses no generated token.
            blocks = len(self.block_manager._distinct_blocks(victim, self.block_manager.gpu_tables))
            step.reason("swap_space_exhausted", victim.request_id, blocks=blocks, free=self.block_manager.cpu.num_free)
            mode = PreemptionMode.RECOMPUTE
        if mode is PreemptionMode.SWAP:
            blocks = len(self.block_manager._distinct_blocks(victim, self.block_manager.gpu_tables))
            step.swap_out.extend(self.block_manager.swap_out(victim))
            victim.set_status(Status.SWAPPED)
            self._enqueue(self.swapped, victim)
            step.reason("preempted_swap", victim.request_id, needed_by=needed_by, need=need, free=free, blocks=blocks)
        else:
            self._preempt_by_recompute(victim)
            step.reason("preempted_recompute", victim.request_id, needed_by=needed_by, need=need, free=free)
        step.preempted.append(Preempted(victim.request_id, mode))
        self.num_preemptions_total += 1

    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        """Free the victim's blocks and forget its KV; its generated tokens stay and are
        recomputed as part of its next prefill."""
        for seq in victim.live_seqs():
            self.block_manager.free(seq)
            seq.num_computed = 0
        victim.set_status(Status.WAITING)
        self._enqueue(self.waiting, victim)

    # ---------------------------------------------------------------- outcome
    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished, self._ignored = self._ignored, []
        output = self._last_output
        self._last_output = None
        if output is None:
            return finished
        touched: dict[str, SequenceGroup] = {}
        for item in output.scheduled:
            group = self.groups[item.request_id]
            seq = self._seq(group, item.seq_id)
            if seq is None or seq.status is not Status.RUNNING:
                continue  # finished meanwhile
            seq.num_computed += item.num_tokens
            new_seqs = [seq]
            if item.is_prefill and not group.forked:
                new_seqs += self._fork(group, seq)
            for s in new_seqs:
                s.num_tokens += 1  # the token sampled this step (its KV is computed next step)
                self._check_stop(group, s, outcome.stopped)
            touched[group.request_id] = group
        for group in touched.values():
            if not group.live_seqs():
                self.running.remove(group)
                status = self._final_status(group)
                kind = "finished_length_capped" if status is Status.FINISHED_LENGTH_CAPPED else "finished_stopped"
                group.status = status
                reason = Reason.of(
                    kind, group.request_id, max_tokens=group.request.max_tokens, max_model_len=self.config.max_model_len
                )
                finished.append(Finished(group.request_id, status, reason))
        return finished

    def _fork(self, group: SequenceGroup, parent: Sequence) -> list[Sequence]:
        children = []
        for index in range(1, group.request.n):
            child = Sequence(
                seq_id(group.request_id, index), group.request_id, parent.prompt_len,
                parent.num_tokens, parent.num_computed, Status.RUNNING,
            )
            self.block_manager.fork(parent, child)
            group.seqs.append(child)
            children.append(child)
        group.forked = True
        return children

    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id in stopped:
            seq.status = Status.FINISHED_STOPPED
        elif seq.num_generated >= group.request.max_tokens or seq.num_tokens >= self.config.max_model_len:
            seq.status = Status.FINISHED_LENGTH_CAPPED
        else:
            return
        self.block_manager.free(seq)

    @staticmethod
    def _final_status(group: SequenceGroup) -> Status:
        if all(s.status is Status.FINISHED_LENGTH_CAPPED for s in group.seqs):
            return Status.FINISHED_LENGTH_CAPPED
        return Status.FINISHED_STOPPED

    # ---------------------------------------------------------------- helpers
    def _enqueue(self, queue: list[SequenceGroup], group: SequenceGroup) -> None:
        """Insert in policy order (keys are unique: they end with the arrival number). Bisected on
        the keys, not a list of them: a backlog of thousands is not rebuilt per arrival."""
        policy = self.config.policy
        queue.insert(bisect.bisect_right(queue, group.key(policy), key=lambda g: g.key(policy)), group)

    def _queue_of(self, group: SequenceGroup) -> list[SequenceGroup]:
        return {Status.WAITING: self.waiting, Status.RUNNING: self.running, Status.SWAPPED: self.swapped}[group.status]

    def _ignore(self, queue: list[SequenceGroup], group: SequenceGroup, step: _StepBuilder) -> None:
        queue.remove(group)
        self._finish(group, Status.FINISHED_IGNORED)
        step.ignored.append(group.request_id)
        self._ignored.append(Finished(group.request_id, Status.FINISHED_IGNORED, step.reasons[-1]))

    def _finish(self, group: SequenceGroup, status: Status) -> None:
        for seq in group.live_seqs():
            self.block_manager.free(seq)
            seq.status = status
        group.status = status

    @staticmethod
    def _seq(group: SequenceGroup, sid: str) -> Sequence | None:
        return next((s for s in group.seqs if s.seq_id == sid), None)

    # ---------------------------------------------------------------- observation
    def snapshot(self) -> Snapshot:
        """The whole state, built as a delta on the previous snapshot (`Snapshot.base`).

        A sequence's view is rebuilt only when one of its fields differs from the view last
        handed out, and every part that did not change is the previous snapshot's own object
        (views, tables, count tuples, queues), so a checker can skip what is identical
        (`spec.invariants._views`). `changed_seqs` names the rebuilt views. A group that was seen
        finished and holding nothing can no longer change and is not visited again.
        """
        bm = self.block_manager
        if not observation.INCREMENTAL:
            self._last_snapshot, self._settled, self._unsettled_finished = None, set(), set()
            self._observed_waiting = ([], ())
        base = self._last_snapshot
        waiting_ids = self._waiting_ids()
        old_seqs = base.seqs if base is not None and base.seqs is not None else {}
        old_statuses = base.statuses if base is not None and base.statuses is not None else {}
        new_views: dict[str, SeqView] = {}
        new_statuses: dict[str, Status] = {}
        gpu_tables, cpu_tables = bm.gpu_tables, bm.cpu_tables
        for group in self._groups_to_visit(base, waiting_ids):
            rid = group.request_id
            if old_statuses.get(rid) is not group.status:
                new_statuses[rid] = group.status
            holds = False
            for seq in group.seqs:
                sid = seq.seq_id
                if sid in gpu_tables:
                    blocks, device = tuple(gpu_tables[sid]), "gpu"
                elif sid in cpu_tables:
                    blocks, device = tuple(cpu_tables[sid]), "cpu"
                else:
                    blocks, device = (), None
                holds = holds or bool(blocks)
                old = old_seqs.get(sid)
                if old is not None and old.blocks == blocks:
                    blocks = old.blocks  # keep the object: an unchanged table is the same table
                if (old is None or old.status is not seq.status or old.num_tokens != seq.num_tokens
                        or old.num_computed != seq.num_computed or old.blocks is not blocks or old.device != device):
                    new_views[sid] = SeqView(sid, seq.request_id, seq.status, seq.num_tokens, seq.num_computed, blocks, device)
            if group.status.is_finished:
                if not holds and all(s.status.is_finished for s in group.seqs):
                    self._settled.add(rid)
                    self._unsettled_finished.discard(rid)
                else:
                    self._unsettled_finished.add(rid)
        self._added_since_snapshot.clear()
        seqs = {**old_seqs, **new_views} if new_views or base is None else old_seqs
        statuses = {**old_statuses, **new_statuses} if new_statuses or base is None else old_statuses

        def same(new: tuple, old: tuple | None) -> tuple:
            return old if old is not None and old == new else new

        old_snap = base if base is not None else Snapshot()
        gpu_changes, cpu_changes = bm.gpu.changed_blocks(), bm.cpu.changed_blocks()  # taken every snapshot

        def pool(changes: dict[int, int] | None, new, old: tuple | None) -> tuple:  # type: ignore[no-untyped-def]
            """A pool's counts or free ids: the previous tuple when its log names no change (every
            write is logged, reference_impl/pool_log.py), else built anew (``new()``)."""
            return old if changes == {} and old is not None else new()

        snap = Snapshot(
            statuses=statuses,
            seqs=seqs,
            waiting=same(waiting_ids, old_snap.waiting),
            running=same(tuple(g.request_id for g in self.running), old_snap.running),
            swapped=same(tuple(g.request_id for g in self.swapped), old_snap.swapped),
            # [:]: see BlockPool.free_ids
            gpu_ref_counts=pool(gpu_changes, lambda: tuple(bm.gpu.ref_counts[:]), old_snap.gpu_ref_counts),
            cpu_ref_counts=pool(cpu_changes, lambda: tuple(bm.cpu.ref_counts[:]), old_snap.cpu_ref_counts),
            gpu_free=bm.gpu.num_free,
            cpu_free=bm.cpu.num_free,
            gpu_free_ids=pool(gpu_changes, bm.gpu.free_ids, old_snap.gpu_free_ids),
            cpu_free_ids=pool(cpu_changes, bm.cpu.free_ids, old_snap.cpu_free_ids),
            base=base,
            changed_seqs=frozenset(new_views) if base is not None else None,
            changed_requests=frozenset(new_statuses) if base is not None else None,
            gpu_block_changes=gpu_changes if base is not None else None,
            cpu_block_changes=cpu_changes if base is not None else None,
        )
        # Only the latest is kept; holding the chain is the records' business, not the scheduler's.
        self._last_snapshot = snap
        self._observed_waiting = (self._observed_waiting[0], snap.waiting)  # the tuple base.waiting will be
        return snap

    def _waiting_ids(self) -> tuple[str, ...]:
        """The waiting queue's request ids: the last snapshot's very tuple while the queue holds
        the same groups in the same order (compared by identity at C speed), so that neither a
        snapshot nor `_groups_to_visit` walks an unchanged backlog in Python."""
        seen, ids = self._observed_waiting
        waiting = self.waiting
        if len(seen) == len(waiting) and all(map(is_, seen, waiting)):
            return ids
        ids = tuple(map(_REQUEST_ID, waiting))
        self._observed_waiting = (list(waiting), ids)
        return ids

    def _waiting_set(self, ids: tuple[str, ...]) -> frozenset[str]:
        """The ids of ``ids`` (a snapshot's waiting tuple) as a set: built once per tuple and kept
        for the last two (a snapshot's and its base's). Observation only."""
        kept = self._waiting_sets.get(id(ids))
        if kept is not None and kept[0] is ids:
            return kept[1]
        members = frozenset(ids)
        self._waiting_sets = {**dict(list(self._waiting_sets.items())[-1:]), id(ids): (ids, members)}
        return members

    def _groups_to_visit(self, base: Snapshot | None, waiting_ids: tuple[str, ...]) -> list[SequenceGroup]:
        """The groups whose views may have changed since ``base``: every running or swapped
        group, every group that entered or left a queue, and every group whose status is not
        its queue's. A group that stayed waiting, still WAITING, has no blocks to gain and no
        token to add, so its views are base's; a finished group is visited until it is seen
        holding nothing (`_settled`). When the waiting queue is base's (``waiting_ids`` is its
        tuple) and every group in it is WAITING (both checked at C speed), none of it is walked:
        only the waiting groups that hold blocks are visited."""
        if base is None or base.waiting is None:
            return [g for rid, g in self.groups.items() if rid not in self._settled]
        holders = {request_of(sid) for sid in (*self.block_manager.gpu_tables, *self.block_manager.cpu_tables)}
        visit = [*self.running, *self.swapped]
        if waiting_ids is base.waiting and list(map(_STATUS, self.waiting)).count(Status.WAITING) == len(self.waiting):
            seen = {g.request_id for g in visit}
            visit += [g for rid in sorted(holders) if rid not in seen and (g := self.groups.get(rid)) is not None
                      and g.status is Status.WAITING]  # waiting (or a mutant's misplaced) holders
            seen = {g.request_id for g in visit}
            # A group that left running or swapped is visited wherever it went (a few per step).
            visit += [self.groups[rid] for rid in (*(base.running or ()), *(base.swapped or ()))
                      if rid not in seen and rid in self.groups and rid not in self._settled]
            visit += [self.groups[rid] for rid in (*self._unsettled_finished, *self._added_since_snapshot)
                      if rid not in self._settled]
            return visit
        # The queue changed: who entered and who left it is read at C speed on the ids (a set per
        # queue tuple, kept for the next snapshot), not by a walk of the backlog in Python.
        was_waiting, now_waiting = self._waiting_set(base.waiting), self._waiting_set(waiting_ids)
        groups = self.groups
        if list(map(_STATUS, self.waiting)).count(Status.WAITING) != len(self.waiting):
            visit += [g for g in self.waiting if g.status is not Status.WAITING]  # a mutant's misplaced status
        visit += [groups[rid] for rid in filterfalse(was_waiting.__contains__, waiting_ids)]  # entered
        visit += [groups[rid] for rid in sorted(holders.intersection(now_waiting))]  # waiting holders
        seen = {g.request_id for g in visit}
        left = [rid for rid in (*filterfalse(now_waiting.__contains__, base.waiting), *(base.running or ()),
                                *(base.swapped or ())) if rid not in seen]
        visit += [groups[rid] for rid in left if rid in groups and rid not in self._settled]
        visit += [self.groups[rid] for rid in (*self._unsettled_finished, *self._added_since_snapshot)
                  if rid not in self._settled]
        return visit

    def metrics(self) -> dict[str, int]:
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "num_swapped": len(self.swapped),
            "num_preemptions_total": self.num_preemptions_total,
            "gpu_free_blocks": self.block_manager.gpu.num_free,
            "cpu_free_blocks": self.block_manager.cpu.num_free,
        }
