"""Traces inside a `spec.domain.ConfigDomain`: what the runner generates for an adapter that
declared the configs its engine supports.

The configs are drawn field by field within the domain (not drawn freely and filtered, which
would waste most draws on a narrow domain); the traces on them come from the generator of the
domain's flow (`conformance.generation.v0.traces` for V0, `conformance.generation.v1.token_traces` for
the token flows). The whole default domain draws exactly `conformance.generation.v0.traces()`, so an
adapter that declares nothing is tested as before domains existed.

What an engine lacks is drawn as follows (issue 34):
- no sequence limit: the token budget is drawn as for any engine (chunks of every size stay
  reachable) and ``max_num_seqs`` is the most a config may say, the budget (or UNBOUNDED_SEQS);
- no length limit: ``max_model_len`` is UNBOUNDED_LEN; prompts are drawn on the scale a limit
  would have had, and outputs from max_tokens alone, long ones included;
- preconditions (``requires``): a field on the left of ``>=`` or ``>`` is raised until it holds,
  and whatever still fails is filtered out;
- no stops: the traces carry none.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import strategies as st

from spec.config import SchedulerConfig
from spec.domain import (
    PRECONDITION_FIELDS,
    UNBOUNDED_LEN,
    UNBOUNDED_SEQS,
    ConfigDomain,
    parse_precondition,
    precondition_value,
)
from spec.errors import InputError
from spec.trace import Trace

# max_tokens drawn for a non-default domain: long outputs too (`conformance.generation.v0.output_lengths`).
MAX_OUTPUT = 24


@st.composite
def domain_configs(draw: st.DrawFn, domain: ConfigDomain) -> SchedulerConfig:
    """A config inside ``domain``, favouring the same corners as `conformance.generation.v0.configs`:
    caches of a handful of blocks, budgets near the prompt limit."""
    token_flow = domain.flow != "v0"
    block_size = draw(st.sampled_from([1, 2, 4] if token_flow else [1, 2, 4, 8]))
    max_num_seqs = draw(st.integers(1, 6)) if domain.seq_limit else 1  # no limit: set from the budget below
    max_model_len = draw(st.integers(block_size * 2 if token_flow else block_size, block_size * 12))
    chunked = domain.chunked_prefill and (not domain.unchunked or draw(st.booleans() | st.just(True)))
    if not domain.token_budget:  # never binds: every running sequence at full length
        budget = (max_num_seqs if domain.seq_limit else UNBOUNDED_SEQS) * (
            max_model_len if domain.length_limit else UNBOUNDED_LEN)
    elif chunked:
        budget = draw(st.integers(max_num_seqs, max(max_num_seqs, max_model_len * 2)))
    else:
        low = max(max_num_seqs, max_model_len if domain.budget_covers_model_len else max_model_len // 2)
        budget = draw(st.integers(low, max(low, max_model_len * 2 + 8)))
    if not domain.seq_limit:
        max_num_seqs = min(UNBOUNDED_SEQS, budget)
    min_blocks = -(-max_model_len // block_size) if domain.cache_holds_model_len else 2
    modes = ("auto", "recompute", "swap") if domain.swap else ("recompute",)
    if domain.preemption_mode is not None:
        modes = (domain.preemption_mode,)
    config = SchedulerConfig(
        block_size=block_size,
        # half the caches within a few blocks of the least: preemptions of long outputs (issue 34)
        num_gpu_blocks=draw(st.integers(min_blocks, min_blocks + 3) | st.integers(min_blocks, max(min_blocks + 4, 24))),
        num_cpu_blocks=draw(st.integers(0, 24)) if domain.cpu_pool else 0,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len if domain.length_limit else UNBOUNDED_LEN,
        watermark=domain.watermark if domain.watermark is not None else draw(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.25])),
        preemption_mode=draw(st.sampled_from(modes)),
        policy=draw(st.sampled_from(["fcfs", "priority"])) if domain.priority else "fcfs",
        enable_chunked_prefill=chunked,
        max_num_partial_prefills=draw(st.sampled_from([0, 0, 1, 2])) if chunked and domain.prefill_caps else 0,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 3, 8])) if chunked and domain.prefill_caps else 0,
        enable_prefix_caching=domain.prefix_caching and (not domain.uncached or draw(st.booleans() | st.just(True))),
        pipeline_depth=domain.pipeline_depth,
        num_speculative_tokens=draw(st.integers(1, 4)) if domain.speculative else 0,
    )
    return satisfied(config, domain)


def satisfied(config: SchedulerConfig, domain: ConfigDomain) -> SchedulerConfig:
    """``config`` with each precondition's left field raised until it holds, where the left side
    is one field and the operator ``>=`` or ``>`` (the rest are left to the filter)."""
    for index, text in enumerate(domain.requires):
        left, op, right = parse_precondition(text, f"domain.requires[{index}]")
        terms, _ = left
        if op not in (">=", ">") or len(terms) != 1 or terms[0] not in PRECONDITION_FIELDS:
            continue
        need = precondition_value(right, config) + (op == ">")
        if precondition_value(left, config) < need:
            try:
                config = replace(config, **{str(terms[0]): need})
            except InputError:
                continue  # the raised value breaks a rule of the config itself: filtered out
    return config


def scale_of(config: SchedulerConfig) -> int | None:
    """The prompt scale for a config without a length limit (None: its own prompt limit)."""
    if config.max_model_len < UNBOUNDED_LEN:
        return None
    return min(config.prompt_limit, config.block_size * 12)


def traces_in(domain: ConfigDomain) -> st.SearchStrategy[Trace]:
    """Every trace this strategy draws is admitted by ``domain`` (tests/test_config_domain.py)."""
    if domain == ConfigDomain():
        from conformance.generation.v0 import traces

        return traces()
    configs = domain_configs(domain)
    if domain.requires:
        configs = configs.filter(lambda c: domain.why_not(c) is None)
    drawn = _flow_traces(domain, configs)
    return drawn if domain.stops else drawn.map(lambda t: replace(t, stops=()))


def _flow_traces(domain: ConfigDomain, configs: st.SearchStrategy[SchedulerConfig]) -> st.SearchStrategy[Trace]:
    from conformance.generation.v0 import traces

    if domain.flow == "v0":
        return configs.flatmap(lambda c: traces(config=c, max_n=domain.max_n, allow_aborts=domain.aborts,
                                                prompt_scale=scale_of(c), max_output=MAX_OUTPUT))
    from conformance.generation.v1 import token_traces

    def tokens(c: SchedulerConfig) -> st.SearchStrategy[Trace]:
        return token_traces(domain.flow, config=c, allow_aborts=domain.aborts, prompt_scale=scale_of(c),
                            max_output=MAX_OUTPUT, length_corners=True)

    if domain.speculative:  # the drafter's and the model's decisions too
        from conformance.generation.specdec import with_drafts

        return configs.flatmap(lambda c: tokens(c).flatmap(lambda t: with_drafts(t, k=c.num_speculative_tokens)))
    return configs.flatmap(tokens)
