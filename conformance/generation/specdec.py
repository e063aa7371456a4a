"""Hypothesis strategies for the speculative-decoding flow (`conformance.flows.specdec`).

A speculative trace is a V1 trace (`conformance.generation.v1`) with ``num_speculative_tokens``
k in 1..4 (EAGLE/MTP drafters run 1-7) and the environment's draft decisions
(`spec.speculative.DraftDecision`): per step and sequence, how many drafts the drafter proposes
next and how many of the verified ones the model accepts, and where a stop falls inside the
accepted run. Decisions are drawn sparsely over the steps a request may run (a sequence not named
gets the default: k proposed, none accepted), biased to accepting, so that accepted runs cross
block boundaries, meet ``max_tokens`` and ``max_model_len``, and stops fall inside them.
"""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from conformance.generation.v1 import token_configs, token_traces
from spec.config import SchedulerConfig
from spec.speculative import DraftDecision
from spec.trace import Trace
from spec.types import seq_id

MAX_K = 4


@st.composite
def decisions(draw: st.DrawFn, k: int, allow_empty: bool = False) -> DraftDecision:
    accepted = draw(st.integers(0, k) | st.just(k))
    proposed = draw(st.none() | st.integers(0, k))
    stop_at = draw(st.none() | st.integers(0, k))
    empty = allow_empty and draw(st.integers(0, 5)) == 0
    return DraftDecision(proposed, accepted, stop_at, empty)


@st.composite
def with_drafts(draw: st.DrawFn, trace: Trace, k: int | None = None, allow_empty: bool = False) -> Trace:
    """``trace`` with k drawn (unless given) and draft decisions for its requests' steps."""
    k = draw(st.integers(1, MAX_K)) if k is None else k
    config = dataclasses.replace(trace.config, num_speculative_tokens=k)
    seqs = [seq_id(a.request.request_id, 0) for a in trace.arrivals]
    horizon = max((a.step for a in trace.arrivals), default=0) + 40
    raw = draw(st.lists(st.tuples(st.integers(0, horizon), st.sampled_from(seqs), decisions(k, allow_empty)),
                        max_size=80))
    chosen = {(step, sid): d for step, sid, d in raw}
    for step, sid in trace.stops:  # half the stops fall inside an accepted run
        if draw(st.booleans()):
            chosen[(step, sid)] = DraftDecision(draw(st.none() | st.integers(0, k)), draw(st.integers(1, k)),
                                                draw(st.integers(0, k - 1)), False)
    drafts = tuple((step, sid, d) for (step, sid), d in sorted(chosen.items()))
    # An empty outcome rolls the step back to the last known token, whose block may have been keyed
    # when the step was scheduled; its KV was written by that step's forward pass, so PFX-001 and
    # SPD-007 allow it (`spec.invariants._views.void_outcomes`, docs/SPECDEC.md section 8): prefix
    # caching stays as drawn. With outcomes in flight it is turned off (`pipelined`).
    return Trace(config, trace.arrivals, trace.aborts, trace.stops, trace.max_steps, dict(trace.meta), drafts)


def specdec_configs() -> st.SearchStrategy:
    """The flow's configs: V1's, with k in 1..MAX_K."""
    return st.builds(lambda c, k: dataclasses.replace(c, num_speculative_tokens=k), token_configs("v1"),
                     st.integers(1, MAX_K))


def specdec_traces(allow_empty: bool = False) -> st.SearchStrategy:
    """The flow's traces: V1 traces with k and draft decisions (no empty outcomes unless asked)."""
    return token_traces("v1").flatmap(lambda t: with_drafts(t, allow_empty=allow_empty))


def specdec_traces_for(config: SchedulerConfig, max_requests: int = 6, allow_empty: bool = False) -> st.SearchStrategy:
    """Traces on one config (its k kept when set)."""
    k = config.num_speculative_tokens or None
    return token_traces("v1", config=config, max_requests=max_requests).flatmap(
        lambda t: with_drafts(t, k=k, allow_empty=allow_empty))


def specdec_traces_with_empty() -> st.SearchStrategy:
    """With vllm-project/vllm#42722's empty outcomes too (the mutant that drops their rollback)."""
    return specdec_traces(allow_empty=True)


def pipelined(trace: Trace, depth: int) -> Trace:
    """``trace`` with outcomes ``depth`` steps late (the async reference's config: no watermark, no
    partial-prefill limit, as the async flow's traces)."""
    config = dataclasses.replace(trace.config, pipeline_depth=depth, watermark=0.0, max_num_partial_prefills=0)
    if depth and any(d.empty for _, _, d in trace.drafts):
        # The empty-outcome allowance of PFX-001/SPD-007 (`void_outcomes`) is stated for
        # synchronous steps only: with outcomes in flight such a trace runs without prefix caching.
        config = dataclasses.replace(config, enable_prefix_caching=False)
    return dataclasses.replace(trace, config=config)


def pipelined_specdec_traces(depth: int | None = None, allow_empty: bool = False) -> st.SearchStrategy:
    """Speculative traces with outcomes in flight: ``pipeline_depth`` ``depth`` (drawn from 1..2
    when None): what the async reference runs with drafts."""
    depths = st.integers(1, 2) if depth is None else st.just(depth)
    return st.tuples(specdec_traces(allow_empty=allow_empty), depths).map(lambda pair: pipelined(*pair))


def depth_one_specdec_traces() -> st.SearchStrategy:
    """Depth 1 (vLLM's AsyncScheduler): the mutants of the async reference with drafts search these."""
    return pipelined_specdec_traces(1)


def depth_one_specdec_traces_with_empty() -> st.SearchStrategy:
    """Depth 1 with vllm-project/vllm#42722's empty outcomes (the next step, already in flight, was
    fed a token that never came: the async reference voids it)."""
    return pipelined_specdec_traces(1, allow_empty=True)
