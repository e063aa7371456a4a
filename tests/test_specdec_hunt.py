"""The specdec hunt's classification (conformance.selftest.campaigns.specdec_hunt), without vLLM: a finding
is known only by the source line vLLM names *and* the config shape that line needs."""

from __future__ import annotations

import dataclasses

from conformance.runner.driver import TraceResult
from conformance.runner.guard import AdapterFault
from conformance.selftest.campaigns.specdec_hunt import PADDED, classify, padded_shape, probe_42722

ASSERT = "AssertionError (at vllm/v1/core/sched/scheduler.py:1579)"


def _trace(threshold: int, k: int = 2):  # type: ignore[no-untyped-def]
    trace = probe_42722(0)
    config = dataclasses.replace(trace.config, long_prefill_token_threshold=threshold, num_speculative_tokens=k,
                                 enable_chunked_prefill=True)
    return dataclasses.replace(trace, config=config)


def test_clean_trace_has_no_class() -> None:
    trace = _trace(0)
    assert classify(trace, TraceResult(trace)) is None


def test_the_padded_admission_assert_needs_its_line_and_its_shape() -> None:
    cut = _trace(2, k=2)  # threshold 2 < 1 + k = 3
    assert padded_shape(cut) and not padded_shape(_trace(3, k=2)) and not padded_shape(_trace(0))
    fault = AdapterFault("raised", "schedule", "assert num_new_tokens == 1 + self.num_spec_tokens", ASSERT)
    assert classify(cut, TraceResult(cut, fault=fault, fault_step=1)) == PADDED
    assert classify(_trace(3), TraceResult(_trace(3), fault=fault, fault_step=1)) == "unclassified"
    other = AdapterFault("raised", "schedule", "boom", "vllm/v1/core/sched/scheduler.py:999")
    assert classify(cut, TraceResult(cut, fault=other, fault_step=1)) == "unclassified"


def _over_budget_stall(k: int):  # type: ignore[no-untyped-def]
    """The hunt's shrunk stall: r0 leaves block [0] cached; r3 hits it and has one token left,
    which vLLM pads to 1 + k > the budget of 1 and so never admits."""
    from spec.config import SchedulerConfig
    from spec.trace import Arrival, Trace
    from spec.types import Request

    config = SchedulerConfig(block_size=1, num_gpu_blocks=7, num_cpu_blocks=0, max_num_seqs=1, max_num_batched_tokens=1,
                             max_model_len=7, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
                             enable_prefix_caching=True, num_speculative_tokens=k)
    return Trace(config, (Arrival(0, Request("r0", 1, 1, prompt_tokens=(0,))),
                          Arrival(0, Request("r3", 2, 1, prompt_tokens=(0, 2)))), max_steps=6)


def test_the_over_budget_stall_is_explained_by_the_padding_alone() -> None:
    from conformance.selftest.campaigns.specdec_hunt import over_budget_shape, padding_explains

    trace = _over_budget_stall(4)
    assert over_budget_shape(trace) and padding_explains(trace, "sync", {"LIV-001", "LIV-003"})
