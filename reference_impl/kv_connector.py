"""The V1 reference's KV connector: external KV loads, delayed frees (docs/CONNECTORS.md).

Two parts, kept apart as the engine keeps them apart:

* `ScriptedConnector` is the environment: a connector whose answers come from the trace's script
  (`spec.connector.ConnectorScript`). It records each transfer it starts (a load into a request's
  blocks, a finished request's send out of them) and reports each one done in the outcome of the
  step its script names. It is what the vLLM host's scripted ``KVConnectorBase_V1`` does too.
* `ConnectorFlow` is the scheduler's side, a mixin of `reference_impl.v1_scheduler.V1Scheduler`
  active only with ``config.kv_connector``; without it every method hands over to the plain flow.

The waiting pass with a connector (vLLM 0.33.0 ``Scheduler.schedule``, scheduler.py:1044-1610), in
order, while budget is left:

1. Requests that hold KV blocks in waiting (vLLM's ``kv_holding_waiting``: those that started an
   asynchronous load) are served before the rest; the waiting queue keeps them as its prefix.
2. A request whose load is in flight is skipped (it keeps its place; it is never scheduled). One
   whose load was reported done is promoted: its loaded blocks are cached up to its valid
   tokens, or, after a failure that left nothing valid, freed (``_update_waiting_for_remote_kv``).
3. A request with no computed tokens looks up the prefix cache, then asks the connector for the
   tokens past the hit (``get_num_new_matched_tokens``).
4. An asynchronous load allocates the hit and the blocks of the external tokens, nothing to
   compute, and waits (``WAITING_FOR_REMOTE_KV``): only if the whole sequence fits above the
   watermark and the load's blocks fit in what the other in-flight prefills have not reserved
   (``_inflight_prefill_reserved_blocks``, scheduler.py:1420-1430); its blocks are cached only
   when it lands.
5. Otherwise the request is admitted as in the plain flow, a synchronous load's tokens counted
   as computed (the load lands before the step's forward pass).

The outcome (``update_from_output``, scheduler.py:2259-2585): blocks a reported load failed to fill
truncate the computed tokens of their request at the first failed block (a running request that
loaded synchronously skips the step; vLLM ``_update_requests_with_invalid_blocks``); under the
``fail`` policy those requests finish as FINISHED_ERROR and the failed blocks leave the prefix
cache. Finished loads are marked done; a finished request's blocks go back to the pool when its
transfer is reported done (``_update_from_kv_xfer_finished``), not before.

Pipelined steps with a connector: `reference_impl.async_scheduler` (its step 6) calls the two
halves of the outcome (`_kv_outcome_begin`, `_kv_outcome_end`) around each returned step.

Where this differs from vLLM 0.33.0: no spec decode (the generators draw none with a connector),
a failed load's placeholders are voided under pipelining (vllm-project/vllm#45138), a priority
policy orders each of the two waiting segments by priority as vLLM's two heaps do; the connector's
own prefix-cache stats and events are not modelled.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, replace

from spec.connector import NO_SCRIPT, ConnectorScript, TransferView
from spec.observation import Capability
from spec.reasons import Reason
from spec.status import Status
from spec.types import Finished, StepOutcome


@dataclass
class Transfer:
    """One transfer the connector started: what it touches and the step whose outcome reports it."""

    request_id: str
    kind: str  # "load" or "send"
    blocks: tuple[int, ...]
    tokens: int  # a load: where its request's KV reaches once it lands
    load_async: bool
    failed: tuple[int, ...]  # of the blocks, those the load fails to fill
    due: int  # the step whose outcome reports it done

    def view(self) -> TransferView:
        return TransferView(self.kind, self.blocks, self.tokens, self.load_async, self.failed)


class ScriptedConnector:
    """A KV connector that answers from the trace's scripts (the environment, not the scheduler)."""

    def __init__(self) -> None:
        self.scripts: dict[str, ConnectorScript] = {}
        self.transfers: dict[str, Transfer] = {}  # in flight, by request, in the order started
        self.reported: dict[str, Transfer] = {}  # reported in the last outcome
        self.loaded: set[str] = set()  # requests whose first load was started (a later one never fails)
        self.ran: set[str] = set()  # requests ever scheduled: they computed KV a send or store could carry

    def script(self, request_id: str) -> ConnectorScript:
        return self.scripts.get(request_id, NO_SCRIPT)

    def matched(self, request_id: str, num_tokens: int, local_hit_tokens: int) -> tuple[int, bool]:
        """``get_num_new_matched_tokens``: (external tokens past the hit, whether the load is async)."""
        script = self.script(request_id)
        tokens = script.matched_tokens(num_tokens, local_hit_tokens)
        return tokens, bool(tokens) and script.load_async

    def start_load(self, request_id: str, table: list[int], first: int, tokens: int, load_async: bool,
                   step: int) -> None:
        """``update_state_after_alloc``: load into ``table[first:]``; the first load of a request
        fails on its script's ``failed_blocks`` (indices into the table)."""
        script = self.script(request_id)
        blocks = tuple(table[first:])
        failed = () if request_id in self.loaded else tuple(
            table[i] for i in script.failed_blocks if first <= i < len(table))
        self.loaded.add(request_id)
        due = step + script.load_steps - 1 if load_async else step
        self.transfers[request_id] = Transfer(request_id, "load", blocks, tokens, load_async, failed, due)

    def request_finished(self, request_id: str, table: list[int], next_step: int) -> bool:
        """``request_finished``: whether the finished request's blocks stay held for a send (or an
        offloading store) its script asks for; only a request that ran has KV of its own to send."""
        load = self.transfers.get(request_id)
        if load is not None and load.load_async:
            return True  # a load in flight still writes them (vLLM: finish_requests, delay_free_blocks)
        # (a synchronous load lands in its step's forward pass: with pipelined steps a request can
        # finish while that step is in flight, and the step's fence, not the connector, holds them)
        steps = self.script(request_id).send_steps
        if not steps or request_id not in self.ran or not table:
            return False
        self.transfers[request_id] = Transfer(request_id, "send", tuple(table), 0, False, (), next_step + steps - 1)
        return True

    def report(self, step: int) -> list[Transfer]:
        """The transfers step ``step``'s outcome reports done: loads first, then sends (vLLM reads
        ``finished_recving`` before ``finished_sending``), each in the order they started."""
        due = [t for t in self.transfers.values() if t.due <= step]
        due.sort(key=lambda t: t.kind != "load")
        for t in due:
            del self.transfers[t.request_id]
        self.reported = {t.request_id: t for t in due}
        return due

    def views(self) -> dict[str, TransferView]:
        return {rid: t.view() for rid, t in self.transfers.items()}

    def reported_views(self) -> dict[str, TransferView]:
        return {rid: t.view() for rid, t in self.reported.items()}


class ConnectorFlow:
    """The connector's side of `V1Scheduler` (see the module docstring). Mixed in before
    `TrackedScheduler`; every method is the plain flow's when ``self.connector`` is None."""

    connector: ScriptedConnector | None = None
    # vLLM 0.33.0 keeps the blocks a synchronous load failed to fill (and those after them) in the
    # prefix cache under the recompute policy, expecting their request to rewrite them
    # (``_handle_invalid_blocks``, scheduler.py:3759-3760). Off: the spec's reference drops their
    # keys (PFX-001: a cached block's key matches what it holds); on in lockstep against vLLM.
    keeps_failed_blocks_cached: bool = False
    # vLLM 0.33.0 lets a request that hit a failed block in the step its owner loaded it keep the
    # block as computed and only redo that step (scheduler.py:3644-3651, 3671-3680): it then attends
    # to the block's garbage while the owner's recompute is partway (KVC-011). Off: the spec's
    # reference cuts it back to that block too; it computes the same tokens beside the owner.
    sharers_keep_failed_blocks: bool = False
    # vLLM 0.33.0 keeps a request in ``_inflight_prefills`` from its first asynchronous load until it
    # is scheduled, so when a load that failed entirely is retried asynchronously, the request's own
    # remaining blocks count in the reservation its retry must fit beside (scheduler.py:1420-1430,
    # 3432-3436): with fewer than twice its blocks free it waits for ever. Off: the spec's reference
    # reserves for the other prefills only; on in lockstep against vLLM (a finding, docs/CONNECTORS.md).
    reserves_own_blocks: bool = False
    # With speculative decoding (k > 0) vLLM 0.33.0 counts one speculative step (1 + k tokens) more
    # in every in-flight prefill's remaining blocks (``_request_remaining_blocks``,
    # scheduler.py:3404-3421) and adds one for the asynchronous load itself to its reservation
    # (``_spec_decode_step_blocks``, :372-380, 1421-1431), a guard against load deadlocks. Off: the
    # spec's reference reserves the sequences alone (KVC-008 lets a design hold these back); on in
    # lockstep against vLLM.
    reserves_spec_steps: bool = False
    # vLLM 0.33.0's running loop chunks a running request by the budget left whatever
    # ``enable_chunked_prefill`` says (scheduler.py:838-847; only the waiting loop reads it,
    # :1337-1344), so a request a failed load set back to recompute, the one running request with
    # more than a decode left when chunked prefill is off, is prefilled in chunks that the config
    # rules out. Off: the spec's reference schedules such a recompute whole or not this step, as
    # the waiting loop does a prompt (BUD-004); on in lockstep against vLLM (a finding,
    # docs/CONNECTORS.md).
    chunks_recompute_without_chunked_prefill: bool = False

    def _init_connector(self) -> None:
        """Called by the scheduler's constructor: a connector only with ``config.kv_connector``."""
        self.connector = ScriptedConnector() if self.config.kv_connector else None  # type: ignore[attr-defined]
        if self.connector is not None:  # it shows the connector's record (Snapshot.kv_transfers)
            self.capabilities = type(self).capabilities | {Capability.KV_TRANSFERS}  # type: ignore[attr-defined]
        self._kv_queue: set[str] = set()  # vLLM's kv_holding_waiting: the front of waiting
        self._kv_landed: set[str] = set()  # loads reported done, not yet promoted
        self._kv_cut: dict[str, int] = {}  # loads in flight a failure elsewhere cut: their valid tokens
        self._kv_reverted: set[str] = set()  # the last outcome's: running requests that redo their step, uncut
        # vLLM's ``_inflight_prefills`` (scheduler.py:491-493): requests whose reservation gates an
        # asynchronous load. A request joins when it starts an asynchronous load (:1542) or is
        # admitted with a chunk that leaves prompt to compute (:1592-1593), and leaves when a
        # step schedules its last prompt chunk (:1869-1871), when preempted (:1820) or finished
        # (:3038). A running request cut back by a failed load does not join again.
        self._kv_inflight: set[str] = set()

    def _to_visit(self, base, waiting_ids=None):  # type: ignore[no-untyped-def]
        """Also the requests in the KV-holding front of waiting: a promoted request whose failed
        load left nothing valid gave its blocks back without leaving the queue."""
        visit = super()._to_visit(base, waiting_ids)  # type: ignore[misc]
        if visit is None or self.connector is None or not self._kv_queue:
            return visit
        return list({r.request_id: r for r in (*visit, *(self.requests[rid] for rid in sorted(self._kv_queue)))}.values())  # type: ignore[attr-defined]

    def snapshot(self):  # type: ignore[no-untyped-def]
        snap = super().snapshot()  # type: ignore[misc]
        if self.connector is None:
            return snap
        snap = replace(snap, kv_transfers=self.connector.views(), kv_reported=self.connector.reported_views())
        self._last_snapshot = snap
        return snap

    def kv_connector_scripts(self, scripts: Mapping[str, ConnectorScript]) -> None:
        """Take the trace's connector scripts (the engine loops call it before the first step)."""
        if self.connector is not None:
            self.connector.scripts = dict(scripts)

    # ------------------------------------------------------------------ the waiting queue
    def _kv_members(self) -> int:
        """How many requests at the front of waiting are vLLM's ``kv_holding_waiting``."""
        n = 0
        for r in self.waiting:  # type: ignore[attr-defined]
            if r.request_id not in self._kv_queue:
                break
            n += 1
        return n

    def _to_waiting(self, tracked, *, front: bool) -> None:  # type: ignore[no-untyped-def]
        if self.connector is None:
            return super()._to_waiting(tracked, front=front)  # type: ignore[misc]
        self._insert(tracked, self._kv_members(), len(self.waiting), front)  # type: ignore[attr-defined]

    def _insert(self, tracked, low: int, high: int, front: bool) -> None:  # type: ignore[no-untyped-def]
        """Insert into ``waiting[low:high]``: by policy key under priority, else at its front or end."""
        waiting = self.waiting  # type: ignore[attr-defined]
        if self.config.policy == "priority":  # type: ignore[attr-defined]
            keys = [r.key("priority") for r in waiting[low:high]]
            waiting.insert(low + bisect.bisect_right(keys, tracked.key("priority")), tracked)
        else:
            waiting.insert(low if front else high, tracked)

    def abort_request(self, request_id: str) -> Finished | None:
        done = super().abort_request(request_id)  # type: ignore[misc]
        if self.connector is not None and done is not None:
            self._kv_queue.discard(request_id)
        return done

    def _preempt(self, victim) -> None:  # type: ignore[no-untyped-def]
        if self.connector is not None:
            self._kv_inflight.discard(victim.request_id)
        super()._preempt(victim)  # type: ignore[misc]

    def _kv_after_schedule(self, scheduled: Mapping[str, int]) -> None:
        """The step is scheduled: a request whose chunk reaches its known tokens is no longer an
        in-flight prefill (vLLM ``_update_after_schedule``'s ``is_prefill_chunk``, :1862-1871)."""
        for rid, tokens in scheduled.items():
            tracked = self.requests[rid]  # type: ignore[attr-defined]
            if tracked.num_computed + tokens >= self._num_known(tracked):  # type: ignore[attr-defined]
                self._kv_inflight.discard(rid)

    def _finish(self, tracked, status: Status) -> None:  # type: ignore[no-untyped-def]
        """A finished request keeps its blocks while the connector holds them (a load in flight, a
        send); they go back when the connector reports the transfer done (`_kv_outcome`)."""
        if self.connector is not None:
            self._kv_queue.discard(tracked.request_id)
            self._kv_landed.discard(tracked.request_id)  # a finished request awaits no promotion
            self._kv_inflight.discard(tracked.request_id)
            if self.connector.request_finished(tracked.request_id, list(tracked.blocks), self._step):  # type: ignore[attr-defined]
                tracked.status = status
                return
        super()._finish(tracked, status)  # type: ignore[misc]

    # ------------------------------------------------------------------ admission
    def _kv_reserved_blocks(self, tracked) -> int:  # type: ignore[no-untyped-def]
        """Blocks the other in-flight prefills (`_kv_inflight`) still need for their whole sequence
        (vLLM ``_inflight_prefill_reserved_blocks``, scheduler.py:3432-3436). ``tracked`` itself is
        left out unless `reserves_own_blocks`."""
        config = self.config  # type: ignore[attr-defined]
        holders = [self.requests[rid] for rid in sorted(self._kv_inflight)  # type: ignore[attr-defined]
                   if rid != tracked.request_id or self.reserves_own_blocks]
        step = 1 + config.num_speculative_tokens if self.reserves_spec_steps and config.num_speculative_tokens else 0
        own = config.blocks_for(step) if step else 0  # the load's own speculative step (vLLM's guard)
        return own + sum(max(config.blocks_for(min(r.num_tokens, config.max_model_len) + step) - len(r.blocks), 0)
                         for r in holders)

    def _kv_promote(self, tracked) -> None:  # type: ignore[no-untyped-def]
        """A landed load: cache its valid blocks, or free them all when nothing is valid."""
        if tracked.num_computed:
            self._cache_full_blocks(tracked, tracked.num_computed)  # type: ignore[attr-defined]
        else:
            self._free_blocks(tracked)  # type: ignore[attr-defined]
            tracked.status = Status.WAITING

    def _kv_admit(self, budget: int, threshold: int, scheduled: dict[str, int], reasons: list[Reason],
                  ignored: list[str]) -> None:
        config, connector = self.config, self.connector  # type: ignore[attr-defined]
        assert connector is not None
        bs = config.block_size
        pos = 0
        waiting = self.waiting  # type: ignore[attr-defined]
        running_loop = tuple(self.requests[rid] for rid in scheduled)  # type: ignore[attr-defined]
        while budget > 0 and pos < len(waiting):
            tracked = waiting[pos]
            rid = tracked.request_id
            if self._ignore_if_infeasible(tracked, reasons, ignored):  # type: ignore[attr-defined]
                continue
            if self._kv_seats_taken() >= config.max_num_seqs:
                reasons.append(Reason.of("wait_seats", rid, running=self._kv_seats_taken(), limit=config.max_num_seqs))
                break
            if self._kv_load_pending(tracked):  # its load is in flight: skipped, keeps its place
                reasons.append(Reason.of("wait_remote_kv", rid))
                pos += 1
                continue
            if tracked.status is Status.WAITING_FOR_REMOTE_KV and rid in self._kv_landed:
                self._kv_landed.discard(rid)
                self._kv_promote(tracked)
            if tracked.num_computed == 0:
                hits = self._cache_hits(tracked)  # type: ignore[attr-defined]
                local = len(hits) * bs
                external, load_async = connector.matched(rid, tracked.num_tokens, local)
            else:
                hits, local, external, load_async = [], tracked.num_computed, 0, False
            if not self._kv_whole_sequence_fits(tracked, hits):
                reasons.append(Reason.of("wait_blocks", rid, blocks=self._kv_whole_need(tracked, hits),
                                         free=self.pool.num_free))  # type: ignore[attr-defined]
                break
            if load_async:
                if not self._kv_allocate(tracked, external, hits, reserved=self._kv_reserved_blocks(tracked), cache=False):
                    reasons.append(Reason.of("wait_blocks", rid, blocks=self._blocks_needed(tracked, external, hits),  # type: ignore[attr-defined]
                                             free=self.pool.num_free))  # type: ignore[attr-defined]
                    break
                connector.start_load(rid, list(tracked.blocks), len(hits), local + external, True, self._step)  # type: ignore[attr-defined]
                self._kv_inflight.add(rid)
                tracked.status = Status.WAITING_FOR_REMOTE_KV
                pos = self._kv_hold(tracked, pos)
                reasons.append(Reason.of("wait_remote_kv", rid))
                continue
            computed = local + external
            tokens = tracked.num_tokens - computed
            if 0 < threshold < tokens:
                tokens = threshold
            # with pads_new_decode_drafts vLLM's 1 + k for a one-token admission: the same waiting
            # loop pads a request whose load left one token (scheduler.py:1308-1330)
            padded = self._admission_tokens(tracked, tokens, computed, running_loop, budget)  # type: ignore[attr-defined]
            if padded is None:
                reasons.append(Reason.of("wait_token_budget", rid, tokens=tokens, left=budget))
                break
            remaining, tokens = tracked.num_tokens - computed, padded
            if not config.enable_chunked_prefill and tokens > budget:
                reasons.append(Reason.of("wait_token_budget", rid, tokens=tokens, left=budget))
                break
            tokens = min(tokens, budget)
            if not self._kv_allocate(tracked, external + tokens, hits, reserved=0):
                reasons.append(Reason.of("wait_blocks", rid, blocks=self._blocks_needed(tracked, tokens, hits),  # type: ignore[attr-defined]
                                         free=self.pool.num_free))  # type: ignore[attr-defined]
                break
            if external:  # a synchronous load: done before this step's forward pass
                connector.start_load(rid, list(tracked.blocks[: config.blocks_for(computed)]), len(hits), computed,
                                     False, self._step)  # type: ignore[attr-defined]
            tracked.num_computed = computed
            waiting.pop(pos)
            self._kv_queue.discard(rid)
            tracked.status = Status.RUNNING
            tracked.in_prefill = True
            self.running.append(tracked)  # type: ignore[attr-defined]
            scheduled[rid] = tokens
            budget -= tokens
            if computed + tokens < tracked.num_tokens:  # still prefilling after this chunk (vLLM :1592-1593)
                self._kv_inflight.add(rid)
            if tokens > remaining:  # padded with placeholder drafts (pads_new_decode_drafts)
                self._scheduled_drafts[rid] = tokens - remaining  # type: ignore[attr-defined]
                self._placeholder_drafts.add(rid)  # type: ignore[attr-defined]
            reasons.append(self._reason("prefill_chunk", tracked, tokens, cached=computed))  # type: ignore[attr-defined]

    def _kv_hold(self, tracked, pos: int) -> int:  # type: ignore[no-untyped-def]
        """A request that started an asynchronous load joins the KV-holding front of waiting (vLLM
        re-queues it in ``kv_holding_waiting``); returns where the pass goes on. One already there (a
        retried load) keeps its place, and the pass goes on with the next."""
        if tracked.request_id in self._kv_queue:
            return pos + 1
        self.waiting.pop(pos)  # type: ignore[attr-defined]
        self._kv_queue.add(tracked.request_id)
        self._insert(tracked, 0, self._kv_members(), front=False)
        return self._kv_members()

    def _kv_seats_taken(self) -> int:
        """Seats ``max_num_seqs`` counts: the running requests only (a loading one takes none)."""
        return len(self.running)  # type: ignore[attr-defined]

    def _kv_load_pending(self, tracked) -> bool:  # type: ignore[no-untyped-def]
        """Whether the request's load is still in flight (it is skipped, and keeps its place)."""
        return tracked.request_id in self.connector.transfers  # type: ignore[union-attr]

    def _kv_release(self, tracked) -> None:  # type: ignore[no-untyped-def]
        """A finished request's transfer was reported done: its blocks go back to the pool."""
        self._free_blocks(tracked)  # type: ignore[attr-defined]

    def _kv_whole_need(self, tracked, hits: list[int]) -> int:  # type: ignore[no-untyped-def]
        """Free blocks the whole sequence still needs: beyond its table and the hits, plus each
        hit on the free queue (``allocate_slots``' ``full_sequence_must_fit`` check)."""
        config, pool = self.config, self.pool  # type: ignore[attr-defined]
        full = config.blocks_for(min(tracked.num_tokens, config.max_model_len))
        return max(full - len(tracked.blocks) - len(hits), 0) + sum(1 for b in hits if pool.is_evictable(b))

    def _kv_whole_sequence_fits(self, tracked, hits: list[int]) -> bool:  # type: ignore[no-untyped-def]
        return self._kv_whole_need(tracked, hits) + self._admission_watermark() <= self.pool.num_free  # type: ignore[attr-defined]

    def _kv_allocate(self, tracked, tokens: int, hits: list[int], *, reserved: int,  # type: ignore[no-untyped-def]
                     cache: bool = True) -> bool:
        """Take the hits and the blocks ``tokens`` past them need, if they fit above the watermark
        in what ``reserved`` leaves, or nothing; with ``cache``, key the full blocks they complete
        (an asynchronous load's blocks are keyed when it lands: vLLM ``delay_cache_blocks``)."""
        pool = self.pool  # type: ignore[attr-defined]
        need = self._blocks_needed(tracked, tokens, hits)  # type: ignore[attr-defined]
        if need + self._admission_watermark() > pool.num_free - reserved:  # type: ignore[attr-defined]
            return False
        for block in hits:
            pool.touch(block)
        tracked.blocks.extend(hits)
        if hits:
            tracked.num_computed = len(hits) * self.config.block_size  # type: ignore[attr-defined]
            tracked.num_keyed = len(hits)
        fresh = self.config.blocks_for(tracked.num_computed + tokens) - len(tracked.blocks)  # type: ignore[attr-defined]
        tracked.blocks.extend(pool.allocate(max(fresh, 0)))
        if cache:
            self._cache_full_blocks(tracked, tracked.num_computed + tokens)  # type: ignore[attr-defined]
        return True

    def _kv_running_chunk(self, tracked, tokens: int, budget: int) -> int:  # type: ignore[no-untyped-def]
        """``tokens``, the running loop's chunk for ``tracked``; with chunked prefill off, 0 for a
        recompute it would cut short (`chunks_recompute_without_chunked_prefill`), unless the
        recompute could never fit a step's budget."""
        config = self.config  # type: ignore[attr-defined]
        if self.connector is None or config.enable_chunked_prefill or self.chunks_recompute_without_chunked_prefill \
                or not tracked.in_prefill:
            return tokens
        whole = self._running_chunk(tracked, config.max_num_batched_tokens, 0)  # type: ignore[attr-defined]
        return tokens if tokens >= whole or budget >= config.max_num_batched_tokens else 0

    # ------------------------------------------------------------------ outcome
    def _kv_begin_step(self) -> None:
        """schedule() starts: the last outcome's reports are no longer news."""
        assert self.connector is not None
        self.connector.reported = {}

    def update(self, outcome: StepOutcome) -> list[Finished]:
        if self.connector is None:
            return super().update(outcome)  # type: ignore[misc]
        step = self._step - 1  # type: ignore[attr-defined]
        self.connector.ran.update(r.request_id for r, _ in self._scheduled)  # type: ignore[attr-defined]
        # the step's tokens are not counted as computed yet (`apply_outcome` does it): nothing to take off
        reported, failed_async, failed_sync = self._kv_outcome_begin(step, {})
        if failed_sync:  # a request whose synchronous load failed skips the step's output
            self._scheduled = [(r, n) for r, n in self._scheduled if r.request_id not in failed_sync]  # type: ignore[attr-defined]
        finished = super().update(outcome)  # type: ignore[misc]
        return finished + self._kv_outcome_end(reported, failed_async | failed_sync)

    def _kv_outcome_begin(self, step: int, scheduled: Mapping[str, int]) -> tuple[list[Transfer], set[str], set[str]]:
        """The first half of a step's outcome with a connector, before its tokens are applied: the
        transfers step ``step``'s outcome reports, and the requests their failed blocks cut (those
        waiting for their KV, those running). ``scheduled``: the tokens of the step already counted
        as computed, by request (the pipelined flow counts them when it schedules; vLLM subtracts
        them, scheduler.py:3631-3633)."""
        assert self.connector is not None
        reported = self.connector.report(step)
        self._kv_reverted = set()
        invalid = {b for t in reported if t.kind == "load" for b in t.failed}
        failed_async = self._kv_truncate_async(reported, invalid)
        failed_sync, evict, shared = self._kv_truncate_running(invalid, scheduled) if invalid else (set(), set(), set())
        if not self.keeps_failed_blocks_cached:
            # The spec's rule also drops the blocks after a failed block in the table of a request
            # that shares it and only redoes its step: its step computed them over the failed KV.
            # vLLM 0.33.0 collects only the cut requests' blocks (scheduler.py:3669-3670).
            evict |= shared
        if failed_sync and (self.config.kv_load_failure_policy == "fail" or not self.keeps_failed_blocks_cached):  # type: ignore[attr-defined]
            # The failed blocks and every block after them leave the prefix cache: their KV is
            # garbage until recomputed (PFX-001). vLLM 0.33.0 evicts them under ``fail`` only and
            # keeps them findable under ``recompute`` (scheduler.py:3759-3760): the knob.
            for block in sorted(evict):
                self.pool.forget(block)  # type: ignore[attr-defined]
            for tracked in self.running:  # type: ignore[attr-defined]
                if tracked.request_id in failed_sync:
                    tracked.num_keyed = min(tracked.num_keyed, tracked.num_computed // self.config.block_size)  # type: ignore[attr-defined]
        return reported, failed_async, failed_sync

    def _kv_outcome_end(self, reported: list[Transfer], failed: set[str]) -> list[Finished]:
        """The second half, after the step's tokens are applied: under the ``fail`` policy the
        requests a failed load cut finish (FINISHED_ERROR), then a finished request whose transfer
        was reported gives its blocks back and a landed load waits for its promotion."""
        assert self.connector is not None
        finished: list[Finished] = []
        if self.config.kv_load_failure_policy == "fail":  # type: ignore[attr-defined]
            for rid in sorted(failed):
                finished += self._kv_fail(self.requests[rid])  # type: ignore[attr-defined]
        for t in reported:
            tracked = self.requests[t.request_id]  # type: ignore[attr-defined]
            if tracked.status.is_finished and t.request_id not in self.connector.transfers:  # (not now sending)
                self._kv_release(tracked)
            elif t.kind == "load" and t.load_async:
                self._kv_landed.add(t.request_id)
        return finished

    def _kv_truncate_async(self, reported: list[Transfer], invalid: set[int]) -> set[str]:
        """The requests waiting for their KV (vLLM's WAITING_FOR_REMOTE_KVS, not yet promoted): a
        load landing now counts its tokens as computed (or up to an earlier cut); then each is cut
        at its first failed block among the blocks its load reaches (vLLM
        ``_update_requests_with_invalid_blocks`` over ``kv_holding_waiting``: also a block it hit
        that another request's load failed to fill). A load still in flight keeps its cut for
        when it lands. The ones cut are returned."""
        connector, bs = self.connector, self.config.block_size  # type: ignore[attr-defined]
        assert connector is not None
        for t in reported:
            tracked = self.requests[t.request_id]  # type: ignore[attr-defined]
            if t.kind == "load" and t.load_async and tracked.status is Status.WAITING_FOR_REMOTE_KV:
                tracked.num_computed = min(t.tokens, self._kv_cut.pop(t.request_id, t.tokens))
        failed: set[str] = set()
        if not invalid:
            return failed
        landing = {t.request_id for t in reported if t.kind == "load" and t.load_async}
        marked: set[int] = set()
        for tracked in self.waiting:  # type: ignore[attr-defined]
            rid = tracked.request_id
            in_flight = connector.transfers.get(rid)
            if tracked.status is not Status.WAITING_FOR_REMOTE_KV or not (
                    in_flight is not None or rid in landing or rid in self._kv_landed):
                continue  # promoted already: vLLM's status is WAITING again, and no pass looks at it
            count = in_flight.tokens if in_flight is not None else tracked.num_computed
            cut = hit = False
            for index, block in enumerate(tracked.blocks[: self.config.blocks_for(count)]):  # type: ignore[attr-defined]
                if block not in invalid:
                    continue
                hit = True
                if block in marked:
                    continue
                marked.add(block)
                if cut:
                    continue
                cut = True
                if in_flight is not None:
                    self._kv_cut[rid] = index * bs
                else:
                    tracked.num_computed = index * bs
            if hit:
                failed.add(rid)
        return failed

    def _kv_truncate_running(self, invalid: set[int], scheduled: Mapping[str, int]) -> tuple[set[str], set[int], set[int]]:
        """vLLM ``_update_requests_with_invalid_blocks`` over the running requests: each is cut at
        its first failed block within its computed tokens. A block already cut for an earlier
        request: with `sharers_keep_failed_blocks` (vLLM) the later request keeps it as computed and
        redoes its step (its count goes back to what it was before the step, `_kv_reverted`); the
        spec cuts the later request at it too (KVC-011). Also returns the
        blocks from each cut on (what the ``fail`` policy evicts from the cache), and the blocks
        after the first failed block of each request that redoes its step (computed over it)."""
        bs = self.config.block_size  # type: ignore[attr-defined]
        affected: set[str] = set()
        marked: set[int] = set()
        evict: set[int] = set()
        shared: set[int] = set()
        for tracked in self.running:  # type: ignore[attr-defined]
            computed = tracked.num_computed - scheduled.get(tracked.request_id, 0)
            cut = False
            hit = False
            first = 0
            for index, block in enumerate(tracked.blocks[: self.config.blocks_for(computed)]):  # type: ignore[attr-defined]
                if block not in invalid:
                    continue
                if not hit:
                    shared.update(tracked.blocks[index + 1:])
                    first = index
                hit = True
                if block in marked:
                    continue
                marked.add(block)
                if cut:
                    continue
                cut = True
                tracked.num_computed = index * bs
                evict.update(tracked.blocks[index:])
            if hit:
                affected.add(tracked.request_id)
            if hit and not cut and self.sharers_keep_failed_blocks:  # vLLM: it redoes its step, the block
                tracked.num_computed = computed  # still counted (its count before the step)
                self._kv_reverted.add(tracked.request_id)
            elif hit and not cut:  # the spec: it is cut at the failed block too, and computes it beside its owner
                tracked.num_computed = first * bs
        return affected, evict, shared - evict

    def _kv_fail(self, tracked) -> list[Finished]:  # type: ignore[no-untyped-def]
        """Finish a request whose load failed under the ``fail`` policy."""
        if tracked.status.is_finished:
            return []
        queue = self.waiting if tracked.status.queue == "waiting" else self.running  # type: ignore[attr-defined]
        queue.remove(tracked)
        self._kv_landed.discard(tracked.request_id)
        self._finish(tracked, Status.FINISHED_ERROR)
        return [Finished(tracked.request_id, Status.FINISHED_ERROR, Reason.of("finished_error", tracked.request_id))]

    # ------------------------------------------------------------------ observation
    def kv_views(self) -> tuple[dict[str, TransferView], dict[str, TransferView]]:
        assert self.connector is not None
        return self.connector.views(), self.connector.reported_views()
