"""Executable drafts of the pipelined invariants (docs/ASYNC.md, PIP-001..PIP-006), run on a
scheduler in process until `spec/invariants/` gains the family and the wire carries what they read.

`run_by_position` drives a `reference_impl.async_scheduler.AsyncV1Scheduler` (or a mutant
of it) through a trace's arrivals with stops decided by *position* (``stop_at``: sequence ->
the position whose sampled token is a stop), so that runs at different depths sample the same
tokens, and checks after every step:

* PIP-002: no token is appended to a request after its finish; at the end, no request was ever
  counted as computing more than ``depth`` tokens past its last token;
* PIP-003: in-flight counters are never negative, and all are zero when no step is in flight;
* PIP-005: ``update()`` never raises (an assert in the engine's outcome path is how vLLM's
  EngineCore dies: #48245, #57562, #35755);
* PIP-006: a finish is reported at most ``depth`` steps after the step that sampled the
  request's last token.

`problems` compares a run with the depth-0 run of the same trace for PIP-001 (each request's
delivered tokens and final status). PIP-004 needs block-write bookkeeping the reference does not
have yet (see docs/ASYNC.md). Messages start with the invariant's ID.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from spec.config import SchedulerConfig
from spec.status import Status
from spec.trace import Trace
from spec.types import StepOutcome

Make = Callable[[SchedulerConfig], object]  # -> a AsyncV1Scheduler (or a mutant of it)


@dataclass
class AsyncRun:
    """What one run delivered, and the PIP problems seen while it ran."""

    streams: dict[str, tuple[tuple[int, ...], Status | None]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def position_stops(trace: Trace) -> dict[str, int]:
    """The trace's stops as positions: a stop ``k`` steps after a request's arrival stops the
    token at ``prompt_len + k`` (some position per stopped request, the same at every depth)."""
    arrivals = {a.request.request_id: a for a in trace.arrivals}
    stop_at: dict[str, int] = {}
    for step, seq in trace.stops:
        arrival = arrivals.get(seq.rsplit("#", 1)[0])
        if arrival is not None:
            stop_at.setdefault(seq, arrival.request.prompt_len + max(step - arrival.step, 0))
    return stop_at


def run_by_position(make: Make, trace: Trace, stop_at: dict[str, int], *, aborts: bool = False) -> AsyncRun:
    scheduler = make(trace.config)
    depth: int = scheduler.depth  # type: ignore[attr-defined]
    run = AsyncRun()
    most_computed: dict[str, int] = {}
    last_sample: dict[str, int] = {}  # request -> the last step that sampled a token for it
    finals: dict[str, Status] = {}
    finished_len: dict[str, int] = {}
    for step in range(trace.max_steps * 3 + 10):
        for request in trace.arrivals_at(step):
            scheduler.add_request(request)  # type: ignore[attr-defined]
        for rid in trace.aborts_at(step) if aborts else ():
            done = scheduler.abort_request(rid)  # type: ignore[attr-defined]
            if done is not None:
                finals[rid] = done.status
                finished_len[rid] = scheduler.requests[rid].num_tokens  # type: ignore[attr-defined]
        try:
            scheduler.schedule()  # type: ignore[attr-defined]
            samples = scheduler.samples_of_last_step()  # type: ignore[attr-defined]
            for seq in samples:
                last_sample[seq.rsplit("#", 1)[0]] = step
            stopped = frozenset(seq for seq, position in samples.items() if stop_at.get(seq) == position)
            done_now = scheduler.update(StepOutcome(stopped))  # type: ignore[attr-defined]
        except Exception as err:  # noqa: BLE001 - any failure in the outcome path is the finding
            run.problems.append(f"PIP-005 at step {step}: the scheduler raised {type(err).__name__}: {err}")
            return run
        requests = scheduler.requests  # type: ignore[attr-defined]
        for done in done_now:
            rid = done.request_id
            if rid in finals:
                run.problems.append(f"PIP-002 at step {step}: {rid} finished twice")
            finals[rid] = done.status
            finished_len[rid] = requests[rid].num_tokens
            if done.status is not Status.FINISHED_IGNORED and step - last_sample.get(rid, step) > depth:
                run.problems.append(f"PIP-006 at step {step}: {rid}'s finish came {step - last_sample[rid]} steps "
                                    f"after its last token was sampled, depth {depth}")
        for rid, tracked in requests.items():
            most_computed[rid] = max(most_computed.get(rid, 0), tracked.num_computed)
            if rid in finished_len and tracked.num_tokens != finished_len[rid]:
                run.problems.append(f"PIP-002 at step {step}: {rid} got a token after its finish "
                                    f"({finished_len[rid]} -> {tracked.num_tokens} tokens)")
                finished_len[rid] = tracked.num_tokens
        counters = scheduler.counters  # type: ignore[attr-defined]
        for rid, c in counters.items():
            if min(c.num_placeholders, c.num_in_flight, c.num_stale) < 0:
                run.problems.append(f"PIP-003 at step {step}: {rid} in-flight counters below zero: {c}")
        if not scheduler.in_flight and any(  # type: ignore[attr-defined]
                c.num_placeholders or c.num_in_flight or c.num_stale for c in counters.values()):
            busy = {rid: c for rid, c in counters.items() if c.num_placeholders or c.num_in_flight or c.num_stale}
            run.problems.append(f"PIP-003 at step {step}: nothing in flight, yet {busy}")
        if step >= trace.last_arrival_step and len(finals) == len(trace.arrivals):
            break
    for rid, tracked in scheduler.requests.items():  # type: ignore[attr-defined]
        run.streams[rid] = (tuple(tracked.tokens[tracked.request.prompt_len:]), finals.get(rid))
        if tracked.status is not Status.FINISHED_IGNORED and most_computed.get(rid, 0) > tracked.num_tokens - 1 + depth:
            run.problems.append(f"PIP-002: {rid} was counted computing {most_computed[rid]} tokens, "
                                f"{tracked.num_tokens} tokens at the end, depth {depth}")
    return run


def problems(make: Make, trace: Trace, stop_at: dict[str, int] | None = None) -> list[str]:
    """Every PIP problem of ``make``'s scheduler on ``trace``: its own run's, then PIP-001 against
    the depth-0 reference (aborts left out: their timing legitimately cuts streams differently)."""
    from reference_impl.async_scheduler import AsyncV1Scheduler

    stop_at = position_stops(trace) if stop_at is None else stop_at
    run = run_by_position(make, trace, stop_at)
    found = list(run.problems)
    if not any(p.startswith("PIP-005") for p in found):
        sync = run_by_position(lambda config: AsyncV1Scheduler(config, depth=0), trace, stop_at)
        for rid, want in sync.streams.items():
            got = run.streams.get(rid)
            if got != want:
                found.append(f"PIP-001: {rid} delivered {got}, the synchronous run {want}")
                break
    return found
