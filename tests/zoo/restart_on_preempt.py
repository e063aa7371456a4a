"""Restart a completion on preemption by recompute: the victim goes back to its prompt alone.

1. A recompute victim drops the tokens it generated (and their KV) and is queued again.
2. Its next prefill is its prompt; it generates its completion anew.
3. As tokasaurus (server/utils.py validate_length), it refuses at add_request a request whose
   whole completion cannot fit the cache: a restart would otherwise livelock such a request
   (admitted, grown past the pool, preempted, restarted, admitted again; LIV-002 found it), where
   a scheduler that keeps the tokens ignores it once it has grown past what fits.

Correct for an engine that answers a request only when it finishes (it claims
``output_at_finish``): no client saw the dropped tokens, so regenerating them costs compute,
not correctness (tokasaurus' bump). REQ-004 and CHK-003 allow it under that claim.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from reference_impl.sequence import SequenceGroup
from spec.observation import ALL_CAPABILITIES, Capability
from spec.status import Status
from spec.types import Finished, Request
from zoo._adapter import zoo_adapter


class RestartOnPreempt(Scheduler):
    kept = 0  # prompt tokens dropped besides the completion (none)

    def add_request(self, request: Request) -> Finished | None:
        super().add_request(request)
        bs = self.config.block_size
        whole = -(-min(request.prompt_len + request.max_tokens, self.config.max_model_len) // bs)
        if request.n * whole > self.config.num_gpu_blocks - self.config.watermark_blocks:
            group = self.groups[request.request_id]
            self.waiting.remove(group)
            self._finish(group, Status.FINISHED_IGNORED)
            return Finished(request.request_id, Status.FINISHED_IGNORED)
        return None

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
