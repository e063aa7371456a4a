"""Hypothesis strategies for today's engines: token budgets, chunked prefill, prefix caching.

Configs follow what vLLM V1 and nano-vllm accept (no swap space is used; the watermark is vLLM
V1's default of 0 most of the time; without chunked prefill the token budget covers
max_model_len, as vLLM requires; the cache holds at least one max_model_len sequence, as vLLM
checks at start-up). Prompts are drawn to share prefixes: a few stems of a small vocabulary, so
that prefix-cache hits, evictions and equal blocks after different prefixes all happen.
"""

from __future__ import annotations

from hypothesis import strategies as st

from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request, seq_id

FAMILIES = ("v1", "nano")


@st.composite
def token_configs(draw: st.DrawFn, family: str = "v1") -> SchedulerConfig:
    assert family in FAMILIES
    block_size = draw(st.sampled_from([1, 2, 4] if family == "v1" else [2, 4]))
    max_num_seqs = draw(st.integers(1, 5))
    max_model_len = draw(st.integers(block_size * 2, block_size * 10))
    chunked = family == "v1" and draw(st.booleans() | st.just(True))
    if chunked:
        budget = draw(st.integers(max_num_seqs, max(max_num_seqs, max_model_len // 2)) | st.just(max_num_seqs))
    else:
        lowest = max(max_num_seqs, max_model_len)
        budget = draw(st.integers(lowest, max(lowest, max_model_len * 2)))
    min_blocks = -(-max_model_len // block_size)
    num_gpu_blocks = draw(st.integers(min_blocks, min_blocks + 4) | st.integers(min_blocks, min_blocks + 14))
    threshold = draw(st.sampled_from([0, 0, 1, 3, 8])) if chunked else 0
    partial = draw(st.sampled_from([0, 0, 1, 2])) if chunked else 0
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=0,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        watermark=draw(st.sampled_from([0.0, 0.0, 0.0, 0.1])),
        preemption_mode="recompute",
        policy=draw(st.sampled_from(["fcfs", "priority"])) if family == "v1" else "fcfs",
        enable_chunked_prefill=chunked,
        max_num_partial_prefills=partial,
        long_prefill_token_threshold=threshold,
        enable_prefix_caching=draw(st.booleans() | st.just(True)),
    )


@st.composite
def token_traces(
    draw: st.DrawFn,
    family: str = "v1",
    config: SchedulerConfig | None = None,
    max_requests: int = 6,
    allow_aborts: bool = True,
) -> Trace:
    if config is None:
        config = draw(token_configs(family))
    vocab = draw(st.sampled_from([2, 3, 50]))
    stems = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=config.max_model_len),
                          min_size=1, max_size=3))
    count = draw(st.integers(min(3, max_requests), max_requests) | st.integers(1, max_requests))
    arrivals = []
    step = 0
    for i in range(count):
        step += draw(st.sampled_from([0, 0, 1, 3]))
        stem = draw(st.sampled_from(stems))
        length = draw(st.integers(1, config.max_model_len + 1))
        tail = draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=4))
        tokens = (list(stem[: length]) + tail)[:length]
        while len(tokens) < length:
            tokens.append(len(tokens) % vocab)
        request = Request(
            request_id=f"r{i}",
            prompt_len=length,
            max_tokens=draw(st.integers(1, 12)),
            priority=draw(st.integers(0, 2)),
            prompt_tokens=tuple(tokens),
        )
        arrivals.append(Arrival(step, request))
    horizon = step + 30
    aborts: list[tuple[int, str]] = []
    if allow_aborts:
        for a in arrivals:
            if draw(st.integers(0, 6)) == 0:
                aborts.append((a.step + draw(st.integers(0, 12)), a.request.request_id))
    stops = []
    for a in arrivals:
        if draw(st.integers(0, 4)) == 0:
            stops.append((a.step + draw(st.integers(1, 14)), seq_id(a.request.request_id, 0)))
    trace = Trace(config, tuple(arrivals), tuple(sorted(aborts)), tuple(sorted(stops)))
    return Trace(config, trace.arrivals, trace.aborts, trace.stops, max_steps=horizon + _bound(trace))


def _bound(trace: Trace) -> int:
    """The LIV-002 bound for the trace's requests, so that a hang is visible within max_steps."""
    from spec.catalogue import CheckContext, completion_bound_for

    ctx = CheckContext(trace.config)
    for a in trace.arrivals:
        ctx.requests[a.request.request_id] = a.request
    return completion_bound_for(ctx)


def v1_traces() -> st.SearchStrategy:
    """The V1 flow's traces (`conformance.flows.v1`)."""
    return token_traces("v1")


def nano_traces() -> st.SearchStrategy:
    """The nano-vllm flow's traces (`conformance.flows.nano`)."""
    return token_traces("nano")


def v1_configs() -> st.SearchStrategy:
    """The V1 flow's configs (`conformance.flows.v1`)."""
    return token_configs("v1")


def nano_configs() -> st.SearchStrategy:
    """The nano-vllm flow's configs (`conformance.flows.nano`)."""
    return token_configs("nano")
