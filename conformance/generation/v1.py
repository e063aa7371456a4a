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
    batch_aborts: bool = False,
    resets: bool = False,
    prompt_scale: int | None = None,
    max_output: int = 12,
    length_corners: bool = False,
) -> Trace:
    """Traces of ``family``'s engines. ``batch_aborts``: also batched aborts (`with_abort_batches`);
    ``resets``: with prefix caching, ``reset_prefix_cache`` admin calls and a prompt sent again
    after one (`with_resets`). Both off by default: an engine needs the optional calls
    (spec/protocol.py) for the second. ``prompt_scale``: the longest prompt drawn (default:
    max_model_len, and one over it); ``max_output``: the largest max_tokens drawn
    (`conformance.generation.v0.output_lengths`). ``length_corners`` (declared domains, issue 34
    item 3): short prompts a third of the time, so that long outputs fit under max_model_len and
    get preempted, and stops for half the requests, early ones favoured, so that some land on a
    step that runs a partial prefill chunk."""
    from conformance.generation.v0 import output_lengths

    if config is None:
        config = draw(token_configs(family))
    longest = prompt_scale or config.max_model_len + 1
    vocab = draw(st.sampled_from([2, 3, 50]))
    stems = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=prompt_scale or config.max_model_len),
                          min_size=1, max_size=3))
    count = draw(st.integers(min(3, max_requests), max_requests) | st.integers(1, max_requests))
    arrivals = []
    step = 0
    for i in range(count):
        step += draw(st.sampled_from([0, 0, 1, 3]))
        stem = draw(st.sampled_from(stems))
        lengths = st.integers(1, longest)
        if length_corners:
            lengths = lengths | lengths | st.integers(1, max(1, longest // 3))
        length = draw(lengths)
        tail = draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=4))
        tokens = (list(stem[: length]) + tail)[:length]
        while len(tokens) < length:
            tokens.append(len(tokens) % vocab)
        request = Request(
            request_id=f"r{i}",
            prompt_len=length,
            max_tokens=draw(output_lengths(max_output)),
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
    odds, when = (1, st.integers(1, 3) | st.integers(1, 14)) if length_corners else (4, st.integers(1, 14))
    for a in arrivals:
        if draw(st.integers(0, odds)) == 0:
            stops.append((a.step + draw(when), seq_id(a.request.request_id, 0)))
    trace = Trace(config, tuple(arrivals), tuple(sorted(aborts)), tuple(sorted(stops)))
    admin: tuple[tuple[int, str], ...] = ()
    if resets and config.enable_prefix_caching:
        trace, admin = draw(with_resets(trace))
    batches = draw(with_abort_batches(trace)) if batch_aborts and allow_aborts else ()
    horizon = max(horizon, trace.last_arrival_step + 30)  # a prompt sent again after a reset arrives late
    return Trace(config, trace.arrivals, trace.aborts, trace.stops, max_steps=horizon + _bound(trace),
                 abort_batches=batches, admin=admin)


@st.composite
def with_resets(draw: st.DrawFn, trace: Trace) -> tuple[Trace, tuple[tuple[int, str], ...]]:
    """``reset_prefix_cache`` calls at drawn steps up to the last arrival (some land while blocks are
    held and must be refused, some in an idle gap and must empty the cache), and, half the time, an
    earlier prompt sent again a while after the last arrival with a reset in that very step: the
    repeat must find no cached block (PFX-006; a reset that kept the hash map would hand it one)."""
    last = trace.last_arrival_step
    steps = draw(st.lists(st.integers(0, last + 2), max_size=2))
    arrivals = list(trace.arrivals)
    if arrivals and draw(st.booleans()):
        earlier = draw(st.sampled_from(arrivals)).request
        at = last + draw(st.integers(12, 30))
        again = Request(request_id=f"again-{earlier.request_id}", prompt_len=earlier.prompt_len,
                        max_tokens=earlier.max_tokens, priority=earlier.priority, prompt_tokens=earlier.prompt_tokens)
        arrivals.append(Arrival(at, again))
        steps.append(at)
    out = Trace(trace.config, tuple(arrivals), trace.aborts, trace.stops)
    return out, tuple(sorted((s, "reset_prefix_cache") for s in set(steps)))


@st.composite
def with_abort_batches(draw: st.DrawFn, trace: Trace) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """Batched aborts (vLLM's EngineCore.abort_requests): each names one request that has arrived
    (live or not), ids no request has, and requests a single abort already finished, in a drawn
    order. One arrived request per batch: vLLM frees a batch in the iteration order of a set of
    ids (Scheduler.finish_requests), which no reference can predict, so two live requests in one
    batch would leave the free queue's order to chance."""
    out = []
    for _ in range(draw(st.integers(0, 2))):
        if not trace.arrivals:
            break
        arrival = draw(st.sampled_from(trace.arrivals))
        step = arrival.step + draw(st.integers(0, 10))
        dead = [rid for s, rid in trace.aborts if s < step and rid != arrival.request.request_id]
        ids = [arrival.request.request_id, *(f"ghost-{k}" for k in range(draw(st.integers(1, 3)))),
               *draw(st.lists(st.sampled_from(dead), max_size=2, unique=True) if dead else st.just([]))]
        out.append((step, tuple(draw(st.permutations(ids)))))
    return tuple(sorted(out))


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
