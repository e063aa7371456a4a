"""Hypothesis strategies for the hybrid flow: V1 configs with KV cache groups (spec/kv_groups.py).

A config is a V1 config (`conformance.generation.v1.token_configs`) plus a group layout drawn from
the kinds of today's hybrid models: full + sliding window (Gemma 3, GPT-OSS), full + Mamba in
mode none or align (Qwen3-Next, Nemotron-H, Jamba, Granite 4), full + chunked local attention
(Llama 4), and three-kind mixes. Limits, each with its reason:

- a sliding window of at least 2 tokens (vLLM caches nothing of a 1-token window:
  SlidingWindowManager.reachable_block_mask needs cdiv(W - 1, B) >= 1 blocks per hit);
- Mamba "align" only with prefix caching and "none" only without (vLLM derives the mode from
  enable_prefix_caching: config/cache.py mamba_cache_mode), and "align" with chunked prefill
  (its aligned split is chunking; spec/kv_groups.py);
- the pool holds a max_model_len sequence in every group at once (vLLM checks at start-up that
  one request of max_model_len fits), so drawn pools are sized from the groups' admission counts.

Shrinking stays inside the domain: every drawn value shrinks towards a smaller one that still
satisfies the rules above (the pool's size is drawn as a slack over the minimum).
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from conformance.generation.v1 import token_configs, token_traces
from spec.config import SchedulerConfig
from spec.kv_groups import KVGroup, cdiv
from spec.trace import Trace

LAYOUTS = ("swa", "mamba", "local", "swa+mamba")


@st.composite
def hybrid_groups(draw: st.DrawFn, config: SchedulerConfig, layout: str | None = None) -> tuple[KVGroup, ...]:
    layout = layout or draw(st.sampled_from(LAYOUTS))
    groups = [KVGroup("full")]
    if "swa" in layout:
        groups.append(KVGroup("sliding_window", window=draw(st.integers(2, max(2, config.max_model_len // 2)))))
    if "local" in layout:
        groups.append(KVGroup("chunked_local", window=config.block_size * draw(st.integers(1, 4))))
    if "mamba" in layout:
        groups.append(KVGroup("mamba", mode="align" if config.enable_prefix_caching else "none"))
    if draw(st.integers(0, 5)) == 0:
        groups.append(KVGroup("shared", source=0))
    return tuple(groups)


def fitting_pool(config: SchedulerConfig) -> SchedulerConfig:
    """``config`` with at least the pool one max_model_len request needs across its groups (at its
    pipeline depth: in-flight tokens widen a window's cap), as vLLM checks at start-up."""
    return dataclasses.replace(config, num_gpu_blocks=max(config.num_gpu_blocks, _min_blocks(config)))


def _min_blocks(config: SchedulerConfig) -> int:
    """The blocks one max_model_len request holds across every group at its peak."""
    from reference_impl.hybrid_scheduler import HybridV1Scheduler  # the reference's own count

    probe = HybridV1Scheduler(config)
    whole = cdiv(config.max_model_len, config.block_size)
    extra = 0
    for group in config.kv_groups[1:]:
        if group.kind in ("sliding_window", "chunked_local"):
            extra += min(whole, probe.kv.admission_cap(group))
        elif group.kind == "mamba":
            # "align": two states and k speculative ones (MambaSpec.max_memory_usage_bytes, v1/kv_cache_interface.py:1135-1141)
            extra += 2 + config.num_speculative_tokens if group.mode == "align" else 1
    return whole + extra


@st.composite
def hybrid_configs(draw: st.DrawFn, layout: str | None = None) -> SchedulerConfig:
    base = draw(token_configs("v1"))
    base = dataclasses.replace(base, block_size=draw(st.sampled_from([2, 4])), max_num_partial_prefills=0,
                               max_model_len=max(base.max_model_len, 8))
    if not base.enable_chunked_prefill:
        base = dataclasses.replace(base, max_num_batched_tokens=max(base.max_num_batched_tokens, base.max_model_len))
    groups = draw(hybrid_groups(base, layout))
    if any(g.kind == "mamba" and g.mode == "align" for g in groups) and not base.enable_chunked_prefill:
        base = dataclasses.replace(base, enable_chunked_prefill=True)  # align splits prompts (spec/kv_groups.py)
    config = dataclasses.replace(base, kv_groups=groups, num_gpu_blocks=1)
    need = _min_blocks(config)
    slack = draw(st.integers(0, 4) | st.integers(0, 16))
    return dataclasses.replace(config, num_gpu_blocks=need + slack)


@st.composite
def hybrid_traces(draw: st.DrawFn, layout: str | None = None, max_requests: int = 6) -> Trace:
    config = draw(hybrid_configs(layout))
    return draw(token_traces("v1", config=config, max_requests=max_requests))


def hybrid_flow_traces() -> st.SearchStrategy:
    """The hybrid flow's traces (`conformance.flows.hybrid`)."""
    return hybrid_traces()


def hybrid_flow_configs() -> st.SearchStrategy:
    """The hybrid flow's configs (`conformance.flows.hybrid`)."""
    return hybrid_configs()
