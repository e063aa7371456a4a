"""The configs of vLLM V1's paths (default, chunked prefill, prefix caching, both, partial prefills),
within what vLLM 0.33.0 accepts: shared by the V1 lockstep campaign and the pipelined flow's traces
(`conformance.generation.async_paths`)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from spec.config import SchedulerConfig


@dataclass
class PathSpec:
    chunked: bool
    prefix: bool
    partial: bool = False


PATH_SPECS = {"chunked": PathSpec(True, False), "prefix": PathSpec(False, True),
              "chunked+prefix": PathSpec(True, True), "chunked+partial": PathSpec(True, False, partial=True)}


@st.composite
def path_configs(draw: st.DrawFn, path: str, watermark: bool = False) -> SchedulerConfig:
    """Configs of one of V1's paths, within what vLLM 0.33.0 accepts: a watermark of 0 (V1's
    default) or, with ``watermark``, up to 0.2 (SchedulerConfig.watermark, < 1; for a reference
    with V1's rule, `EngineWatermarkV1`; lockstep_async's reference has the spec's), recompute only,
    max_num_partial_prefills 0 (V1 has no such limit; 1 or 2 on the ``chunked+partial`` path, to
    show it), long_prefill_token_threshold at most
    max_model_len (SchedulerConfig.verify_max_model_len), a budget of at least max_num_seqs and,
    without chunked prefill, at least max_model_len; a cache that holds one max_model_len
    sequence (check_enough_kv_cache_memory)."""
    spec = PATH_SPECS[path]
    block_size = draw(st.sampled_from([1, 2, 4]))
    max_num_seqs = draw(st.integers(1, 5))
    max_model_len = draw(st.integers(block_size * 2, block_size * 10))
    if spec.chunked:
        budget = draw(st.integers(max_num_seqs, max(max_num_seqs, max_model_len // 2))
                      | st.integers(max_num_seqs, max(max_num_seqs, max_model_len * 2))
                      | st.just(max_num_seqs))
        threshold = min(draw(st.sampled_from([0, 0, 1, 3, 8])), max_model_len)
    else:
        lowest = max(max_num_seqs, max_model_len)
        budget = draw(st.integers(lowest, max(lowest, max_model_len * 2)))
        threshold = 0
    min_blocks = -(-max_model_len // block_size)
    num_gpu_blocks = draw(st.integers(min_blocks, min_blocks + 4) | st.integers(min_blocks, min_blocks + 14))
    return SchedulerConfig(
        block_size=block_size, num_gpu_blocks=num_gpu_blocks, num_cpu_blocks=0, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget, max_model_len=max_model_len,
        watermark=draw(st.sampled_from([0.0, 0.0, 0.1, 0.2])) if watermark else 0.0, preemption_mode="recompute",
        policy=draw(st.sampled_from(["fcfs", "priority"])), enable_chunked_prefill=spec.chunked,
        max_num_partial_prefills=draw(st.sampled_from([1, 2])) if spec.partial else 0,
        long_prefill_token_threshold=threshold, enable_prefix_caching=spec.prefix,
    )
