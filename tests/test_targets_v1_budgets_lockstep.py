"""Issue 32 item 3: vLLM 0.33.0's V1 scheduler with encoder inputs, LoRA adapters and pause, in strict
lockstep with the V1 reference (conformance/selftest/campaigns/lockstep_budgets.py), and the wire
parts it needs (the encoder cache and pause state in snapshots, the pause calls).

The lockstep tests are skipped when the ``vllm-v1`` target is not installed, unless
KVSCHED_REQUIRE_TARGETS=1 (CI); the codec and POL-001 tests always run.
"""

from __future__ import annotations

import dataclasses

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.selftest.campaigns import lockstep_budgets as L
from conformance.wire import WireError, snapshot_from_json, snapshot_to_json
from reference_impl.engine import run_trace
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.encoder import EncoderEntry, EncoderInput
from spec.invariants.policy import fcfs_admission
from spec.observation import Snapshot
from spec.rules import CheckContext
from spec.status import Status
from spec.trace import Arrival, Trace
from spec.types import Request
from tests.test_targets import need


def _config(**extra) -> SchedulerConfig:
    return SchedulerConfig(block_size=4, num_gpu_blocks=40, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=16,
                           max_model_len=64, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
                           **extra)


def test_snapshot_codec_carries_the_encoder_cache_and_pause_state():
    snap = Snapshot(encoder_cache={"h": EncoderEntry(3, frozenset({"a", "b"}))}, encoder_free=2, pause_state="paused_new")
    back = snapshot_from_json(snapshot_to_json(snap))
    assert (back.encoder_cache, back.encoder_free, back.pause_state) == (snap.encoder_cache, 2, "paused_new")
    with pytest.raises(WireError, match="snapshot.pause_state"):
        snapshot_from_json({"pause_state": "asleep"})
    with pytest.raises(WireError, match="snapshot.encoder_cache.version"):
        snapshot_from_json({"encoder_cache": {"entries": {}}})


def test_pol001_passes_over_a_request_for_its_adapter_without_reasons():
    """A target gives no reasons: POL-001 reads the adapter skip from the state (vLLM's skip_request
    for max_loras, scheduler.py:1091-1102), so only an overtaking that no budget explains is flagged."""
    trace = Trace(_config(max_loras=1), tuple(Arrival(0, Request(f"r{i}", 4, 3, lora_id=lora))
                                              for i, lora in enumerate((1, 2, 1))), max_steps=40)
    first = run_trace(trace, V1Scheduler).records[0]
    assert [s.request_id for s in first.output.scheduled] == ["r0", "r2"]
    ctx = CheckContext(trace.config, {a.request.request_id: a.request for a in trace.arrivals})
    silent = dataclasses.replace(first, output=dataclasses.replace(first.output, reasons=()))
    assert list(fcfs_admission(ctx, silent)) == []
    unexplained = Trace(_config(max_loras=2), trace.arrivals, max_steps=40)  # two slots: r1 fits, skipping it is not FCFS
    ctx = CheckContext(unexplained.config, ctx.requests)
    assert list(fcfs_admission(ctx, silent)) != []


@pytest.fixture(scope="module")
def adapter():
    return need("vllm-v1").adapter()


@pytest.fixture(scope="module")
def async_adapter():
    return need("vllm-v1-async").adapter()


def _path_adapter(request, path: str):  # type: ignore[no-untyped-def]
    """The path's host and profile: vLLM's AsyncScheduler (the async profile) for an async- path."""
    if path.startswith("async-"):
        return request.getfixturevalue("async_adapter"), get_profile("async").invariants()
    return request.getfixturevalue("adapter"), get_profile("vllm-v1").invariants()


@pytest.mark.parametrize("path", L.PATHS)
def test_path_agrees_or_diverges_only_at_documented_classes(request, path):
    adapter, invariants = _path_adapter(request, path)
    encoder_steps = paused_steps = grammar_waits = input_waits = 0
    classes = []
    for trace in sample_traces(L.path_strategy(path), 12, 20261203):  # the paths agree on 78-100 % of 1000
        outcome = L.run_one(adapter, trace, invariants)
        encoder_steps += sum(1 for rec in outcome.result.records if rec.output.encoder_inputs)
        paused_steps += sum(1 for rec in outcome.result.records if rec.before.pause_state not in (None, "unpaused"))
        grammar_waits += sum(1 for rec in outcome.result.records
                             if Status.WAITING_FOR_GRAMMAR in (rec.before.statuses or {}).values())
        input_waits += sum(1 for rec in outcome.result.records
                           if Status.WAITING_FOR_INPUT in (rec.before.statuses or {}).values())
        cls = L.classify(adapter, trace, outcome, invariants)
        classes.append(cls)
        assert cls is None or cls in L.CLASSES, outcome.describe()
    assert classes.count(None) >= 4, classes
    path = path.removeprefix("async-")  # the pipelined paths draw what their synchronous twins draw
    if path in ("encoder", "mixed", "streaming-mixed"):
        assert encoder_steps > 0  # the engine computed encoder inputs
    if path == "pause":
        assert paused_steps > 0
    if path == "grammar":
        assert grammar_waits > 0  # vLLM showed WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    if path in ("streaming", "streaming-mixed"):
        assert input_waits > 0  # vLLM showed WAITING_FOR_STREAMING_REQ


def test_vllm_computes_a_shared_input_once_and_lets_a_paused_arrival_run_after_resume(adapter):
    cfg = _config(encoder_compute_budget=6, encoder_cache_size=6)
    shared = (EncoderInput(2, 4, "img"),)
    arrivals = (Arrival(0, Request("a", 12, 2, encoder_inputs=shared)), Arrival(0, Request("b", 8, 2, encoder_inputs=shared)),
                Arrival(2, Request("c", 4, 2)))
    trace = Trace(cfg, arrivals, admin=((2, "pause_new"), (4, "resume")), max_steps=40)
    outcome = L.run_one(adapter, trace, get_profile("vllm-v1").invariants())
    assert outcome.divergence_step is None, outcome.describe()
    records = outcome.result.records
    assert [i for rec in records for i in rec.output.encoder_inputs] == [("a", 0)]  # b reads a's output
    assert not any(s.request_id == "c" for rec in records[:4] for s in rec.output.scheduled)
    assert any(s.request_id == "c" for s in records[4].output.scheduled)


@pytest.mark.parametrize("depth", [0, 1])
def test_vllm_places_a_later_inputs_encoder_input_where_its_tokens_land(request, depth):
    """A session's later input carrying an encoder input (an audio chunk of a realtime session): vLLM
    moves it to where the input lands (``offset + base``, scheduler.py:1899-1905) and computes it in the
    step the reference does, synchronous and pipelined, every decision and state agreeing."""
    from spec.session import InputPiece

    cfg = _config(encoder_compute_budget=4, encoder_cache_size=4, pipeline_depth=depth)
    piece = InputPiece(6, 4, 2, encoder_inputs=(EncoderInput(1, 2, "chunk"),))
    arrivals = (Arrival(0, Request("s", 6, 2, encoder_inputs=(EncoderInput(2, 3, "img"),), session=(piece,))),
                Arrival(1, Request("p", 5, 3)))
    trace = Trace(cfg, arrivals, max_steps=60)
    adapter, invariants = _path_adapter(request, "async-streaming-mixed" if depth else "streaming-mixed")
    outcome = L.run_one(adapter, trace, invariants)
    assert outcome.divergence_step is None, outcome.describe()
    assert not outcome.result.violations, outcome.result.violations
    computed = [i for rec in outcome.result.records for i in rec.output.encoder_inputs]
    assert computed == [("s", 0), ("s", 1)]  # the first prompt's image, then the input's chunk


def test_each_recorded_divergence_is_its_class_again(request):
    """The first trace of each (path, class) in docs/results/lockstep-vllm-v1-budgets.json diverges
    again, and the counterfactual that named its class still makes it agree."""
    import json
    from pathlib import Path

    results = json.loads((Path(__file__).resolve().parent.parent / "docs" / "results" /
                          "lockstep-vllm-v1-budgets.json").read_text())
    assert results["first_divergences"]
    for key, first in results["first_divergences"].items():
        path, cls = key.split(":", 1)
        adapter, invariants = _path_adapter(request, path)
        trace = Trace.from_dict(first["trace"])
        outcome = L.run_one(adapter, trace, invariants)
        assert outcome.divergence_step is not None, key
        assert L.classify(adapter, trace, outcome, invariants) == cls, key


def test_vllm_takes_a_session_past_max_model_len(adapter):
    """A finding (docs/CONFORMANCE.md): vLLM 0.33.0 checks each streaming input's length alone, so a
    session's next input takes it past max_model_len (21 of 16 tokens here), and its admission then
    computes 8 tokens with the blocks of 16 (allocate_slots caps the slots at max_model_len,
    kv_cache_manager.py): CAP-002, a chunk without KV slots. The generators keep sessions within it."""
    from conformance.runner.driver import run_checked
    from spec.session import InputPiece

    cfg = dataclasses.replace(_config(), max_model_len=16)
    trace = Trace(cfg, (Arrival(0, Request("s", 10, 4, session=(InputPiece(2, 8, 3),))),), max_steps=40)
    result = run_checked(adapter, trace, get_profile("vllm-v1").invariants(), stop_at_first=False)
    assert max(rec.after.seqs["s#0"].num_tokens for rec in result.records) > cfg.max_model_len
    assert "CAP-002" in result.problem_ids


def test_vllm_stalls_on_an_idle_sessions_kv(adapter):
    """The class session-kv-held-deadlock on its smallest shape (tests/test_sessions.py `_stall`):
    session A waits for input holding 7 of 8 blocks and B needs 5; vLLM idles until A's input comes
    (SES-003), the reference frees A's KV, and `KeepsSessionKV` agrees with vLLM to the end."""
    from tests.test_sessions import _stall

    trace = _stall()
    invariants = get_profile("vllm-v1").invariants()
    outcome = L.run_one(adapter, trace, invariants)
    assert outcome.divergence_step == 2 and "SES-003" in outcome.result.problem_ids
    assert L.classify(adapter, trace, outcome, invariants) == "session-kv-held-deadlock"
