"""Traces inside a `spec.domain.ConfigDomain`: what the runner generates for an adapter that
declared the configs its engine supports.

The configs are drawn field by field within the domain (not drawn freely and filtered, which
would waste most draws on a narrow domain); the traces on them come from the generator of the
domain's flow (`conformance.generation.v0.traces` for V0, `conformance.generation.v1.token_traces` for
the token flows). The whole default domain draws exactly `conformance.generation.v0.traces()`, so an
adapter that declares nothing is tested as before domains existed.
"""

from __future__ import annotations

from hypothesis import strategies as st

from spec.config import SchedulerConfig
from spec.domain import UNBOUNDED_SEQS, ConfigDomain
from spec.trace import Trace


@st.composite
def domain_configs(draw: st.DrawFn, domain: ConfigDomain) -> SchedulerConfig:
    """A config inside ``domain``, favouring the same corners as `conformance.generation.v0.configs`:
    caches of a handful of blocks, budgets near the prompt limit."""
    token_flow = domain.flow != "v0"
    block_size = draw(st.sampled_from([1, 2, 4] if token_flow else [1, 2, 4, 8]))
    max_num_seqs = draw(st.integers(1, 6)) if domain.seq_limit else UNBOUNDED_SEQS
    max_model_len = draw(st.integers(block_size * 2 if token_flow else block_size, block_size * 12))
    chunked = domain.chunked_prefill and (not domain.unchunked or draw(st.booleans() | st.just(True)))
    if not domain.token_budget:
        budget = max_num_seqs * max_model_len  # can never bind: every running sequence at full length
    elif chunked:
        budget = draw(st.integers(max_num_seqs, max(max_num_seqs, max_model_len * 2)))
    else:
        low = max(max_num_seqs, max_model_len if domain.budget_covers_model_len else max_model_len // 2)
        budget = draw(st.integers(low, max(low, max_model_len * 2 + 8)))
    min_blocks = -(-max_model_len // block_size) if domain.cache_holds_model_len else 2
    modes = ("auto", "recompute", "swap") if domain.swap else ("recompute",)
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=draw(st.integers(min_blocks, max(min_blocks + 4, 24))),
        num_cpu_blocks=draw(st.integers(0, 24)) if domain.cpu_pool else 0,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        watermark=domain.watermark if domain.watermark is not None else draw(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.25])),
        preemption_mode=draw(st.sampled_from(modes)),
        policy=draw(st.sampled_from(["fcfs", "priority"])) if domain.priority else "fcfs",
        enable_chunked_prefill=chunked,
        max_num_partial_prefills=draw(st.sampled_from([0, 0, 1, 2])) if chunked and domain.prefill_caps else 0,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])) if chunked and domain.prefill_caps else 0,
        enable_prefix_caching=domain.prefix_caching and draw(st.booleans() | st.just(True)),
        pipeline_depth=domain.pipeline_depth,
        num_speculative_tokens=draw(st.integers(1, 4)) if domain.speculative else 0,
    )


def traces_in(domain: ConfigDomain) -> st.SearchStrategy[Trace]:
    """Every trace this strategy draws is admitted by ``domain`` (tests/test_config_domain.py)."""
    from conformance.generation.v0 import traces

    if domain == ConfigDomain():
        return traces()
    if domain.flow == "v0":
        return domain_configs(domain).flatmap(
            lambda c: traces(config=c, max_n=domain.max_n, allow_aborts=domain.aborts))
    from conformance.generation.v1 import token_traces

    if domain.speculative:  # the drafter's and the model's decisions too
        from conformance.generation.specdec import with_drafts

        return domain_configs(domain).flatmap(lambda c: token_traces(domain.flow, config=c, allow_aborts=domain.aborts)
                                              .flatmap(lambda t: with_drafts(t, k=c.num_speculative_tokens)))
    return domain_configs(domain).flatmap(
        lambda c: token_traces(domain.flow, config=c, allow_aborts=domain.aborts))
