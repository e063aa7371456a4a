"""The life of a request: it finishes exactly once, is never lost, and keeps its tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from spec.invariants._evaluation import RequestAt, SeqAt
from spec.invariants._views import drops_unseen_tokens, step_facts
from spec.invariants.connector import held_by_transfer, load_failed
from spec.invariants.sessions import took_input
from spec.invariants.triggers import (
    added,
    finishes,
    finishes_aborted,
    finishes_stopped,
    names_requests,
    reported_finished,
)
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import AFTER_STEP, OUTCOME, REQUEST, SCHEDULE, SEQUENCE, CheckContext, invariant
from spec.status import Status
from spec.types import request_of


@invariant(
    "REQ-001", "safety",
    "A request is reported finished at most once, and only a request that was added.",
    """Every request ends in exactly one finished state (DESIGN: no request is lost); a second
    finish frees its blocks twice (SGLang-JAX PR #982: release on two paths).""",
    about=OUTCOME, when=finishes,
)
def finished_once(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    counts = Counter(f.request_id for f in rec.finished)
    for rid, n in counts.items():
        if rid not in ctx.requests:
            yield f"{rid} reported finished but never added"
        elif rid in ctx.finished:
            yield f"{rid} reported finished again ({ctx.finished[rid].value} before)"
        elif n > 1:
            yield f"{rid} reported finished {n} times in one step"


@invariant(
    "REQ-002", "safety",
    """No request is lost: the scheduler shows every added request that was not reported finished
    as unfinished, and every request it shows finished was reported.""",
    """A request dropped from every queue without a finish report hangs its client forever;
    one finished silently never returns its output.""",
    (C.STATUSES,),
    about=REQUEST, when=added, at=(AFTER_STEP,),
)
def none_lost(ctx: CheckContext, rec: StepRecord, req: RequestAt) -> Iterator[str]:
    rid, status = req.id, req.status
    reported = req.reported is not None or rid in step_facts(rec).finished
    if status is None:
        yield f"{rid} was added but the scheduler no longer knows it"
    elif status.is_finished and not reported:
        yield f"{rid} is {status.value} but was never reported finished"
    elif not status.is_finished and reported:
        yield f"{rid} was reported finished but is {status.value}"


@invariant(
    "REQ-003", "safety",
    "A finished request is never scheduled, preempted or swapped in again.",
    """Finished statuses are final (the lifecycle graph has no edge out of them); scheduling a
    finished request computes into blocks it already gave back.""",
    about=SCHEDULE, when=names_requests,
)
def finished_is_final(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    named = {s.request_id for s in rec.output.scheduled} | {p.request_id for p in rec.output.preempted}
    for rid in sorted(named | set(rec.output.swapped_in)):
        if rid in ctx.finished:
            yield f"{rid} finished as {ctx.finished[rid].value} but appears in step {rec.step}'s output"


@invariant(
    "REQ-004", "safety",
    """Every generated token is kept: a step adds exactly one token to each scheduled sequence
    (with chunked prefill: one once all of its tokens are computed, none after a partial chunk;
    with d draft tokens: from one to d + 1, the accepted drafts and the bonus, or none on an
    outcome with no token) and none to the others, and preemption never drops tokens; except
    that where the scheduler claims ``output_at_finish``, a preemption by recompute may drop
    generated tokens from the end (never the prompt).""",
    """Recompute re-prefills the prompt and the tokens generated so far (vLLM treats them as the
    new prompt); a preemption that forgets them (vLLM PR #5349, TensorRT-LLM PR #10943) restarts
    or corrupts the output the client already received. What makes that a defect is the client:
    an engine that answers a request only when it finishes (tokasaurus 0.0.4, the stranger test:
    a bump restarts the completion, manager.py:764-781) has shown those tokens to nobody, so
    regenerating them costs compute, not correctness; it declares so (``output_at_finish``).
    A streaming engine (vLLM, SGLang, nano-vllm's generators) may not. A streaming-input session
    that takes up its next input drops its last sampled token, whose KV was never computed, for
    the input's tokens (vLLM 0.33.0 _update_request_as_session, scheduler.py:1879-1921): the client
    has that token, and the model's context continues from the input (spec/session.py; SES-002
    bounds what a session may hold).""",
    (C.SEQ_LENGTHS,),
    synchronous=True,
    planned=False,  # pipelined: PIP-001 (every token the sample of its position) and PIP-002 say it
    about=SEQUENCE, at=(AFTER_STEP,),
)
def tokens_kept(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    assert rec.before.seqs is not None
    sid, new, old = seq.id, seq.view, rec.before.seqs.get(seq.id)
    facts = step_facts(rec)
    if old is None:
        if request_of(sid) not in facts.prefilled and request_of(sid) not in facts.added:
            yield f"{sid} appeared without its request being added or prefilled"
        return
    if old.status.is_finished or new.request_id in load_failed(rec):  # a failed KV load samples nothing
        return
    if new.request_id in ctx.sessions and took_input(ctx, rec, new.request_id, old.num_tokens, new.num_tokens):
        return  # a streaming session took up its next input (SES-002 bounds what it may hold)
    grow = 1 if sid in facts.scheduled else 0
    if sid in facts.drafts or sid in facts.voided:  # SPD-005/SPD-006 say how many
        low = 0 if sid in facts.voided else 1
        if not low <= (new.num_tokens or 0) - (old.num_tokens or 0) <= 1 + facts.drafts.get(sid, 0):
            yield (f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens "
                   f"(scheduled with {facts.drafts.get(sid, 0)} drafts)")
        return
    if grow and ctx.config.enable_chunked_prefill:  # a chunk that leaves tokens uncomputed samples nothing
        if not _partial_chunk_ok(rec, sid, old, new) and not drops_unseen_tokens(ctx, rec, old, new, grow):
            yield f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens (scheduled, chunked)"
        return
    if (new.num_tokens or 0) != (old.num_tokens or 0) + grow and not drops_unseen_tokens(ctx, rec, old, new, grow):
        yield f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens (scheduled: {bool(grow)})"


def _partial_chunk_ok(rec: StepRecord, sid: str, old, new) -> bool:
    """With chunked prefill: a scheduled sequence gains one token exactly when its chunk completes
    its tokens, none otherwise (decided from the snapshot after schedule() when there is one)."""
    grew = (new.num_tokens or 0) - (old.num_tokens or 0)
    if rec.mid is None or rec.mid.seqs is None or sid not in rec.mid.seqs:
        return grew in (0, 1)
    mid = rec.mid.seqs[sid]
    if mid.num_computed is None:  # no computed_tokens: a prefix-cache hit shortens a complete prefill
        return grew in (0, 1)
    given = sum(s.num_tokens for s in rec.output.scheduled if s.seq_id == sid)
    completes = (mid.num_computed or 0) + given >= (mid.num_tokens or 0)
    return grew == (1 if completes else 0)


@invariant(
    "REQ-005", "safety",
    """A request finishes as FINISHED_STOPPED only if an outcome stopped one of its sequences in
    a step that ran the request (this step or an earlier one).""",
    """Which sequence samples a stop token is the model's word, delivered in the step's outcome
    (StepOutcome.stopped). A stop applied to the wrong request cuts off a client whose output
    was not done and lets the stopped one run on to its length cap: both clients get wrong
    answers, and every count stays consistent, so nothing else notices.""",
    about=OUTCOME, when=finishes_stopped,
)
def stopped_only_when_told(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for f in rec.finished:
        if f.status is Status.FINISHED_STOPPED and f.request_id not in ctx.stopped:
            yield f"{f.request_id} finished as {f.status.value} but no outcome stopped any of its sequences"


@invariant(
    "REQ-006", "safety",
    """A request reported finished in an earlier step has only finished sequences, and none of
    them holds a block.""",
    """The request's finish is what its client sees; its sequences are what the KV cache sees.
    Every other check reads one side: REQ-002 the request's status, QUE-002 the statuses of a
    live request's sequences, RES-005 the blocks of a finished sequence. A scheduler that
    reports a group finished while one of its sequences still runs (an abort or a stop applied
    to one sequence of an n > 1 group and taken for the whole group) passes all of them, and
    the sequence left behind holds its blocks for good: nothing will ever schedule or free it.
    One step of grace, as RES-005 gives: a scheduler may free at its next schedule().""",
    (C.STATUSES, C.BLOCK_TABLES),
    about=REQUEST, when=reported_finished, at=(AFTER_STEP,),
)
def finished_request_is_done(ctx: CheckContext, rec: StepRecord, req: RequestAt) -> Iterator[str]:
    if req.snap.seqs is None:
        return
    rid, reported = req.id, req.reported
    assert reported is not None
    for view in req.views():
        if not view.status.is_finished:
            yield f"{view.seq_id} is {view.status.value} but its request {rid} was reported {reported.value} before this step"
        elif view.blocks and rid not in held_by_transfer(req.snap):  # a connector transfer holds them (KVC-007)
            yield (f"{view.seq_id} of {rid} (reported {reported.value} before this step) still holds "
                   f"{view.device} blocks {list(view.blocks)}")


@invariant(
    "REQ-007", "safety",
    """A request the client did not abort is finished FINISHED_ABORTED only as an engine error
    with its reason (a Finished whose reason is ``engine_error``).""",
    """A request ends by its stop, its length, a refusal or an ignore, or by the client's abort.
    An engine that ends one on its own (one engine aborts every request of a pass when its pool
    runs out, issue 34) and reports it as aborted tells its client a lie about who ended it: the
    client retries nothing, since it thinks it asked. An engine error stated as such (the reason
    ``engine_error``, with what failed) is the truth; whether it was needed is LIV-004's question.""",
    about=OUTCOME, when=finishes_aborted,
)
def engine_ends_say_why(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for f in rec.finished:
        if f.status is Status.FINISHED_ABORTED and f.request_id not in ctx.client_aborted \
                and (f.reason is None or f.reason.kind != "engine_error"):
            yield (f"{f.request_id} finished as {f.status.value} but the client never aborted it, and no "
                   f"engine_error reason says why ({f.reason.kind if f.reason else 'no reason'})")
