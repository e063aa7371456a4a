"""One token budget and no sequence limit (vLLM V1's flow without max_num_seqs).

The engine reads every setting of its config but max_num_seqs, which it does not have: running
requests are bounded by the token budget alone (each running request takes at least one token
per step, and admission stops when the budget is spent). Its traces set max_num_seqs to the
token budget, the most a config may say, so the declared limits (BUD-002/003) still speak for
this engine while the budget binds. (`spec.domain.ConfigDomain(seq_limit=False)` would give it
max_num_seqs = 64, and so budgets of 64 and more that these small traces never reach.)
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from reference_impl.v1_scheduler import CAPABILITIES, V1Scheduler
from spec.config import SchedulerConfig
from zoo._adapter import zoo_adapter


class _WithoutSeqLimit:
    """The config as this engine reads it: every setting as given, no sequence limit."""

    max_num_seqs = sys.maxsize

    def __init__(self, config: SchedulerConfig, extra_tokens: int = 0) -> None:
        self._config = config
        self.max_num_batched_tokens = config.max_num_batched_tokens + extra_tokens

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


class TokenBudgetOnly(V1Scheduler):
    extra_tokens = 0

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.config = _WithoutSeqLimit(config, self.extra_tokens)  # type: ignore[assignment]


class OverBudget(TokenBudgetOnly):
    extra_tokens = 1  # bug: one token past the budget


def traces() -> Any:
    from conformance.generation.v1 import token_configs, token_traces

    configs = token_configs("v1").map(lambda c: replace(c, max_num_seqs=c.max_num_batched_tokens))
    return configs.flatmap(lambda c: token_traces("v1", config=c))


def make():
    adapter = zoo_adapter("zoo-no-seq-limit", TokenBudgetOnly, capabilities=CAPABILITIES)
    adapter.trace_strategy = traces  # type: ignore[attr-defined]
    return adapter


def make_broken():
    adapter = zoo_adapter("zoo-no-seq-limit-broken", OverBudget, capabilities=CAPABILITIES)
    adapter.trace_strategy = traces  # type: ignore[attr-defined]
    return adapter
