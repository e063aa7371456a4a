"""Hypothesis strategies for the KV-connector flow (`conformance.flows.connector`).

A connector trace is a V1 trace (`conformance.generation.v1`) whose config has ``kv_connector``
(and a ``kv_load_failure_policy``, either) and whose requests carry the connector's script
(`spec.connector.ConnectorScript`): about two in three requests get external tokens, half of
those load asynchronously over 1-4 steps, some loads fail on one or two of their blocks, and some
finished requests keep their blocks for a send or a store of 1-4 steps. The pool is kept small
(the V1 generator's KV pressure), so loads, sends and admissions compete for blocks.

Everything drawn is a field of the trace, so Hypothesis shrinks inside the domain: a script
shrinks towards no external tokens, a synchronous load, one step, no failure, no send.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from conformance.generation.v1 import token_configs, token_traces
from spec.config import SchedulerConfig
from spec.connector import ConnectorScript
from spec.trace import Arrival, Trace
from spec.types import Request


@st.composite
def scripts(draw: st.DrawFn, prompt_len: int, block_size: int) -> ConnectorScript:
    blocks = -(-prompt_len // block_size)
    return ConnectorScript(
        external_tokens=draw(st.integers(0, prompt_len) | st.just(prompt_len)),
        load_async=draw(st.booleans()),
        load_steps=draw(st.integers(1, 4)),
        failed_blocks=tuple(sorted(set(draw(st.lists(st.integers(0, max(blocks - 1, 0)), max_size=2))))) if draw(
            st.integers(0, 3)) == 0 else (),
        send_steps=draw(st.sampled_from([0, 0, 1, 2, 4])),
    )


@st.composite
def with_connector(draw: st.DrawFn, trace: Trace) -> Trace:
    """``trace`` with a connector in its config and scripts for some of its requests."""
    # max_num_partial_prefills: V1 has no such limit (0), and the connector's waiting pass models V1.
    config = dataclasses.replace(trace.config, kv_connector=True, max_num_partial_prefills=0,
                                 long_prefill_token_threshold=_threshold(trace.config),
                                 kv_load_failure_policy=draw(st.sampled_from(["recompute", "fail"])))
    chosen = {}
    for a in trace.arrivals:
        if draw(st.integers(0, 2)):
            chosen[a.request.request_id] = draw(scripts(a.request.prompt_len, config.block_size))
    return dataclasses.replace(trace, config=config, connector=chosen)


def _threshold(config: SchedulerConfig) -> int:
    """vLLM refuses a long_prefill_token_threshold above max_model_len (SchedulerConfig validation)."""
    return min(config.long_prefill_token_threshold, config.max_model_len)


def connector_configs() -> st.SearchStrategy:
    """The flow's configs: V1's with a connector, either failure policy."""
    return st.builds(lambda c, p: dataclasses.replace(c, kv_connector=True, kv_load_failure_policy=p,
                                                      max_num_partial_prefills=0, long_prefill_token_threshold=_threshold(c)),
                     token_configs("v1"), st.sampled_from(["recompute", "fail"]))


def connector_traces() -> st.SearchStrategy:
    """The flow's traces: V1 traces with the connector's scripts."""
    return token_traces("v1").flatmap(with_connector)


def connector_traces_for(config: SchedulerConfig, max_requests: int = 6) -> st.SearchStrategy:
    """Traces on one config (its connector fields kept)."""
    return token_traces("v1", config=config, max_requests=max_requests).flatmap(with_connector)


@st.composite
def pressure_traces(draw: st.DrawFn) -> Trace:
    """Connector traces under KV pressure, for the museum's liveness shapes: a pool a few blocks
    above the longest prompt, two to four requests arriving together, most loading asynchronously
    (the loads hold blocks the others need), no aborts or stops to free them early."""
    block_size = draw(st.sampled_from([1, 2]))
    max_model_len = draw(st.integers(4, 12))
    config = SchedulerConfig(
        block_size=block_size, num_gpu_blocks=-(-max_model_len // block_size) + draw(st.integers(0, 3)),
        num_cpu_blocks=0, max_num_seqs=draw(st.integers(1, 3)), max_num_batched_tokens=max_model_len,
        max_model_len=max_model_len, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
        kv_connector=True)
    requests = []
    chosen = {}
    for i in range(draw(st.integers(2, 4))):
        length = draw(st.integers(2, max_model_len - 1))
        requests.append(Arrival(draw(st.integers(0, 1)), Request(f"r{i}", length, max_tokens=draw(st.integers(1, 4)),
                                                                 prompt_tokens=tuple(range(i * 50 % 7, i * 50 % 7 + length)))))
        if draw(st.integers(0, 3)):
            chosen[f"r{i}"] = ConnectorScript(external_tokens=draw(st.integers(1, length)), load_async=True,
                                              load_steps=draw(st.integers(1, 2)))
    requests.sort(key=lambda a: a.step)
    return Trace(config, tuple(requests), max_steps=60, connector=chosen)


@st.composite
def failed_block_sharer_traces(draw: st.DrawFn) -> Trace:
    """An owner whose synchronous load of its prompt fails on one block under the recompute policy,
    and a request with the same prompt arriving at step 0 to 3 (KVC-011; the hunt
    conformance/selftest/campaigns/failed_block_readers.py): a small budget and a long-prefill
    threshold of at most a block chunk the owner's recompute and leave budget to the sharer;
    half the time a third request and a small pool press the owner out."""
    bs = draw(st.sampled_from([2, 4]))
    blocks = draw(st.integers(2, 4))
    prompt = tuple((3 * i + 1) % 7 for i in range(blocks * bs + draw(st.integers(1, bs))))
    tail = tuple(5 for _ in range(draw(st.integers(1, 2 * bs))))
    pressure = draw(st.booleans())
    need = -(-(len(prompt) + len(tail) + 4) // bs)
    num_blocks = need + draw(st.integers(1, 3)) if pressure else 4 * need
    config = SchedulerConfig(  # vLLM V1 refuses a pool smaller than max_model_len (vllm_v1_host.reset)
        block_size=bs, num_gpu_blocks=num_blocks, num_cpu_blocks=0, max_model_len=num_blocks * bs,
        max_num_seqs=3, max_num_batched_tokens=draw(st.integers(bs + 1, 3 * bs)),
        long_prefill_token_threshold=draw(st.integers(0, bs)),  # the owner's recompute cut, budget left to the sharer
        watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True, enable_prefix_caching=True,
        kv_connector=True, kv_load_failure_policy="recompute")
    owner = Request("owner", len(prompt), draw(st.integers(1, 4)), prompt_tokens=prompt)
    sharer = Request("sharer", len(prompt) + len(tail), draw(st.integers(1, 4)), prompt_tokens=prompt + tail)
    arrivals = [Arrival(0, owner), Arrival(draw(st.integers(0, 3)), sharer)]
    if pressure:  # a long request that comes later and presses the owner out
        length = draw(st.integers(2 * bs, len(prompt) + bs))
        arrivals.append(Arrival(draw(st.integers(0, 2)), Request("press", length, draw(st.integers(4, 12)),
                                                                 prompt_tokens=tuple(6 for _ in range(length)))))
    script = ConnectorScript(external_tokens=len(prompt) - 1, load_async=False,
                             failed_blocks=(draw(st.integers(0, blocks - 1)),))
    return Trace(config, tuple(sorted(arrivals, key=lambda a: a.step)), max_steps=200, connector={"owner": script})
