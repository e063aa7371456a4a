"""Traces with streaming-input sessions (issue 32; spec/session.py). What is drawn, and why:

- V1 token traces (chunked prefill, prefix caching and the policy drawn as for the flow, a
  max_model_len of 16 or more), about half
  the requests made sessions of one to three later inputs, so that sessions and plain requests share
  the cache;
- the first input arrives 0 to 12 steps after the request, each later one 0 to 8 steps after the
  one before, so that some arrive while the session still runs (taken up at its stop) and some
  after (it waits for input);
- inputs of 1 to 8 tokens with max_tokens 1 to 4, and a session's whole length (every prompt and
  max_tokens) kept below max_model_len (its first max_tokens lowered to fit): vLLM 0.33.0 accepts a session past it (it validates each
  input alone, v1/engine/input_processor.py), which the spec leaves undrawn (docs/CONFORMANCE.md);
- `session_deadlock_traces`: the shape of the lockstep class ``session-kv-held-deadlock``, a
  session holding most of a small pool while it waits for input and a request that needs it.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from conformance.generation.v1 import token_configs, token_traces
from spec.config import SchedulerConfig
from spec.session import InputPiece
from spec.trace import Arrival, Trace
from spec.types import Request


@st.composite
def with_sessions(draw: st.DrawFn, trace: Trace) -> Trace:
    """``trace`` with about half its requests made streaming sessions (module docstring)."""
    limit = trace.config.max_model_len - 1
    arrivals = []
    for arrival in trace.arrivals:
        request = arrival.request
        if draw(st.booleans()):
            room = limit - request.prompt_len - 1  # what the inputs may take, the first max_tokens at least 1
            pieces: list[InputPiece] = []
            step = arrival.step + draw(st.integers(0, 12))
            for _ in range(draw(st.integers(1, 3))):
                if room < 2:
                    break
                length = min(draw(st.integers(1, 8)), room - 1)
                piece = InputPiece(step, length, min(draw(st.integers(1, 4)), room - length))
                room -= piece.prompt_len + piece.max_tokens
                pieces.append(piece)
                step += draw(st.integers(0, 8))
            if pieces:
                request = replace(request, max_tokens=min(request.max_tokens, room + 1), session=tuple(pieces))
        arrivals.append(Arrival(arrival.step, request))
    return replace(trace, arrivals=tuple(arrivals), max_steps=max(trace.max_steps, 400))


def session_traces() -> st.SearchStrategy:
    """V1 traces whose requests are, about half of them, streaming-input sessions."""
    # a max_model_len of at least 16, so that a session has room for its inputs
    configs = token_configs("v1").filter(lambda c: c.max_model_len >= 16)
    return configs.flatmap(lambda c: token_traces("v1", config=c)).flatmap(with_sessions)


@st.composite
def session_deadlock_traces(draw: st.DrawFn) -> Trace:
    """A session A that fills most of a small pool, stops and waits for its next input (arriving a
    few steps later), and a request B, arriving meanwhile, that needs the blocks A holds."""
    block_size = 4
    blocks = draw(st.integers(6, 10))
    config = SchedulerConfig(
        block_size=block_size, num_gpu_blocks=blocks, num_cpu_blocks=0, max_num_seqs=4,
        max_num_batched_tokens=64, max_model_len=blocks * block_size, watermark=0.0, preemption_mode="recompute",
        enable_chunked_prefill=draw(st.booleans()),
    )
    a_len = draw(st.integers((blocks - 3) * block_size, (blocks - 2) * block_size))
    first = draw(st.integers(1, 2))
    piece = InputPiece(draw(st.integers(4, 8)), draw(st.integers(1, 3)), draw(st.integers(1, 2)))
    b_len = draw(st.integers(3 * block_size, (blocks - 1) * block_size))
    a = Request("A", a_len, first, session=(piece,))
    b = Request("B", b_len, draw(st.integers(1, 3)))
    return Trace(config, (Arrival(0, a), Arrival(draw(st.integers(1, 3)), b)), max_steps=80)
