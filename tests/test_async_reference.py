"""The pipelined V1 reference (reference_impl/async_scheduler.py): depth 0 is the V1 reference,
and at depth 1 and 2 the client receives the same token stream as a synchronous run that samples
the same tokens (docs/ASYNC.md PIP-001..PIP-006 as drafted in conformance/selftest/async_checks.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.generation.v1 import token_traces
from conformance.selftest.async_checks import problems
from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.status import Status
from spec.trace import Trace
from spec.types import Request, StepOutcome

FUZZ = settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def cfg(**kw) -> SchedulerConfig:
    base = dict(block_size=2, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=16,
                max_model_len=32, watermark=0.0, preemption_mode="recompute")
    return SchedulerConfig(**{**base, **kw})


def decisions(output):
    return ([(s.seq_id, s.num_tokens, s.is_prefill) for s in output.scheduled],
            [p.request_id for p in output.preempted], list(output.ignored))


# ------------------------------------------------------------------------------ depth 0 is V1
@FUZZ
@given(token_traces("v1"))
def test_depth_0_is_the_v1_reference_step_for_step(trace: Trace) -> None:
    v1, pipelined = V1Scheduler(trace.config), AsyncV1Scheduler(trace.config, depth=0)
    for step in range(trace.max_steps):
        for request in trace.arrivals_at(step):
            v1.add_request(request)
            pipelined.add_request(request)
        for rid in trace.aborts_at(step):
            assert v1.abort_request(rid) == pipelined.abort_request(rid)
        assert decisions(v1.schedule()) == decisions(pipelined.schedule()), f"step {step}"
        assert pipelined.snapshot().seqs == v1.snapshot().seqs, f"step {step}, mid-step"
        outcome = StepOutcome(trace.stops_at(step))
        assert [(f.request_id, f.status) for f in v1.update(outcome)] == \
               [(f.request_id, f.status) for f in pipelined.update(outcome)], f"step {step}"
        want, got = v1.snapshot(), pipelined.snapshot()
        assert (got.seqs, got.waiting, got.running, got.gpu_free_ids, got.gpu_block_keys) == \
               (want.seqs, want.waiting, want.running, want.gpu_free_ids, want.gpu_block_keys), f"step {step}"


# ------------------------------------------------------------------------------ depth 1 and 2
@st.composite
def position_stopped_traces(draw: st.DrawFn) -> tuple[Trace, dict[str, int]]:
    trace = draw(token_traces("v1", allow_aborts=False))
    stop_at = {}
    for arrival in trace.arrivals:
        if draw(st.booleans()):
            stop_at[f"{arrival.request.request_id}#0"] = arrival.request.prompt_len + draw(st.integers(0, 10))
    return trace, stop_at


@FUZZ
@given(position_stopped_traces(), st.sampled_from([1, 2]))
def test_async_stream_equals_the_synchronous_stream(case, depth: int) -> None:
    """PIP-001 (stream), PIP-002 (nothing after a finish, at most `depth` tokens computed past
    the end), PIP-003 (counters), PIP-005 (no failure), PIP-006 (finish latency), as drafted in
    conformance/selftest/async_checks.py."""
    trace, stop_at = case
    assert problems(lambda config: AsyncV1Scheduler(config, depth=depth), trace, stop_at) == []


@FUZZ
@given(token_traces("v1"), st.sampled_from([1, 2]))
def test_every_request_finishes_once_with_aborts_and_stops(trace: Trace, depth: int) -> None:
    """PIP-005 on the reference: outcomes of aborted and preempted requests are taken in stride."""
    scheduler = AsyncV1Scheduler(trace.config, depth=depth)
    finished: list[str] = []
    for step in range(trace.max_steps * 3 + 10):
        for request in trace.arrivals_at(step):
            scheduler.add_request(request)
        for rid in trace.aborts_at(step):
            done = scheduler.abort_request(rid)
            finished.extend([done.request_id] if done else [])
        scheduler.schedule()
        finished.extend(f.request_id for f in scheduler.update(StepOutcome(trace.stops_at(step))))
        if step >= trace.last_arrival_step and len(set(finished)) == len(trace.arrivals):
            break
    assert sorted(finished) == sorted(a.request.request_id for a in trace.arrivals)


# ------------------------------------------------------------------------------ worked example
def test_one_request_at_depth_1_finishes_one_step_late_and_computes_nothing_past_max_tokens() -> None:
    """A 4-token prompt with max_tokens 3: the synchronous flow finishes it in step 2 (prefill,
    decode, decode); at depth 1 the outcome of step 2 is processed in step 3, and step 3
    schedules nothing for it (its in-flight token is its last: scheduler.py:800-815)."""
    config = cfg()
    request = Request("a", prompt_len=4, max_tokens=3)
    scheduled, finishes = [], []
    for depth in (0, 1):
        scheduler = AsyncV1Scheduler(config, depth=depth)
        scheduler.add_request(request)
        steps, done_at = [], None
        for step in range(6):
            steps.append(decisions(scheduler.schedule())[0])
            if scheduler.update(StepOutcome()):
                done_at = step
        scheduled.append(steps)
        finishes.append(done_at)
    assert finishes == [2, 3]
    assert scheduled[0][:3] == scheduled[1][:3] == [[("a#0", 4, True)], [("a#0", 1, False)], [("a#0", 1, False)]]
    assert scheduled[1][3] == []


def test_a_stop_at_depth_1_costs_one_token_that_is_never_delivered() -> None:
    config = cfg()
    scheduler = AsyncV1Scheduler(config, depth=1)
    scheduler.add_request(Request("a", prompt_len=4, max_tokens=10))
    scheduler.schedule()
    scheduler.update(StepOutcome())  # step 0: prefill, its token in flight
    scheduler.schedule()  # step 1: decodes position 4 before step 0's token is known
    assert scheduler.update(StepOutcome(frozenset({"a#0"}))) == []  # step 1's token is a stop; step 0 processed
    output = scheduler.schedule()  # step 2: the stop is still in flight, one more token is computed
    assert decisions(output)[0] == [("a#0", 1, False)]
    [done] = scheduler.update(StepOutcome())  # step 1's outcome: stopped; step 2's token is dropped
    assert done.status is Status.FINISHED_STOPPED
    assert len(scheduler.requests["a"].tokens) == 6  # prompt 4, token of step 0, the stop token of step 1
    scheduler.schedule()
    assert scheduler.update(StepOutcome()) == []
    assert not scheduler.in_flight or all(e == [] for e in (s.entries for s in scheduler.in_flight))


def test_depth_is_bounded() -> None:
    with pytest.raises(ValueError, match="depth"):
        AsyncV1Scheduler(cfg(), depth=3)


def test_safety_holds_for_a_correct_pipelined_scheduler(tmp_path):
    """`safety` holds for every correct scheduler: the async reference at depth 1 (vLLM's default
    pipelining) passes it, the invariants that assume a synchronous step being checked on the step
    as planned (`spec.planned_view`) or, where that cannot say them, not applicable there
    (`Invariant.synchronous`, `Invariant.planned`) rather than false failures."""
    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import load_adapter
    from conformance.runner.fuzz import fuzz
    from conformance.runner.plan import RunPlan

    result = fuzz(lambda: load_adapter("reference-async"), RunPlan(get_profile("safety"), max_examples=60, seed=4, out_dir=tmp_path))
    assert result.examples == 60 and not result.findings, {p: f.message for p, f in result.findings.items()}
    assert "REQ-004" in result.not_applicable
    assert not {"BUD-004", "CAP-001", "CAP-002", "CAP-003", "CHK-004", "LEN-001", "PFX-001"} & set(result.not_applicable)
