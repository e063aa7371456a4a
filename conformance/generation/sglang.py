"""The SGLang flow's traces (`conformance.flows.sglang`): what the ``sglang`` host takes, drawn so
that decode runs out of slots and retracts (see `sglang_traces`)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from conformance.generation.v1 import _bound
from reference_impl.sglang_scheduler import door_limits
from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request, seq_id


@st.composite
def sglang_configs(draw: st.DrawFn, policy: str | None = None, full: bool = True, burst: bool = False,
                   chunked: bool | None = False) -> SchedulerConfig:
    """What the ``sglang`` host takes: page size 1, recompute, no CPU pool, no watermark;
    ``chunked`` (None: drawn) turns chunked prefill on with a budget below the longer prompts.
    ``full=False``: without chunking, a budget of at least max_model_len (SGLang admits a first
    prompt over the budget, `first-prefill-above-input-budget`). The pool is drawn small against
    max_model_len (a few requests' worth), so decode runs out of slots; at least 12 slots, so
    that SGLang's input limit (``min(max_model_len + 1, slots - 1) - 5``) leaves room for a
    prompt; ``burst``: room for three of a burst's requests (`sglang_traces`)."""
    max_model_len = draw(st.integers(10, 32))
    if burst:  # room for three requests of a burst below max_model_len each (`sglang_traces`)
        slots, seqs = draw(st.integers(14, max(14, max_model_len + 2))), draw(st.integers(3, 8))
    else:
        slots = draw(st.integers(12, max_model_len + 2) | st.integers(max_model_len + 2, 3 * max_model_len))
        seqs = draw(st.integers(3, 8) | st.integers(1, 8))
    chunked = draw(st.booleans()) if chunked is None else chunked
    if chunked:  # a budget below the longer prompts, so that they are cut into chunks
        budget = draw(st.integers(max(4, seqs), max(4, seqs, max_model_len // 2)))
    else:
        budget = draw(st.integers(max(4, seqs) if full else max_model_len, 2 * max_model_len))
    return SchedulerConfig(
        block_size=1, num_gpu_blocks=slots, num_cpu_blocks=0, max_num_seqs=seqs, max_num_batched_tokens=budget,
        max_model_len=max_model_len, enable_chunked_prefill=chunked,
        watermark=0.0, preemption_mode="recompute", policy=policy or draw(st.sampled_from(("fcfs", "lpm"))),
        enable_prefix_caching=True)


@st.composite
def sglang_traces(draw: st.DrawFn, policy: str | None = None, max_requests: int = 10, full: bool = True,
                  burst: bool | None = None, chunked: bool | None = False) -> Trace:
    """The sglang flow's traces (`conformance.flows.sglang`): see the module docstring."""
    burst = draw(st.booleans()) if burst is None else burst
    config = draw(sglang_configs(policy, full, burst, chunked))
    _, input_limit = door_limits(config)
    vocab = draw(st.sampled_from([2, 3, 50]))
    stems = draw(st.lists(st.lists(st.integers(3, 3 + vocab - 1), min_size=1, max_size=input_limit + 1),
                          min_size=1, max_size=3))
    count = draw(st.integers(3, max_requests)) if burst else draw(st.integers(4, max_requests)
                                                                   | st.integers(1, max_requests))
    # a burst: short prompts arriving together, each a third to a half of the pool; two are admitted
    # in full, the next ones a step later against 0.7 of what the running ones may still
    # generate (the new-token ratio), and together they outgrow the pool: decode retracts
    slots = config.num_gpu_blocks
    burst_prompt = draw(st.integers(1, 2))
    # two such requests are admitted in full; a third a step later fits when
    # slots - 3 * prompt + 0.4 > 2.4 * max_tokens, and three outgrow the pool when
    # 3 * (prompt + max_tokens - 1) > slots (the handmade retract-decode trace: 20 slots, 1 + 7)
    burst_tokens = max(1, int((slots - 3 * burst_prompt + 0.4) / 2.4))
    arrivals, stops, step = [], [], 0
    for i in range(count):
        step += 0 if burst else draw(st.sampled_from([0, 0, 0, 1, 2, 5]))
        if burst:
            length = min(burst_prompt, max(1, input_limit - 1))
            max_tokens = burst_tokens
        elif config.enable_chunked_prefill:  # long prompts, cut into chunks
            length = draw(st.integers(max(1, input_limit // 2), max(1, input_limit - 1))
                          | st.integers(1, input_limit + 2))
            max_tokens = draw(st.integers(1, 6) | st.integers(config.max_model_len // 2, config.max_model_len))
        else:
            length = draw(st.integers(1, max(1, input_limit // 2)) | st.integers(1, input_limit + 2))
            max_tokens = draw(st.integers(1, 6) | st.integers(config.max_model_len // 2, config.max_model_len))
        tail = draw(st.lists(st.integers(3, 3 + vocab - 1), max_size=3))
        tokens = (list(draw(st.sampled_from(stems))[:length]) + tail)[:length]
        while len(tokens) < length:
            tokens.append(3 + len(tokens) % vocab)
        if burst:  # prompts of their own: a shared prefix would save the slot that makes them outgrow the pool
            tokens = [100 + 3 * i + k for k in range(length)]
        request = Request(f"r{i}", prompt_len=length, max_tokens=max_tokens, prompt_tokens=tuple(tokens))
        arrivals.append(Arrival(step, request))
        if not burst and draw(st.integers(0, 7)) == 0:
            stops.append((step + draw(st.integers(1, 20)), seq_id(request.request_id, 0)))
    trace = Trace(config, tuple(arrivals), (), tuple(sorted(stops)))
    return Trace(config, trace.arrivals, (), trace.stops, max_steps=step + 40 + _bound(trace))


def sglang_configs_any() -> st.SearchStrategy:
    """The flow's configs, both policies, chunked prefill on or off (`conformance.flows.sglang`)."""
    return sglang_configs(full=False, chunked=None)


def sglang_traces_any() -> st.SearchStrategy:
    """The flow's traces, both policies, chunked prefill on or off, without chunking a budget of at
    least max_model_len (`conformance.flows.sglang`)."""
    return sglang_traces(full=False, chunked=None)


@st.composite
def sglang_lora_traces(draw: st.DrawFn, policy: str | None = None, roomy: bool = False) -> Trace:
    """The flow's traces with LoRA adapters (issue 32; sgl-project/sglang #25865, #23141): chunked
    prefill on (a request carried over mid-prefill is the shape of #25865), ``max_loras`` 1 or 2 and
    adapter ids 1-3, so that the slots bind. Three traces in four give every request an adapter:
    SGLang counts the base model (adapter 0) as one of its slots and the spec does not
    (hosts/sglang_lora.py), so only on such traces is SGLang's count the spec's; the fourth mixes
    base-model requests in. ``roomy``: a pool of at least max_model_len slots (the ``sglang``
    target's domain, `cache_holds_model_len`)."""
    trace = draw(sglang_traces(policy, chunked=True, burst=False))
    config = replace(trace.config, max_loras=draw(st.integers(1, 2)))
    if roomy:
        config = replace(config, num_gpu_blocks=max(config.num_gpu_blocks, config.max_model_len))
    lowest = draw(st.sampled_from([1, 1, 1, 0]))
    arrivals = tuple(Arrival(a.step, replace(a.request, lora_id=draw(st.integers(lowest, 3)))) for a in trace.arrivals)
    return replace(trace, config=config, arrivals=arrivals)


@st.composite
def sglang_carried_chunk_lora_traces(draw: st.DrawFn, policy: str | None = None) -> Trace:
    """sgl-project/sglang #25865's shape at page size 1: ``max_loras + 1`` requests of as many adapters,
    prompts of half to one and a half token budgets (so that one is cut into chunks and its last chunk
    leaves budget for another), arriving over three steps on a roomy pool; in half of them one request is
    stopped two to five steps after it arrives (while it decodes, most often)."""
    budget = draw(st.integers(6, 12))
    config = SchedulerConfig(
        block_size=1, num_gpu_blocks=64, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=budget,
        max_model_len=32, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
        enable_prefix_caching=True, policy=policy or draw(st.sampled_from(("fcfs", "lpm"))),
        max_loras=draw(st.integers(1, 2)))
    arrivals = []
    for i in range(config.max_loras + 1):
        length = draw(st.integers(budget // 2, budget + budget // 2))
        arrivals.append(Arrival(draw(st.integers(0, 2)), Request(
            f"r{i}", length, draw(st.integers(1, 6)), prompt_tokens=tuple(100 + 40 * i + k for k in range(length)),
            lora_id=i + 1)))
    stops = ()
    if draw(st.booleans()):
        stopped = draw(st.sampled_from(arrivals))
        stops = ((stopped.step + draw(st.integers(2, 5)), seq_id(stopped.request.request_id, 0)),)
    return Trace(config, tuple(sorted(arrivals, key=lambda a: a.step)), (), stops, max_steps=80)


# ------------------------------------------------------------------------------ running and classifying
