"""Chunked prefill and the token budget of today's engines (vLLM V1, nano-vllm, SGLang).

A request's tokens are computed over one or more steps: each step gives it some of the token
budget, its computed-token count advances by exactly that, and it samples a token only once all
of its tokens are computed. These hold for any scheduler, chunked or not (V0 included); the
chunk-size and partial-prefill limits bite only when the config sets them.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._evaluation import SeqAt
from spec.invariants._views import drops_unseen_tokens, returned_step, step_facts, views_of
from spec.invariants.connector import load_failed
from spec.invariants.triggers import (
    long_prefill_contended,
    partial_prefills_limited,
    preempts_by_recompute,
    schedules,
)
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import AFTER_SCHEDULE, AFTER_STEP, SCHEDULE, SEQUENCE, STEP, CheckContext, invariant
from spec.status import PreemptionMode, Status


@invariant(
    "CHK-001", "safety",
    "Every scheduled sequence is given at least one token.",
    """A batch entry with zero tokens has no query position: the model runner cannot build its
    attention metadata, and a scheduler that counts it as progress never computes anything
    (nano-vllm can schedule a prefill of zero tokens when the prefix cache covers the whole
    prompt).""",
    about=SCHEDULE, when=schedules,
)
def at_least_one_token(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for item in rec.output.scheduled:
        if item.num_tokens < 1:
            yield f"{item.seq_id} is scheduled for {item.num_tokens} tokens"


@invariant(
    "CHK-002", "safety",
    """A sequence's computed tokens never exceed its tokens, and after schedule() its computed
    tokens plus the tokens scheduled now, draft tokens aside, do not either.""",
    """vLLM V1 schedules ``num_tokens - num_computed_tokens`` at most (its comment: computed
    tokens catch up with the tokens); computing past the end reads token ids that do not exist
    and writes KV slots no block was sized for.""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=SEQUENCE,
)
def computed_within_tokens(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v = seq.view
    if v.num_computed is None or v.num_tokens is None:
        return
    if v.num_computed > v.num_tokens:
        yield f"{seq.where}: {seq.id} has {v.num_computed} computed of {v.num_tokens} tokens"
    item = step_facts(rec).scheduled.get(seq.id) if seq.where == AFTER_SCHEDULE else None
    if item is not None and v.num_computed + item.num_tokens - item.num_drafts > v.num_tokens:  # drafts lie past them
        yield f"{item.seq_id} is scheduled for {item.num_tokens} tokens with {v.num_computed} of {v.num_tokens} computed"


@invariant(
    "CHK-003", "safety",
    """A request preempted by recompute has, once out of running, no blocks and no computed
    tokens, and still every token it had (prompt and generated, same ids); where the scheduler
    claims ``output_at_finish``, still its prompt and a prefix of its generated tokens.""",
    """vLLM V1's _preempt_request frees the blocks and sets num_computed_tokens = 0 but keeps the
    output tokens, which the resume re-prefills; a stale computed count (nano-vllm PR #207) skips
    tokens on resume, a dropped token (vLLM PR #5349) changes output the client already has. An
    engine that answers only at the finish has shown no client those tokens and may regenerate
    them (REQ-004 says why; tokasaurus' bump does).""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.BLOCK_TABLES),
    about=SCHEDULE, when=preempts_by_recompute,
)
def recompute_resets(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.before.seqs is not None
    state = rec.mid if rec.mid is not None else rec.after
    assert state.seqs is not None
    scheduled = {s.request_id for s in rec.output.scheduled}
    for p in rec.output.preempted:
        if p.mode is not PreemptionMode.RECOMPUTE or p.request_id in scheduled:
            continue
        for v in views_of(state, p.request_id):
            if v.status.is_finished:
                continue
            old = rec.before.seqs.get(v.seq_id)
            if v.num_computed:
                yield f"{v.seq_id} preempted by recompute still counts {v.num_computed} computed tokens"
            if v.blocks:
                yield f"{v.seq_id} preempted by recompute still holds blocks {list(v.blocks)}"
            if old is not None and drops_unseen_tokens(ctx, rec, old, v):
                continue
            if old is not None and old.num_tokens is not None and v.num_tokens != old.num_tokens:
                yield f"{v.seq_id} had {old.num_tokens} tokens before preemption, {v.num_tokens} after"
            elif old is not None and old.token_ids is not None and v.token_ids is not None and v.token_ids != old.token_ids:
                yield f"{v.seq_id} changed its token ids when preempted"


@invariant(
    "CHK-004", "safety",
    """A step advances each scheduled sequence's computed tokens by exactly the tokens it was
    given (with d draft tokens among them: by at least the tokens less the d drafts, which the
    outcome may reject, and one less on an outcome with no token), and leaves every other live
    sequence's computed tokens as they were.""",
    """vLLM V1's _update_after_schedule adds num_scheduled_tokens to num_computed_tokens, no more
    and no less: counting a partial chunk as the whole prompt leaves KV holes that later steps
    read, counting less recomputes (and re-writes) KV.""",
    (C.MID_STEP, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    synchronous=True, about=SEQUENCE, at=(AFTER_STEP,),
)
def computed_advances_by_scheduled(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.seqs is not None
    sid, a, m = seq.id, seq.view, rec.mid.seqs.get(seq.id)
    if m is None or m.status.is_finished or m.num_computed is None or a.num_computed is None:
        return
    if m.request_id in load_failed(rec):  # a failed KV load cuts the computed tokens (KVC-005 says where)
        return
    facts = step_facts(rec)
    given = facts.tokens.get(sid)
    if given is not None:
        want = m.num_computed + given
    elif m.status is Status.RUNNING or m.status is Status.SWAPPED:
        want = m.num_computed
    else:
        return
    k = ctx.config.num_speculative_tokens
    lagged = bool(k and ctx.config.pipeline_depth)
    voided = sid in rec.drafts and rec.drafts[sid].empty
    if sid in facts.drafts or voided or lagged:  # SPD-005 says how many roll back
        # (pipelined, the outcome processed now is an earlier step's: up to k + 1 of its tokens)
        slack = k + 1 if lagged else facts.drafts.get(sid, 0) + voided
        returned = returned_step(ctx, rec)
        # pipelined, an empty outcome also voids the sequence's later steps in flight (this one included)
        if lagged and returned is not None and sid in returned.scheduled and returned.decision(sid).empty:
            slack = (k + 1) * (ctx.config.pipeline_depth + 1)
        if want - slack <= a.num_computed <= want:
            return
    if a.num_computed != want and not (a.status.is_finished and given is None):
        yield f"{sid} went from {m.num_computed} to {a.num_computed} computed tokens, given {given or 0}"


@invariant(
    "CHK-005", "safety",
    """With long_prefill_token_threshold set and more than one request running or waiting, no
    sequence is given more tokens in a step than the threshold.""",
    """vLLM's long_prefill_token_threshold caps a long prompt's chunk so that it cannot take the
    whole budget from the decodes and shorter prompts behind it (V1 applies it only when another
    request could use the budget).""",
    (C.QUEUES,),
    about=SCHEDULE, when=long_prefill_contended,
)
def long_prefill_capped(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    threshold = ctx.config.long_prefill_token_threshold
    if threshold <= 0:
        return
    if len(rec.before.running or ()) + len(rec.before.waiting or ()) <= 1:
        return
    for item in rec.output.scheduled:
        if item.num_tokens > threshold:
            yield f"{item.seq_id} is given {item.num_tokens} tokens, long_prefill_token_threshold {threshold}"


@invariant(
    "CHK-006", "safety",
    """With max_num_partial_prefills set, between steps at most that many running sequences are
    mid-prefill (more than their last token still uncomputed).""",
    """vLLM's max_num_partial_prefills bounds the prompts being chunked at once, so that
    half-computed prompts do not pile up holding blocks while none of them finishes; 0 means no
    limit (vLLM V1 does not apply one).""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.STATUSES),
    about=STEP, when=partial_prefills_limited,
)
def partial_prefills_bounded(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    limit = ctx.config.max_num_partial_prefills
    if limit <= 0:
        return
    assert rec.after.seqs is not None
    partial = sorted(
        sid for sid, v in rec.after.seqs.items()
        if v.status is Status.RUNNING and (v.num_computed or 0) < (v.num_tokens or 0) - 1
    )
    if len(partial) > limit:
        yield f"{len(partial)} sequences are mid-prefill {partial[:5]}, max_num_partial_prefills {limit}"
