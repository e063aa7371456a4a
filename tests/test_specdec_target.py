"""vLLM 0.33.0 with speculative decoding through the ``vllm-v1`` and ``vllm-v1-async`` hosts (the
host plays the drafter and the rejection sampler), in lockstep with the references with drafts.
Skips unless ``kvsched targets install vllm-v1`` has run."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.selftest.campaigns.async_smoke import async_installed

pytestmark = pytest.mark.skipif(not async_installed(), reason="vllm-v1 target not installed")


def _trace(depth: int):  # type: ignore[no-untyped-def]
    from spec.config import SchedulerConfig
    from spec.speculative import DraftDecision
    from spec.trace import Arrival, Trace
    from spec.types import Request

    config = SchedulerConfig(block_size=2, num_gpu_blocks=32, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=64, max_model_len=64, watermark=0.0, preemption_mode="recompute",
                             num_speculative_tokens=3, pipeline_depth=depth)
    drafts = tuple((step, "a#0", DraftDecision(accepted=step % 4)) for step in range(12))
    return Trace(config, (Arrival(0, Request("a", prompt_len=4, max_tokens=30, prompt_tokens=(1, 2, 3, 4))),),
                 stops=((4, "a#0"),), max_steps=16,
                 drafts=drafts[:4] + ((4, "a#0", DraftDecision(accepted=3, stop_at=1)),) + drafts[5:])


@pytest.mark.parametrize("path", ["sync", "async"])
def test_drafts_are_verified_and_rolled_back_as_the_reference_does(path: str) -> None:
    from conformance.flows.profiles import get_profile
    from conformance.selftest.campaigns.lockstep_specdec import adapter_for, base_of, run_one

    adapter = adapter_for(path)
    try:
        outcome = run_one(adapter, _trace(1 if path == "async" else 0), get_profile("safety").invariants(),
                          base_of(path))
    finally:
        adapter.close()
    result = outcome.result
    assert result.fault is None and result.divergence is None and outcome.state is None, outcome.describe()
    assert result.violations == []
    assert any(s.num_drafts for r in result.records for s in r.output.scheduled)
    assert result.drained


def test_vllm_dies_when_the_threshold_cuts_a_padded_admission() -> None:
    """docs/SPECDEC.md: the known vLLM 0.33.0 defect (scheduler.py:1579), on its shrunk trace."""
    from pathlib import Path

    from conformance.flows.profiles import get_profile
    from conformance.selftest.campaigns.lockstep_specdec import adapter_for, base_of, classify, run_one
    from spec.trace import Trace

    trace = Trace.load(Path(__file__).resolve().parents[1] / "docs/traces/specdec/sync-padded-admission-cut-by-threshold.json")
    trace = dataclasses.replace(trace, meta={})
    adapter = adapter_for("sync")
    try:
        invariants = get_profile("safety").invariants()
        outcome = run_one(adapter, trace, invariants, base_of("sync"))
        assert classify(adapter, "sync", trace, outcome, invariants) == "padded-admission-cut-by-threshold"
    finally:
        adapter.close()


def test_in_flight_drafts_at_max_model_len_agree_in_the_vllm_compatible_mode() -> None:
    """docs/SPECDEC.md section 5: async with drafts, vLLM skips a request whose in-flight drafts,
    all accepted, would reach max_model_len (scheduler.py:850-857). The campaign's reference
    (vLLM-compatible mode) agrees to the end; the spec's policy schedules the token a rejection
    would need, and the counterfactual names the class."""
    from pathlib import Path

    from conformance.flows.profiles import get_profile
    from conformance.selftest.campaigns.lockstep_specdec import adapter_for, base_of, classify, run_one
    from spec.trace import Trace

    trace = Trace.load(Path(__file__).resolve().parents[1]
                       / "docs/traces/specdec/async-in-flight-drafts-clamped-at-max-model-len.json")
    trace = dataclasses.replace(trace, meta={})
    adapter = adapter_for("async")
    try:
        invariants = get_profile("safety").invariants()
        vllm_mode = run_one(adapter, trace, invariants, base_of("async"))
        assert vllm_mode.divergence_step is None, vllm_mode.describe()
        policy = run_one(adapter, trace, invariants, base_of("async", policy=True))
        assert policy.divergence_step is not None
        assert classify(adapter, "async", trace, policy, invariants, policy=True) == \
            "in-flight-drafts-clamped-at-max-model-len"
    finally:
        adapter.close()
