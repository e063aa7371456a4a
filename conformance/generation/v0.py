"""Hypothesis strategies for configs and traces that reach the scheduler's corners.

The draws favour the boundaries where schedulers break: prompts of exact block multiples,
prompts equal to (or just over) the prompt limit, ``n > 1`` groups whose forks share blocks,
caches of a handful of blocks that force preemption, swap spaces too small for a victim, and
aborts in every state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from hypothesis import strategies as st

from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request, seq_id


@st.composite
def configs(draw: st.DrawFn, policies: tuple[str, ...] = ("fcfs", "priority"), modes: tuple[str, ...] = ("auto", "recompute", "swap")) -> SchedulerConfig:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_gpu_blocks = draw(st.integers(2, 24))
    max_num_seqs = draw(st.integers(1, 6))
    max_model_len = draw(st.integers(block_size, block_size * 12))
    max_num_batched_tokens = draw(st.integers(max(max_num_seqs, max_model_len // 2), max_model_len * 2 + 8))
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=draw(st.integers(0, 24)),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(max_num_batched_tokens, max_num_seqs),
        max_model_len=max_model_len,
        watermark=draw(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.25])),
        preemption_mode=draw(st.sampled_from(modes)),
        policy=draw(st.sampled_from(policies)),
    )


@st.composite
def prompt_lengths(draw: st.DrawFn, config: SchedulerConfig, scale: int | None = None) -> int:
    """``scale``: the longest prompt to favour, where it is not the config's prompt limit (an
    engine without max_model_len has a limit no prompt should be drawn near)."""
    return draw(_prompt_lengths(config, scale))


@functools.lru_cache(maxsize=64)
def _prompt_lengths(config: SchedulerConfig, scale: int | None = None) -> st.SearchStrategy[int]:
    """Prompt lengths for ``config``: any up to the limit, exact block multiples, and the limit
    itself and its neighbours. Built once per config (a strategy built per request cost more than
    drawing from it)."""
    bs, limit = config.block_size, min(config.prompt_limit, scale or config.prompt_limit)
    return st.one_of(
        st.integers(1, max(1, limit)),
        st.sampled_from(sorted({max(1, k * bs) for k in range(1, 4)})),  # exact block multiples
        st.sampled_from(sorted({max(1, limit - 1), limit, limit + 1})),  # at the limit
    )


@functools.lru_cache(maxsize=16)
def output_lengths(max_output: int = 12) -> st.SearchStrategy[int]:
    """max_tokens: 1..12 as ever, and with ``max_output`` above 12 also long outputs, which reach
    a preemption of a request that has generated many tokens (a recompute's credit for them)."""
    if max_output <= 12:
        return st.integers(1, max_output)
    return st.integers(1, 12) | st.integers(13, max_output)


# Drawn once per request: built once (the same draws as building them per request). A strategy
# built per draw is also validated per draw, which cost about a third of generating a small trace.
_GAPS, _PRIORITIES = st.integers(0, 3), st.integers(0, 2)
_ABORT_AFTER, _STOP_ODDS, _STOP_AFTER = st.integers(0, 12), st.integers(0, 3), st.integers(1, 14)


@functools.lru_cache(maxsize=16)
def _default_configs() -> st.SearchStrategy[SchedulerConfig]:
    return configs()


@functools.lru_cache(maxsize=64)
def _prompt_length_draws(config: SchedulerConfig, scale: int | None) -> st.SearchStrategy[int]:
    return prompt_lengths(config, scale)


@functools.lru_cache(maxsize=64)
def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@st.composite
def traces(
    draw: st.DrawFn,
    config: SchedulerConfig | None = None,
    max_requests: int = 6,
    max_n: int = 3,
    allow_aborts: bool = True,
    abort_odds: int = 6,
    group_limit: Callable[[SchedulerConfig], int] | None = None,
    abort_burst: bool = False,
    prompt_scale: int | None = None,
    max_output: int = 12,
    forks_copy_on_write: bool = False,
    min_requests: int = 1,
) -> Trace:
    """``abort_odds``: each request is aborted with probability 1 / abort_odds, at a step drawn
    from its arrival to 12 steps later (so in whatever state it is then: waiting, running,
    swapped, or already finished). A real target's strategy lowers it to reach aborts of running
    and swapped requests within a small campaign (`conformance.targets`). ``group_limit(config)``:
    the most parallel sequences a request may have under ``config``, where an engine takes fewer
    than ``max_n`` (vLLM V0 preempts a multi-sequence group by swap only). ``abort_burst``: half
    the traces also abort, at one step drawn after the first arrival, every request that has
    arrived by then (a client disconnect storm): whatever is waiting, running or swapped at that
    step is aborted together, which reaches aborts of short-lived states (a swapped group) far
    more often than aborts drawn per request. ``prompt_scale``: see `prompt_lengths`;
    ``max_output``: the largest max_tokens drawn (`output_lengths`). ``forks_copy_on_write``: a
    request with ``n > 1`` gets a prompt whose last block is partly filled and at least two tokens to generate, so its
    forks share that block and the first decode after the fork copies it on write (an exact
    block multiple puts the first generated token in a fresh block, and nothing is copied; with
    blocks of one slot every block is full, and nothing changes)."""
    if config is None:
        config = draw(_default_configs())
    count = draw(_integers(min(min_requests, max_requests), max_requests))
    arrivals = []
    step = 0
    group_sizes = _integers(1, max(1, min(max_n, group_limit(config))) if group_limit else max_n)
    for i in range(count):
        step += draw(_GAPS)
        prompt_len = draw(_prompt_length_draws(config, prompt_scale))
        max_tokens = draw(output_lengths(max_output))
        n = draw(group_sizes)
        if forks_copy_on_write and n > 1:
            if config.block_size > 1 and prompt_len % config.block_size == 0:  # then prompt_len > 1
                prompt_len -= 1  # still within the limit; now its last block is shared partly filled
            max_tokens = max(max_tokens, 2)
        request = Request(request_id=f"r{i}", prompt_len=prompt_len, max_tokens=max_tokens, n=n,
                          priority=draw(_PRIORITIES))
        arrivals.append(Arrival(step, request))
    horizon = step + 30
    aborts: list[tuple[int, str]] = []
    if allow_aborts:
        for a in arrivals:
            if draw(_integers(0, abort_odds - 1)) == 0:
                aborts.append((a.step + draw(_ABORT_AFTER), a.request.request_id))
        if abort_burst and draw(st.booleans()):
            at = draw(st.integers(arrivals[0].step + 1, step + 12))
            aborted = {rid for _, rid in aborts}
            aborts += [(at, a.request.request_id) for a in arrivals
                       if a.step <= at and a.request.request_id not in aborted]
    stops = []
    for a in arrivals:
        for index in range(a.request.n):
            if draw(_STOP_ODDS) == 0:
                stops.append((a.step + draw(_STOP_AFTER), seq_id(a.request.request_id, index)))
    # Long enough for every request to finish under the LIV-002 bound, so a hang is visible.
    requests = [a.request for a in arrivals]
    bound = (len(requests) + 2) * (sum(r.n * r.max_tokens for r in requests) + len(requests) + 2)
    return Trace(config, tuple(arrivals), tuple(sorted(aborts)), tuple(sorted(stops)), max_steps=horizon + bound)


def sample_traces(strategy: st.SearchStrategy, count: int, seed_value: int) -> list[Trace]:
    """``count`` traces drawn from ``strategy``, the same list for the same seed (for benchmarks
    and lockstep campaigns that must run every side on identical traces)."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    drawn: list[Trace] = []

    @settings(max_examples=count, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @seed(seed_value)
    @given(strategy)
    def collect(trace: Trace) -> None:
        drawn.append(trace)

    collect()
    return drawn
