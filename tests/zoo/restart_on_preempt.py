"""Restart a completion on preemption by recompute: the victim goes back to its prompt alone.

1. A recompute victim drops the tokens it generated (and their KV) and is queued again.
2. Its next prefill is its prompt; it generates its completion anew.

Correct for an engine that answers a request only when it finishes (it claims
``output_at_finish``): no client saw the dropped tokens, so regenerating them costs compute,
not correctness (tokasaurus' bump). REQ-004 and CHK-003 allow it under that claim.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from reference_impl.sequence import SequenceGroup
from spec.observation import ALL_CAPABILITIES, Capability
from zoo._adapter import zoo_adapter


class RestartOnPreempt(Scheduler):
    kept = 0  # prompt tokens dropped besides the completion (none)

    def _preempt_by_recompute(self, victim: SequenceGroup) -> None:
        super()._preempt_by_recompute(victim)
        for seq in victim.live_seqs():
            seq.num_tokens = max(seq.prompt_len - self.kept, 1)


class DropsPromptToo(RestartOnPreempt):
    kept = 1  # bug: the restart also loses the prompt's last token


CLAIMS = ALL_CAPABILITIES | {Capability.OUTPUT_AT_FINISH}


def make():
    return zoo_adapter("zoo-restart-on-preempt", RestartOnPreempt, capabilities=CLAIMS)


def make_broken():
    return zoo_adapter("zoo-restart-on-preempt-broken", DropsPromptToo, capabilities=CLAIMS)
