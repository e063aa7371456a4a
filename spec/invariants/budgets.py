"""What one step may schedule: budgets, token counts, lengths, and an output that agrees with the state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import changed_requests_between, fresh_after, running_seq_count, snapshots
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.status import PreemptionMode, Status


@invariant(
    "BUD-001", "safety",
    "The tokens scheduled in one step never exceed max_num_batched_tokens.",
    """Seed 003 §2.1 (SchedulingBudget.can_schedule: used_tokens + new_tokens <= token_budget)
    and seed 000 §3.3 step 1; the budget bounds the batch the model must hold in one forward pass
    (vLLM PR #7391: decodes slipping past the budget).""",
)
def token_budget(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    total = rec.output.num_batched_tokens
    if total > ctx.config.max_num_batched_tokens:
        yield f"scheduled {total} tokens, budget {ctx.config.max_num_batched_tokens}"


@invariant(
    "BUD-002", "safety",
    "The sequences scheduled in one step never exceed max_num_seqs.",
    """Seed 000 §3.4 step 2 (max_num_seqs=2 bounds what runs together) and seed 003 §2.1
    (seq_budget); the batch's sequence dimension is sized by it.""",
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
    synchronous=True,
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
        if ctx.config.enable_prefix_caching or ctx.config.kv_connector:
            continue  # a prefill after a cache hit (or a KV connector's load) starts with computed tokens
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
    again (vllm/v1/core/sched/scheduler.py:800-815).""",
    (C.SEQ_LENGTHS, C.STATUSES),
    synchronous=True,
)
def max_model_len(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.after.seqs is not None
    # Planned (depth > 0): the sample in flight may be the one past the limit that finishes the
    # sequence (synchronously appended and finished in one step), but never a second one.
    limit = ctx.config.max_model_len + (2 if ctx.config.pipeline_depth else 0)
    for sid, v in fresh_after(ctx, rec):
        if v.status in (Status.RUNNING, Status.SWAPPED) and (v.num_tokens or 0) >= limit:
            request = ctx.requests.get(v.request_id)
            # planned (depth > 0), the final chunk's sample may be in flight too
            prompt_only = () if request is None else range(
                request.prompt_len, request.prompt_len + (2 if ctx.config.pipeline_depth else 1))
            if (ctx.config.enable_chunked_prefill or ctx.config.kv_connector) and v.num_tokens in prompt_only:
                continue  # a prompt of exactly max_model_len tokens, still being prefilled (in chunks, or again
                # after a KV load that failed)
            yield f"{sid} has {v.num_tokens} tokens, max_model_len {ctx.config.max_model_len}"


@invariant(
    "LEN-002", "safety",
    "A prompt longer than the prompt limit (min of max_model_len and max_num_batched_tokens) is never scheduled.",
    """Seed 003 §2.2 (check the prompt length first: over the limit is FINISHED_IGNORED) and
    vLLM's _get_prompt_limit: without chunked prefill such a prompt can never be computed in one
    step.""",
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
    "OUT-001", "safety",
    "Within one step a sequence is scheduled at most once, and only sequences of known, unfinished requests are scheduled, preempted or swapped in.",
    """The batch is built from the output (seed 000 §3.3 step 4); a duplicate entry computes a
    token twice and writes its KV twice.""",
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
        readmitted = want is Status.WAITING and rid in scheduled
        ignored = mid.get(rid) is Status.FINISHED_IGNORED and rid in rec.output.ignored
        if mid.get(rid) is not want and not readmitted and not ignored:
            yield f"{rid} preempted by {mode.value} but {mid.get(rid)} after schedule()"
    changed = changed_requests_between(rec.mid, rec.before)  # only a request whose status changed can have left running
    before = rec.before.statuses
    for rid in before if changed is None else sorted(changed):
        status = before.get(rid)
        if status is Status.RUNNING and mid.get(rid) in (Status.WAITING, Status.SWAPPED) and rid not in preempted:
            yield f"{rid} left running for {mid[rid].value} without being reported preempted"
