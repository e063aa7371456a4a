"""Streaming-input sessions (issue 32; spec/session.py): the trace field, the V1 reference's waits
and resumes, and SES-003's eviction of an idle session's KV. Each test runs one small trace."""

from __future__ import annotations

import json

import pytest

from conformance.flows.profiles import get_profile
from conformance.selftest.mutants import violated
from conformance.selftest.mutants_budgets import SessionKeepsKV
from reference_impl.engine import run_trace
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.lifecycle import coverage
from spec.session import InputPiece, piece_tokens
from spec.status import Status
from spec.trace import Arrival, Trace
from spec.types import Request, generated_token

INVARIANTS = get_profile("vllm-v1").invariants()


def _config(**extra) -> SchedulerConfig:
    base = dict(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=32,
                max_model_len=48, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True)
    return SchedulerConfig(**{**base, **extra})


def test_the_session_field_round_trips_and_older_traces_read_unchanged():
    session = Request("s", 4, 2, session=(InputPiece(3, 5, 2), InputPiece(9, 1, 1)))
    trace = Trace(_config(), (Arrival(0, session), Arrival(1, Request("p", 3, 1))), max_steps=50)
    data = json.loads(trace.to_json())
    assert data["requests"][0]["session"] == {"version": 1, "inputs": [
        {"step": 3, "prompt_len": 5, "max_tokens": 2}, {"step": 9, "prompt_len": 1, "max_tokens": 1}]}
    assert "session" not in data["requests"][1]  # a plain request's dict is what it was
    assert Trace.from_dict(data).arrivals == trace.arrivals
    data["requests"][0]["session"]["version"] = 2
    with pytest.raises(InputError, match=r"requests\[0\]\.session\.version"):
        Trace.from_dict(data)
    data["requests"][0]["session"] = {"version": 1, "inputs": [{"step": 5, "prompt_len": 1, "max_tokens": 1},
                                                               {"step": 2, "prompt_len": 1, "max_tokens": 1}]}
    with pytest.raises(InputError, match="before input 0"):
        Trace.from_dict(data)


def test_a_session_waits_for_its_input_holding_its_kv_then_resumes_and_finishes():
    """SES-001: the session generates its max_tokens, then is WAITING_FOR_INPUT (not scheduled, its
    blocks kept) until the input's step; it then computes only the input (its last sampled token
    dropped for the input's tokens) and finishes after its last input's max_tokens."""
    trace = Trace(_config(), (Arrival(0, Request("s", 6, 2, session=(InputPiece(6, 3, 2),))),), max_steps=40)
    run = run_trace(trace, V1Scheduler)
    assert run.drained and violated(V1Scheduler, trace, invariants=INVARIANTS) == set()
    waiting = [r for r in run.records if r.after.statuses["s"] is Status.WAITING_FOR_INPUT]
    assert [r.step for r in waiting] == [1, 2, 3, 4, 5]
    assert all(r.after.seqs["s#0"].blocks for r in waiting)  # its KV kept while it waits
    assert not any(r.output.scheduled for r in run.records if 1 < r.step < 6)
    resumed = run.records[6]
    assert [(s.request_id, s.num_tokens) for s in resumed.output.scheduled] == [("s", 3)]  # only the input: the rest is computed
    tokens = run.records[-1].after.seqs["s#0"].token_ids
    assert tokens[:7] == (0, 1, 2, 3, 4, 5, generated_token("s", 0, 6))  # the prompt, the kept sample
    assert tokens[7:10] == piece_tokens(0, 3)  # the input, where the dropped sample was
    assert run.records[-1].finished[0].status is Status.FINISHED_LENGTH_CAPPED and len(tokens) == 12


def test_an_input_that_arrives_while_the_session_runs_is_taken_up_at_its_stop():
    trace = Trace(_config(), (Arrival(0, Request("s", 6, 3, session=(InputPiece(1, 2, 1),))),), max_steps=40)
    run = run_trace(trace, V1Scheduler)
    assert run.drained and violated(V1Scheduler, trace, invariants=INVARIANTS) == set()
    assert Status.WAITING_FOR_INPUT not in {s for r in run.records for s in r.after.statuses.values()}
    # its RUNNING -> WAITING is the session's take_input, not a preemption (spec.lifecycle)
    counts = coverage(run.records)
    assert counts[("RUNNING", "WAITING", "take_input")] == 1
    assert counts[("RUNNING", "WAITING", "preempt_recompute")] == 0


def test_transition_coverage_tells_a_recompute_preemption_from_a_taken_input():
    # two prompts that outgrow 4 blocks of 4 slots: the later one is preempted by recompute
    config = _config(num_gpu_blocks=4, max_model_len=16)
    trace = Trace(config, (Arrival(0, Request("a", 6, 8)), Arrival(0, Request("b", 6, 8))), max_steps=80)
    run = run_trace(trace, V1Scheduler)
    assert any(r.output.preempted for r in run.records)
    counts = coverage(run.records)
    assert counts[("RUNNING", "WAITING", "preempt_recompute")] >= 1
    assert counts[("RUNNING", "WAITING", "take_input")] == 0


def _stall() -> Trace:
    """Session A holds 7 of 8 blocks waiting for an input at step 12; B needs 5 of them."""
    a = Request("A", 26, 1, session=(InputPiece(12, 2, 1),))
    return Trace(_config(num_gpu_blocks=8, max_model_len=32), (Arrival(0, a), Arrival(2, Request("B", 17, 2))),
                 max_steps=60)


def test_an_idle_session_gives_its_kv_back_to_a_request_that_needs_it():
    """SES-003: the reference frees A's KV when B cannot run without it; vLLM's rule (A keeps it)
    leaves the engine idle until A's input comes."""
    trace = _stall()
    run = run_trace(trace, V1Scheduler)
    assert run.drained and violated(V1Scheduler, trace, invariants=INVARIANTS) == set()
    assert [x.request_id for x in run.records[2].output.reasons if x.kind == "evicted_idle_session"] == ["A"]
    assert {"SES-003", "LIV-001", "LIV-003"} <= violated(SessionKeepsKV, trace, invariants=INVARIANTS)


def test_a_stopped_turn_holding_no_kv_joins_waiting_last():
    """vLLM enqueues a session whose turn stopped by whether it holds KV (`_enqueue_waiting_request`,
    scheduler.py:2709-2715): with ``num_computed_tokens`` 0 it goes to the tail of the plain waiting
    queue, behind a request that arrived in the same step, not to the KV-holding front."""
    from pathlib import Path

    from reference_impl.async_scheduler import AsyncV1Scheduler

    trace = Trace.load(Path(__file__).resolve().parent.parent / "docs" / "traces" / "async" /
                       "session-without-kv-joins-waiting-last.json")
    run = run_trace(trace, lambda c: AsyncV1Scheduler(c, c.pipeline_depth))
    after = run.records[4].after
    assert after.statuses["r2"] is Status.WAITING_FOR_INPUT and not after.seqs["r2#0"].blocks
    assert after.waiting == ("r3", "r2")
