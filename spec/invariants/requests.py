"""The life of a request: it finishes exactly once, is never lost, and keeps its tokens."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import (
    changed_between,
    changed_requests_between,
    drops_unseen_tokens,
    fresh_views,
    seq_ids_by_request,
)
from spec.invariants.connector import held_by_transfer, load_failed
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.status import Status
from spec.types import request_of


@invariant(
    "REQ-001", "safety",
    "A request is reported finished at most once, and only a request that was added.",
    """Every request ends in exactly one finished state (DESIGN: no request is lost); a second
    finish frees its blocks twice (SGLang-JAX PR #982: release on two paths).""",
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
)
def none_lost(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.after.statuses is not None
    reported = set(ctx.finished) | {f.request_id for f in rec.finished}
    prior = ctx.previous.after if ctx.previous is not None else None
    changed = changed_requests_between(rec.after, prior)
    # A request whose status and report are as at the last passed step still passes.
    candidates = ctx.requests if changed is None else sorted(
        (changed | {f.request_id for f in rec.finished} | {r.request_id for r in rec.added}) & ctx.requests.keys())
    for rid in candidates:
        status = rec.after.statuses.get(rid)
        if status is None:
            yield f"{rid} was added but the scheduler no longer knows it"
        elif status.is_finished and rid not in reported:
            yield f"{rid} is {status.value} but was never reported finished"
        elif not status.is_finished and rid in reported:
            yield f"{rid} was reported finished but is {status.value}"


@invariant(
    "REQ-003", "safety",
    "A finished request is never scheduled, preempted or swapped in again.",
    """Finished statuses are final (the lifecycle graph has no edge out of them); scheduling a
    finished request computes into blocks it already gave back.""",
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
    A streaming engine (vLLM, SGLang, nano-vllm's generators) may not.""",
    (C.SEQ_LENGTHS,),
    synchronous=True,
    planned=False,  # pipelined: PIP-001 (every token the sample of its position) and PIP-002 say it
)
def tokens_kept(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.before.seqs is not None and rec.after.seqs is not None
    scheduled = {s.seq_id for s in rec.output.scheduled}
    drafted = {s.seq_id: s.num_drafts for s in rec.output.scheduled if s.num_drafts}
    voided = {sid for sid, d in rec.drafts.items() if d.empty and sid in scheduled}
    forked_from = {request_of(s.seq_id) for s in rec.output.scheduled if s.is_prefill}
    changed = changed_between(rec.after, rec.before)
    # A view that is the same object before and after did not grow: only a scheduled one can be wrong.
    candidates = rec.after.seqs if changed is None else sorted(changed | scheduled)
    failed = load_failed(rec)  # a step whose KV load failed samples nothing for the request
    for sid in candidates:
        new = rec.after.seqs.get(sid)
        old = rec.before.seqs.get(sid)
        if old is None or new is None or new.request_id in failed:
            continue
        if old.status.is_finished:
            continue
        grow = 1 if sid in scheduled else 0
        if sid in drafted or sid in voided:  # SPD-005/SPD-006 say how many
            low = 0 if sid in voided else 1
            if not low <= (new.num_tokens or 0) - (old.num_tokens or 0) <= 1 + drafted.get(sid, 0):
                yield (f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens "
                       f"(scheduled with {drafted.get(sid, 0)} drafts)")
            continue
        if grow and ctx.config.enable_chunked_prefill:  # a chunk that leaves tokens uncomputed samples nothing
            if not _partial_chunk_ok(rec, sid, old, new) and not drops_unseen_tokens(ctx, rec, old, new, grow):
                yield f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens (scheduled, chunked)"
            continue
        if (new.num_tokens or 0) != (old.num_tokens or 0) + grow and not drops_unseen_tokens(ctx, rec, old, new, grow):
            yield f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens (scheduled: {bool(grow)})"
    for sid in rec.after.seqs if changed is None else sorted(changed):
        if sid in rec.after.seqs and sid not in rec.before.seqs and request_of(sid) not in forked_from and request_of(sid) not in {
            r.request_id for r in rec.added
        }:
            yield f"{sid} appeared without its request being added or prefilled"


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
    reads=("request_id", "status", "blocks", "device"),
)
def finished_request_is_done(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    after = rec.after
    assert after.seqs is not None
    prior = ctx.previous
    # Requests first seen finished at this step's start: all their sequences. Other finished
    # requests passed at the last step: only their sequences whose views changed since.
    if prior is None or after.kv_transfers or prior.after.kv_transfers:  # a transfer's hold may just have ended
        fresh = set(ctx.finished)
    else:
        fresh = {f.request_id for f in prior.finished} & ctx.finished.keys()
    by_request = seq_ids_by_request(after)
    sids = {sid for rid in fresh for sid in by_request.get(rid, ())}
    sids.update(sid for sid, v in fresh_views(after, prior.after if prior is not None else None, ctx.reads)
                if v.request_id in ctx.finished)
    for sid in sorted(sids):
        view = after.seqs.get(sid)
        if view is None:
            continue
        rid = view.request_id
        if not view.status.is_finished:
            yield f"{sid} is {view.status.value} but its request {rid} was reported {ctx.finished[rid].value} before this step"
        elif view.blocks and rid not in held_by_transfer(after):  # a connector transfer holds them (KVC-007)
            yield (f"{sid} of {rid} (reported {ctx.finished[rid].value} before this step) still holds "
                   f"{view.device} blocks {list(view.blocks)}")
