"""One token budget and no sequence limit (vLLM V1's flow without max_num_seqs).

The engine reads every setting of its config but max_num_seqs, which it does not have: running
requests are bounded by the token budget alone (each running request takes at least one token
per step, and admission stops when the budget is spent). Its domain says so
(``ConfigDomain(seq_limit=False)``): budgets are drawn as for any engine, so prompts are split
into chunks of every size, max_num_seqs is the budget (the most a config may say), and the
sequence limits (BUD-002/003, STR-002) are not applicable.
"""

from __future__ import annotations

import sys
from typing import Any

from reference_impl.v1_scheduler import CAPABILITIES, V1Scheduler
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, seq_limit=False, chunked_prefill=True,
                      prefix_caching=True, budget_covers_model_len=True, cache_holds_model_len=True)


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
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-no-seq-limit", TokenBudgetOnly, capabilities=CAPABILITIES, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-no-seq-limit-broken", OverBudget, capabilities=CAPABILITIES, domain=DOMAIN)
