"""The async flow: a step's outcome is processed ``config.pipeline_depth`` steps after the step
was scheduled (vLLM's ``AsyncScheduler``, docs/ASYNC.md). What is promised to the client when
outcomes lag.

They hold at depth 0 too (each says what a synchronous scheduler already does), so they are stated
for every scheduler; the family is named for the flow that makes them non-trivial. The file is
named by the flow id (STYLE.md rule 1); ``async`` is a keyword, so `spec.catalogue` imports it by
name. PIP-003 reads the optional ``in_flight`` snapshot part (capability ``in_flight``); PIP-005
is a failure predicate: it names the runner's fault when a call fails on an outcome of a request
that left the running set while that outcome was in flight.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._evaluation import SeqAt, before_is_new, finish_length, first_unread_token
from spec.invariants.triggers import (
    finishes_delivered,
    finishes_delivered_in_flight,
    has_generated,
    in_flight_observed,
    of_finished_request,
    pipelined_writes,
)
from spec.observation import Capability as C
from spec.observation import Snapshot, StepFailure, StepRecord
from spec.rules import OUTCOME, SEQUENCE, STEP, CheckContext, invariant
from spec.status import Status
from spec.types import generated_token

_DELIVERED = (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH_CAPPED)


@invariant(
    "PIP-001", "safety",
    """Every generated token of a sequence is the model's sample at its position: the token at
    position p of sequence i of request r is ``generated_token(r, i, p)``. No token is repeated,
    lost or invented, across preemption, aborts, chunk boundaries and stops. (A streaming session's
    tokens past its first prompt are its inputs' as well as samples: SES-002 bounds them.)""",
    """The client cannot tell a pipelined engine from a synchronous one except by latency. An
    in-flight token kept across a preemption and then sampled again is delivered twice
    (vllm-project/vllm#38624, #47900); output ids lost on preemption (#28787) shift every later
    token; an outcome applied to a request that finished meanwhile invents one. The sampled
    tokens are a fixed function of the position (`spec.types.generated_token`), which every
    implementation and engine host uses, so the stream a synchronous run delivers is known.""",
    (C.PREFIX_CACHE, C.SEQ_LENGTHS),
    reads=("request_id", "token_ids"), about=SEQUENCE, when=has_generated,
)
def tokens_are_the_samples(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v, sid = seq.view, seq.id
    if v.request_id in ctx.sessions:
        return
    request, tokens = ctx.requests[v.request_id], v.token_ids
    assert tokens is not None
    index = int(sid.rsplit("#", 1)[1]) if "#" in sid else 0
    for position in range(max(request.prompt_len, first_unread_token(ctx, rec, seq)), len(tokens)):
        want = generated_token(v.request_id, index, position)
        if tokens[position] != want:
            yield f"{seq.where}: {sid} has token {tokens[position]} at position {position}, the model sampled {want} there"
            break


@invariant(
    "PIP-002", "safety",
    """No token is delivered to a request after its finish is reported: a finished request's
    sequences keep the token count they had in the step that finished it.""",
    """An in-flight step cannot be recalled, but its output for a request that finished (a stop,
    a length cap or an abort) while it was in flight must be dropped (vLLM:
    vllm/v1/core/sched/scheduler.py:2327-2334); a token after the finish reaches a client that
    was told the stream ended. The other half of the promise, at most pipeline_depth tokens
    computed past the last delivered one, reads in-flight tokens the snapshot does not carry yet
    (`conformance.selftest.async_checks`).""",
    (C.SEQ_LENGTHS,),
    about=SEQUENCE, when=of_finished_request,
)
def no_token_after_finish(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v, rid, then = seq.view, seq.view.request_id, finish_length(ctx, seq.id)
    if then is not None and v.num_tokens is not None and v.num_tokens != then:
        yield f"{seq.where}: {seq.id} has {v.num_tokens} tokens, {then} when {rid} finished ({ctx.finished[rid].name})"


@invariant(
    "PIP-006", "policy",
    """A request that finishes stopped or length-capped is reported finished at most
    ``pipeline_depth`` steps after the last step that scheduled it (in that very step when the
    depth is 0).""",
    """A finish is known once the step that sampled the last token returns, which is
    pipeline_depth steps after it was scheduled; the steps in between may still schedule the
    request (computing past its stop), so its last scheduled step is at or after the sampling
    step. Latency beyond that is a queue deeper than declared or stale in-flight frames that
    delay a stop (vllm-project/vllm#49860). A policy claim: a scheduler may legitimately report
    later, but then it declares a deeper pipeline.""",
    about=OUTCOME, when=finishes_delivered,
)
def finish_within_depth(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    last = ctx.flow_state.setdefault("PIP-006", {})
    for item in rec.output.scheduled:
        last[item.request_id] = rec.step
    aborted = set(rec.aborted)
    for done in rec.finished:
        rid = done.request_id
        if done.status not in _DELIVERED or rid in aborted or rid not in last:
            continue
        late = rec.step - last[rid]
        if late > ctx.config.pipeline_depth:
            yield (f"{rid} finished ({done.status.name}) {late} steps after the last step that scheduled it "
                   f"(step {last[rid]}), pipeline_depth {ctx.config.pipeline_depth}")



def _in_flight_window(ctx: CheckContext, step: int, label: str) -> int:
    """The oldest step whose outcome may still be unprocessed at snapshot ``label`` of ``step``:
    before and mid-step, steps ``step - d`` on (mid-step, ``step`` itself too); once the step's
    outcome is in, ``step - d + 1`` on."""
    depth = ctx.config.pipeline_depth
    return step - depth + (1 if label == "after" else 0)


def _counter_problems(ctx: CheckContext, snap: Snapshot, label: str, step: int) -> Iterator[str]:
    assert snap.in_flight is not None and snap.seqs is not None
    last = ctx.flow_state.setdefault("PIP-003", {})
    oldest = _in_flight_window(ctx, step, label)
    for sid, c in snap.in_flight.items():
        if min(c) < 0:
            yield f"{label}: {sid} has in-flight counters {dict(c._asdict())}: below zero"
            continue
        if any(c) and last.get(sid, -1) < oldest:
            yield (f"{label}: {sid} has in-flight counters {dict(c._asdict())} though no step that may still be in "
                   f"flight scheduled it (last scheduled at step {last.get(sid)}, pipeline_depth "
                   f"{ctx.config.pipeline_depth})")
            continue
        view = snap.seqs.get(sid)
        if view is None:
            continue
        if view.status is not Status.RUNNING:
            if c.placeholders or c.stale != c.in_flight_tokens:
                yield (f"{label}: {sid} is {view.status.name} with in-flight counters {dict(c._asdict())}: "
                       f"expected no placeholder and every in-flight token stale")
        elif not c.stale and view.num_computed is not None and view.num_tokens is not None:
            sampled = view.num_computed + c.in_flight_tokens - view.num_tokens + 1
            if c.placeholders < sampled:
                yield (f"{label}: {sid} has {c.placeholders} placeholders, but its in-flight steps compute up to "
                       f"position {view.num_computed + c.in_flight_tokens - 1} of {view.num_tokens} tokens and so "
                       f"sample {sampled}")


@invariant(
    "PIP-003", "safety",
    """Every unfinished sequence's in-flight counters (placeholders, in-flight tokens, stale
    tokens) are never negative and agree with what is in flight: all are zero once no step that
    scheduled the sequence can still be in flight (in particular when nothing is in flight); a
    sequence that is not running holds no placeholder and counts every in-flight token stale;
    a running one without stale tokens holds a placeholder for every position its in-flight
    steps sample.""",
    """``assert request.num_output_placeholders >= 0`` is how vLLM's engine dies
    (vllm-project/vllm#48245, #57562, #35755): a counter that drifts from what is in flight
    underflows when the outcome returns, and an inflated one delays a stop (#49860). Checking the
    counters against the steps in flight catches the drift when it happens, steps before the
    assert would: a preemption that does not mark the victim's in-flight tokens stale (#48245),
    a final prefill chunk that reserves no placeholder though the model returns its token
    (#35755). Steps are in flight for pipeline_depth steps after they are scheduled
    (`SchedulerConfig.pipeline_depth`).""",
    (C.IN_FLIGHT, C.STATUSES, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=STEP, when=in_flight_observed,
)
def in_flight_counters_agree(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if before_is_new(ctx, rec):
        yield from _counter_problems(ctx, rec.before, "before", rec.step)
    last = ctx.flow_state.setdefault("PIP-003", {})
    for item in rec.output.scheduled:
        last[item.seq_id] = rec.step
    if rec.mid is not None and rec.mid.in_flight is not None:
        yield from _counter_problems(ctx, rec.mid, "mid-step", rec.step)
    yield from _counter_problems(ctx, rec.after, "after", rec.step)


@invariant(
    "PIP-005", "safety",
    """The engine never fails on an outcome of a request it preempted, aborted or finished while
    the step that carries it was in flight: an outcome of such a request is dropped or applied as
    stale, never a reason to raise.""",
    """An ``AssertionError`` in ``update_from_output`` kills vLLM's ``EngineCore`` and every
    client with it (vllm-project/vllm#48245, #57562, #35755). The runner reports any failed call
    as a fault; this invariant names the failure as PIP-005 when the call was ``update`` and a
    request the failed step may have processed an outcome of (scheduled in one of the last
    pipeline_depth steps) had left the running set since (preempted, aborted or finished), the
    case a pipelined engine must handle and a synchronous one never meets.""",
    at_failure=True,
)
def survives_stale_outcomes(ctx: CheckContext, failure: StepFailure) -> Iterator[str]:
    depth = ctx.config.pipeline_depth
    if failure.call != "update" or depth == 0:
        return
    stale = []
    for rid, steps in ctx.scheduled_in.items():
        in_flight = [t for t in steps if failure.step - depth <= t < failure.step]
        left = ctx.left_at.get(rid)
        if in_flight and left is not None and left[0] >= in_flight[0]:
            stale.append(f"{rid} (scheduled at step {in_flight[0]}, {left[1]} at step {left[0]})")
    if stale:
        yield (f"update failed while an outcome of {', '.join(sorted(stale))} was in flight: {failure.message}")


def _written_blocks(rec: StepRecord, block_size: int) -> dict[str, dict[int, str | None]]:
    """Per sequence the step schedules, the GPU blocks its tokens are written to, with each
    block's key mid-step (None: unkeyed or no keys shown). The step computes the last ``tokens``
    positions before ``num_computed + in_flight_tokens`` (the processed frontier plus every
    in-flight token, this step's included)."""
    mid = rec.mid
    assert mid is not None and mid.seqs is not None and mid.in_flight is not None
    keys = mid.gpu_block_keys
    written: dict[str, dict[int, str | None]] = {}
    for item in rec.output.scheduled:
        view, counters = mid.seqs.get(item.seq_id), mid.in_flight.get(item.seq_id)
        if view is None or counters is None or not view.blocks or view.num_computed is None:
            continue
        end = view.num_computed + counters.in_flight_tokens
        slots = {p // block_size for p in range(max(end - item.num_tokens, 0), end)}
        blocks = [view.blocks[i] for i in sorted(slots) if i < len(view.blocks)]
        written[item.seq_id] = {b: keys[b] if keys is not None and 0 <= b < len(keys) else None for b in blocks}
    return written


def _handed_over(snap: Snapshot, label: str, pending: dict[tuple[int, str], dict[int, str | None]]) -> Iterator[str]:
    assert snap.seqs is not None
    orphans = []
    for (step, sid), blocks in pending.items():
        view = snap.seqs.get(sid)
        held = set(view.blocks or ()) if view is not None and view.device == "gpu" else set()
        orphans += [(step, sid, b, key) for b, key in blocks.items() if b not in held]
    if not orphans:
        return
    free = set(snap.gpu_free_ids or ())
    holders: dict[int, list[str]] = {}
    for sid, view in snap.seqs.items():
        if view.device == "gpu":
            for b in view.blocks or ():
                holders.setdefault(b, []).append(sid)
    keys = snap.gpu_block_keys
    for step, sid, b, key in orphans:
        if b in free:
            yield f"{label}: block {b}, which step {step} writes for {sid}, is free before that step's outcome is in"
            continue
        now = keys[b] if keys is not None and 0 <= b < len(keys) else None
        others = [t for t in holders.get(b, ()) if t != sid]
        if others and (key is None or now != key):  # a prefix hit on the same content is no hand-over
            yield (f"{label}: block {b}, which step {step} writes for {sid}, is in {others[0]}'s table before that "
                   f"step's outcome is in")


@invariant(
    "PIP-004", "safety",
    """A block that an in-flight step writes for a sequence is not handed to another request (nor
    put back in the free pool) before that step's outcome is processed, unless the engine
    declares that its steps run in scheduling order (``ordered_steps``). A prefix hit on the
    block's same content is not a hand-over.""",
    """A KV write still landing in a block that now belongs to another request corrupts that
    request's context silently. A preempted, aborted or finished request's blocks are freed at
    once, while a step that writes them may still run; vLLM relies on the GPU running steps in
    order (a later step writes the block after the earlier write) and defers the free until the
    step returns only where a KV connector may write out of order (``defer_block_free``,
    vllm/v1/core/sched/scheduler.py:189-195, 3077-3105). An engine that cannot promise order
    must fence. The writes of a step are the positions it computes (``in_flight`` tokens past the
    processed frontier, mid-step).""",
    (C.IN_FLIGHT, C.BLOCK_TABLES, C.COMPUTED_TOKENS, C.MID_STEP, C.FREE_LISTS),
    unless=(C.ORDERED_STEPS,),
    about=STEP, when=pipelined_writes,
)
def in_flight_writes_fenced(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    depth = ctx.config.pipeline_depth
    if depth == 0 or rec.mid is None or rec.mid.in_flight is None:
        return
    pending: dict[tuple[int, str], dict[int, str | None]] = ctx.flow_state.setdefault("PIP-004", {})
    for key in [k for k in pending if k[0] < rec.step - depth]:
        del pending[key]
    if before_is_new(ctx, rec):
        yield from _handed_over(rec.before, "before", pending)
    for sid, blocks in _written_blocks(rec, ctx.config.block_size).items():
        pending[(rec.step, sid)] = blocks
    yield from _handed_over(rec.mid, "mid-step", pending)
    for key in [k for k in pending if k[0] < rec.step - depth + 1]:
        del pending[key]
    yield from _handed_over(rec.after, "after", pending)


@invariant(
    "PIP-007", "safety",
    """A request that finishes stopped or length-capped has computed at most ``pipeline_depth``
    positions past its last token: when it finishes, the tokens computed or in flight for it reach
    at most ``num_tokens - 1 + pipeline_depth`` (a synchronous step: ``num_tokens - 1``, the last
    sampled token has no KV; with speculative decoding each in-flight step may also carry its k
    drafts, and the stopping step its k drafts past a stop inside them: ``pipeline_depth * (1 + k) + k``
    for k = num_speculative_tokens).""",
    """An in-flight step cannot be recalled, so the steps scheduled before a stop is known compute
    past it: at most pipeline_depth of them, one position each (vLLM drops their outputs,
    vllm/v1/core/sched/scheduler.py:2327-2334). More is KV written and compute spent past the end
    of the stream, a queue deeper than declared, or a request scheduled again although its
    in-flight token already reaches max_tokens or max_model_len (scheduler.py:800-815). The second
    half of issue 16's "no token after the finish" (PIP-002 is the first); read mid-step, from the
    in-flight counters, in the step that reports the finish.""",
    (C.IN_FLIGHT, C.MID_STEP, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=OUTCOME, when=finishes_delivered_in_flight,
)
def computes_at_most_depth_past_the_end(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    mid = rec.mid
    if mid is None or mid.in_flight is None or mid.seqs is None or rec.after.seqs is None:
        return
    aborted = set(rec.aborted)
    depth = ctx.config.pipeline_depth
    # with speculative decoding each in-flight step computes its next token and up to k drafts, and
    # the step that sampled the stop computed its drafts past a stop inside its accepted run
    k = ctx.config.num_speculative_tokens
    ahead = depth * (1 + k) + k
    for done in rec.finished:
        if done.status not in _DELIVERED or done.request_id in aborted:
            continue
        for v in rec.after.seqs_of(done.request_id):
            planned, counters = mid.seqs.get(v.seq_id), mid.in_flight.get(v.seq_id)
            if planned is None or counters is None or planned.num_computed is None or v.num_tokens is None:
                continue
            computed = planned.num_computed + counters.in_flight_tokens - counters.stale
            if computed > v.num_tokens - 1 + ahead:
                yield (f"{v.seq_id} finished ({done.status.name}) with {v.num_tokens} tokens but {computed} computed or "
                       f"in flight: {computed - v.num_tokens + 1} past its last, pipeline_depth {depth}")
