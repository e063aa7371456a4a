"""The connector flow's teeth beyond tests/test_mutants.py (which finds a trace for each connector
mutant's invariant): the three museum shapes caught on the museum's KV-pressure traces within 10
steps, and the reference's vLLM-compatible knobs (`EngineConnectorV1`) showing what each one
changes on a worked example (docs/CONNECTORS.md, section 5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from conformance.flows.profiles import get_profile
from conformance.generation.connector import pressure_traces
from conformance.selftest import mutants_connector as m
from conformance.selftest.mutants import violated
from reference_impl.engine import run_trace
from reference_impl.kv_connector_scheduler import ConnectorScheduler, EngineConnectorV1
from spec.trace import Trace

CONNECTOR = get_profile("connector").invariants()
STALL = Path(__file__).resolve().parent.parent / "docs" / "traces" / "connector" / "own-reservation-stall.json"
SEARCH = settings(max_examples=2000, database=None, derandomize=True, phases=[Phase.generate, Phase.shrink],
                  suppress_health_check=list(HealthCheck), deadline=None)


@pytest.mark.parametrize(("mutant", "invariant"), [
    (m.LookaheadAfterLoad, "KVC-009"),  # vllm-project/vllm#57104
    (m.HolderBehindHead, "KVC-009"),  # vllm-project/vllm#57841
    (m.LoadingTakesASeat, "KVC-008"),  # vllm-project/vllm#53130
])
def test_museum_shape_caught_within_ten_steps(mutant, invariant):
    trace = find(pressure_traces(), lambda t: invariant in violated(mutant, t, invariants=CONNECTOR), settings=SEARCH)
    steps = len(run_trace(trace, mutant).records)
    assert violated(ConnectorScheduler, trace, invariants=CONNECTOR) == set()
    first = next(r.step for r, v in _first_violation(mutant, trace, invariant))
    assert first < 10, f"caught at step {first} of {steps}"


def _first_violation(make, trace, invariant):
    from reference_impl.engine import iter_steps
    from spec.catalogue import Checker

    scheduler = make(trace.config)
    checker = Checker(trace.config, scheduler.capabilities, CONNECTOR)
    for record in iter_steps(trace, scheduler):
        found = [v for v in checker.check_step(record) if v.invariant_id == invariant]
        if found:
            yield record, found
            return


def _retried_load() -> Trace:
    """One request whose asynchronous load fails on its first block, so nothing of it is valid and
    it is retried, in a pool of four blocks (bs 1) for its three tokens (the hunt's finding)."""
    return Trace.load(STALL)


def test_own_reservation_stalls_a_retried_load_in_vllm_mode_only():
    trace = _retried_load()
    assert violated(ConnectorScheduler, trace, invariants=CONNECTOR) == set()
    assert {"KVC-009", "LIV-003"} <= violated(EngineConnectorV1, trace, invariants=CONNECTOR)


def test_failed_blocks_stay_cached_in_vllm_mode_only():
    trace = Trace.from_dict({
        "version": 1,
        "config": {"block_size": 2, "num_gpu_blocks": 8, "num_cpu_blocks": 0, "max_num_seqs": 2,
                   "max_num_batched_tokens": 16, "max_model_len": 16, "watermark": 0.0, "kv_connector": True,
                   "enable_prefix_caching": True, "enable_chunked_prefill": True},
        "requests": [{"id": "A", "prompt_len": 7, "max_tokens": 2}],
        "connector": {"version": 1, "requests": [{"request": "A", "external_tokens": 6, "failed_blocks": [1]}]}})
    assert violated(ConnectorScheduler, trace, invariants=CONNECTOR) == set()
    assert "PFX-001" in violated(EngineConnectorV1, trace, invariants=CONNECTOR)
