"""Streaming-input sessions (issue 32): a request whose prompt arrives in pieces (spec/session.py).

A session whose generation so far is done waits for its next input (Status.WAITING_FOR_INPUT) in
the waiting queue; vLLM 0.33.0 keeps its KV blocks meanwhile (WAITING_FOR_STREAMING_REQ, in
``kv_holding_waiting``, scheduler.py:2704-2741) and passes over it (``_handle_blocked_waiting_request``,
3549-3552). Three rules: it is not scheduled while it waits, and waits only while an input is to come
(SES-001); it never holds tokens of an input that has not arrived (SES-002); and the KV it holds
while the engine has nothing else to run never keeps a request that could run from running (SES-003).

Who else reads `awaits_input`: LIV-001 and LIV-003 do not count a session waiting for its input as
work left undone, and POL-001 lets the requests behind it overtake it; POL-004 lets a session that
holds its KV in waiting stand ahead of a recompute victim (vLLM serves ``kv_holding_waiting`` first).
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.rules import STEP, CheckContext, invariant
from spec.status import Status
from spec.types import seq_id


def awaits_input(snap: Snapshot, request_id: str) -> bool:
    """Whether the snapshot shows the request waiting for its next input."""
    return (snap.statuses or {}).get(request_id) is Status.WAITING_FOR_INPUT


def passed_over_for_input(ctx: CheckContext, rec: StepRecord, request_id: str) -> bool:
    """Whether the step may pass over the request because it waits for its next input: it is
    WAITING_FOR_INPUT before the step and no input of it arrives at the step (SES-001)."""
    if not awaits_input(rec.before, request_id):
        return False
    request = ctx.requests.get(request_id)
    return request is None or all(p.step != rec.step for p in request.session)


def holds_blocks(snap: Snapshot, request_id: str) -> bool:
    """Whether the request's sequence holds blocks in the snapshot."""
    view = (snap.seqs or {}).get(seq_id(request_id, 0))
    return view is not None and bool(view.blocks)


def is_session(ctx: CheckContext, request_id: str) -> bool:
    request = ctx.requests.get(request_id)
    return request is not None and bool(request.session)


def input_bound(ctx: CheckContext, request_id: str, step: int) -> int:
    """The most tokens a session can hold after ``step``: its prompt and max_tokens, and the
    prompt_len and max_tokens of each input that arrived by then."""
    request = ctx.requests[request_id]
    return request.prompt_len + request.max_tokens + sum(
        p.prompt_len + p.max_tokens for p in request.session if p.step <= step)


def took_input(ctx: CheckContext, rec: StepRecord, request_id: str, old_tokens: int | None,
               new_tokens: int | None) -> bool:
    """Whether a session's change of length in this step is inputs taken up (spec/session.py step
    3): one or more consecutive inputs that arrived by the step, each replacing the last sampled
    token with its tokens, and a token sampled between two of them or after the last. So the
    session grew by the inputs' tokens, or by one less."""
    request = ctx.requests.get(request_id)
    if request is None or not request.session or old_tokens is None or new_tokens is None:
        return False
    grew = new_tokens - old_tokens
    arrived = [p.prompt_len for p in request.session if p.step <= rec.step]
    for first in range(len(arrived)):
        total = 0
        for length in arrived[first:]:
            total += length
            if grew in (total - 1, total):
                return True
    return False


# Triggers: when each rule below has something to check (spec/invariants/triggers.py).
def sessions_wait(ctx: CheckContext, rec: StepRecord) -> bool:
    """a session is in the waiting queue before the step"""
    return bool(ctx.sessions) and any(rid in ctx.sessions for rid in rec.before.waiting or ())


def sessions_live(ctx: CheckContext, rec: StepRecord) -> bool:
    """a session holds tokens after the step"""
    return bool(ctx.sessions) and any(seq_id(rid, 0) in (rec.after.seqs or {}) for rid in ctx.sessions)


@invariant(
    "SES-001", "policy",
    """A streaming session that is WAITING_FOR_INPUT when a step begins is scheduled in it only if one
    of its inputs arrives at that step, and a session is WAITING_FOR_INPUT only while one of its
    inputs is still to arrive (at that step or later).""",
    """vLLM 0.33.0 gives a session whose generation is done and whose next input has not come the
    status WAITING_FOR_STREAMING_REQ (scheduler.py:2738-2740) and passes over it (3549-3552); the
    next input, sent before a step's schedule(), turns it WAITING again (1879-1921, at add_request:
    2931-2943). A session left waiting after its last input came is never served: its client waits
    for an answer that never starts. Policy, not safety: a correct design could use the wait,
    computing the KV of the session's last sampled token (vLLM discards that token and its KV at the
    next input, 1886-1893), so the "not scheduled" half is vLLM's choice, and so is the status.""",
    (C.STREAMING, C.QUEUES, C.STATUSES),
    about=STEP, when=sessions_wait,
)
def waits_for_input(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    scheduled = {s.request_id for s in rec.output.scheduled}
    for rid in rec.before.waiting or ():
        if not awaits_input(rec.before, rid):
            continue
        request = ctx.requests.get(rid)
        steps = [p.step for p in request.session] if request is not None else []
        if rid in scheduled and rec.step not in steps:
            yield f"{rid} is scheduled at step {rec.step} while it waits for its next input (inputs at steps {steps})"
        if not steps or max(steps) < rec.step:
            yield (f"{rid} still waits for input at step {rec.step}, but its last input arrived at step {max(steps)}"
                   if steps else f"{rid} waits for input at step {rec.step} but is no streaming session")


@invariant(
    "SES-002", "safety",
    """No session holds tokens of an input that has not arrived: after every step a session holds at
    most its prompt and max_tokens plus, for each input that arrived by that step, its prompt_len
    and max_tokens.""",
    """A scheduler cannot know tokens the client has not sent: a session that grows past what has
    arrived took a later input early (its tokens computed before the client sent them, so a client
    that changes its mind is answered from input it never gave), or generated past a piece's
    max_tokens. Safety: every design of streaming input owes it.""",
    (C.STREAMING, C.SEQ_LENGTHS),
    about=STEP, when=sessions_live,
)
def no_token_before_its_input(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    seqs = rec.after.seqs or {}
    for rid in sorted(ctx.sessions):
        view = seqs.get(seq_id(rid, 0))
        if view is None or view.num_tokens is None or view.status.is_finished:
            continue
        bound = input_bound(ctx, rid, rec.step)
        if view.num_tokens > bound:
            yield (f"{rid} holds {view.num_tokens} tokens after step {rec.step}, more than the {bound} its "
                   f"inputs arrived by then allow")


@invariant(
    "SES-003", "liveness",
    """The KV a waiting session holds never stalls an idle engine: in a step that begins with nothing
    running or swapped, unpaused, and schedules nothing, no session in the waiting queue holds blocks
    while another waiting request is WAITING.""",
    """With nothing running, a session's held KV is the only thing a WAITING request can be waiting
    for, and what frees it is the session's client sending its next input, which may never happen:
    the engine stalls on a client. Worse, the session that then resumes waits behind the request it
    starves for blocks (vLLM 0.33.0 admits from waiting without preempting: scheduler.py:1060-1075,
    kv_holding_waiting; its seats count WAITING_FOR_STREAMING_REQ sessions too, 1070-1074), so the two
    wait for each other for good. A correct design frees (and later recomputes) an idle session's KV
    when it is all that stands in the way.""",
    (C.STREAMING, C.QUEUES, C.STATUSES, C.BLOCK_TABLES),
    about=STEP, when=sessions_wait,
)
def idle_session_kv_yields(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    before = rec.before
    if before.running or before.swapped or rec.output.scheduled or before.pause_state not in (None, "unpaused"):
        return
    waiting = before.waiting or ()
    statuses = before.statuses or {}
    holders = [rid for rid in waiting if is_session(ctx, rid) and holds_blocks(before, rid)]
    for holder in holders:
        ready = [rid for rid in waiting if rid != holder and statuses.get(rid) is Status.WAITING]
        if ready:
            yield (f"nothing runs at step {rec.step}, yet session {holder} holds its KV blocks in waiting while "
                   f"{ready[:3]} wait and nothing is scheduled")
