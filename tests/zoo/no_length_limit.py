"""No length limit: an engine without max_model_len (most small engines have none).

1. The engine reads every setting of its config but max_model_len, which it does not have: a
   sequence ends by its stop or its max_tokens, and a prompt is refused only by the token budget
   (without chunked prefill) or the cache.
2. The adapter says so in its domain (``ConfigDomain(length_limit=False)``): configs get a
   max_model_len no trace reaches, prompts are drawn on their own scale and outputs from max_tokens
   alone, and LEN-001 is not applicable.

Correct: nothing in safety needs a length limit the engine does not have.
"""

from __future__ import annotations

import sys
from typing import Any

from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from spec.status import Status
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(length_limit=False)


class _WithoutLengthLimit:
    """The config as this engine reads it: every setting as given, no max_model_len."""

    max_model_len = sys.maxsize

    def __init__(self, config: SchedulerConfig) -> None:
        self._config = config

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)

    @property
    def prompt_limit(self) -> int:
        return sys.maxsize if self._config.enable_chunked_prefill else self._config.max_num_batched_tokens


class NoLengthLimit(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.config = _WithoutLengthLimit(config)  # type: ignore[assignment]


class CapsOneEarly(NoLengthLimit):
    def _check_stop(self, group: SequenceGroup, seq: Sequence, stopped: frozenset[str]) -> None:
        if seq.seq_id not in stopped and 1 < group.request.max_tokens <= seq.num_generated + 1:
            seq.status = Status.FINISHED_LENGTH_CAPPED  # bug: one token short of max_tokens
            self.block_manager.free(seq)
            return
        super()._check_stop(group, seq, stopped)


def traces() -> Any:
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-no-length-limit", NoLengthLimit, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-no-length-limit-broken", CapsOneEarly, domain=DOMAIN)
