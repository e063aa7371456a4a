"""Strict lockstep of the reference's vLLM V1 flow against vLLM 0.33.0's real V1 scheduler
(conformance/selftest/campaigns/lockstep_v1.py) on its chunked-prefill and prefix-caching paths: decisions
and the state after every step (computed tokens, block tables, queues, free count).

Skipped when the ``vllm-v1`` target is not installed, unless KVSCHED_REQUIRE_TARGETS=1 (CI).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.selftest.campaigns import lockstep_v1 as L
from spec.trace import Trace
from tests.test_targets import need

TRACES = Path(__file__).resolve().parent.parent / "docs" / "traces" / "lockstep-v1"


@pytest.fixture(scope="module")
def adapter():
    return need("vllm-v1").adapter()


@pytest.mark.parametrize("path", ["chunked", "prefix", "chunked+prefix", "chunked+partial"])
def test_path_agrees_or_diverges_only_at_documented_deviations(adapter, path):
    invariants = get_profile("vllm-v1").invariants()
    classes, steps, shared = [], 0, 0
    # 45 traces (30 before the watermark was drawn, issue 21): since the host refuses a prompt of max_model_len tokens at the door (as V1 does),
    # fewer requests run at once, and 20 traces met no shared prefix block on chunked+prefix.
    for trace in sample_traces(L.path_strategy(path), 45, 20261130):
        assert trace.config.enable_chunked_prefill == ("chunked" in path)
        assert trace.config.enable_prefix_caching == ("prefix" in path)
        assert bool(trace.config.max_num_partial_prefills) == ("partial" in path)
        outcome = L.run_one(adapter, trace, invariants)
        steps += len(outcome.result.records)
        # prefix caching on the engine's side: some block is held by two requests at once
        shared += sum(1 for rec in outcome.result.records if max(rec.after.gpu_ref_counts or (0,)) > 1)
        cls = L.classify(adapter, trace, outcome)
        classes.append(cls)
        allowed: set[str | None] = {None}
        if "partial" in path:  # V1 has no partial-prefill limit (a spec decision)
            allowed.add("partial-prefills-not-applied")
        assert cls in allowed, outcome.describe()
    assert steps > 60 and classes.count(None) >= 10, classes
    if "prefix" in path:
        assert shared > 0
    else:
        assert shared == 0


def test_a_generate_prompt_of_max_model_len_is_refused_at_the_door_not_clamped(adapter):
    """The trace that showed chunk-clamped-below-max-model-len (a chunked prompt of exactly
    max_model_len tokens stopping one token short) now meets V1's input processor first: the host
    refuses the prompt at the door as vLLM 0.33.0 does for a generate request, so the clamp is not
    reached (it is real for pooling requests: vLLM #47971, #24704, #55427, fixed by #48039). The
    campaign's reference refuses it too (conformance/selftest/campaigns/door.py), so the trace agrees to its end."""
    trace = Trace.load(TRACES / "chunked-chunk-clamped-below-max-model-len.json")
    mml = trace.config.max_model_len
    assert trace.config.enable_chunked_prefill and any(a.request.prompt_len == mml for a in trace.arrivals)
    outcome = L.run_one(adapter, trace, get_profile("vllm-v1").invariants())
    refused = {rid for rec in outcome.result.records for rid in rec.refused}
    assert refused == {a.request.request_id for a in trace.arrivals if a.request.prompt_len == mml}
    assert outcome.result.divergence is None and outcome.state is None, outcome.describe()
    assert L.classify(adapter, trace, outcome) is None
    assert not {v.invariant_id for v in outcome.result.violations} & {"LIV-001", "LEN-001"}
