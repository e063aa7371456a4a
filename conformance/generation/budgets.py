"""Hypothesis strategies for the V1 flow's budgets beyond tokens and KV blocks (issue 32):
encoder inputs under an encoder compute budget and cache, and LoRA requests under max_loras.

A trace here is a V1 trace (`conformance.generation.v1.token_traces`) whose config gains an encoder
(``encoder_compute_budget``, ``encoder_cache_size``) and ``max_loras``, and whose requests gain encoder
inputs and adapter ids. What is drawn, and why:

- chunked prefill on: an encoder input the budget or cache cannot take cuts a chunk before it
  (vLLM does so with chunked prefill off too, which the spec's BUD-004 forbids there);
- prefix caching off: vLLM keys a block by its tokens *and* the hashes of the encoder inputs in it
  (``kv_cache_utils.generate_block_hash_extra_keys``), the reference's keys are tokens only;
- a few content hashes per trace, each with one length, so that requests share encoder outputs;
  lengths up to 6 positions and a cache of one to three of the largest, so that it fills;
- adapter ids 1-3 (0: the base model) and max_loras 1-2, so that the slots bind;
- a third of the time a pause (``pause_new`` or ``pause_all``) at a step up to two after the last
  arrival and its ``resume`` one to five steps later, so that requests arrive, wait and run across it;
- grammar waits (`grammar_traces`): about half the requests wait 0 to 4 steps for their grammar.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from conformance.generation.v1 import token_configs, token_traces
from spec.config import SchedulerConfig
from spec.encoder import EncoderInput
from spec.trace import Arrival, Trace
from spec.types import Request

MAX_INPUT_LEN = 6


@st.composite
def budget_configs(draw: st.DrawFn) -> SchedulerConfig:
    config = draw(token_configs("v1"))
    longest = draw(st.integers(1, MAX_INPUT_LEN))
    encoder = draw(st.booleans() | st.just(True))
    lora = draw(st.booleans())
    budget = draw(st.integers(longest, longest * 3)) if encoder else 0
    return replace(
        config, enable_chunked_prefill=True, enable_prefix_caching=False,
        encoder_compute_budget=budget, encoder_cache_size=draw(st.integers(longest, longest * 3)) if encoder else 0,
        max_loras=draw(st.integers(1, 2)) if lora else 0,
    )


@st.composite
def with_budgets(draw: st.DrawFn, trace: Trace, pause: bool | None = None) -> Trace:
    """``trace`` with encoder inputs and adapter ids drawn for its requests (its config has the budgets).
    ``pause``: a pause and its resume always (True), never (False), or a third of the time (None)."""
    config = trace.config
    longest = min(config.encoder_compute_budget, config.encoder_cache_size)
    lengths = {f"h{i}": draw(st.integers(1, longest)) for i in range(draw(st.integers(1, 3)))} if longest else {}
    arrivals = []
    for arrival in trace.arrivals:
        request = arrival.request
        inputs = _encoder_inputs(draw, lengths, request.prompt_len)
        # a session's later inputs may carry their own (an audio chunk of a realtime session), with the same hashes
        session = tuple(replace(piece, encoder_inputs=_encoder_inputs(draw, lengths, piece.prompt_len))
                        for piece in request.session)
        lora = draw(st.integers(0, 3)) if config.max_loras else 0
        arrivals.append(Arrival(arrival.step, replace(request, encoder_inputs=inputs, lora_id=lora, session=session)))
    admin = list(trace.admin)
    if pause is True or (pause is None and draw(st.integers(0, 2)) == 0):
        at = draw(st.integers(0, trace.last_arrival_step + 2))
        admin += [(at, draw(st.sampled_from(["pause_new", "pause_all"]))), (at + draw(st.integers(1, 5)), "resume")]
    return replace(trace, arrivals=tuple(arrivals), admin=tuple(sorted(admin)))


def _encoder_inputs(draw: st.DrawFn, lengths: dict[str, int], prompt_len: int) -> tuple[EncoderInput, ...]:
    """Up to two encoder inputs within ``prompt_len`` positions, each hash at its one length."""
    inputs: list[EncoderInput] = []
    position = 0
    for _ in range(draw(st.integers(0, 2)) if lengths else 0):
        digest = draw(st.sampled_from(sorted(lengths)))
        start = position + draw(st.integers(0, 4))
        if start + lengths[digest] > prompt_len:
            break
        inputs.append(EncoderInput(start, lengths[digest], digest))
        position = start + lengths[digest]
    return tuple(inputs)


def budget_traces() -> st.SearchStrategy:
    """V1 traces with encoder inputs and LoRA ids under their budgets."""
    return budget_configs().flatmap(lambda c: token_traces("v1", config=c)).flatmap(with_budgets)


@st.composite
def with_grammars(draw: st.DrawFn, trace: Trace) -> Trace:
    """``trace`` with a grammar wait drawn for about half its requests: each is ready 0 to 4 steps
    after its arrival (0: compiled before the first step it could run in; spec/invariants/grammar.py)."""
    arrivals = []
    for arrival in trace.arrivals:
        ready = draw(st.none() | st.integers(0, 4))
        request = replace(arrival.request, grammar_ready_step=None if ready is None else arrival.step + ready)
        arrivals.append(Arrival(arrival.step, request))
    return replace(trace, arrivals=tuple(arrivals))


def grammar_traces() -> st.SearchStrategy:
    """V1 traces whose structured-output requests wait for their grammars (chunked prefill drawn)."""
    return token_configs("v1").flatmap(lambda c: token_traces("v1", config=c)).flatmap(with_grammars)


def v1_traces_with_budgets() -> st.SearchStrategy:
    """What ``kvsched conform --adapter reference-v1`` draws: the V1 flow's traces, and a fifth of the
    time each traces with the encoder and LoRA budgets (`budget_traces`), with grammar waits
    (`grammar_traces`) or with streaming-input sessions (`conformance.generation.sessions`)."""
    from conformance.generation.sessions import session_traces
    from conformance.generation.v1 import v1_traces

    return st.one_of(v1_traces(), v1_traces(), budget_traces(), grammar_traces(), session_traces())





@st.composite
def encoder_deadlock_traces(draw: st.DrawFn) -> Trace:
    """The shape of vllm-project/vllm PR #31857: a running request A whose next chunk needs an encoder
    output, and a waiting request B whose own input fills the encoder cache while B waits for KV
    blocks that A holds. Drawn around the museum exhibit: the sizes, the positions, the arrivals."""
    length = draw(st.integers(2, 6))
    threshold = draw(st.integers(length + 1, 8))  # both waiting at step 0: each chunk capped at it
    position = draw(st.integers(threshold + 1, 2 * threshold - 1))  # A's input: read by its second chunk
    a_len = draw(st.integers(position + length, position + length + 6))
    b_len = draw(st.integers(36, 44))
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=draw(st.integers(11, 13)), num_cpu_blocks=0, max_num_seqs=4,
        max_num_batched_tokens=2 * threshold, max_model_len=48, watermark=0.0, preemption_mode="recompute",
        enable_chunked_prefill=True, long_prefill_token_threshold=threshold,
        encoder_compute_budget=length, encoder_cache_size=length,
    )
    a = Request("A", a_len, draw(st.integers(1, 3)), prompt_tokens=tuple(i % 7 for i in range(a_len)),
                encoder_inputs=(EncoderInput(position, length, "a"),))
    b = Request("B", b_len, draw(st.integers(1, 3)), prompt_tokens=tuple(i % 5 for i in range(b_len)),
                encoder_inputs=(EncoderInput(0, length, "b"),))
    return Trace(config, (Arrival(0, a), Arrival(0, b)), max_steps=200)


@st.composite
def carried_chunk_lora_traces(draw: st.DrawFn) -> Trace:
    """The shape of sgl-project/sglang #25865: a LoRA request mid-prefill carried over into a step in
    which a request with another adapter could be admitted, under max_loras adapters."""
    budget = draw(st.integers(8, 16))
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=40, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=budget,
        max_model_len=64, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
        max_loras=draw(st.integers(1, 2)),
    )
    arrivals = []
    for i in range(config.max_loras + 1):
        length = draw(st.integers(budget // 2, budget + budget // 2))
        arrivals.append(Arrival(draw(st.integers(0, 2)), Request(
            f"r{i}", length, draw(st.integers(1, 4)), prompt_tokens=tuple(range(length)), lora_id=i + 1)))
    return Trace(config, tuple(arrivals), max_steps=200)


@st.composite
def encoder_decode_traces(draw: st.DrawFn) -> Trace:
    """The shape of vllm-project/vllm #55733 (fix #51228): requests whose encoder inputs are consumed by
    their prefill and that then decode for several steps, the steps in which an encoder-decoder cache
    credited the inputs' space again."""
    length = draw(st.integers(2, 6))
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=16,
        max_model_len=32, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
        encoder_compute_budget=length, encoder_cache_size=length * draw(st.integers(1, 2)),
    )
    arrivals = []
    for i in range(draw(st.integers(1, 3))):
        position = draw(st.integers(0, 2))
        prompt = position + length + draw(st.integers(0, 4))
        arrivals.append(Arrival(draw(st.integers(0, 2)), Request(
            f"r{i}", prompt, draw(st.integers(3, 6)), prompt_tokens=tuple(range(prompt)),
            encoder_inputs=(EncoderInput(position, length, f"img{draw(st.integers(0, 1))}"),))))
    return Trace(config, tuple(arrivals), max_steps=60)


@st.composite
def paused_arrival_traces(draw: st.DrawFn) -> Trace:
    """The shape of vllm-project/vllm #51487: requests that arrive while the engine is paused, and the
    resume after which they must run."""
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=16,
        max_model_len=32, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
    )
    pause = draw(st.integers(0, 2))
    arrivals = [Arrival(0, Request("r0", draw(st.integers(2, 8)), draw(st.integers(2, 8))))]
    for i in range(1, draw(st.integers(2, 3))):
        length = draw(st.integers(2, 8))
        arrivals.append(Arrival(pause + draw(st.integers(0, 1)), Request(f"r{i}", length, draw(st.integers(1, 4)))))
    admin = ((pause, draw(st.sampled_from(["pause_new", "pause_all"]))), (pause + draw(st.integers(2, 4)), "resume"))
    return Trace(config, tuple(arrivals), admin=admin, max_steps=60)


def mixed_session_traces() -> st.SearchStrategy:
    """Streaming-input sessions (`conformance.generation.sessions.with_sessions`) over the budgets'
    configs: sessions beside grammar waits, encoder inputs in first prompts and later inputs, adapter
    ids and, a third of the time, a pause. A session's adapter serves every input."""
    from conformance.generation.sessions import with_sessions

    configs = budget_configs().filter(lambda c: c.max_model_len >= 16)
    return configs.flatmap(lambda c: token_traces("v1", config=c)).flatmap(with_sessions).flatmap(
        with_grammars).flatmap(with_budgets)
