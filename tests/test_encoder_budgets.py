"""Issue 32: the encoder budget and cache, LoRA slots and pause, in the spec and the V1 reference.

The reference with none of the new config fields set is the V1 reference of before, step for step
(tests/data/v1_unchanged_runs.json: 40 V1 traces and the digests of their outputs, recorded at
840b409 before these features existed)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.selftest.mutants import violated
from reference_impl.engine import run_trace
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.encoder import EncoderInput
from spec.errors import InputError
from spec.trace import Arrival, Trace
from spec.types import Request

RUNS = json.loads((Path(__file__).parent / "data" / "v1_unchanged_runs.json").read_text())["runs"]


@pytest.mark.parametrize("index", range(len(RUNS)))
def test_v1_reference_unchanged_without_the_new_budgets(index):
    recorded = RUNS[index]
    trace = Trace.from_dict(recorded["trace"])
    assert trace.to_dict() == recorded["trace"]  # old traces read and write exactly as before
    run = run_trace(trace, V1Scheduler)
    steps = [{"output": r.output.to_dict(), "finished": [[f.request_id, f.status.value] for f in r.finished]}
             for r in run.records]
    assert len(steps) == recorded["steps"]
    assert hashlib.sha256(json.dumps(steps, sort_keys=True).encode()).hexdigest() == recorded["sha256"]


def _violations(trace: Trace) -> set[str]:
    return violated(V1Scheduler, trace, invariants=get_profile("vllm-v1").invariants())


def _config(**extra) -> SchedulerConfig:
    return SchedulerConfig(block_size=4, num_gpu_blocks=40, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=16,
                           max_model_len=64, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
                           **extra)


def test_new_fields_are_optional_validated_and_round_trip():
    cfg = _config(encoder_compute_budget=8, encoder_cache_size=12, max_loras=1)
    request = Request("a", 20, 2, encoder_inputs=(EncoderInput(2, 6, "img"),), lora_id=3)
    trace = Trace(cfg, (Arrival(0, request),))
    again = Trace.from_dict(json.loads(trace.to_json()))
    assert again.to_dict() == trace.to_dict() and again.requests[0] == request
    assert "encoder_inputs" not in Request("b", 3).to_dict() and "max_loras" not in _config().to_dict()
    bad = trace.to_dict()
    bad["requests"][0]["encoder_inputs"][0]["length"] = 9  # over the encoder budget of 8
    with pytest.raises(InputError, match=r"requests\[0\].encoder_inputs\[0\].length"):
        Trace.from_dict(bad)
    with pytest.raises(InputError, match="encoder_cache_size"):
        SchedulerConfig(encoder_compute_budget=4)
    plain = trace.to_dict()
    plain["config"].pop("max_loras")
    with pytest.raises(InputError, match=r"requests\[0\].lora_id"):
        Trace.from_dict(plain)


def test_encoder_inputs_are_computed_once_shared_and_within_budget():
    cfg = _config(encoder_compute_budget=6, encoder_cache_size=12)
    image = EncoderInput(4, 6, "cat")
    trace = Trace(cfg, (Arrival(0, Request("a", 20, 2, encoder_inputs=(image,))),
                        Arrival(0, Request("b", 20, 2, encoder_inputs=(image,)))), max_steps=40)
    run = run_trace(trace, V1Scheduler)
    computed = [item for r in run.records for item in r.output.encoder_inputs]
    assert computed == [("a", 0)]  # b reads a's cached output
    first = run.records[0]
    # a's 16-token chunk reads the image; b gets nothing of the budget left
    assert [(s.request_id, s.num_tokens) for s in first.output.scheduled] == [("a", 16)]
    assert first.mid.encoder_cache["cat"].users == frozenset({"a"})
    assert run.drained
    assert _violations(trace) == set()


def test_a_chunk_stops_before_an_input_the_budget_cannot_take():
    cfg = _config(encoder_compute_budget=6, encoder_cache_size=6)
    trace = Trace(cfg, (Arrival(0, Request("a", 30, 1, encoder_inputs=(EncoderInput(2, 6, "x"), EncoderInput(10, 6, "y")))),),
                  max_steps=40)
    run = run_trace(trace, V1Scheduler)
    first, second = run.records[0], run.records[1]
    assert [s.num_tokens for s in first.output.scheduled] == [10]  # up to y, which needs x's space
    assert first.output.encoder_inputs == (("a", 0),)
    assert second.output.encoder_inputs == (("a", 1),)  # x was consumed and let go, y evicts it
    assert run.drained and _violations(trace) == set()


def test_max_loras_skips_a_third_adapter_until_a_slot_frees():
    cfg = _config(max_loras=2)
    trace = Trace(cfg, tuple(Arrival(0, Request(f"r{i}", 4, 3, lora_id=i + 1)) for i in range(3)), max_steps=40)
    run = run_trace(trace, V1Scheduler)
    first = run.records[0]
    assert [s.request_id for s in first.output.scheduled] == ["r0", "r1"]
    assert any(r.kind == "wait_lora_slots" for r in first.output.reasons)
    assert run.drained and _violations(trace) == set()


def test_pause_holds_new_work_and_resume_runs_it():
    cfg = _config()
    arrivals = (Arrival(0, Request("a", 4, 4)), Arrival(1, Request("b", 4, 2)), Arrival(3, Request("c", 4, 2)))
    admin = ((1, "pause_new"), (3, "pause_all"), (4, "resume"))
    trace = Trace(cfg, arrivals, admin=admin, max_steps=40)
    assert Trace.from_dict(json.loads(trace.to_json())).admin == admin
    run = run_trace(trace, V1Scheduler)
    by_step = {r.step: {s.request_id for s in r.output.scheduled} for r in run.records}
    assert by_step[1] == {"a"} and by_step[2] == {"a"}  # paused_new: a runs on, b waits
    assert by_step[3] == set()  # paused_all: nothing
    assert by_step[4] == {"a", "b", "c"}  # resumed: the held requests run beside a
    assert run.records[1].before.pause_state == "paused_new" and run.records[4].before.pause_state == "unpaused"
    assert run.drained and _violations(trace) == set()


@pytest.mark.parametrize("op", ["reset_prefix_cache", "pause_new", "pause_all"])
def test_admin_calls_replay_through_the_isolated_adapter(tmp_path, capsys, op):
    """The isolation stamp names every optional call (conformance/runner/channel.py CALLS): before,
    an admin call made the adapter's child raise ``tuple.index(x): x not in tuple``."""
    from conformance.commands.cli import main

    cfg = replace(_config(), enable_prefix_caching=True)
    trace = Trace(cfg, (Arrival(0, Request("a", 4, 3, prompt_tokens=(1, 2, 3, 4))),),
                  admin=((1, op), (2, "resume")) if op != "reset_prefix_cache" else ((1, op),), max_steps=20)
    path = trace.save(tmp_path / "admin.json")
    assert main(["replay", str(path), "--adapter", "reference-v1", "--profile", "vllm-v1"]) == 0
    assert "no violation" in capsys.readouterr().out


def test_a_grammar_wait_is_passed_over_until_its_ready_step():
    """GRM-002: a structured-output request is WAITING_FOR_GRAMMAR, never scheduled, before its
    grammar_ready_step, and the request behind it overtakes it (vLLM skip_request); from that step on
    it is admitted as any other, and the field round-trips (left out when unset)."""
    from spec.status import Status

    arrivals = (Arrival(0, Request("g", 4, 3, grammar_ready_step=2)), Arrival(0, Request("b", 4, 1)))
    trace = Trace(_config(), arrivals, max_steps=40)
    assert Trace.from_dict(json.loads(trace.to_json())).arrivals == arrivals
    assert "grammar_ready_step" not in Request("x", 4, 1).to_dict()
    run = run_trace(trace, V1Scheduler)
    by_step = {r.step: {s.request_id for s in r.output.scheduled} for r in run.records}
    assert by_step[0] == {"b"} and by_step[1] == set() and by_step[2] == {"g"}
    assert run.records[1].after.statuses["g"] is Status.WAITING_FOR_GRAMMAR
    assert run.records[2].after.statuses["g"] is Status.RUNNING
    assert run.drained and _violations(trace) == set()
