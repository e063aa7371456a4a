"""The hunt's classifier and its CONFORMANCE.md section (no vLLM needed: the results are data)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conformance.selftest.campaigns.async_hunt import classify
from conformance.selftest.campaigns.conformance_md import _async_hunt
from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request


def _trace(prompt_len: int, chunked: bool) -> Trace:
    config = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=1,
                             max_num_batched_tokens=4, max_model_len=6, watermark=0.0, preemption_mode="recompute",
                             enable_chunked_prefill=chunked, long_prefill_token_threshold=2 if chunked else 0,
                             pipeline_depth=1)
    return Trace(config, (Arrival(0, Request("r0", prompt_len=prompt_len, max_tokens=1)),))


def _result(*problems: str):
    return SimpleNamespace(problem_ids=set(problems))


def test_the_known_clamp_is_told_apart_from_anything_new():
    assert classify(_trace(6, True), _result()) is None
    assert classify(_trace(6, True), _result("LIV-001", "LIV-002")) == "chunk-clamped-below-max-model-len"
    assert classify(_trace(5, True), _result("LIV-001")) == "unclassified"  # not the clamp's shape
    assert classify(_trace(6, False), _result("LIV-002")) == "unclassified"  # no chunked prefill, no clamp
    assert classify(_trace(6, True), _result("LIV-001", "PIP-003")) == "unclassified"  # more than the clamp


def test_the_conformance_section_reads_the_result_files(tmp_path):
    run = {"traces": 10, "steps": 99, "preemptions": 3, "aborts": 4, "stops": 5, "prefix_caching_on": 6,
           "chunked_prefill_on": 7, "clean_traces": 9, "by_class": {"chunk-clamped-below-max-model-len: LIV-001": 1}}
    cls = {"kind": "vllm-deviation", "explanation": "the clamp", "trace": "docs/traces/async/hunt/x.json",
           "steps": 4, "message": "LIV-001 at step 3"}
    (tmp_path / "async-hunt-0.29.0.json").write_text(json.dumps(
        {"version": 1, "seed": 1, "run": run, "classes": {"chunk-clamped-below-max-model-len": cls}}))
    (tmp_path / "async-probe-57562-0.29.0.json").write_text(json.dumps(
        {"seed": 57562, "traces": 5, "steps": 50, "requests_per_trace_max": 10, "prefix_caching_on": 2,
         "problems": []}))
    text = "\n".join(_async_hunt(tmp_path))
    assert "| 0.29.0 (seed 1) | 10 | 99 | 3 | 4 | 5 | 6 | 7 | 9 |" in text
    assert "[0.29.0](traces/async/hunt/x.json)" in text and "| 0.29.0 (seed 57562) | 5 | 50 | 10 | 2 | 0 |" in text
    assert "#57562" in text
    assert _async_hunt(tmp_path / "none") == []
