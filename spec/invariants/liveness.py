"""Liveness: the scheduler keeps making progress, and every request finishes."""

from __future__ import annotations

from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import admitted
from spec.observation import Capability as C
from spec.observation import StepRecord


@invariant(
    "LIV-001", "liveness",
    """Every step with unfinished requests makes progress: it schedules a token, ignores a request,
    or preempts one to free blocks, or (pipeline_depth > 0) a step at most pipeline_depth steps
    earlier scheduled one, whose outcome is still in flight; or the engine is paused (a paused_all
    snapshot before schedule(), or paused_new with nothing running).""",
    """Seed 000 §3.1: 'you cannot leave the 4 tables empty while guests wait'. A step that does
    nothing with work queued repeats forever, since nothing changes before the next one.""",
    (C.QUEUES,),
)
def progress(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    queued = any(rec.before.queue(q) for q in ("waiting", "running", "swapped"))
    pause = rec.before.pause_state
    if pause == "paused_all" or (pause == "paused_new" and not rec.before.running):
        queued = False  # the caller stopped the work (PAU-001)
    out = rec.output
    # The async flow: a step may wait for an in-flight outcome (every running request's tokens are
    # in flight up to its limit); a step scheduled within pipeline_depth steps is still progress.
    seen = ctx.flow_state.setdefault("LIV-001", {})
    if out.scheduled:
        seen["last"] = rec.step
    in_flight = ctx.config.pipeline_depth and rec.step - seen.get("last", -1 - ctx.config.pipeline_depth) <= \
        ctx.config.pipeline_depth
    if queued and not (out.scheduled or out.ignored or out.preempted or in_flight):
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
    "An idle engine never leaves its waiting head waiting: with nothing running or swapped, the head is admitted or ignored.",
    """With nothing running, every block is free, so a head that does not fit now never will: it
    must be ignored, not left to block the queue forever (vLLM PR #2163 and the AllocStatus.NEVER
    rule). An engine that holds blocks back for in-flight writes (``Snapshot.gpu_fenced``,
    PIP-004), or a step in flight (``Snapshot.in_flight``: its outcome may free blocks or be a
    preempted request's that must return first), is not idle until they are back. Under the
    ``lpm`` policy the waiting order is decided in the step itself (the longest cached prefix
    first, SGLang's ``SchedulePolicy.calc_priority``), so the queue before the step names no head:
    an idle engine must then admit or ignore some waiting request. A paused engine (Snapshot.pause_state)
    is not idle but stopped by its caller (PAU-001).""",
    (C.QUEUES,),
)
def idle_head_served(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    waiting = rec.before.waiting or ()
    in_flight = rec.before.in_flight is not None and any(c.in_flight_tokens for c in rec.before.in_flight.values())
    paused = rec.before.pause_state not in (None, "unpaused")
    if waiting and not rec.before.running and not rec.before.swapped and not rec.before.gpu_fenced and not in_flight \
            and not paused:
        head = waiting[0]
        if ctx.config.policy == "lpm":
            if not set(waiting) & (set(admitted(rec)) | set(rec.output.ignored)):
                yield f"engine idle, yet no waiting request (head {head} before lpm's order) was admitted or ignored"
        elif head not in admitted(rec) and head not in rec.output.ignored:
            yield f"engine idle, yet waiting head {head} was neither admitted nor ignored"
