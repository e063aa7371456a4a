"""The speculative-decoding flow: vLLM V1's scheduler with ``num_speculative_tokens`` = k > 0
(spec/speculative.py is the model; spec/invariants/specdec.py what it promises).

The decisions are `V1Scheduler`'s (and, with outcomes in flight, `AsyncV1Scheduler`'s): vLLM
runs speculative decoding inside its one ``Scheduler`` class, so the reference does too, and this
class only names the flow (the registry, its profile and its mutants refer to it). One step:

1. After a step that sampled for a request, the drafter proposes up to k drafts for its next
   decode; the trace says how many (`DraftDecision.proposed`). `TrackedRequest.num_proposed`
   holds them; a preemption drops them (vLLM ``_preempt_request`` clears ``spec_token_ids``).
2. ``schedule()``: a decoding request in the running loop asks for its next token plus its drafts,
   capped so that the token after the last draft fits ``max_model_len`` and ``max_tokens``
   (`V1Scheduler._draft_room`); then the long-prefill threshold and the budget cap the whole
   chunk, drafts last. The drafts take budget and KV slots like any token; whatever fitted is
   ``ScheduledSeq.num_drafts``, and the proposal is spent. Admission from waiting never adds
   drafts (a request there has none).
3. ``update()``: the model accepts j of the d drafts (`DraftDecision.accepted`, at most d); the
   rejected d - j roll back from the computed tokens; the j + 1 committed tokens are appended one
   at a time, and a stop (at `DraftDecision.stop_at`) or a length limit among them ends the stream
   there, rolling computed tokens back to it (`v1_scheduler.commit_tokens`). An outcome with no
   token (`DraftDecision.empty`, vllm-project/vllm#42722) rolls the whole step back: the request
   recomputes its last token. Blocks the committed tokens complete are keyed when the outcome
   returns, before a stop frees them (vLLM scheduler.py:2402-2415); drafts' slots are kept when
   rejected (declared as a k-token reservation, CAP-006).

Where this differs from vLLM 0.33.0 (lockstep classes in conformance/selftest/campaigns/lockstep_specdec.py):
drafts are capped at ``max_tokens`` (SPD-004; vLLM computes them and trims the excess), and a
request admitted from waiting with one token left is not padded to 1 + k tokens with placeholder
drafts (vLLM ``scheduler.py:1306-1330`` pads it for CUDA graphs; those drafts are never proposed).
"""

from __future__ import annotations

from reference_impl.v1_scheduler import V1Scheduler


class SpecDecScheduler(V1Scheduler):
    """`V1Scheduler`, named as the speculative-decoding flow's reference (k from the config)."""
