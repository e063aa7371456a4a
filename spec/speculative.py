"""Speculative decoding in the spec: what the drafter proposes and what the model accepts.

With speculative decoding (``SchedulerConfig.num_speculative_tokens`` = k > 0) a running request
is scheduled for its next token plus up to k *draft* tokens a drafter proposed. The model
verifies them in that step: it accepts a prefix of j drafts and samples one more token after them
(the *bonus*), so the step commits j + 1 tokens; the other drafts are rejected and their KV is
garbage that the scheduler must roll back (vLLM 0.33.0: ``update_from_output``,
``vllm/v1/core/sched/scheduler.py:2346-2364``).

Neither the proposal nor the acceptance is the scheduler's choice, so a trace fixes both, per
step and sequence, as a `DraftDecision` (the trace field ``drafts``, `spec.trace`):

* ``proposed``: drafts the drafter proposes *after* this step for the sequence's next decode
  (default k; clamped to k). The scheduler may schedule fewer (budget, length), never more.
* ``accepted``: of the drafts this step verified, how many the model accepts (default 0;
  clamped to the drafts scheduled and to those the drafter really proposed).
* ``stop_at``: when the trace stops the sequence in this step (``stops``), the index of the stop
  token among the step's committed tokens (default: the last). Tokens after it are never
  delivered, though the model computed them.
* ``empty``: the model returns no token at all for the sequence in this step (the outcome of
  vllm-project/vllm#42722; the PR's discussion names chunked-prefill catch-up as a case). Its
  drafts and the step's sample are void: the scheduler must roll the step back, and with
  outcomes in flight also the request's later steps, fed a token that never came.

Why the bonus token is not a draft: every verifying step samples one token whatever the drafts
were, so a step with j accepted drafts delivers j + 1 tokens, and a step with no drafts is today's
decode. Token values stay `spec.types.generated_token` at each position, so a speculative run
delivers exactly the stream a non-speculative run delivers for the same stop positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.config import MAX_SPECULATIVE_TOKENS

__all__ = ["MAX_SPECULATIVE_TOKENS", "NO_DECISION", "DraftDecision", "committed_tokens", "stop_index"]


@dataclass(frozen=True)
class DraftDecision:
    """The environment's speculative-decoding choices for one sequence in one step."""

    proposed: int | None = None  # None: the drafter proposes k
    accepted: int = 0
    stop_at: int | None = None  # None: a stop falls on the last committed token
    empty: bool = False

    def num_proposed(self, k: int) -> int:
        return k if self.proposed is None else min(self.proposed, k)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"accepted": self.accepted}
        if self.proposed is not None:
            data["proposed"] = self.proposed
        if self.stop_at is not None:
            data["stop_at"] = self.stop_at
        if self.empty:
            data["empty"] = True
        return data


NO_DECISION = DraftDecision()


def committed_tokens(decision: DraftDecision, num_drafts: int, num_valid: int | None = None) -> int:
    """Tokens one verifying step commits for a sequence it scheduled with ``num_drafts`` drafts:
    the accepted drafts (at most the drafts scheduled and, when ``num_valid`` is given, the drafts
    the drafter really proposed) plus the bonus; 0 for an empty outcome."""
    if decision.empty:
        return 0
    accepted = min(decision.accepted, num_drafts, num_drafts if num_valid is None else num_valid)
    return accepted + 1


def stop_index(decision: DraftDecision, committed: int) -> int:
    """Index, among ``committed`` tokens, of the stop token of a sequence the trace stops."""
    last = committed - 1
    return last if decision.stop_at is None else min(decision.stop_at, last)
