"""The V1 reference's streaming-input sessions (issue 32; spec/session.py, spec/invariants/sessions.py).

`SessionFlow` is a mixin of `reference_impl.v1_scheduler.V1Scheduler`; a request without later
inputs never reaches any of it. A session, in order (vLLM 0.33.0 v1/core/sched/scheduler.py):

1. It arrives and runs as any request (``add_request``, 2945-2948: a ``resumable`` request).
2. When its generation stops (a stop, its current ``max_tokens``) with inputs still to come, it does
   not finish (`session_goes_on`, from `_finish`; ``_handle_stopped_request``, 2717-2741). Its next
   input taken up at once if it has arrived, else it is WAITING_FOR_INPUT; either way it re-enters
   waiting keeping its KV, at the end of the KV-holding front of the queue (vLLM's
   ``kv_holding_waiting``, served before the rest: 1063-1068, 2709-2715).
3. Before each step's schedule(), a waiting session whose next input has arrived takes it up
   (`take_arrived_inputs`; vLLM's ``add_request`` of the update, 2931-2943): its last sampled token,
   never computed, is dropped for the input's tokens, and its ``max_tokens`` is the input's
   (``_update_request_as_session``, 1879-1921); the input's encoder inputs join the session's, moved
   to where its tokens land (1899-1905, `spec.session.taken_up_inputs`). Admitted again, it computes only what it lacks
   (``num_computed_tokens > 0``: no prefix-cache lookup, 1259-1268).
4. A session waiting for input holds a seat (``num_waiting_for_streaming_input``, 1070-1074) and is
   passed over (3549-3552).

Where this differs from vLLM 0.33.0 (SES-003, a spec decision): when admission stops at a request,
for seats or for blocks, while nothing runs and nothing was scheduled in the step, the other
sessions holding KV in waiting give it back (`evict_idle_sessions`): freed, their computed tokens
forgotten (they recompute once admitted), no longer holding a seat, at the back of waiting. vLLM keeps them, so the request
waits on a client's next input, and for good when the session that resumes queues behind it
(the lockstep campaign's class ``session-kv-held-deadlock``); two sessions that each took up an
input can hold what the other needs. ``evicts_idle_sessions = False`` is
vLLM's rule.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from spec.reasons import Reason
from spec.session import piece_tokens, taken_up_inputs
from spec.status import Status


class SessionFlow:
    """The session half of the V1 reference (module docstring). Its state: ``_sessions``, each
    session's next input (an index into ``Request.session``)."""

    evicts_idle_sessions: bool = True  # SES-003; False: vLLM 0.33.0 keeps an idle session's KV
    # vLLM 0.33.0 gives a session that takes up an input the input's arrival time (scheduler.py:1912,
    # ``session.arrival_time = update.arrival_time``), so under the priority policy it queues as a
    # request that arrived with the input. Off: a session keeps the arrival of its request (POL-001,
    # POL-003, POL-004 read it); on in the lockstep campaign's model `RenewsSessionArrival`.
    renews_arrival_on_input: bool = False
    # vLLM 0.33.0 admits from kv_holding_waiting under PAUSED_NEW ("Requests holding KV blocks are always
    # drained first, and are the only ones admitted under PAUSED_NEW", scheduler.py:1063-1066), so a
    # session that took up an input runs while the engine is paused for new work. Off: PAU-001, nothing
    # is admitted while paused; on in the lockstep campaign's model `AdmitsHeldSessionsWhilePaused`.
    admits_held_sessions_while_paused: bool = False

    def _init_sessions(self) -> None:
        self._sessions: dict[str, int] = {}  # session -> its next input's index
        self._session_changed: set[str] = set()  # changed in the waiting queue since the last snapshot
        self._input_arrivals: dict[str, list[int]] = {}  # renews_arrival_on_input: each arrived input's arrival

    def session_added(self, tracked) -> None:  # type: ignore[no-untyped-def]
        if tracked.request.session and not tracked.status.is_finished:
            self._sessions[tracked.request_id] = 0

    def _inputs_left(self, tracked) -> bool:  # type: ignore[no-untyped-def]
        index = self._sessions.get(tracked.request_id)
        return index is not None and index < len(tracked.request.session)

    def _next_arrived(self, tracked, step: int) -> bool:  # type: ignore[no-untyped-def]
        """Whether the session's next input has arrived before step ``step``'s schedule()."""
        return self._inputs_left(tracked) and tracked.request.session[self._sessions[tracked.request_id]].step <= step

    def take_arrived_inputs(self) -> None:
        """Step 3: each session waiting for input whose input has come takes it up."""
        if self.renews_arrival_on_input:  # the inputs arriving now, after this step's requests
            for rid in self._sessions:
                for piece in self.requests[rid].request.session:  # type: ignore[attr-defined]
                    if piece.step == self._step and not self.requests[rid].status.is_finished:  # type: ignore[attr-defined]
                        self._input_arrivals.setdefault(rid, []).append(self._arrivals)  # type: ignore[attr-defined]
                        self._arrivals += 1  # type: ignore[attr-defined]
        for rid in self._sessions:
            tracked = self.requests[rid]  # type: ignore[attr-defined]
            if tracked.status is Status.WAITING_FOR_INPUT and self._next_arrived(tracked, self._step):  # type: ignore[attr-defined]
                self._take_input(tracked)

    def _take_input(self, tracked) -> None:  # type: ignore[no-untyped-def]
        index = self._sessions[tracked.request_id]
        piece = tracked.request.session[index]
        del tracked.tokens[-1]  # the last sampled token: its KV was never computed
        encoder_inputs = tracked.request.encoder_inputs + taken_up_inputs(piece, tracked.num_tokens)
        tracked.tokens.extend(piece_tokens(index, piece.prompt_len))
        tracked.request = replace(tracked.request, prompt_len=tracked.num_tokens, max_tokens=piece.max_tokens,
                                  prompt_tokens=None, encoder_inputs=encoder_inputs)
        self._sessions[tracked.request_id] = index + 1
        if self.renews_arrival_on_input:
            tracked.arrival = self._input_arrivals[tracked.request_id][index]
        tracked.status = Status.WAITING
        self._session_changed.add(tracked.request_id)

    def session_goes_on(self, tracked, status: Status) -> bool:  # type: ignore[no-untyped-def]
        """Step 2, called by `_finish` for a request whose generation stopped: True if it is a
        session with inputs to come, now waiting for the next (or with it) instead of finished."""
        if status not in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH_CAPPED) or not self._inputs_left(tracked):
            return False
        tracked.num_proposed = 0
        tracked.status = Status.WAITING_FOR_INPUT
        if self._next_arrived(tracked, self._step - 1):  # type: ignore[attr-defined]  # it arrived before this step
            self._take_input(tracked)
        self._insert_holding(tracked)
        return True

    def _kv_prefix(self) -> int:
        """How many requests at the front of waiting are sessions holding KV (vLLM's kv_holding_waiting)."""
        n = 0
        for r in self.waiting:  # type: ignore[attr-defined]
            if not (r.blocks and r.request_id in self._sessions):
                break
            n += 1
        return n

    def _insert_holding(self, tracked) -> None:  # type: ignore[no-untyped-def]
        """Into waiting where vLLM's `_enqueue_waiting_request` puts it (scheduler.py:2709-2715): last
        in the KV-holding front while it holds KV (under priority, by policy order within it), else
        last of all (vLLM's plain waiting queue)."""
        start, end = 0, self._kv_prefix()  # the part of waiting it joins: the KV-holding front ...
        if not tracked.blocks:
            start, end = end, len(self.waiting)  # type: ignore[attr-defined]  # ... or the rest
        if self.config.policy == "priority":  # type: ignore[attr-defined]
            keys = [r.key("priority") for r in self.waiting[start:end]]  # type: ignore[attr-defined]
            end = start + bisect.bisect_right(keys, tracked.key("priority"))
        self.waiting.insert(end, tracked)  # type: ignore[attr-defined]

    def idle_seats(self) -> int:
        """Seats held by sessions waiting for input with their KV (vLLM: all of them)."""
        return sum(1 for rid in self._sessions if self.requests[rid].status is Status.WAITING_FOR_INPUT  # type: ignore[attr-defined]
                   and (self.requests[rid].blocks or not self.evicts_idle_sessions))  # type: ignore[attr-defined]

    def evict_idle_sessions(self, head, skipped: list, scheduled: dict, reasons: list) -> bool:  # type: ignore[no-untyped-def]
        """SES-003: with nothing running or scheduled, the sessions in waiting (or passed over in this
        step) that hold KV, but the one admission stopped at, free their KV and their seats so that
        it can run: the first WAITING request from ``head`` on. False if none was freed."""
        if not self.evicts_idle_sessions or self.running or scheduled or not self._sessions:  # type: ignore[attr-defined]
            return False
        ready = head if head.status is Status.WAITING else next(
            (r for r in self.waiting if r.status is Status.WAITING), None)  # type: ignore[attr-defined]
        if ready is None:
            return False
        holders = [r for r in (*skipped, *self.waiting) if r is not ready and r.blocks  # type: ignore[attr-defined]
                   and r.request_id in self._sessions]
        for tracked in holders:
            reasons.append(Reason.of("evicted_idle_session", tracked.request_id, blocks=len(tracked.blocks),
                                     needed_by=ready.request_id))
            self._free_blocks(tracked)  # type: ignore[attr-defined]
            tracked.num_computed = 0
            tracked.in_prefill = True
            (skipped if tracked in skipped else self.waiting).remove(tracked)  # type: ignore[attr-defined]
            self.waiting.append(tracked)  # type: ignore[attr-defined]  # a waiting request without KV
            self._session_changed.add(tracked.request_id)
        return bool(holders)
