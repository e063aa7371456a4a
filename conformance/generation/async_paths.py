"""The pipelined flow's traces: vLLM V1's paths at depth 1 (two batches in flight), as the
``vllm-v1-async`` target, the ``reference-async`` built-in and the async flow draw them."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from conformance.generation.v1 import token_traces
from conformance.generation.v1_paths import path_configs
from spec.config import SchedulerConfig

PATHS = ("plain", "chunked", "preemption")


@st.composite
def one_behind_configs(draw: st.DrawFn, path: str) -> SchedulerConfig:
    """A V1 path's config (`conformance.generation.v1_paths.path_configs`: what vLLM 0.33.0 accepts), with prefix
    caching drawn on or off and, on the ``preemption`` path, a tight cache and several seats."""
    chunked = {"plain": False, "chunked": True}.get(path)
    if chunked is None:
        chunked = draw(st.booleans())
    config = draw(path_configs("chunked+prefix" if chunked else "prefix"))
    config = dataclasses.replace(config, enable_prefix_caching=draw(st.booleans()))
    if path == "preemption":
        min_blocks = config.blocks_for(config.max_model_len)
        config = dataclasses.replace(config, num_gpu_blocks=draw(st.integers(min_blocks, min_blocks + 1)),
                                     max_num_seqs=max(config.max_num_seqs, 2),
                                     max_num_batched_tokens=max(config.max_num_batched_tokens, 2))
    return dataclasses.replace(config, pipeline_depth=1)  # vLLM's: two batches in flight


def path_strategy(path: str) -> st.SearchStrategy:
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    requests = 8 if path == "preemption" else 6
    return one_behind_configs(path).flatmap(lambda config: token_traces("v1", config=config, max_requests=requests))


def all_paths_configs() -> st.SearchStrategy:
    """Every path's configs, at depth 1 (the async flow's, `conformance.flows`)."""
    return st.one_of(*(one_behind_configs(path) for path in PATHS))


def all_paths_strategy() -> st.SearchStrategy:
    """Every path's traces at depth 1: the ``vllm-v1-async`` target's, the ``reference-async``
    built-in's and the async flow's (`conformance.flows`)."""
    return st.one_of(*(path_strategy(path) for path in PATHS))
