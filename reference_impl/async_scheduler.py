"""The V1 flow with pipelined steps: a step's outcome arrives ``depth`` steps after it was scheduled
(vLLM 0.33.0's ``AsyncScheduler`` driven by ``EngineCore.step_with_batch_queue``: depth 1).

docs/ASYNC.md is the design; this module is its executable meaning. The scheduling decisions
are `V1Scheduler`'s; what changes is *when* a step's tokens become known. One engine step, as
`schedule()` then `update()` run it:

1. ``schedule()`` plans the step with V1's flow, seeing every request as if its in-flight steps
   had already returned: a request's uncomputed tokens are ``num_tokens + num_placeholders -
   num_computed``, where a placeholder is a token some in-flight step samples (its value is not
   known yet) and ``num_computed`` already counts every in-flight step's tokens
   (vllm/v1/core/sched/scheduler.py:838-842; `_running_chunk`).
2. A running request whose in-flight tokens already reach ``max_tokens`` or ``max_model_len`` is
   not scheduled again: that token could never be delivered (scheduler.py:800-815).
3. The scheduled tokens are counted as computed at once, and every request whose tokens this
   step completes gets one more placeholder: the step samples a token at position
   ``num_computed`` (scheduler.py:1845-1866 ``_update_after_schedule``; async_scheduler.py:24-46).
   The step joins the in-flight queue.
4. ``update(outcome)`` hands the environment's outcome (which sampled tokens are stops) to the
   step just scheduled, then *processes* the oldest in-flight steps until at most ``depth`` are
   left (core.py:778-795). Processing a step appends each sampled token (resolving a
   placeholder), applies stops and length limits, and frees finished requests; an outcome of a
   request that has finished or was aborted meanwhile is dropped (scheduler.py:2327-2334).
5. Preemption (recompute) resets computed tokens and placeholders; the victim's in-flight steps
   become *stale*: their tokens are still delivered when they return but touch no counter
   (scheduler.py:1799-1843 ``_preempt_request``, 2316-2323 and 2744-2770). A stale step's drafts
   are what the drafter had proposed when it ran, before the preemption (its verified tokens are
   delivered whole, scheduler.py:1825-1835); the preemption clears the proposal only for the next
   admission (``InFlightCounters.num_stale_valid``).

6. With a KV connector (``config.kv_connector``, `reference_impl.kv_connector`): the waiting pass
   is V1's connector pass; processing a step first reports the transfers its outcome names and cuts
   the requests their failed blocks touch (a running request's count minus the step's own tokens,
   as vLLM reads it), a request whose synchronous load failed skips the step's output and its
   failed step's placeholder and its later in-flight steps are voided (it recomputes from the cut,
   a prefill again); then the step's tokens; then, under ``fail``, the cut requests finish, and the
   reported transfers free or promote (vLLM ``update_from_output``, scheduler.py:2279-2585). A
   finish's sends count from the next step to schedule. vLLM runs the fencing variant with a
   consumer connector (`reference_impl.kv_connector_scheduler.PipelinedConnectorScheduler`).

``depth=0`` processes each step's outcome in the same `update()`: no step is ever in flight and
the flow is `V1Scheduler`'s, decision for decision and snapshot for snapshot
(tests/test_async_reference.py).

The snapshot reports ``num_computed`` as the *processed frontier* (``num_computed`` minus the
in-flight tokens, 0 for a preempted request): the KV an in-flight step writes is not yet known
to be there, exactly what the V1 reference shows mid-step.

Where this differs from the engine (spec decisions, docs/ASYNC.md):
* a preempted request is not readmitted while a stale step of it is still in flight (at depth 1
  this never happens: V1 admits nothing in a step that preempts, and the stale step returns in
  that same step's update); vLLM 0.33.0 would resample a position the stale token then also
  fills;
* V1's extra clamp of every running chunk at ``max_model_len - num_computed - 1`` is not applied
  to prefill chunks (the V1 reference's spec decision, lockstep_v1 ``chunk-clamped-...``);
* the sampled token's value is the trace's (`spec.types.generated_token` at its position), so a
  pipelined run and a synchronous run sample the same tokens and may be compared.

Speculative decoding (k > 0, spec/speculative.py) at depth > 0: the drafter's proposal is not
back when the next step is scheduled, so a request whose scheduled step samples is given k
placeholder drafts for its next decode (vLLM ``AsyncScheduler._update_after_schedule``,
async_scheduler.py:24-56), and a step with d drafts adds 1 + d placeholders. When the step
returns, drafts beyond what the drafter really proposed are invalid (never accepted); rejected
ones roll back computed tokens and placeholders alike (scheduler.py:2346-2364). "Sure to reach
the limit" counts one token per sampling step in flight, not its placeholders (the drafts may
all be rejected; scheduler.py:800-815). At depth 0 the flow is `V1Scheduler`'s, drafts included.
An empty outcome (the model returns no token for a request: vllm-project/vllm#42722's output)
rolls the whole step back, its drafts and its sampled position, so the request recomputes its last
known token. At depth > 0 the request's later steps are already in flight, fed a token that never
came (vLLM's runner feeds the previous step's sample on the device); what they compute for it is
void: their tokens leave the computed count and the placeholders at once, and their outcomes for it
are dropped when they return, counted meanwhile as stale (vLLM's drop-mode stale output,
scheduler.py:2336-2338, is the same discard for a same-step resume). The drafter proposed nothing
(nothing was sampled), so the request's next decode has no drafts. vLLM 0.33.0 does none of this:
``update_from_output`` skips the rollback when the output is empty (scheduler.py:2349-2351) and
leaves the placeholders of the step in place; `conformance.selftest.mutants_specdec` has both
shapes.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from reference_impl.v1_scheduler import (
    CAPABILITIES,
    TrackedRequest,
    V1Scheduler,
    commit_tokens,
    finished_record,
    snapshot_of,
)
from spec.config import MAX_PIPELINE_DEPTH, SchedulerConfig
from spec.observation import Capability, InFlightView, Snapshot
from spec.reservation import Reservation
from spec.speculative import NO_DECISION, DraftDecision
from spec.status import Status
from spec.types import Finished, Request, SchedulerOutput, StepOutcome

MAX_DEPTH = MAX_PIPELINE_DEPTH  # spec/config.py says why 2


@dataclass
class InFlightCounters:
    """A request's share of the steps still in flight (vLLM's ``Request`` fields of the same
    meaning: ``num_output_placeholders``, ``num_in_flight_tokens``, ``num_stale_output_tokens``)."""

    num_placeholders: int = 0  # tokens in-flight steps sample for it, not yet appended
    num_in_flight: int = 0  # tokens in-flight steps compute for it
    num_stale: int = 0  # of those, tokens of steps scheduled before its last preemption
    num_dropped: int = 0  # of the stale ones, tokens of steps whose outcomes are dropped whole (voided)
    num_sampling: int = 0  # in-flight steps (not stale) that sample for it: each commits >= 1 token
    num_valid_drafts: int = 0  # speculative decoding: what the drafter proposed after its last returned step
    # the same for its stale steps: their drafts were proposed (and verified) before the preemption
    num_stale_valid: int = 0


@dataclass
class InFlightStep:
    """One scheduled step whose outcome has not been processed: per request, the tokens it
    computes and the position it samples (None: a prefill chunk that samples nothing)."""

    step: int
    entries: list[tuple[TrackedRequest, int, int | None, int]]  # (request, tokens, position, drafts)
    stopped: frozenset[str] | None = None  # the outcome, once the model has run it
    decisions: Mapping[str, DraftDecision] | None = None  # its speculative decisions (spec/speculative.py)
    # requests whose outcome in this step is void: an earlier step's outcome for them was empty
    dropped: set[str] = field(default_factory=set)


@dataclass
class _FrontierView:
    """A request as the snapshot shows it: the processed frontier in place of ``num_computed``."""

    tracked: TrackedRequest
    num_computed: int
    seq_id: str = field(init=False)
    request_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.seq_id, self.request_id = self.tracked.seq_id, self.tracked.request_id

    @property
    def status(self) -> Status:
        return self.tracked.status

    @property
    def num_tokens(self) -> int:
        return self.tracked.num_tokens

    @property
    def blocks(self) -> list[int]:
        return self.tracked.blocks

    @property
    def tokens(self) -> list[int]:
        return self.tracked.tokens


class AsyncV1Scheduler(V1Scheduler):
    """`V1Scheduler` whose outcomes arrive ``depth`` steps late (by default the config's
    ``pipeline_depth``). Implements `spec.protocol.SchedulerLike`."""

    # Its in-flight counters (PIP-003); it frees a request's blocks at once, relying, as vLLM does,
    # on steps running in order (ORDERED_STEPS: PIP-004 is moot; `DeferredFreeAsyncV1Scheduler` fences).
    capabilities = CAPABILITIES | {Capability.IN_FLIGHT, Capability.ORDERED_STEPS}

    def __init__(self, config: SchedulerConfig, depth: int | None = None) -> None:
        depth = config.pipeline_depth if depth is None else depth
        if not 0 <= depth <= MAX_DEPTH:
            raise ValueError(f"depth must be 0..{MAX_DEPTH}, got {depth}")
        super().__init__(config)
        self.depth = depth
        self.in_flight: collections.deque[InFlightStep] = collections.deque()  # oldest first
        self.counters: dict[str, InFlightCounters] = {}

    @property
    def reservation(self) -> Reservation | None:
        """The slots of its in-flight tokens: allocated when a step is scheduled, counted when the
        step returns, at most ``depth`` per sequence (CAP-006; tests/test_reservation.py)."""
        k = self.config.num_speculative_tokens  # and its drafts': each in-flight step 1 + k, the next k
        eagle = self._slot_tokens(0)  # EAGLE's lookahead slots too, with `lookahead_slots_with_eagle`
        return Reservation(lookahead_tokens=self.depth * (1 + k) + k + eagle) if self.depth or k else None

    def _track(self, request: Request) -> TrackedRequest:
        tracked = super()._track(request)
        self.counters[tracked.request_id] = InFlightCounters()
        return tracked

    # ---------------------------------------------------------------- 1-3. schedule
    def schedule(self) -> SchedulerOutput:
        output = super().schedule()  # V1's flow, through the hooks below
        entries = []
        for tracked, tokens in self._scheduled:
            counters = self.counters[tracked.request_id]
            drafts = self._scheduled_drafts.get(tracked.request_id, 0)
            tracked.num_computed += tokens  # 3. counted as computed when scheduled
            counters.num_in_flight += tokens
            position = None
            if tracked.num_computed >= tracked.num_tokens + counters.num_placeholders + drafts:
                position = tracked.num_computed - drafts  # the step samples from this position on
                counters.num_placeholders += 1 + drafts
                counters.num_sampling += 1
                tracked.in_prefill = False
                if self.depth:  # placeholders for the drafts proposed after this step
                    tracked.num_proposed = self.config.num_speculative_tokens
            entries.append((tracked, tokens, position, drafts))
        self._scheduled = []  # V1's update must not apply them again
        self._scheduled_drafts = {}
        self.in_flight.append(InFlightStep(output.step, entries))
        return output

    def _running_chunk(self, tracked: TrackedRequest, budget: int, threshold: int) -> int:
        counters = self.counters[tracked.request_id]
        if counters.num_sampling and self._in_flight_reaches_limit(tracked, counters):
            return 0  # 2. nothing it computes now could be delivered
        known = tracked.num_tokens + counters.num_placeholders  # 1. (in-flight drafts as if accepted)
        tokens = known + self._draft_room(tracked, known) - tracked.num_computed
        if 0 < threshold < tokens:
            tokens = threshold
        return self._max_model_len_clamp(tracked, min(tokens, budget))  # a no-op unless the knob is on

    def _num_known(self, tracked: TrackedRequest) -> int:
        return tracked.num_tokens + self.counters[tracked.request_id].num_placeholders

    def _in_flight_reaches_limit(self, tracked: TrackedRequest, counters: InFlightCounters) -> bool:
        """Whether the tokens already in flight take the request to ``max_tokens`` or
        ``max_model_len`` (vLLM: scheduler.py:800-815 for the first, the running loop's
        ``max_model_len - num_computed_tokens - 1`` clamp for the second)."""
        ahead = counters.num_sampling
        return (tracked.num_generated + ahead >= tracked.request.max_tokens
                or tracked.num_tokens + ahead >= self.config.max_model_len)

    def _whole_sequence_fits(self, tracked: TrackedRequest, hits: list[int]) -> bool:
        # Spec decision: a preempted request whose stale steps are still in flight waits for them
        # (only at depth 2; the step's reason says wait_blocks, spec/reasons.py has no kind for it yet).
        # Steps whose outcomes are dropped whole (a session's stopped turn) are not waited for: vLLM
        # discards them when they return and admits it meanwhile (``drop_stale_output``, scheduler.py:1084, 2338).
        counters = self.counters[tracked.request_id]
        if counters.num_stale > counters.num_dropped:
            return False
        return super()._whole_sequence_fits(tracked, hits)

    # ---------------------------------------------------------------- 5. preemption
    def _preempt(self, victim: TrackedRequest) -> None:
        super()._preempt(victim)
        counters = self.counters[victim.request_id]
        counters.num_stale = counters.num_in_flight  # its in-flight steps no longer count
        counters.num_placeholders = 0
        counters.num_sampling = 0
        counters.num_stale_valid = counters.num_valid_drafts  # what its stale steps' drafts were
        counters.num_valid_drafts = 0

    # ---------------------------------------------------------------- 4. outcome
    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished, self._ignored = self._ignored, []
        if self.in_flight and self.in_flight[-1].stopped is None:
            self.in_flight[-1].stopped = outcome.stopped  # the model ran the step just scheduled
            self.in_flight[-1].decisions = outcome.drafts
            if self.connector is not None:  # its requests computed KV a send could carry
                self.connector.ran.update(t.request_id for t, *_ in self.in_flight[-1].entries)
        while len(self.in_flight) > self.depth:
            finished.extend(self._process(self.in_flight.popleft()))
        if self._continued:  # sessions that stopped with inputs to come do not finish (reference_impl.sessions)
            finished = [f for f in finished if f.request_id not in self._continued]
            self._continued = set()
        return finished

    def _process(self, step: InFlightStep) -> list[Finished]:
        """Apply one returned step: commit each request's sampled tokens, then stop, cap or go on.
        With a KV connector (6. below), the transfers the step's outcome reports come first."""
        if self.connector is not None:
            return self._kv_process(step)
        return self._process_outcome(step)

    def _process_outcome(self, step: InFlightStep) -> list[Finished]:
        finished = []
        stopped = step.stopped or frozenset()
        decisions = step.decisions or {}
        for tracked, tokens, position, drafts in step.entries:
            if tracked.status.is_finished:
                continue  # finished or aborted while the step was in flight: its output is dropped
            counters = self.counters[tracked.request_id]
            counters.num_in_flight -= tokens
            if tracked.request_id in step.dropped:  # fed a token that never came: nothing to apply
                counters.num_stale -= tokens
                counters.num_dropped -= tokens
                assert counters.num_stale >= 0, f"{tracked.request_id}: stale tokens below zero"
                continue
            stale = counters.num_stale > 0
            if stale:
                counters.num_stale -= tokens
                assert counters.num_stale >= 0, f"{tracked.request_id}: stale tokens below zero"
            if tracked.request.encoder_inputs:  # once the step ran, the outputs its tokens consumed are let go,
                # past the placeholders (vLLM's _free_encoder_inputs, scheduler.py:2387-2389, 2847-2855; it runs
                # after a step's draft rollback, which this count does not take off yet)
                self.encoder.release_consumed(tracked.request_id, tracked.request.encoder_inputs,
                                              tracked.num_computed - counters.num_placeholders)
            if position is None:
                continue  # a prefill chunk: nothing sampled
            # with drafts, earlier rejections shift it; so do vLLM's kept placeholders of a failed load
            if not self.config.num_speculative_tokens and not self.keeps_failed_load_placeholders:
                assert position == tracked.num_tokens, (
                    f"{tracked.request_id}: step {step.step} sampled position {position}, expected {tracked.num_tokens}")
            decision = decisions.get(tracked.seq_id, NO_DECISION)
            placeholders, in_prefill = tracked.num_proposed, tracked.in_prefill
            # A stale step ran before the preemption: its drafts are what the drafter had proposed
            # then (the preemption drops the proposal for the next admission, not for steps already run).
            valid = counters.num_stale_valid if stale else counters.num_valid_drafts
            # vLLM rolls rejected drafts back only from a positive count (scheduler.py:2361-2362), so
            # a kept step delivered over a failed load's cut to 0 keeps its rejected drafts counted
            rollback = not stale and not (self.keeps_failed_load_placeholders and tracked.num_computed <= 0)
            status = commit_tokens(tracked, drafts, decision, stopped, self.config, rollback=rollback,
                                   num_valid=valid if self.depth else None)
            if self.keeps_failed_load_placeholders:  # a cut request's kept step delivers, and it still recomputes
                tracked.in_prefill = in_prefill
            if stale:  # the proposal after a stale step feeds the next stale step only
                counters.num_stale_valid = tracked.num_proposed
            else:
                counters.num_valid_drafts = tracked.num_proposed
            if self.depth:
                tracked.num_proposed = placeholders  # the next step's drafts are already placeholders
            if not stale:
                counters.num_placeholders -= 1 + drafts  # the committed tokens and the rejected drafts
                counters.num_sampling -= 1
                assert counters.num_placeholders >= 0, f"{tracked.request_id}: placeholders below zero"
                if decision.empty and tracked.status is Status.RUNNING:
                    self._after_empty_outcome(tracked, counters, drafts)
            if not stale and tracked.status is Status.RUNNING:
                # the blocks whose KV every processed step has now written, even if it stops here
                # (scheduler.py:2402-2415: cached before the stop is handled)
                self._cache_full_blocks(tracked, self.frontier(tracked))
            if status is None:
                continue
            (self.running if tracked.status is Status.RUNNING else self.waiting).remove(tracked)
            self._finish(tracked, status)
            finished.append(finished_record(tracked, status, self.config))
        return finished

    # ---------------------------------------------------------------- 6. a KV connector
    def _kv_process(self, step: InFlightStep) -> list[Finished]:
        """A returned step with a KV connector (`reference_impl.kv_connector`, as vLLM's
        ``update_from_output`` orders it, scheduler.py:2279-2585): the transfers its outcome reports
        and the cuts of their failed blocks first; a request whose synchronous load failed skips
        the step's output (`_kv_skip_failed`); then the step's tokens; then, under ``fail``, the
        cut requests finish, and the reported transfers free or promote."""
        scheduled = {t.request_id: n for t, n, *_ in step.entries}
        reported, failed_async, failed_sync = self._kv_outcome_begin(step.step, scheduled)
        if failed_sync:
            step.entries = [e for e in step.entries if not self._kv_skip_failed(step, e, failed_sync)]
        finished = self._process_outcome(step)
        return finished + self._kv_outcome_end(reported, failed_async | failed_sync)

    # vLLM 0.33.0 keeps the output placeholders of a request whose synchronous load failed: the
    # failed step's output is skipped (scheduler.py:2324-2326) and the truncation resets only
    # ``num_computed_tokens`` (``_update_requests_with_invalid_blocks``, :3660-3661), so the
    # placeholders of the failed step and of its later in-flight steps stay counted in what the
    # request is scheduled next (``num_tokens + num_output_placeholders - num_computed_tokens``,
    # :839-843), and the later steps' tokens, computed over the failed KV, are delivered
    # (vllm-project/vllm#45138, #49250; fixes #45430, #45146, #49252 not merged). Off: the spec's
    # pipelined reference voids them (their tokens and placeholders leave the counts, their
    # outcomes are dropped), as after an empty outcome; on only to classify the divergence.
    keeps_failed_load_placeholders: bool = False

    def _kv_skip_failed(self, step: InFlightStep, entry: tuple[TrackedRequest, int, int | None, int],
                        failed: set[str]) -> bool:
        """Whether ``entry`` belongs to a request whose synchronous load failed (its computed tokens
        were cut at the failed block): its in-flight tokens are let go (vLLM drains them before the
        skip, scheduler.py:2316-2326), its output is not applied, and its recompute is a prefill."""
        tracked, tokens, position, drafts = entry
        if tracked.request_id not in failed or tracked.status.is_finished:
            return False
        counters = self.counters[tracked.request_id]
        counters.num_in_flight -= tokens
        if counters.num_stale:
            counters.num_stale -= tokens
            if tracked.request_id in step.dropped:
                counters.num_dropped -= tokens
            return True
        tracked.in_prefill = True
        if tracked.request_id in step.dropped:
            return True
        if self.keeps_failed_load_placeholders:
            if position is not None:  # the drafter ran on the failed step: its proposal is what the kept step verifies
                decision = (step.decisions or {}).get(tracked.seq_id, NO_DECISION)
                counters.num_valid_drafts = decision.num_proposed(self.config.num_speculative_tokens)
            return True
        if position is not None:
            counters.num_placeholders -= 1 + drafts
            counters.num_sampling -= 1
        # a request cut at its failed block has a count below its later steps' tokens; one that only
        # redoes its step (its failed block was another's to recompute) was set back by this step's tokens
        self._void_later_steps(tracked, counters, uncount=tracked.request_id in self._kv_reverted)
        return True

    def session_goes_on(self, tracked: TrackedRequest, status: Status) -> bool:
        """A streaming session whose turn stopped with inputs to come (`reference_impl.sessions`):
        its steps still in flight computed the stopped turn, so they are voided (their outcomes
        dropped, their tokens out of the computed count, their placeholders given back), as vLLM
        drops the turn's in-flight work and resumes from the materialized frontier
        (``_handle_stopped_request``, scheduler.py:2722-2730: ``drop_stale_output``)."""
        if not super().session_goes_on(tracked, status):
            return False
        self._void_later_steps(tracked, self.counters[tracked.request_id])
        return True

    def _after_empty_outcome(self, tracked: TrackedRequest, counters: InFlightCounters, drafts: int) -> None:
        """After an empty outcome (the step itself is already rolled back, ``drafts`` and its
        sample): the request's steps still in flight computed from a token that never came. Take
        their tokens out of the computed count and their placeholders back, and mark their
        outcomes for it dropped (stale until they return)."""
        self._void_later_steps(tracked, counters)
        tracked.num_proposed = 0  # nothing was sampled, so nothing was drafted
        counters.num_valid_drafts = 0
        tracked.in_prefill = tracked.num_computed == 0  # as `commit_tokens` labels the recompute

    def _void_later_steps(self, tracked: TrackedRequest, counters: InFlightCounters, *, uncount: bool = True) -> None:
        """Mark the request's outcomes in every step still in flight dropped, their tokens stale and
        their placeholders given back; with ``uncount``, their tokens also leave the computed count
        (after a failed load the count was already cut below them: ``uncount=False``)."""
        for later in self.in_flight:
            for entry_tracked, tokens, position, drafts in later.entries:
                if entry_tracked is not tracked or tracked.request_id in later.dropped:
                    continue
                later.dropped.add(tracked.request_id)
                if uncount:
                    tracked.num_computed -= tokens
                counters.num_stale += tokens
                counters.num_dropped += tokens
                if position is not None:
                    counters.num_placeholders -= 1 + drafts
                    counters.num_sampling -= 1

    # ---------------------------------------------------------------- observation
    def samples_of_last_step(self) -> dict[str, int]:
        """The sequences the step just scheduled samples for, with the position each samples:
        what a model would know, so that a test can decide stops by position."""
        if not self.in_flight or self.in_flight[-1].stopped is not None:
            return {}
        return {t.seq_id: p for t, _, p, _ in self.in_flight[-1].entries if p is not None}

    def frontier(self, tracked: TrackedRequest) -> int:
        """Tokens whose KV a processed step wrote (stale in-flight tokens are not in the computed
        count: a preempted request's is 0, a voided step's were taken out)."""
        counters = self.counters[tracked.request_id]
        return max(tracked.num_computed - (counters.num_in_flight - counters.num_stale), 0)

    def snapshot(self) -> Snapshot:
        views = {rid: _FrontierView(t, self.frontier(t)) for rid, t in self.requests.items()}
        snap = snapshot_of(self.config, views, self.waiting, self.running, self.pool,  # type: ignore[arg-type]
                           self._last_snapshot, extra=self._extra_parts())  # the encoder cache, the pause state
        kv = {} if self.connector is None else {"kv_transfers": self.connector.views(),
                                                "kv_reported": self.connector.reported_views()}
        self._last_snapshot = dataclasses.replace(snap, in_flight=self.in_flight_counters(), **kv)
        return self._last_snapshot

    def in_flight_counters(self) -> dict[str, InFlightView]:
        """Each unfinished sequence's in-flight counters, as the IN_FLIGHT snapshot part shows them."""
        return {t.seq_id: InFlightView(c.num_placeholders, c.num_in_flight, c.num_stale)
                for rid, t in self.requests.items() if not t.status.is_finished
                for c in (self.counters[rid],)}

    def metrics(self) -> dict[str, int]:
        return {**super().metrics(), "steps_in_flight": len(self.in_flight),
                "placeholders": sum(c.num_placeholders for c in self.counters.values())}


class DeferredFreeAsyncV1Scheduler(AsyncV1Scheduler):
    """`AsyncV1Scheduler` for an engine whose steps may write KV out of order (vLLM's
    ``defer_block_free``: a KV connector can load into a block a step still writes;
    vllm/v1/core/sched/scheduler.py:189-195). The blocks of a request preempted, aborted or
    finished while a step that scheduled it is in flight are held back (fenced) until that step's
    outcome is processed, then freed in the order they would have been
    (scheduler.py:3084-3093 ``_free_request_blocks``, 3106 ``_drain_deferred_frees``). It claims
    no ORDERED_STEPS, so PIP-004 holds it to the fence."""

    capabilities = AsyncV1Scheduler.capabilities - {Capability.ORDERED_STEPS}

    def __init__(self, config: SchedulerConfig, depth: int | None = None) -> None:
        super().__init__(config, depth)
        self.fenced: list[tuple[int, list[int]]] = []  # (the last in-flight step writing them, blocks) in free order

    def _free_blocks(self, tracked: TrackedRequest) -> None:
        fence = max((step.step for step in self.in_flight if any(t is tracked for t, *_ in step.entries)),
                    default=None)
        if fence is None or not tracked.blocks:
            super()._free_blocks(tracked)
            return
        self.fenced.append((fence, list(reversed(tracked.blocks))))  # tail first, as V1's free
        tracked.blocks = []
        tracked.num_keyed = 0

    def _process(self, step: InFlightStep) -> list[Finished]:
        # The step's writes are done: what it fenced goes back first, before the step's own frees
        # (vLLM drains at the top of ``update_from_output``, scheduler.py:2279-2282).
        due = [blocks for fence, blocks in self.fenced if fence <= step.step]
        self.fenced = [(fence, blocks) for fence, blocks in self.fenced if fence > step.step]
        for blocks in due:
            self.pool.release(blocks)
        return super()._process(step)

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        self._last_snapshot = dataclasses.replace(
            snap, gpu_fenced=tuple(b for _, blocks in self.fenced for b in blocks))
        return self._last_snapshot
