"""Streaming-input sessions (issue 32; spec/session.py): the trace field, the V1 reference's waits
and resumes, and SES-003's eviction of an idle session's KV. Each test runs one small trace."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from conformance.flows.profiles import get_profile
from conformance.selftest.mutants import violated
from conformance.selftest.mutants_budgets import SessionKeepsKV
from reference_impl.engine import run_trace
from reference_impl.v1_scheduler import V1Scheduler
from spec.catalogue import Checker
from spec.config import SchedulerConfig
from spec.encoder import EncoderInput
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
    data["requests"][0]["session"]["version"] = 3
    with pytest.raises(InputError, match=r"requests\[0\]\.session\.version"):
        Trace.from_dict(data)
    data["requests"][0]["session"]["version"] = 1
    data["requests"][0]["session"]["inputs"][0]["encoder_inputs"] = [{"position": 0, "length": 2, "hash": "a"}]
    with pytest.raises(InputError, match=r"session\.inputs\[0\]"):  # a piece's encoder inputs need version 2
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


def test_a_later_input_carries_encoder_inputs_where_its_tokens_land():
    """A piece's encoder inputs (version 2) join the session's once taken up, moved to where the piece's
    first token lands (its last sampled token dropped: vLLM's ``offset + base``, scheduler.py:1899-1905);
    the checker places them the same way (`CheckContext.encoder_inputs`), so ENC-001..004 read them."""
    config = replace(_config(), encoder_compute_budget=4, encoder_cache_size=4, enable_chunked_prefill=True)
    piece = InputPiece(6, 4, 2, encoder_inputs=(EncoderInput(1, 2, "a"),))
    trace = Trace(config, (Arrival(0, Request("s", 6, 2, session=(piece,))),), max_steps=40)
    data = json.loads(trace.to_json())
    assert data["requests"][0]["session"] == {"version": 2, "inputs": [
        {"step": 6, "prompt_len": 4, "max_tokens": 2, "encoder_inputs": [{"position": 1, "length": 2, "hash": "a"}]}]}
    assert Trace.from_dict(data).arrivals == trace.arrivals
    run = run_trace(trace, V1Scheduler)
    assert run.drained and violated(V1Scheduler, trace, invariants=INVARIANTS) == set()
    # 6 prompt tokens and 2 generated, the last dropped: the piece lands at 7, its input at 8..9
    computed = [(r.step, r.output.encoder_inputs) for r in run.records if r.output.encoder_inputs]
    assert [inputs for _, inputs in computed] == [(("s", 0),)]
    record = next(r for r in run.records if r.step == computed[0][0])
    assert record.mid.encoder_cache["a"].users == frozenset({"s"})  # held while its chunk runs
    assert record.after.encoder_cache["a"].users == frozenset()  # consumed in that chunk, let go after it
    checker = Checker(config, V1Scheduler.capabilities, INVARIANTS)
    for record in run.records:
        checker.check_step(record)
    assert checker.context.session_encoder_inputs["s"] == (EncoderInput(8, 2, "a"),)


class _ShowsSessionInputs(V1Scheduler):
    """The reference, keeping each unfinished session's encoder inputs after every snapshot."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.inputs_after: dict[int, dict[str, tuple]] = {}

    def snapshot(self):  # type: ignore[no-untyped-def]
        self.inputs_after[self._step] = {rid: t.request.encoder_inputs for rid, t in self.requests.items()
                                         if t.request.session and not t.status.is_finished}
        return super().snapshot()


@pytest.mark.parametrize("depth", [0, 1])
def test_the_checker_places_taken_up_encoder_inputs_as_the_reference_does(depth):
    """`note_session_inputs` reads a take-up from the snapshots alone; on drawn sessions whose later
    inputs carry encoder inputs it places them where the reference put them, after every step."""
    from conformance.generation.budgets import mixed_session_traces
    from conformance.generation.v0 import sample_traces
    from reference_impl.async_scheduler import AsyncV1Scheduler

    base = _ShowsSessionInputs if not depth else type("_AsyncShows", (_ShowsSessionInputs, AsyncV1Scheduler), {})
    compared = 0
    for trace in sample_traces(mixed_session_traces(), 40, 20261204):
        if not any(p.encoder_inputs for a in trace.arrivals for p in a.request.session):
            continue
        trace = replace(trace, config=replace(trace.config, pipeline_depth=depth))
        scheduler = base(trace.config)
        run = run_trace(trace, lambda config, made=scheduler: made)
        checker = Checker(trace.config, base.capabilities, [])
        for record in run.records:
            checker.check_step(record)
            # the snapshot after the step is the last one the reference took in it (its step count moved on)
            shown = scheduler.inputs_after.get(record.step + 1, scheduler.inputs_after.get(record.step, {}))
            for rid in checker.context.piece_encoded - set(checker.context.finished):
                if rid in shown:
                    assert checker.context.encoder_inputs(rid) == shown[rid], (record.step, rid)
                    compared += bool(checker.context.inputs_taken.get(rid))
    assert compared > 20, compared
