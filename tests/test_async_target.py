"""vLLM 0.33.0's AsyncScheduler through the ``vllm_v1_async_host.py`` wire host (the
``vllm-v1-async`` target), one step behind, in lockstep with the async reference at depth 1.
Skips unless ``kvsched targets install vllm-v1`` has run (the async target shares that venv)."""

from __future__ import annotations

import pytest

from conformance.selftest.campaigns.async_smoke import async_installed

pytestmark = pytest.mark.skipif(not async_installed(), reason="vllm-v1 target not installed")


@pytest.fixture(scope="module")
def adapter():
    from conformance.selftest.campaigns.async_smoke import async_adapter

    # Not closed at the end: its host stays in the wire's pool (shut down at exit) for the next
    # file that drives vllm-v1-async, rather than each file paying vLLM's start again.
    return async_adapter()


def test_host_says_it_is_one_step_behind(adapter) -> None:
    assert adapter.hello.get("pipeline_depth") == 1


def test_a_request_finishes_one_step_after_its_last_token_is_sampled(adapter) -> None:
    from conformance.flows.profiles import get_profile
    from conformance.selftest.campaigns.lockstep_async import run_one
    from spec.config import SchedulerConfig
    from spec.trace import Arrival, Trace
    from spec.types import Request

    config = SchedulerConfig(block_size=2, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=16, watermark=0.0, preemption_mode="recompute")
    trace = Trace(config, (Arrival(0, Request("a", prompt_len=4, max_tokens=3)),), max_steps=8)
    outcome = run_one(adapter, trace, get_profile("safety").invariants())
    records = outcome.result.records
    assert outcome.result.divergence is None and outcome.state is None and outcome.result.fault is None
    scheduled = [[(s.seq_id, s.num_tokens) for s in r.output.scheduled] for r in records]
    assert scheduled[:4] == [[("a#0", 4)], [("a#0", 1)], [("a#0", 1)], []]  # step 3: its last token is in flight
    assert [r.step for r in records if r.finished] == [3]  # the synchronous flow finishes it in step 2


@pytest.mark.parametrize("path", ["plain", "chunked", "preemption"])
def test_seeded_traces_agree_with_the_pipelined_reference(adapter, path: str) -> None:
    from conformance.flows.profiles import get_profile
    from conformance.generation.async_paths import path_strategy
    from conformance.generation.v0 import sample_traces
    from conformance.selftest.campaigns.lockstep_async import classify, run_one

    invariants = get_profile("safety").invariants()
    for trace in sample_traces(path_strategy(path), 8, 16):
        outcome = run_one(adapter, trace, invariants)
        assert outcome.result.fault is None, outcome.result.fault
        # the reference refuses a prompt of max_model_len at the door as the host does (conformance/selftest/campaigns/door.py)
        assert classify(adapter, trace, outcome, invariants) is None, outcome.describe()


def test_vllm_in_flight_counters_stay_in_range(adapter) -> None:
    """PIP-003 on vLLM itself, from the host's raw ``in_flight`` snapshot field: after each step's
    update no counter is negative and no sequence has more placeholders than steps in flight (1)."""
    from conformance.generation.async_paths import path_strategy
    from conformance.generation.v0 import sample_traces
    from spec.types import StepOutcome

    for trace in sample_traces(path_strategy("preemption"), 6, 3):
        adapter.reset(trace.config)
        for step in range(trace.max_steps):
            for request in trace.arrivals_at(step):
                adapter.add_request(request)
            for rid in trace.aborts_at(step):
                adapter.abort_request(rid)
            adapter.schedule()
            adapter.update(StepOutcome(trace.stops_at(step)))
            counters = adapter.host.call("snapshot", {}, 60)["in_flight"]
            assert counters["version"] == 1
            for seq, c in counters["seqs"].items():
                assert min(c.values()) >= 0, (step, seq, c)
                assert c["placeholders"] <= 1, (step, seq, c)


def test_registered_target_conforms_to_the_async_profile(tmp_path) -> None:
    """``kvsched conform --adapter vllm-v1-async --profile async``: the target's own traces (its
    domain: depth 1, chunked prefill and prefix caching on or off), the PIP family, lockstep with
    the async reference. The only finding allowed is vLLM's documented door refusal (lockstep_v1 /
    lockstep_async ``generate-prompt-at-max-model-len-refused``): V1's input processor refuses a
    generate prompt of exactly max_model_len tokens, which the reference runs (LOCKSTEP). Before
    the host refused it (issue 21) such a chunked prompt met V1's chunk clamp and hung (LIV-001/002)."""
    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import load_adapter
    from conformance.runner.fuzz import fuzz
    from conformance.runner.plan import RunPlan

    result = fuzz(lambda: load_adapter("vllm-v1-async"), RunPlan(get_profile("async"), max_examples=20, seed=16, out_dir=tmp_path))
    assert result.examples == 20
    # PIP-001 reads token ids, which come with the prefix-cache capability the host does not declare.
    assert {"PIP-002", "PIP-003", "PIP-005", "PIP-006"} <= set(result.active), result.active
    assert {"PIP-001", "PIP-004"} <= set(result.not_applicable), result.not_applicable  # no token ids; ordered_steps
    assert set(result.findings) <= {"LOCKSTEP"}, sorted(result.findings)
    for finding in result.findings.values():
        config = finding.trace.config
        assert any(a.request.prompt_len == config.max_model_len for a in finding.trace.arrivals), finding.message
