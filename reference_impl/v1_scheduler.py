"""The reference scheduler for vLLM V1's flow (vLLM 0.33.0 ``v1/core/sched/scheduler.py``).

V1 has no prefill phase and no decode phase: each request has tokens and computed tokens, and
every step hands out one token budget (``max_num_batched_tokens``) so that computed tokens catch
up. One call of `schedule()` is, in order:

1. Running requests, in running-queue order, while budget is left. Each gets
   ``min(uncomputed, budget)`` tokens, capped at ``long_prefill_token_threshold`` when that is set
   and more than one request is running or waiting. A decode is one token; a prompt (or a
   recompute) left unfinished continues as a chunk. If its blocks do not fit, the victim is
   preempted: the running tail under FCFS, the least urgent running request (largest
   ``(priority, arrival)``) under priority; a victim that was already scheduled in this step gives
   its tokens back. A request that has to preempt itself is not scheduled; under FCFS the loop
   ends there, under priority it goes on with the next.
2. Waiting requests, only if nothing was preempted in this step, while budget is left and fewer
   than ``max_num_seqs`` requests run. The head first looks up its prompt in the prefix cache
   (whole blocks, never the last token: at least one token is computed), then gets the rest of
   its tokens or, with chunked prefill, as many as the budget allows (without chunked prefill a
   head that does not fit the budget waits). Admission needs the blocks of the *whole* sequence
   to fit above the watermark (V1's ``scheduler_reserve_full_isl``), though only the chunk's are
   allocated; the first head that cannot be admitted stops admission (FCFS).

Preemption is recompute only: the victim frees its blocks, forgets its computed tokens (and its
prefix-cache hit), keeps every generated token, and re-enters waiting at the front (under
priority, in policy order). Admitted requests join the running tail.

`update()` advances each scheduled request's computed tokens by what it was given. A request
whose tokens are then all computed samples one token (the trace's stop decisions apply to it;
``max_tokens`` and ``max_model_len`` cap it); a request still mid-prefill samples nothing.

Speculative decoding (``num_speculative_tokens`` = k > 0; spec/speculative.py): after a step
that sampled for a request, the drafter proposes up to k drafts for it (the trace says how
many). The request's next decode is scheduled for its next token plus those drafts, as far as
the budget allows and never past what could be delivered (the bonus token after the last draft
must fit ``max_model_len`` and ``max_tokens``: `_draft_room`); drafts are part of its tokens, so
they take budget and KV slots like any other. A prefill chunk never carries drafts, and an
admitted request has none (its proposal was cleared by the preemption or never made). The
outcome accepts j drafts: the step commits j + 1 tokens, one at a time, and a stop or length
limit among them ends the stream there; the rejected drafts are rolled back from the computed
tokens (an outcome with no token at all rolls the whole step back to the last known token,
vllm-project/vllm#42722). Where this differs from vLLM 0.33.0: vLLM does not cap drafts at
``max_tokens`` (``scheduler.py:838-857``; `check_stop` trims the excess) and pads a new decode
from waiting to 1 + k tokens with placeholder drafts (``scheduler.py:1306-1330``). Both are
policies of the spec (SPD-004: no draft past what could be delivered; no draft nobody proposed),
and both are class-level knobs here, off by default (`drafts_past_max_tokens`,
`pads_new_decode_drafts`): the speculative lockstep campaign turns them on, so that it compares
vLLM strictly past them (conformance/selftest/campaigns/lockstep_specdec.py).

Streaming-input sessions (a request with later inputs, spec/session.py) are `SessionFlow`'s
(reference_impl/sessions.py): a session whose generation stops with inputs to come waits for the
next in the waiting queue, keeping its KV; without sessions none of it runs.

Where this reference decides differently from the engine (each a spec decision, listed in
docs/TODAY.md): prompts longer than the prompt limit and requests that could never fit the cache
are finished as ignored (the engine rejects the first before scheduling and refuses configs that
allow the second); the watermark applies to every admission (the engine skips it when nothing
runs: `EngineWatermarkV1` at the end of this file models the engine's rule, which lockstep against
vLLM uses); ``max_num_partial_prefills`` is honoured when set (V1 ignores it; 0, the default, is V1);
``n > 1`` is not modelled (V1 fans it out into separate requests before the scheduler).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import compress, filterfalse, islice, repeat
from operator import attrgetter, is_, is_not

from reference_impl.encoder_budget import EncoderCache, EncoderPlan
from reference_impl.kv_connector import ConnectorFlow
from reference_impl.prefix_cache import CachingBlockPool
from reference_impl.sessions import SessionFlow
from reference_impl.table_log import TableLog
from reference_impl.token_log import TokenLog
from spec import observation
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import ALL_CAPABILITIES, Capability, SeqView, Snapshot
from spec.prefix import block_keys
from spec.reasons import Reason
from spec.reservation import Reservation
from spec.speculative import NO_DECISION, DraftDecision, committed_tokens, stop_index
from spec.status import PreemptionMode, Status
from spec.types import (
    Finished,
    Preempted,
    Request,
    ScheduledSeq,
    SchedulerOutput,
    StepOutcome,
    generated_token,
    seq_id,
)

CAPABILITIES = ALL_CAPABILITIES | {Capability.PREFIX_CACHE, Capability.TOKEN_BUDGET_FLOW}


@dataclass
class TrackedRequest:
    """One request (one sequence: ``n == 1``) as the token-budget schedulers track it."""

    request: Request
    arrival: int
    tokens: list[int]
    status: Status = Status.WAITING
    num_computed: int = 0  # tokens whose KV is in the cache (prefix hits included)
    blocks: list[int] = field(default_factory=TableLog)  # a list that flags writes (reference_impl.table_log)
    num_keyed: int = 0  # leading blocks registered in the prefix cache
    in_prefill: bool = True  # no token sampled since (re)admission
    num_proposed: int = 0  # drafts the drafter proposed for its next decode (speculative decoding)
    # Formatted once, not per read: the step and the snapshot read it several times per request
    # (a property formatting the string was about a fifth of an unchecked step). The request id
    # is kept the same way: a property read was ~20 calls per request-step, 2-3 % of a checked
    # one. A session's next input replaces ``request`` with the same id (reference_impl/sessions.py).
    seq_id: str = field(init=False, repr=False, compare=False)
    request_id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.request_id = self.request.request_id
        self.seq_id = seq_id(self.request_id, 0)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.request.prompt_len

    def key(self, policy: str) -> tuple[int, ...]:
        if policy == "priority":
            return (self.request.priority, self.arrival)
        return (self.arrival,)


def check_single_sequence(request: Request) -> None:
    if request.n != 1:
        raise InputError(
            f"request {request.request_id!r}.n",
            f"must be 1 for this scheduler (vLLM V1 and nano-vllm fan n out into requests), got {request.n}",
        )


class TrackedScheduler:
    """What the V1 and nano-vllm references share: one `TrackedRequest` per request, a caching
    block pool (``free_order``: its eviction order), recompute-only preemption, the outcome step
    and the (delta) snapshot. The flows themselves, `schedule()`, are the subclasses'."""

    capabilities = CAPABILITIES
    free_order = "v1"

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.pool = CachingBlockPool(config.num_gpu_blocks, caching=config.enable_prefix_caching, order=self.free_order)
        self.waiting: list[TrackedRequest] = []
        self.running: list[TrackedRequest] = []
        self.requests: dict[str, TrackedRequest] = {}
        self.num_preemptions_total = 0
        self._step = 0
        self._arrivals = 0
        self._scheduled: list[tuple[TrackedRequest, int]] = []
        self._scheduled_drafts: dict[str, int] = {}  # of this step's tokens, the drafts, by request
        self._ignored: list[Finished] = []
        self._last_snapshot: Snapshot | None = None  # the base of the next snapshot's delta
        self._finished_holding: set[str] = set()  # finished requests seen holding blocks
        # Observation only: the waiting queue as last observed and its ids (`_waiting_ids`); the
        # sets of the last two snapshots' waiting ids (`_waiting_set`).
        self._observed_waiting: tuple[list[TrackedRequest], tuple[str, ...]] = ([], ())
        self._waiting_sets: dict[int, tuple[tuple[str, ...], frozenset[str]]] = {}

    # ---------------------------------------------------------------- client side
    def _track(self, request: Request) -> TrackedRequest:
        """Start tracking a new request (not yet queued)."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        check_single_sequence(request)
        tracked = TrackedRequest(request, self._arrivals, TokenLog(request.prompt_token_ids()))
        self._arrivals += 1
        self.requests[request.request_id] = tracked
        return tracked

    def abort_request(self, request_id: str) -> Finished | None:
        tracked = self.requests.get(request_id)
        if tracked is None or tracked.status.is_finished:
            return None
        (self.waiting if tracked.status.queue == "waiting" else self.running).remove(tracked)
        self._finish(tracked, Status.FINISHED_ABORTED)
        return Finished(request_id, Status.FINISHED_ABORTED, Reason.of("finished_aborted", request_id))

    def abort_requests(self, request_ids: Iterable[str]) -> list[Finished]:
        """One abort call naming many ids (vLLM's ``EngineCore.abort_requests`` ->
        ``Scheduler.finish_requests``): unknown and finished ids are skipped, the others aborted in
        the order given (spec/protocol.py)."""
        return [done for rid in request_ids if (done := self.abort_request(rid)) is not None]

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache if no block is in use (vLLM's ``Scheduler.reset_prefix_cache()``
        without ``reset_running_requests``); False, changing nothing, otherwise."""
        return self.pool.reset_cache()

    # ---------------------------------------------------------------- blocks and preemption
    def _free_blocks(self, tracked: TrackedRequest) -> None:
        self.pool.release(reversed(tracked.blocks))  # tail first: evicted first
        tracked.blocks = TableLog()
        tracked.num_keyed = 0

    def _preempt(self, victim: TrackedRequest) -> None:
        """Recompute: free every block, reset every derived counter, keep every token."""
        self._free_blocks(victim)
        victim.num_computed = 0
        victim.in_prefill = True
        victim.num_proposed = 0  # its drafts were for the decode it no longer runs (vLLM clears them too)
        victim.status = Status.WAITING
        self._to_waiting(victim, front=True)
        self.num_preemptions_total += 1

    def _to_waiting(self, tracked: TrackedRequest, *, front: bool) -> None:
        if self.config.policy == "priority":
            keys = [r.key("priority") for r in self.waiting]
            self.waiting.insert(bisect.bisect_right(keys, tracked.key("priority")), tracked)
        elif front:
            self.waiting.insert(0, tracked)
        else:
            self.waiting.append(tracked)

    # ---------------------------------------------------------------- outcome
    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished, self._ignored = self._ignored, []
        scheduled, self._scheduled = self._scheduled, []
        drafts, self._scheduled_drafts = self._scheduled_drafts, {}
        # With speculative decoding vLLM caches the blocks an outcome completes when it returns
        # (accepted drafts fill blocks; scheduler.py:2402-2415), before a stop frees them.
        cache = self._cache_computed_blocks if self.config.num_speculative_tokens else None
        return finished + apply_outcome(scheduled, outcome.stopped, self.config, self.running, self._finish,
                                        drafts, outcome.drafts, cache)

    def _cache_computed_blocks(self, tracked: TrackedRequest) -> None:
        """Key the full blocks of its computed tokens (a no-op in `TrackedScheduler`, which has no
        prefix-cache keys of its own to add; `V1Scheduler` keys them)."""

    def _finish(self, tracked: TrackedRequest, status: Status) -> None:
        self._free_blocks(tracked)
        tracked.status = status

    # ---------------------------------------------------------------- observation
    def snapshot(self) -> Snapshot:
        base = self._last_snapshot
        waiting_ids = self._waiting_ids()
        snap = snapshot_of(self.config, self.requests, self.waiting, self.running, self.pool, base,
                           self._to_visit(base, waiting_ids), self._extra_parts(), waiting_ids)
        if snap.changed_seqs is None:
            self._finished_holding = set()
        seqs = snap.seqs
        for sid in snap.seqs if snap.changed_seqs is None else snap.changed_seqs:
            view = seqs[sid]
            if view.status.is_finished and view.blocks:
                self._finished_holding.add(view.request_id)
            else:
                self._finished_holding.discard(view.request_id)
        self._last_snapshot = snap
        self._observed_waiting = (self._observed_waiting[0], snap.waiting)  # the tuple base.waiting will be
        return snap

    def _extra_parts(self) -> dict[str, object]:
        """Snapshot parts of a flow's own features (a `Snapshot` field name -> its value); none here."""
        return {}

    def _waiting_ids(self) -> tuple[str, ...]:
        """The waiting queue's request ids: the last snapshot's very tuple while the queue holds
        the same requests in the same order (compared by identity at C speed; between the
        snapshots after schedule() and after the step it always does), so that neither the
        snapshot nor `_to_visit` reads the backlog's ids again, and `_to_visit` knows at once
        that nothing entered or left it. Observation only."""
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

    def _to_visit(self, base: Snapshot | None, waiting_ids: tuple[str, ...] | None = None) -> list[TrackedRequest] | None:
        """The requests whose views may differ from ``base``'s (None: every request): the running
        ones, the ones that were running, entered or left the waiting queue, or were added since,
        and a waiting one that holds blocks or computed tokens or is not WAITING. A request that
        stayed waiting has no token to add and nothing to hold, so its view is base's; finished
        requests that were in no queue at ``base`` cannot change. Linear in the waiting queue
        with a small constant; the views built are only those of changed requests."""
        if base is None or base.waiting is None or base.running is None or base.statuses is None:
            return None
        requests, waiting = self.requests, self.waiting
        if waiting_ids is None:
            waiting_ids = tuple(map(_REQUEST_ID, waiting))
        same_queue = waiting_ids is base.waiting  # the same requests in the same order (`_waiting_ids`)
        visit = dict(zip(map(_REQUEST_ID, self.running), self.running, strict=True))  # the running ones, at C speed
        # The waiting queue is the backlog: each condition is read at C speed over it, in queue
        # order (the snapshot's view order follows, so reports do not depend on hash seeds).
        if not same_queue:
            for rid in filterfalse(self._waiting_set(base.waiting).__contains__, waiting_ids):
                visit[rid] = requests[rid]
        for r in (*compress(waiting, map(_BLOCKS, waiting)), *compress(waiting, map(_COMPUTED, waiting)),
                  *compress(waiting, map(is_not, map(_STATUS, waiting), repeat(Status.WAITING)))):
            visit[r.request_id] = r
        left = () if same_queue else filterfalse(self._waiting_set(waiting_ids).__contains__, base.waiting)
        for rid in (*base.running, *left, *sorted(self._finished_holding)):
            visit[rid] = requests[rid]  # left a queue since base, or finished holding blocks (a subclass may free late)
        for r in islice(requests.values(), len(base.statuses), None):  # added since (never removed)
            visit[r.request_id] = r
        return list(visit.values())

    def metrics(self) -> dict[str, int]:
        return {
            "num_running": len(self.running),
            "num_waiting": len(self.waiting),
            "num_preemptions_total": self.num_preemptions_total,
            "gpu_free_blocks": self.pool.num_free,
        }


class V1Scheduler(ConnectorFlow, SessionFlow, TrackedScheduler):
    """vLLM V1's scheduling flow, readable. Implements `spec.protocol.SchedulerLike`."""

    # It computes encoder inputs within the encoder budget and cache, and LoRA requests within
    # max_loras (reference_impl/encoder_budget.py; the hooks are the `_encoder_*` and `_lora_*` methods).
    # Streaming-input sessions: reference_impl/sessions.py.
    capabilities = CAPABILITIES | {Capability.ENCODER, Capability.LORA, Capability.PAUSE, Capability.GRAMMAR,
                                   Capability.STREAMING}

    # Under the priority policy, a running request that preempts itself (it is the lowest-priority
    # one) lets the scan go on to the requests after it, which may still fit: vLLM 0.33.0
    # (vllm/v1/core/sched/scheduler.py, "preempted itself ... may still fit"). A hook, so a variant
    # can model an engine whose scan stops there.
    scan_past_self_preemption: bool = True

    # vLLM 0.33.0's speculative-decoding behaviours where the spec's policy differs. Off by default
    # (the policy); on in the lockstep campaign's reference (conformance/selftest/campaigns/lockstep_specdec.py),
    # so that it compares vLLM past them and every remaining divergence is a finding.
    #
    # drafts_past_max_tokens: vLLM schedules a decode's drafts capped at the budget, the long-prefill
    # threshold and max_model_len only, not at max_tokens (vllm/v1/core/sched/scheduler.py:838-857,
    # `num_tokens_with_spec`); accepted tokens past max_tokens are trimmed when the outcome returns
    # (scheduler.py:2744-2770, `check_stop`). Off: SPD-004, no draft past what could be delivered.
    drafts_past_max_tokens: bool = False
    # pads_new_decode_drafts: vLLM pads a request admitted from waiting with one token left (a
    # prefix hit on all but its last token, or a preempted request resuming) to 1 + k tokens with
    # -1 placeholder drafts, for full CUDA graphs, when no running request was mid-prefill and some
    # ran or it had computed tokens, if 1 + k + 1 positions fit max_model_len; it does not admit the
    # request at all if 1 + k exceed the budget left (scheduler.py:1308-1330, 1578-1582). The
    # placeholders were never proposed and are never accepted. Off: an admission never has drafts.
    pads_new_decode_drafts: bool = False
    # clamps_chunk_at_max_model_len: vLLM caps every running chunk at `max_model_len -
    # num_computed_tokens - num_sampled_tokens_per_step` (scheduler.py:850-857, "Make sure the input
    # position does not exceed the max model len. This is necessary when using spec decoding"),
    # where the computed tokens count the in-flight steps' drafts as if accepted: with async
    # scheduling and drafts, a request whose in-flight drafts, all accepted, would reach
    # max_model_len is not scheduled, and if they are rejected it waits a step. (For max_tokens vLLM
    # waits only until the in-flight steps' sure tokens reach it, scheduler.py:800-815, as the
    # async reference does for both.) Without drafts and behind V1's door the cap never binds; on a
    # prompt of exactly max_model_len it is the clamp stall of pooling requests (vLLM #48039). Off:
    # the spec schedules what a rejection would still need.
    clamps_chunk_at_max_model_len: bool = False
    # lookahead_slots_with_eagle: with drafts (k > 0) and ``drop_eagle_block`` (an EAGLE/MTP drafter),
    # every allocation also takes slots for the k tokens past the scheduled ones that EAGLE's drafter
    # writes KV for (vLLM ``num_lookahead_tokens``, config/vllm.py:649-653, passed to allocate_slots
    # by the running loop and admission, v1/core/sched/scheduler.py:914-918 and 1403-1440; capped at
    # max_model_len, kv_cache_manager.py:551-553); the whole-sequence admission check counts none
    # (kv_cache_manager.py:531-548). Off: the spec's drafts take only their own slots.
    lookahead_slots_with_eagle: bool = False

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._last_output: SchedulerOutput | None = None
        self._placeholder_drafts: set[str] = set()  # this step's padded admissions (pads_new_decode_drafts)

        self._rejected: list[TrackedRequest] = []  # over max_model_len: refused on arrival
        self.encoder = EncoderCache(config.encoder_cache_size)
        self.pause_state = "unpaused"  # spec.observation.PAUSE_STATES (the pause calls set it)
        self._encoder_left = 0  # this step's encoder budget left
        self._encoder_computed: list[tuple[str, int]] = []  # this step's encoder inputs (request, index)
        self._init_connector()  # KV connector (reference_impl.kv_connector): only with config.kv_connector
        self._grammar_readied: set[str] = set()  # grammar waits ended since the last snapshot (`_to_visit`)
        self._init_sessions()  # streaming-input sessions (reference_impl.sessions): only requests with a session
        self._continued: set[str] = set()  # sessions whose generation stopped in this update and go on

    @property
    def reservation(self) -> Reservation | None:
        """With speculative decoding, the k draft slots past its tokens: allocated for the drafts
        and kept when they are rejected (vLLM frees no block on a rejection; CAP-006)."""
        k = self.config.num_speculative_tokens
        eagle = self._slot_tokens(0)  # EAGLE's lookahead slots too, with `lookahead_slots_with_eagle`
        return Reservation(lookahead_tokens=k + eagle) if k else None

    # ---------------------------------------------------------------- client side
    def add_request(self, request: Request) -> None:
        tracked = self._track(request)
        if request.prompt_len > self.config.max_model_len:
            # vLLM V1 rejects it before the scheduler (vllm/v1/engine/input_processor.py): it never
            # waits, is ignored in the next step's output, and an abort finds nothing to abort.
            tracked.status = Status.FINISHED_IGNORED
            self._rejected.append(tracked)
            return
        self._to_waiting(tracked, front=False)
        if request.grammar_ready_step is not None:  # vLLM v1/request.py:116-117
            tracked.status = Status.WAITING_FOR_GRAMMAR
        if request.session:
            self.session_added(tracked)

    def _long_prefill_threshold(self) -> int:
        """This step's cap on one request's chunk. vLLM V1 does not cap a request that is alone in
        the scheduler: there is no other request for it to starve (vllm/config/scheduler.py,
        ``long_prefill_token_threshold``). A hook, so a variant can model an engine that always caps."""
        return self.config.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0

    # ---------------------------------------------------------------- schedule
    def update(self, outcome: StepOutcome) -> list[Finished]:
        if self._placeholder_drafts:  # placeholder drafts are never accepted (pads_new_decode_drafts)
            decisions = dict(outcome.drafts)
            for rid in self._placeholder_drafts:
                sid = self.requests[rid].seq_id
                d = decisions.get(sid, NO_DECISION)
                decisions[sid] = DraftDecision(d.proposed, 0, d.stop_at, d.empty)
            outcome = StepOutcome(outcome.stopped, decisions)
        scheduled = [tracked for tracked, _ in self._scheduled if tracked.request.encoder_inputs]
        finished = super().update(outcome)
        if self._continued:  # sessions that stopped with inputs to come do not finish (reference_impl.sessions)
            finished = [f for f in finished if f.request_id not in self._continued]
            self._continued = set()
        for tracked in scheduled:  # inputs computed past are let go (finished ones by `_finish`)
            self.encoder.release_consumed(tracked.request_id, tracked.request.encoder_inputs, tracked.num_computed)
        return finished

    def schedule(self) -> SchedulerOutput:
        self._placeholder_drafts = set()
        self._encoder_left, self._encoder_computed = self.config.encoder_compute_budget, []
        if self.connector is not None:
            self._kv_begin_step()
        if self._sessions:
            self.take_arrived_inputs()
        budget = self.config.max_num_batched_tokens
        threshold = self._long_prefill_threshold()
        scheduled: dict[str, int] = {}
        preempted: list[TrackedRequest] = []
        reasons: list[Reason] = []
        ignored: list[str] = []
        for tracked in self._rejected:
            reasons.append(Reason.of("ignored_too_long", tracked.request_id, tokens=tracked.request.prompt_len,
                                     limit=self.config.max_model_len))
            ignored.append(tracked.request_id)
            self._ignored.append(Finished(tracked.request_id, Status.FINISHED_IGNORED, reasons[-1]))
        self._rejected = []

        # 1. running requests first (none while paused_all: vLLM scheduler.py:723)
        index = 0
        while index < len(self.running) and budget > 0 and self.pause_state != "paused_all":
            tracked = self.running[index]
            chunk = self._kv_running_chunk(tracked, self._running_chunk(tracked, budget, threshold), budget)
            tokens, plan = self._encoder_plan(tracked, tracked.num_computed, chunk)
            if tokens == 0:  # never here (a running request has a token left); a variant's cap may say 0
                index += 1
                continue
            fits = self._allocate(tracked, tokens, hits=[], watermark=False)
            stuck = False  # no victim whose preemption frees blocks now (`_preemption_frees`)
            while not fits:
                victim = self._victim()
                if not self._preemption_frees(victim):
                    stuck = True
                    break
                victim_index = self.running.index(victim)
                self.running.remove(victim)
                if victim_index < index:
                    index -= 1
                if victim.request_id in scheduled:  # priority: it gives its tokens back
                    budget += scheduled.pop(victim.request_id)
                    self._encoder_unschedule(victim)
                    self._scheduled_drafts.pop(victim.request_id, None)
                self._preempt(victim)
                preempted.append(victim)
                reasons.append(Reason.of(
                    "preempted_recompute", victim.request_id, needed_by=tracked.request_id,
                    need=self._blocks_needed(tracked, tokens), free=self.pool.num_free,
                ))
                if victim is tracked:
                    break
                fits = self._allocate(tracked, tokens, hits=[], watermark=False)
            if not fits:
                if self.config.policy == "priority" and self.scan_past_self_preemption and not stuck:
                    continue  # the victim was this request; the next ones may still fit
                break
            scheduled[tracked.request_id] = tokens
            self._encoder_commit(tracked, plan)
            budget -= tokens
            index += 1
            if tracked.num_proposed:  # its drafts are spent on this step, however many fitted
                drafts = tracked.num_computed + tokens - self._num_known(tracked)
                self._scheduled_drafts[tracked.request_id] = max(drafts, 0)
                tracked.num_proposed = 0
            kind = "prefill_chunk" if tracked.in_prefill else "decode"
            reasons.append(self._reason(kind, tracked, tokens, cached=0))

        # 2. then waiting requests, unless this step preempted or the engine is paused
        if preempted:
            if self.waiting:
                reasons.append(Reason.of("wait_running_first", self.waiting[0].request_id))
        elif self.pause_state == "unpaused":  # paused: requests added meanwhile wait for the resume
            self._admit(budget, threshold, scheduled, reasons, ignored)
        elif self.pause_state == "paused_new" and self.admits_held_sessions_while_paused and self._sessions:
            self._admit(budget, threshold, scheduled, reasons, ignored, held_only=True)

        output = SchedulerOutput(
            step=self._step,
            scheduled=tuple(
                ScheduledSeq(self.requests[rid].seq_id, rid, n, self.requests[rid].in_prefill,
                             self._scheduled_drafts.get(rid, 0))
                for rid, n in scheduled.items()
            ),
            preempted=tuple(Preempted(v.request_id, PreemptionMode.RECOMPUTE) for v in preempted),
            ignored=tuple(ignored),
            reasons=tuple(reasons),
            encoder_inputs=tuple(self._encoder_computed),
        )
        if self.connector is not None:
            self._kv_after_schedule(scheduled)
        self._scheduled = [(self.requests[rid], n) for rid, n in scheduled.items()]
        self._step += 1
        self._last_output = output
        return output

    def _preemption_frees(self, victim: TrackedRequest) -> bool:
        """Whether preempting ``victim`` gives its blocks back at once (else the request that needs
        blocks is not scheduled this step, and the running scan stops). Always, unless a variant that
        would only fence them (`reference_impl.kv_connector_scheduler.PipelinedConnectorScheduler`)."""
        return True

    def _running_chunk(self, tracked: TrackedRequest, budget: int, threshold: int) -> int:
        """The tokens a running request gets: the rest of its tokens, capped at the threshold and
        the budget left, and with `clamps_chunk_at_max_model_len` vLLM's cap at ``max_model_len -
        num_computed - 1``."""
        tokens = tracked.num_tokens + self._draft_room(tracked, tracked.num_tokens) - tracked.num_computed
        if 0 < threshold < tokens:
            tokens = threshold
        return self._max_model_len_clamp(tracked, min(tokens, budget))

    def _max_model_len_clamp(self, tracked: TrackedRequest, tokens: int) -> int:
        """With `clamps_chunk_at_max_model_len`, vLLM's cap of a running chunk at ``max_model_len -
        num_computed - 1`` (0: the request is skipped this step); otherwise ``tokens``."""
        if not self.clamps_chunk_at_max_model_len:
            return tokens
        return max(min(tokens, self.config.max_model_len - tracked.num_computed - 1), 0)

    def _num_known(self, tracked: TrackedRequest) -> int:
        """Its tokens, drafts not counted: what a scheduled chunk computes before its drafts begin
        (the async flow counts its in-flight placeholders too)."""
        return tracked.num_tokens

    def _draft_room(self, tracked: TrackedRequest, num_tokens: int) -> int:
        """Drafts a decoding request is scheduled with: its proposal, at most k, and no more than
        leave room for the bonus token within ``max_model_len`` and ``max_tokens`` (a draft past
        either could never be delivered). ``num_tokens``: its tokens once the steps in flight
        return (the async flow counts their placeholders)."""
        if not tracked.num_proposed:
            return 0
        room = min(tracked.num_proposed, self.config.num_speculative_tokens, self.config.max_model_len - num_tokens - 1)
        if not self.drafts_past_max_tokens:
            generated = num_tokens - tracked.request.prompt_len
            room = min(room, tracked.request.max_tokens - generated - 1)
        return max(room, 0)

    def _admit(
        self, budget: int, threshold: int, scheduled: dict[str, int], reasons: list[Reason], ignored: list[str],
        held_only: bool = False,
    ) -> None:
        """The waiting pass. ``held_only``: only the sessions holding their KV at the front of waiting
        (vLLM's kv_holding_waiting under PAUSED_NEW, `admits_held_sessions_while_paused`)."""
        if self.connector is not None:  # the waiting pass with a connector: reference_impl.kv_connector
            return self._kv_admit(budget, threshold, scheduled, reasons, ignored)
        config = self.config
        running_loop = tuple(self.requests[rid] for rid in scheduled)  # what the running loop scheduled
        skipped: list[TrackedRequest] = []  # passed over for this step only, back at the head after it
        loras = self._lora_slots_taken()
        while budget > 0 and self.waiting:
            tracked = self.waiting[0]
            if held_only and not (tracked.blocks and tracked.request_id in self._sessions):
                break
            if self._ignore_if_infeasible(tracked, reasons, ignored):
                continue
            seats = len(self.running) + (self.idle_seats() if self._sessions else 0)
            if seats >= config.max_num_seqs:
                if self._sessions and self.evict_idle_sessions(tracked, skipped, scheduled, reasons):
                    continue
                reasons.append(Reason.of("wait_seats", tracked.request_id, running=seats, limit=config.max_num_seqs))
                break
            if tracked.status is Status.WAITING_FOR_INPUT:  # a session waiting for its next input (SES-001)
                reasons.append(Reason.of("wait_input", tracked.request_id, blocks=len(tracked.blocks)))
                skipped.append(self.waiting.pop(0))
                continue
            if not self._grammar_ready(tracked):
                reasons.append(Reason.of("wait_grammar", tracked.request_id, ready=tracked.request.grammar_ready_step))
                skipped.append(self.waiting.pop(0))
                continue
            if not self._lora_fits(tracked, loras):
                reasons.append(Reason.of("wait_lora_slots", tracked.request_id, loras=len(loras), limit=config.max_loras))
                skipped.append(self.waiting.pop(0))
                continue
            hits = self._cache_hits(tracked)
            computed = tracked.num_computed + len(hits) * config.block_size  # a session's KV kept in waiting
            remaining = tracked.num_tokens - computed
            tokens = remaining
            if 0 < threshold < tokens:
                tokens = threshold
            padded = self._admission_tokens(tracked, tokens, computed, running_loop, budget)
            if padded is None:
                reasons.append(Reason.of("wait_token_budget", tracked.request_id, tokens=tokens, left=budget))
                break
            tokens = padded
            if not config.enable_chunked_prefill and tokens > budget:
                reasons.append(Reason.of("wait_token_budget", tracked.request_id, tokens=tokens, left=budget))
                break
            tokens = self._aligned_chunk(tracked, computed, min(tokens, budget))
            if tokens == 0:  # only a hybrid cache's alignment rounds a chunk to nothing (HybridV1Scheduler)
                reasons.append(Reason.of("wait_token_budget", tracked.request_id, tokens=0, left=budget))
                break
            limit = config.max_num_partial_prefills
            if limit and computed + tokens < tracked.num_tokens - 1:
                partial = sum(1 for r in self.running if self._mid_prefill_after(r, scheduled))
                if partial >= limit:
                    reasons.append(Reason.of("wait_partial_prefills", tracked.request_id, partial=partial, limit=limit))
                    break
            tokens, plan = self._encoder_plan(tracked, computed, tokens)
            if tokens == 0:  # its next encoder input fits neither the budget nor the cache: the next may
                reasons.append(Reason.of("wait_encoder", tracked.request_id, left=self._encoder_left,
                                         free=self.encoder.num_free))
                skipped.append(self.waiting.pop(0))
                continue
            if not self._whole_sequence_fits(tracked, hits):
                if self._sessions and self.evict_idle_sessions(tracked, skipped, scheduled, reasons):
                    continue
                need = self._blocks_needed(tracked, tracked.num_tokens - computed, hits, lookahead=False)
                if self._ignore_if_stuck(tracked, need, reasons, ignored):
                    continue
                reasons.append(Reason.of("wait_blocks", tracked.request_id, blocks=need, free=self.pool.num_free))
                break
            if not self._allocate(tracked, tokens, hits=hits, watermark=True):
                if self._sessions and self.evict_idle_sessions(tracked, skipped, scheduled, reasons):
                    continue
                need = self._blocks_needed(tracked, tokens, hits)
                reasons.append(Reason.of("wait_blocks", tracked.request_id, blocks=need, free=self.pool.num_free))
                break
            self.waiting.pop(0)
            tracked.status = Status.RUNNING
            tracked.in_prefill = True
            self.running.append(tracked)
            scheduled[tracked.request_id] = tokens
            self._encoder_commit(tracked, plan)
            if tracked.request.lora_id:
                loras.add(tracked.request.lora_id)
            budget -= tokens
            if tokens > remaining:  # padded with placeholder drafts (pads_new_decode_drafts)
                self._scheduled_drafts[tracked.request_id] = tokens - remaining
                self._placeholder_drafts.add(tracked.request_id)
            reasons.append(self._reason("prefill_chunk", tracked, tokens, cached=computed))
        self.waiting[0:0] = skipped  # vLLM: waiting.prepend_requests(step_skipped_waiting)

    # ---------------------------------------------------------------- encoder and LoRA (issue 32)
    def _encoder_plan(self, tracked: TrackedRequest, computed: int, tokens: int) -> tuple[int, EncoderPlan | None]:
        """The tokens a chunk from ``computed`` on may compute given its encoder inputs, and the plan
        to commit if it is scheduled (`EncoderCache.plan`); a text request's chunk is unchanged."""
        inputs = tracked.request.encoder_inputs
        if not inputs or not tokens:
            return tokens, None
        plan = self.encoder.plan(tracked.request_id, inputs, computed, tokens, self._encoder_left)
        return plan.tokens, plan

    def _encoder_commit(self, tracked: TrackedRequest, plan: EncoderPlan | None) -> None:
        if plan is None:
            return
        self.encoder.commit(tracked.request_id, tracked.request.encoder_inputs, plan)
        self._encoder_left -= plan.cost
        self._encoder_computed.extend((tracked.request_id, i) for i in plan.compute)

    def _encoder_unschedule(self, victim: TrackedRequest) -> None:
        """A victim scheduled earlier in this step gives its encoder work back (vLLM restores the
        budget, scheduler.py:955-968); its never-computed outputs leave the cache."""
        mine = [i for rid, i in self._encoder_computed if rid == victim.request_id]
        if not mine:
            return
        self._encoder_computed = [(rid, i) for rid, i in self._encoder_computed if rid != victim.request_id]
        for i in mine:
            item = victim.request.encoder_inputs[i]
            self._encoder_left += item.length
            self.encoder.forget(victim.request_id, item.content_hash)

    def _extra_parts(self) -> dict[str, object]:
        return {"encoder_cache": self.encoder.view(), "encoder_free": self.encoder.num_free,
                "pause_state": self.pause_state}

    # ---------------------------------------------------------------- pause (issue 32)
    def pause_new(self) -> bool:
        """Admit nothing from waiting until `resume` (vLLM PauseState.PAUSED_NEW)."""
        self.pause_state = "paused_new"
        return True

    def pause_all(self) -> bool:
        """Schedule nothing until `resume` (vLLM PauseState.PAUSED_ALL)."""
        self.pause_state = "paused_all"
        return True

    def resume(self) -> bool:
        self.pause_state = "unpaused"
        return True

    def _to_waiting(self, tracked: TrackedRequest, *, front: bool) -> None:
        """As the base class's, behind the sessions that hold their KV in waiting (vLLM serves its
        ``kv_holding_waiting`` first; reference_impl.sessions)."""
        low = self._kv_prefix() if self._sessions else 0
        if not low:
            return super()._to_waiting(tracked, front=front)
        head, self.waiting = self.waiting[:low], self.waiting[low:]
        try:
            super()._to_waiting(tracked, front=front)
        finally:
            self.waiting[0:0] = head

    def _grammar_ready(self, tracked: TrackedRequest) -> bool:
        """Whether a request may be admitted as far as its grammar goes; one whose grammar is ready
        becomes WAITING when the admission loop reaches it (vLLM _handle_blocked_waiting_request,
        scheduler.py:3535-3545), and until then it is passed over (skip_request, 1078-1081)."""
        if tracked.status is not Status.WAITING_FOR_GRAMMAR:
            return True
        if self._step < tracked.request.grammar_ready_step:
            return False
        tracked.status = Status.WAITING
        self._grammar_readied.add(tracked.request_id)
        return True

    def _to_visit(self, base: Snapshot | None, waiting_ids: tuple[str, ...] | None = None) -> list[TrackedRequest] | None:
        """As the base class's, and the waiting requests whose grammar wait ended since (their status
        changed, WAITING_FOR_GRAMMAR -> WAITING, while they stayed in the waiting queue)."""
        visit = super()._to_visit(base, waiting_ids)
        readied, self._grammar_readied = self._grammar_readied | self._session_changed, set()
        self._session_changed = set()
        if visit is None or not readied:
            return visit
        seen = {r.request_id for r in visit}
        return visit + [self.requests[rid] for rid in sorted(readied - seen)]

    def _lora_slots_taken(self) -> set[int]:
        """The adapters of every running request, scheduled in this step or not (vLLM's
        ``scheduled_loras``, scheduler.py:1040-1047)."""
        if not self.config.max_loras:
            return set()
        return {r.request.lora_id for r in self.running if r.request.lora_id}

    def _lora_fits(self, tracked: TrackedRequest, loras: set[int]) -> bool:
        """Whether admitting it keeps max_loras (vLLM skips the request otherwise, scheduler.py:1090-1102)."""
        lora = tracked.request.lora_id
        return not lora or lora in loras or len(loras) < self.config.max_loras

    def _preempt(self, victim: TrackedRequest) -> None:
        self.encoder.release(victim.request_id, victim.request.encoder_inputs)
        super()._preempt(victim)

    def _finish(self, tracked: TrackedRequest, status: Status) -> None:
        if self._sessions and self.session_goes_on(tracked, status):
            self._continued.add(tracked.request_id)
            return
        self.encoder.release(tracked.request_id, tracked.request.encoder_inputs)
        super()._finish(tracked, status)

    def _admission_tokens(self, tracked: TrackedRequest, tokens: int, computed: int,
                          running_loop: tuple[TrackedRequest, ...], budget: int) -> int | None:
        """The tokens an admitted request is scheduled for, before the budget (None: admission
        stops here): all it has left (``tokens``, after the threshold), or with
        `pads_new_decode_drafts` vLLM's 1 + k for a one-token admission (scheduler.py:1308-1330:
        no running request of this step mid-prefill, ``prefill_scheduled``; some scheduled by the
        running loop, ``scheduled_running_reqs``, or tokens computed; room for the sampled token)."""
        k = self.config.num_speculative_tokens
        if (not self.pads_new_decode_drafts or not k or tracked.num_tokens - computed != 1
                or any(r.in_prefill for r in running_loop) or not (running_loop or computed)
                or computed + 1 + k + 1 > self.config.max_model_len):
            return tokens
        return None if 1 + k > budget else 1 + k  # "Prefer to not schedule than schedule un-padded"

    def _ignore_if_infeasible(self, tracked: TrackedRequest, reasons: list[Reason], ignored: list[str]) -> bool:
        config = self.config
        if tracked.request.prompt_len > config.prompt_limit:
            reasons.append(Reason.of("ignored_too_long", tracked.request_id, tokens=tracked.request.prompt_len,
                                     limit=config.prompt_limit))
        elif self._blocks_for_whole(tracked) > self._never_fits_capacity():
            reasons.append(Reason.of("ignored_never_fits", tracked.request_id, blocks=self._blocks_for_whole(tracked),
                                     capacity=self._never_fits_capacity()))
        else:
            return False
        self._ignore(tracked, reasons[-1], ignored)
        return True

    def _ignore(self, tracked: TrackedRequest, reason: Reason, ignored: list[str]) -> None:
        """Finish a waiting request as FINISHED_IGNORED for ``reason``, reported in this step's output."""
        self.waiting.remove(tracked)
        self._finish(tracked, Status.FINISHED_IGNORED)
        ignored.append(tracked.request_id)
        self._ignored.append(Finished(tracked.request_id, Status.FINISHED_IGNORED, reason))

    def _ignore_if_stuck(self, tracked: TrackedRequest, need: int, reasons: list[Reason], ignored: list[str]) -> bool:
        """Ignore a head whose whole sequence needs ``need`` blocks, more than an idle engine will ever
        have above the watermark (LIV-003). Never here: one table's count is the same with a cache hit
        or without, and `_ignore_if_infeasible` has compared it already. A hybrid cache's is not
        (HybridV1Scheduler)."""
        return False

    def _blocks_for_whole(self, tracked: TrackedRequest) -> int:
        """The blocks a request's whole sequence ever holds at once (what never-fits compares with
        the capacity): one table of its tokens here; a hybrid cache adds its other groups'."""
        return self.config.blocks_for(tracked.num_tokens)

    def _aligned_chunk(self, tracked: TrackedRequest, computed: int, tokens: int) -> int:
        """The chunk an admitted request gets from ``computed`` tokens (its hit included): ``tokens``
        here; a hybrid cache with a Mamba "align" group ends it on a block boundary."""
        return tokens

    def _mid_prefill_after(self, tracked: TrackedRequest, scheduled: dict[str, int]) -> bool:
        """Whether a running request will still be mid-prefill after this step's chunk: more than
        its last token uncomputed (the spec's count for ``max_num_partial_prefills``)."""
        return tracked.num_computed + scheduled.get(tracked.request_id, 0) < tracked.num_tokens - 1

    # ---------------------------------------------------------------- blocks
    def _cache_hits(self, tracked: TrackedRequest) -> list[int]:
        """The longest run of cached full blocks at the start of the request's tokens, leaving
        at least its last token to compute (its logits are needed)."""
        if not self.config.enable_prefix_caching or tracked.num_computed:  # a session holding its KV looks up nothing
            return []
        hits = []
        for key in block_keys(tracked.tokens, self.config.block_size, limit=tracked.num_tokens - 1):
            block = self.pool.lookup(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def _slot_tokens(self, tokens: int) -> int:
        """The tokens an allocation up to ``tokens`` gives slots to: ``tokens``, plus EAGLE's k
        lookahead slots with `lookahead_slots_with_eagle`, capped at max_model_len."""
        k = self.config.num_speculative_tokens
        if not (self.lookahead_slots_with_eagle and k and self.config.drop_eagle_block):
            return tokens
        return min(tokens + k, self.config.max_model_len)

    def _blocks_needed(self, tracked: TrackedRequest, tokens: int, hits: list[int] = (),  # type: ignore[assignment]
                       lookahead: bool = True) -> int:
        """Free blocks that computing ``tokens`` more tokens takes: new blocks beyond the table
        and the hits, plus every hit that sits on the free queue (holding it takes it off).
        ``lookahead`` False: without EAGLE's lookahead slots (the whole-sequence check)."""
        computed = tracked.num_computed + len(hits) * self.config.block_size
        upto = self._slot_tokens(computed + tokens) if lookahead else computed + tokens
        fresh = max(self.config.blocks_for(upto) - len(tracked.blocks) - len(hits), 0)
        return fresh + sum(1 for b in hits if self.pool.is_evictable(b))

    def _whole_sequence_fits(self, tracked: TrackedRequest, hits: list[int]) -> bool:
        computed = tracked.num_computed + len(hits) * self.config.block_size
        need = self._blocks_needed(tracked, tracked.num_tokens - computed, hits, lookahead=False)
        return need + self._admission_watermark() <= self.pool.num_free

    def _admission_watermark(self) -> int:
        """Blocks an admission must leave free. The spec's rule: the watermark, for every admission
        (a documented decision; the torch twin and the Z3 encoding follow it). `EngineWatermarkV1`
        is vLLM V1's own rule."""
        return self.config.watermark_blocks

    def _never_fits_capacity(self) -> int:
        """The most blocks a request may ever need before it is ignored as never fitting."""
        return self.config.num_gpu_blocks - self.config.watermark_blocks

    def _allocate(self, tracked: TrackedRequest, tokens: int, *, hits: list[int], watermark: bool) -> bool:
        """vLLM V1's ``allocate_slots``: take the hits and the new blocks that ``tokens`` more
        tokens need, or nothing; then cache the full blocks those tokens complete."""
        need = self._blocks_needed(tracked, tokens, hits)
        if need + (self._admission_watermark() if watermark else 0) > self.pool.num_free:
            return False
        for block in hits:
            self.pool.touch(block)
        tracked.blocks.extend(hits)
        if hits:
            tracked.num_computed = len(hits) * self.config.block_size
            tracked.num_keyed = len(hits)
        fresh = self.config.blocks_for(self._slot_tokens(tracked.num_computed + tokens)) - len(tracked.blocks)
        tracked.blocks.extend(self.pool.allocate(max(fresh, 0)))
        self._cache_full_blocks(tracked, tracked.num_computed + tokens)
        return True

    def _cache_computed_blocks(self, tracked: TrackedRequest) -> None:
        self._cache_full_blocks(tracked, tracked.num_computed)

    def _cache_full_blocks(self, tracked: TrackedRequest, upto: int) -> None:
        if not self.config.enable_prefix_caching:
            return
        keys = block_keys(tracked.tokens, self.config.block_size, limit=upto)
        for index in range(tracked.num_keyed, len(keys)):
            self.pool.register(tracked.blocks[index], keys[index])
        tracked.num_keyed = max(tracked.num_keyed, len(keys))

    # ---------------------------------------------------------------- preemption
    def _victim(self) -> TrackedRequest:
        if self.config.policy == "priority":
            return max(self.running, key=lambda r: r.key("priority"))
        return self.running[-1]

    def _reason(self, kind: str, tracked: TrackedRequest, tokens: int, cached: int) -> Reason:
        if kind == "decode":
            return Reason.of("decode", tracked.request_id, tokens=tokens, new_blocks=0, copies=0)
        return Reason.of(kind, tracked.request_id, tokens=tokens,
                         remaining=tracked.num_tokens - tracked.num_computed, cached=cached)

    def metrics(self) -> dict[str, int]:
        return {**super().metrics(), "cached_blocks": sum(1 for k in self.pool.keys if k is not None)}


_NONE: Mapping[str, int] = {}
_NO_DECISIONS: Mapping[str, DraftDecision] = {}

# A queue's ids read at C speed (the waiting queue is the size of the backlog, every snapshot).
_REQUEST_ID = attrgetter("request_id")
_BLOCKS, _COMPUTED, _STATUS = attrgetter("blocks"), attrgetter("num_computed"), attrgetter("status")


def snapshot_of(
    config: SchedulerConfig,
    requests: dict[str, TrackedRequest],
    waiting: list[TrackedRequest],
    running: list[TrackedRequest],
    pool: CachingBlockPool,
    base: Snapshot | None = None,
    visit: Iterable[TrackedRequest] | None = None,
    extra: Mapping[str, object] | None = None,
    waiting_ids: tuple[str, ...] | None = None,
) -> Snapshot:
    """The snapshot of a token-budget scheduler (no swap space: the CPU pool stays empty), built
    as a delta on ``base`` (the scheduler's previous snapshot) when given: a request's view is
    rebuilt only when a field of it changed (its tokens only ever grow), every unchanged part is
    base's own object, and `Snapshot.changed_seqs` / `changed_requests` name what was rebuilt.
    ``visit``: the requests that may have changed since ``base`` (default: every request); ``extra``:
    further Snapshot parts by field name (the encoder cache, the pause state), each base's own object
    when equal; ``waiting_ids``: the waiting queue's ids when the caller has them."""
    if not observation.INCREMENTAL:
        base = None
    old_seqs = base.seqs if base is not None and base.seqs is not None else {}
    fresh: dict[str, SeqView] = {}
    kept_tokens: dict[str, int] = {}  # of the fresh views: leading token ids that are the old view's
    changed_status: dict[str, Status] = {}
    for r in requests.values() if visit is None or base is None else visit:
        old = old_seqs.get(r.seq_id)
        table = r.blocks
        if type(table) is TableLog and not table.written and old is not None and old.blocks is not None \
                and len(old.blocks) == len(table):
            blocks = old.blocks  # neither written nor grown since read into old's view (reference_impl.table_log)
        else:
            blocks = tuple(table[:])  # an exact list's copy is C speed (a TableLog's is not)
            if type(table) is TableLog:
                table.written = False
            if old is not None and old.blocks == blocks:
                blocks = old.blocks  # keep the object: an unchanged table is the same table (checks skip it)
        tokens, num_tokens = r.tokens, len(r.tokens)
        kept = None  # leading tokens unchanged since this list was last read (None: not logged, compare)
        if type(tokens) is TokenLog:  # `TokenLog.observed`, inline
            kept, tokens.low = min(tokens.low, num_tokens), num_tokens
        old_tokens = old.token_ids if old is not None else None
        if (old is None or old.status is not r.status or old.num_computed != r.num_computed
                or old.num_tokens != num_tokens or old.blocks is not blocks
                or (kept is not None and old_tokens is not None and kept < len(old_tokens))):
            if kept is not None and old_tokens is not None and kept >= len(old_tokens):
                kept_tokens[r.seq_id] = len(old_tokens)
                # The old tuple and the new tokens: the same tuple when none was added.
                grown = num_tokens - len(old_tokens)
                token_ids = old_tokens if not grown else old_tokens + (tokens[-1],) if grown == 1 \
                    else old_tokens + tuple(tokens[len(old_tokens):])
            else:
                if kept is not None and old_tokens is not None:
                    kept_tokens[r.seq_id] = kept
                token_ids = tuple(tokens[:])  # an exact list's copy is C speed (a TokenLog's is not)
            fresh[r.seq_id] = SeqView(r.seq_id, r.request_id, r.status, num_tokens, r.num_computed, blocks,
                                      "gpu" if blocks else None, token_ids)
    if base is None:
        seqs = fresh
        statuses = {rid: r.status for rid, r in requests.items()}
    else:
        seqs = {**old_seqs, **fresh} if fresh else old_seqs
        changed_status = {v.request_id: v.status for v in fresh.values()
                          if base.statuses is None or base.statuses.get(v.request_id) is not v.status}
        statuses = {**base.statuses, **changed_status} if changed_status or base.statuses is None else base.statuses
    prior = base if base is not None else Snapshot()
    changes = pool.changed_blocks()  # taken every snapshot, so that it is always since the last one

    def same(new: object, old: object) -> object:
        return old if new is old or (old is not None and old == new) else new

    def same_counts(new: tuple[int, ...], old: tuple[int, ...] | None) -> tuple[int, ...]:
        """Reference counts: old's tuple when they agree at every block the pool's log names (it
        names every write, reference_impl/pool_log.py), read there only, not along the pool."""
        if changes is None or old is None or new is old or len(new) != len(old):
            return same(new, old)  # type: ignore[return-value]
        return old if all(new[b] == old[b] for b in changes) else new

    return Snapshot(
        statuses=statuses,
        seqs=seqs,
        waiting=same(tuple(map(_REQUEST_ID, waiting)) if waiting_ids is None else waiting_ids, prior.waiting),
        running=same(tuple(map(_REQUEST_ID, running)), prior.running),
        swapped=(),
        gpu_ref_counts=same_counts(pool.observed("ref_counts"), prior.gpu_ref_counts),  # type: ignore[arg-type]
        cpu_ref_counts=same((0,) * config.num_cpu_blocks, prior.cpu_ref_counts),
        gpu_free=pool.num_free,
        cpu_free=config.num_cpu_blocks,
        gpu_free_ids=same(pool.observed("free_ids"), prior.gpu_free_ids),
        cpu_free_ids=same(tuple(range(config.num_cpu_blocks)), prior.cpu_free_ids),
        gpu_block_keys=same(pool.observed("keys"), prior.gpu_block_keys),
        cache_index=same(pool.observed("cache_index"), prior.cache_index),
        **{name: same(value, getattr(prior, name)) for name, value in (extra or {}).items()},
        base=base,
        changed_seqs=frozenset(fresh) if base is not None else None,
        changed_requests=frozenset(changed_status) if base is not None else None,
        gpu_block_changes=changes if base is not None else None,
        cpu_block_changes={} if base is not None else None,  # no CPU pool: nothing ever changes there
        kept_tokens=kept_tokens if base is not None else None,
    )


def apply_outcome(
    scheduled: list[tuple[TrackedRequest, int]],
    stopped: frozenset[str],
    config: SchedulerConfig,
    running: list[TrackedRequest],
    finish: Callable[[TrackedRequest, Status], None],
    drafts: Mapping[str, int] = _NONE,
    decisions: Mapping[str, DraftDecision] = _NO_DECISIONS,
    on_commit: Callable[[TrackedRequest], None] | None = None,
) -> list[Finished]:
    """Feed one step's outcome back (shared by the V1 and nano-vllm flows): advance each scheduled
    request's computed tokens; one whose prompt is complete commits its sampled tokens (one, or
    with ``drafts`` the accepted drafts and the bonus: `commit_tokens`), then stops when the
    environment says so, at ``max_tokens``, or at ``max_model_len`` tokens (leaving ``running``
    through ``finish``). ``decisions``: the trace's speculative decisions by sequence;
    ``on_commit``: called for each request that committed tokens, before it may finish."""
    finished = []
    for tracked, tokens in scheduled:
        if tracked.status is not Status.RUNNING:
            continue
        tracked.num_computed += tokens
        if tracked.num_computed < tracked.num_tokens:
            continue  # mid-prefill: nothing sampled
        decision = decisions.get(tracked.seq_id, NO_DECISION)
        status = commit_tokens(tracked, drafts.get(tracked.request_id, 0), decision, stopped, config)
        if on_commit is not None and not decision.empty:
            on_commit(tracked)
        if status is None:
            continue
        running.remove(tracked)
        finish(tracked, status)
        finished.append(finished_record(tracked, status, config))
    return finished


def commit_tokens(tracked: TrackedRequest, num_drafts: int, decision: DraftDecision, stopped: frozenset[str],
                  config: SchedulerConfig, *, rollback: bool = True, num_valid: int | None = None) -> Status | None:
    """One verifying step's outcome for a request whose tokens the step computed (``num_drafts`` of
    them drafts; ``num_valid`` of those real proposals, the rest placeholders): roll the rejected
    drafts back from its computed tokens (all of the step, back to its last known token, when the
    model returned nothing), then append the committed tokens one at a time; a stop or a length
    limit among them ends the stream there (vLLM ``_update_request_with_output``,
    scheduler.py:2744-2770). Returns the finished status, or None. ``rollback=False``: the counters
    belong to a later admission (the async flow's stale steps); the tokens are still delivered."""
    committed = committed_tokens(decision, num_drafts, num_valid)
    if rollback:
        tracked.num_computed -= num_drafts - (committed - 1) if committed else num_drafts + 1
    if not committed:  # it recomputes its last token to sample it: a decode, unless nothing is left computed
        tracked.in_prefill = tracked.num_computed == 0
    for index in range(committed):
        tracked.tokens.append(generated_token(tracked.request_id, 0, tracked.num_tokens))
        tracked.in_prefill = False
        if tracked.seq_id in stopped and index == stop_index(decision, committed):
            status = Status.FINISHED_STOPPED
        elif tracked.num_generated >= tracked.request.max_tokens or tracked.num_tokens >= config.max_model_len:
            status = Status.FINISHED_LENGTH_CAPPED
        else:
            continue
        if rollback:  # computed tokens cover every token but the last, after the trim too
            tracked.num_computed -= committed - 1 - index
        return status
    if committed:  # the drafter proposes for its next decode
        tracked.num_proposed = decision.num_proposed(config.num_speculative_tokens)
    return None


def finished_record(tracked: TrackedRequest, status: Status, config: SchedulerConfig) -> Finished:
    kind = "finished_length_capped" if status is Status.FINISHED_LENGTH_CAPPED else "finished_stopped"
    return Finished(tracked.request_id, status, Reason.of(kind, tracked.request_id, max_tokens=tracked.request.max_tokens,
                                                          max_model_len=config.max_model_len))


class EngineWatermarkV1(V1Scheduler):
    """The V1 reference with vLLM 0.33.0's own watermark rule, for lockstep against the engine
    (`conformance.selftest.campaigns.lockstep_v1`): ``KVCacheManager.allocate_slots`` adds ``watermark_blocks``
    only for a WAITING or PREEMPTED request, and only when ``has_scheduled_reqs``
    (v1/core/kv_cache_manager.py:518-525; the whole-sequence check at 546 and the allocation at 585
    both use it), which the scheduler passes as ``bool(self.running)`` when it admits a waiting
    request (v1/core/sched/scheduler.py:1435-1452); the running loop's allocate_slots (914-918)
    leaves it at its default (True), but a running request is RUNNING, so it never pays it (as here). So the first admission into an empty
    running set ignores the watermark, and no request is ever refused for the watermark alone (V1
    has no never-fits ignore: it checks at start-up that max_model_len fits the cache). ADM-002
    does not hold for this rule; ADM-004 states it."""

    def _admission_watermark(self) -> int:
        return self.config.watermark_blocks if self.running else 0

    def _never_fits_capacity(self) -> int:
        return self.config.num_gpu_blocks
