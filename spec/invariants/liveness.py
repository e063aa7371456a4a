"""Liveness: the scheduler keeps making progress, and every request finishes."""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import admitted
from spec.invariants.connector import admitted_or_loading, held_by_transfer
from spec.invariants.grammar import grammar_pending
from spec.invariants.sessions import passed_over_for_input
from spec.invariants.triggers import finishes_aborted, only_waiting, requests_added, runnable_work
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import OUTCOME, SCHEDULE, STEP, CheckContext, invariant
from spec.status import Status


@invariant(
    "LIV-001", "liveness",
    """Every step with unfinished requests makes progress: it schedules a token, ignores a request,
    ends one with an engine error (REQ-007), or preempts one to free blocks, or (pipeline_depth > 0) a step at most
    pipeline_depth steps earlier scheduled one, whose outcome is still in flight, or a KV connector's transfer is in
    flight (or started) in it; or the engine is paused (a paused_all snapshot before schedule(), or paused_new with
    nothing running).""",
    """Seed 000 §3.1: 'you cannot leave the 4 tables empty while guests wait'. A step that does
    nothing with work queued repeats forever, since nothing changes before the next one.""",
    (C.QUEUES,),
    about=STEP, when=runnable_work,
)
def progress(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    queued = any(rec.before.queue(q) for q in ("waiting", "running", "swapped"))
    pause = rec.before.pause_state
    if pause == "paused_all" or (pause == "paused_new" and not rec.before.running):
        queued = False  # the caller stopped the work (PAU-001)
    elif queued and not rec.before.running and not rec.before.swapped and \
            all(grammar_pending(ctx, rid, rec.step) or passed_over_for_input(ctx, rec, rid) for rid in rec.before.waiting or ()):
        queued = False  # every waiting request waits for its grammar (GRM-002) or its next input (SES-001)
    out = rec.output
    # The async flow: a step may wait for an in-flight outcome (every running request's tokens are
    # in flight up to its limit); a step scheduled within pipeline_depth steps is still progress.
    seen = ctx.flow_state.setdefault("LIV-001", {})
    if out.scheduled:
        seen["last"] = rec.step
    in_flight = ctx.config.pipeline_depth and rec.step - seen.get("last", -1 - ctx.config.pipeline_depth) <= \
        ctx.config.pipeline_depth
    # A KV connector's transfer in flight (or started by the step) is work the step waits on.
    transfer = held_by_transfer(rec.before, rec.mid)
    if queued and not (out.scheduled or out.ignored or out.preempted or in_flight or transfer or engine_ended(ctx, rec)):
        yield (
            f"nothing scheduled, ignored or preempted with waiting={list(rec.before.waiting or ())} "
            f"running={list(rec.before.running or ())} swapped={list(rec.before.swapped or ())}"
        )


@invariant(
    "LIV-002", "liveness",
    "Every request finishes within a bounded number of steps after the last arrival.",
    """With every infeasible request ignored, FCFS preemption always lets the most urgent request
    run, so each generated token costs at most a bounded number of steps; the bound used is
    (R + 2) * (sum of n * max_tokens + R + 2) for R requests.""",
    at_end=True,
    when=requests_added,
)
def bounded_completion(ctx: CheckContext) -> Iterator[str]:
    if ctx.drained:
        return
    bound = completion_bound_for(ctx)
    if ctx.steps - ctx.last_arrival_step >= bound:
        unfinished = sorted(set(ctx.requests) - set(ctx.finished))
        yield f"{len(unfinished)} request(s) {unfinished[:5]} unfinished {ctx.steps - ctx.last_arrival_step} steps after the last arrival (bound {bound})"


def completion_bound_for(ctx: CheckContext) -> int:
    """Steps after the last arrival within which every request must have finished."""
    requests = list(ctx.requests.values())
    tokens = sum(r.n * r.max_tokens for r in requests)
    # a session's later inputs (spec/session.py): each adds its tokens, and may come after the last arrival
    tokens += sum(p.prompt_len + p.max_tokens + max(p.step - ctx.last_arrival_step, 0) for r in requests for p in r.session)
    if ctx.config.enable_chunked_prefill:
        # each (re)prefill may take one step per chunk; a chunk is at least what the budget
        # leaves after one decode per other running sequence
        chunk = max(1, ctx.config.max_num_batched_tokens - ctx.config.max_num_seqs + 1)
        if ctx.config.long_prefill_token_threshold:
            chunk = min(chunk, ctx.config.long_prefill_token_threshold)
        tokens += sum(r.n * (-(-(r.prompt_len + r.max_tokens) // chunk)) for r in requests)
    return (len(requests) + 2) * (tokens + len(requests) + 2)


@invariant(
    "LIV-003", "liveness",
    "An idle engine never leaves its waiting head waiting: with nothing running or swapped, the head is admitted or ignored (or ended with an engine error).",
    """With nothing running, every block is free, so a head that does not fit now never will: it
    must be ignored, not left to block the queue forever (vLLM PR #2163 and the AllocStatus.NEVER
    rule). An engine that holds blocks back for in-flight writes (``Snapshot.gpu_fenced``,
    PIP-004), or a step in flight (``Snapshot.in_flight``: its outcome may free blocks or be a
    preempted request's that must return first), is not idle until they are back. Under the
    ``lpm`` policy the waiting order is decided in the step itself (the longest cached prefix
    first, SGLang's ``SchedulePolicy.calc_priority``), so the queue before the step names no head:
    an idle engine must then admit or ignore some waiting request. A paused engine (Snapshot.pause_state)
    is not idle but stopped by its caller (PAU-001), and one with a KV connector's transfer in flight
    (``Snapshot.kv_transfers``) is not idle until it reports; a head that starts an asynchronous load
    is served (KVC-009 says it then progresses).""",
    (C.QUEUES,),
    about=SCHEDULE, when=only_waiting,
)
def idle_head_served(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    waiting = rec.before.waiting or ()
    in_flight = rec.before.in_flight is not None and any(c.in_flight_tokens for c in rec.before.in_flight.values())
    paused = rec.before.pause_state not in (None, "unpaused")
    busy = held_by_transfer(rec.before)  # a KV connector's transfer in flight may still free blocks
    waiting = tuple(rid for rid in waiting if not grammar_pending(ctx, rid, rec.step)  # passed over (GRM-002, SES-001)
                    and not passed_over_for_input(ctx, rec, rid))
    if waiting and not rec.before.running and not rec.before.swapped and not rec.before.gpu_fenced and not in_flight \
            and not paused and not busy:
        head = waiting[0]
        if ctx.config.policy == "lpm":
            if not set(waiting) & (set(admitted(rec)) | set(rec.output.ignored) | engine_ended(ctx, rec)):
                yield f"engine idle, yet no waiting request (head {head} before lpm's order) was admitted or ignored"
        elif head not in admitted_or_loading(rec) and head not in rec.output.ignored and head not in engine_ended(ctx, rec):
            yield f"engine idle, yet waiting head {head} was neither admitted nor ignored"


def engine_ended(ctx: CheckContext, rec: StepRecord) -> set[str]:
    """The requests the engine itself ended in this step: finished as aborted, unasked (REQ-007)."""
    return {f.request_id for f in rec.finished
            if f.status is Status.FINISHED_ABORTED and f.request_id not in ctx.client_aborted}


def fits(ctx: CheckContext, request_id: str) -> bool:
    """Whether the request can run alone to its length: its whole completion, every sequence of
    it, within the prompt limit (so that a recompute can prefill the group again: vLLM V0 counts
    all its sequences' tokens against the limit) and (every sequence at its length) within the
    GPU blocks above the watermark, and its sequences within max_num_seqs."""
    request = ctx.requests.get(request_id)
    if request is None:
        return False
    c = ctx.config
    whole = c.blocks_for(min(request.prompt_len + request.max_tokens, c.max_model_len))
    return (request.prompt_len <= c.prompt_limit
            and request.n * min(request.prompt_len + request.max_tokens - 1, c.max_model_len) <= c.prompt_limit and request.n * whole <= c.num_gpu_blocks - c.watermark_blocks
            and request.n <= c.max_num_seqs)


@invariant(
    "LIV-004", "liveness",
    """A request that fits (its prompt within the prompt limit, its whole completion within the
    cache, its sequences within max_num_seqs) is never ended by an engine error.""",
    """The liveness half of issue 34's engine-initiated ends (REQ-007 is the safety half: say so
    when you end one). An engine that runs out of blocks and ends the requests of a pass, or
    ignores a request it could serve alone, never completes work a correct scheduler would:
    preemption frees the blocks any one fitting request needs. A request that does not fit may be
    ended with an engine_error; the client's own aborts are not the engine's. Ignores and refusals
    are left to LEN-003 and LIV-003: an engine states limits of its own there (SGLang's input
    limit of max_req_len - 5, vLLM V0's ignore of a recomputed group past the prompt limit).""",
    about=OUTCOME, when=finishes_aborted,
)
def fitting_requests_are_served(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for f in rec.finished:
        unasked = f.status is Status.FINISHED_ABORTED and f.request_id not in ctx.client_aborted
        if unasked and fits(ctx, f.request_id):
            request = ctx.requests[f.request_id]
            yield (f"{f.request_id} (prompt {request.prompt_len}, max_tokens {request.max_tokens}, n {request.n}) "
                   f"fits the cache but the engine ended it as {f.status.value}"
                   + (f": {f.reason.text()}" if f.reason else ""))
