"""What one step may schedule: budgets, token counts, lengths, and an output that agrees with the state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from spec.invariants._evaluation import SeqAt
from spec.invariants._views import running_seq_count, seq_ids_by_request, snapshots, with_status
from spec.invariants.triggers import (
    finishes_length_capped,
    finishes_or_ignores,
    names_requests,
    running_or_named,
    running_or_swapped,
    runs,
    schedules,
)
from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.rules import AFTER_STEP, OUTCOME, SCHEDULE, SEQUENCE, STEP, CheckContext, invariant
from spec.status import PreemptionMode, Status


@invariant(
    "BUD-001", "safety",
    "The tokens scheduled in one step never exceed max_num_batched_tokens.",
    """Seed 003 §2.1 (SchedulingBudget.can_schedule: used_tokens + new_tokens <= token_budget)
    and seed 000 §3.3 step 1; the budget bounds the batch the model must hold in one forward pass
    (vLLM PR #7391: decodes slipping past the budget).""",
    about=SCHEDULE, when=schedules,
)
def token_budget(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    total = rec.output.num_batched_tokens
    if total > ctx.config.max_num_batched_tokens:
        yield f"scheduled {total} tokens, budget {ctx.config.max_num_batched_tokens}"


@invariant(
    "BUD-002", "safety",
    "The sequences scheduled in one step never exceed max_num_seqs.",
    """Seed 000 §3.4 step 2 (max_num_seqs=2 bounds what runs together) and seed 003 §2.1
    (seq_budget); the batch's sequence dimension is sized by it. Moot for an engine without a
    sequence limit (its domain's ``seq_limit=False``).""",
    unless=(C.NO_SEQ_LIMIT,),
    about=SCHEDULE, when=schedules,
)
def scheduled_seq_budget(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    count = len({s.seq_id for s in rec.output.scheduled})
    if count > ctx.config.max_num_seqs:
        yield f"scheduled {count} sequences, max_num_seqs {ctx.config.max_num_seqs}"


@invariant(
    "BUD-003", "policy",
    "The live sequences of running requests never exceed max_num_seqs.",
    """vLLM counts every running group's sequences against the budget before admitting anything
    (budget.add_num_seqs for self.running); a group with n > 1 takes n seats before it forks
    (vLLM PR #1068: best_of groups overflowing max_num_seqs). Policy, not safety: vLLM's
    max_num_seqs bounds the sequences of one iteration (BUD-002, which stays in safety); an
    engine that keeps more requests resident than it batches in a step (their KV held, the
    batch rotating among them) honours that bound and fails this one. vLLM V0, V1 and nano-vllm
    run every running sequence each step, so for them the two coincide, and their profiles
    keep it.""",
    (C.STATUSES,),
    about=STEP, when=runs,
    unless=(C.NO_SEQ_LIMIT,),
)
def running_seq_budget(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap in snapshots(rec):
        assert snap.seqs is not None
        count = running_seq_count(snap)
        if count > ctx.config.max_num_seqs:
            yield f"{label}: {count} running sequences, max_num_seqs {ctx.config.max_num_seqs}"


@invariant(
    "BUD-004", "safety",
    """Each scheduled sequence computes exactly its uncomputed tokens: a prefill (nothing
    computed yet) all of them, a decode exactly one (plus its draft tokens, with speculative
    decoding).""",
    """Without chunked prefill vLLM V0 schedules a whole prompt or one token per sequence
    (token_chunk_size); scheduling fewer leaves KV holes, more recomputes what is cached. Not
    checked with chunked prefill; with prefix caching a prefill may start after a cache hit.""",
    (C.MID_STEP, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    synchronous=True, about=SCHEDULE, when=schedules,
)
def token_shape(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.seqs is not None
    if ctx.config.enable_chunked_prefill:
        return  # chunks are partial by design: CHK-001/CHK-002/CHK-004 govern them
    for item in rec.output.scheduled:
        v = rec.mid.seqs.get(item.seq_id)
        if v is None or v.num_tokens is None or v.num_computed is None:
            continue
        uncomputed = v.num_tokens - v.num_computed
        if item.num_tokens - item.num_drafts != uncomputed or item.num_tokens < 1:  # drafts lie past the tokens
            yield f"{item.seq_id} scheduled {item.num_tokens} token(s) with {uncomputed} uncomputed"
        if ctx.config.enable_prefix_caching or ctx.config.kv_connector or item.request_id in ctx.sessions:
            continue  # a prefill after a cache hit (a KV connector's load, a session's kept KV) starts with computed tokens
        if item.is_prefill != (v.num_computed == 0):
            kind = "prefill" if item.is_prefill else "decode"
            yield f"{item.seq_id} scheduled as {kind} with {v.num_computed} computed tokens"


@invariant(
    "LEN-001", "safety",
    "Between steps, every running or swapped sequence holds fewer than max_model_len tokens: one that reaches the limit is finished.",
    """A position at or past max_model_len has no rotary embedding or cache slot the model was
    sized for; vLLM's stop checker (stop_checker.py: maybe_stop_sequence) finishes a sequence as
    FINISHED_LENGTH_CAPPED once get_len() >= max_model_len, so its KV never needs that slot. With
    chunked prefill a prompt of exactly max_model_len tokens runs mid-prefill over several steps.
    Pipelined (checked as planned, spec.planned_view): the token that reaches or passes the limit
    may still be in flight (the sequence is finished when its outcome is in, as a synchronous
    step appends and finishes it at once), so planned tokens may pass max_model_len by that one
    sample, never by two: a sequence whose in-flight tokens reach the limit is not scheduled
    again (vllm/v1/core/sched/scheduler.py:800-815). Moot for an engine without a length limit
    (its domain's ``length_limit=False``).""",
    (C.SEQ_LENGTHS, C.STATUSES),
    synchronous=True, about=SEQUENCE, when=running_or_swapped, at=(AFTER_STEP,),
    unless=(C.NO_LENGTH_LIMIT,),
)
def max_model_len(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    # Planned (depth > 0): the sample in flight may be the one past the limit that finishes the
    # sequence (synchronously appended and finished in one step), but never a second one.
    v, limit = seq.view, ctx.config.max_model_len + (2 if ctx.config.pipeline_depth else 0)
    if (v.num_tokens or 0) >= limit:
        request = ctx.requests.get(v.request_id)
        # planned (depth > 0), the final chunk's sample may be in flight too
        prompt_only = () if request is None else range(
            request.prompt_len, request.prompt_len + (2 if ctx.config.pipeline_depth else 1))
        if (ctx.config.enable_chunked_prefill or ctx.config.kv_connector) and v.num_tokens in prompt_only:
            return  # a prompt of exactly max_model_len tokens, still being prefilled (in chunks, or again
            # after a KV load that failed)
        yield f"{seq.id} has {v.num_tokens} tokens, max_model_len {ctx.config.max_model_len}"


@invariant(
    "LEN-002", "safety",
    "A prompt longer than the prompt limit (min of max_model_len and max_num_batched_tokens) is never scheduled.",
    """Seed 003 §2.2 (check the prompt length first: over the limit is FINISHED_IGNORED) and
    vLLM's _get_prompt_limit: without chunked prefill such a prompt can never be computed in one
    step.""",
    about=SCHEDULE, when=schedules,
)
def over_long_never_scheduled(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    limit = ctx.config.prompt_limit
    for item in rec.output.scheduled:
        request = ctx.requests.get(item.request_id)
        if request is not None and request.prompt_len > limit:
            yield f"{item.request_id} (prompt {request.prompt_len} > limit {limit}) is scheduled"
        elif item.num_tokens > limit:
            yield f"{item.seq_id} is scheduled for {item.num_tokens} tokens in one step, limit {limit}"


@invariant(
    "LEN-003", "safety",
    """An over-long prompt is finished as FINISHED_IGNORED, and every ignored request is reported,
    either refused at add_request or in the output of the step that ignored it.""",
    """Seed 003 §2.2 sets FINISHED_IGNORED and drops the request; vLLM returns it in
    SchedulerOutputs.ignored_seq_groups so the client gets an answer instead of silence.
    Relaxed for engines that refuse an unservable request at the door: add_request returning
    its Finished is an answer too (vLLM V1's input processor likewise rejects a prompt longer
    than max_model_len before the scheduler sees it).""",
    about=OUTCOME, when=finishes_or_ignores,
)
def over_long_ignored(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    limit = ctx.config.prompt_limit
    for f in rec.finished:
        request = ctx.requests.get(f.request_id)
        if f.status is Status.FINISHED_IGNORED and f.request_id not in rec.output.ignored \
                and f.request_id not in rec.refused:
            yield f"{f.request_id} finished as ignored without being reported in the step's output"
        if request is not None and request.prompt_len > limit and f.status not in (
            Status.FINISHED_IGNORED, Status.FINISHED_ABORTED
        ):
            yield f"{f.request_id} (prompt {request.prompt_len} > limit {limit}) finished as {f.status.value}"
    for rid in rec.output.ignored:
        if rid not in {f.request_id for f in rec.finished}:
            yield f"{rid} is reported ignored but not finished in this step"


@invariant(
    "LEN-004", "safety",
    """A request finishes as FINISHED_LENGTH_CAPPED only at a length limit: one of its sequences
    has generated max_tokens tokens, or holds max_model_len tokens, or holds all but at most two
    blocks' worth of the GPU pool's tokens (a streaming session's max_tokens: the least of its inputs').""",
    """The client asked for max_tokens tokens; a length cap is the scheduler's word that the
    limit, its own or the model's, was reached (vLLM stop_checker.py: maybe_stop_sequence checks
    get_output_len() == max_tokens and get_len() >= max_model_len; SGLang's FINISH_LENGTH is
    max_new_tokens). Cutting a request short and calling it length-capped truncates the answer
    while every count stays consistent (tokens kept, blocks freed, one finish), so no other
    check sees it. Safety, not policy: a correct design may generate past a limit and drop the
    surplus (speculative drafts, pipelined samples), or stop early for a stop token, an abort or
    a refusal, but each of those finishes under its own status; no correct design reports the
    length cap below the limits. The third limit is the pool's: an engine may cap a sequence at
    what its KV cache can hold, less the slots it keeps back (SGLang's max_req_len is
    min(context_len - 1, max_total_num_tokens - 1), and max_new_tokens is clipped to max_req_len
    - prompt - 1 at the door: tp_worker.py:568-572, reference_impl/sglang_scheduler.py); two
    blocks of slack cover that and keep the rule's point, that a request far from every limit is
    never called length-capped. Not checked pipelined (the finishing sample may be in flight).""",
    (C.SEQ_LENGTHS,),
    synchronous=True,
    planned=False,
    about=OUTCOME, when=finishes_length_capped,
)
def length_capped_only_at_a_limit(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    capped = [f.request_id for f in rec.finished if f.status is Status.FINISHED_LENGTH_CAPPED]
    if not capped:
        return
    # A sequence whose view is gone after the step had at most its tokens before it plus what this step added.
    grows = {s.seq_id: 1 + s.num_drafts for s in rec.output.scheduled}
    after, before = rec.after.seqs or {}, rec.before.seqs or {}
    for rid in capped:
        request = ctx.requests.get(rid)
        if request is None:
            continue
        lengths = [_length_at_finish(sid, after, before, grows) for sid in _seqs_of(rid, rec.after, rec.before)]
        known = [n for n in lengths if n is not None]
        if not known:
            continue  # no view of any of its sequences: nothing to read the length from
        longest = max(known)
        generated = longest - request.prompt_len
        pool = (ctx.config.num_gpu_blocks - 2) * ctx.config.block_size  # what the pool holds, less two blocks
        # a streaming session's last generation is capped at its last input's max_tokens (spec/session.py)
        max_tokens = min(request.max_tokens, *(p.max_tokens for p in request.session)) if request.session \
            else request.max_tokens
        if generated < max_tokens and longest < ctx.config.max_model_len and longest < pool:
            yield (f"{rid} finished {Status.FINISHED_LENGTH_CAPPED.value} with {generated} of its max_tokens "
                   f"{request.max_tokens} generated and {longest} tokens, max_model_len {ctx.config.max_model_len}, "
                   f"the pool {pool} tokens but two blocks")


def _seqs_of(rid: str, *snaps: Snapshot) -> set[str]:
    """The ids of ``rid``'s sequences in any of ``snaps`` (through the per-request index, not a
    scan of every view: a step may finish hundreds of requests)."""
    return {sid for snap in snaps if snap.seqs is not None for sid in seq_ids_by_request(snap).get(rid, ())}


def _length_at_finish(sid: str, after: dict, before: dict, grows: dict[str, int]) -> int | None:
    view = after.get(sid)
    if view is not None and view.num_tokens is not None:
        return view.num_tokens
    view = before.get(sid)
    if view is not None and view.num_tokens is not None:
        return view.num_tokens + grows.get(sid, 0)
    return None


@invariant(
    "OUT-001", "safety",
    "Within one step a sequence is scheduled at most once, and only sequences of known, unfinished requests are scheduled, preempted or swapped in.",
    """The batch is built from the output (seed 000 §3.3 step 4); a duplicate entry computes a
    token twice and writes its KV twice.""",
    about=SCHEDULE, when=names_requests,
)
def output_well_formed(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    counts = Counter(s.seq_id for s in rec.output.scheduled)
    for sid, n in counts.items():
        if n > 1:
            yield f"{sid} scheduled {n} times in one step"
    named = [s.request_id for s in rec.output.scheduled] + [p.request_id for p in rec.output.preempted]
    for rid in named + list(rec.output.swapped_in):
        if rid not in ctx.requests:
            yield f"{rid} appears in the output but was never added"
    preempted = Counter(p.request_id for p in rec.output.preempted)
    for rid, n in preempted.items():
        if n > 1:
            yield f"{rid} preempted {n} times in one step"


@invariant(
    "OUT-002", "safety",
    """The output agrees with the state after schedule(): scheduled requests are RUNNING,
    preempted ones are WAITING (recompute) or SWAPPED (swap), and every request that left
    running is reported as preempted.""",
    """A preempted request left in running (HabanaAI vllm-fork PR #2247) or one moved silently
    keeps blocks the engine thinks are free; vLLM reports victims in preempted / blocks_to_swap_out.""",
    (C.MID_STEP, C.STATUSES),
    about=SCHEDULE, when=running_or_named,
)
def output_matches_state(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.statuses is not None and rec.before.statuses is not None
    mid = rec.mid.statuses
    for rid in {s.request_id for s in rec.output.scheduled}:
        if mid.get(rid) is not Status.RUNNING:
            yield f"{rid} is scheduled but {mid.get(rid)} after schedule()"
    preempted = {p.request_id: p.mode for p in rec.output.preempted}
    scheduled = {s.request_id for s in rec.output.scheduled}
    for rid, mode in preempted.items():
        want = Status.SWAPPED if mode is PreemptionMode.SWAP else Status.WAITING
        # preempted and back in the same schedule(): readmitted by recompute, or swapped out and in
        # again (a round trip: smol-vllm, kvstream swap in after they preempt, issue 34)
        readmitted = rid in scheduled and (want is Status.WAITING or rid in rec.output.swapped_in)
        ignored = mid.get(rid) is Status.FINISHED_IGNORED and rid in rec.output.ignored
        if mid.get(rid) is not want and not readmitted and not ignored:
            yield f"{rid} preempted by {mode.value} but {mid.get(rid)} after schedule()"
    for rid in sorted(with_status(rec.before, Status.RUNNING)):
        if mid.get(rid) in (Status.WAITING, Status.SWAPPED) and rid not in preempted:
            yield f"{rid} left running for {mid[rid].value} without being reported preempted"
