"""SGLang's policy (the ``sglang`` profile, reference_impl/sglang_scheduler.py): what SGLang
decides that another correct scheduler need not.

Policy invariants about a scheduler that claims SGLang's flow (``Capability.SGLANG_FLOW``): for any
other they are not applicable, since vLLM's schedulers pick their victims otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants.triggers import preempts
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import SCHEDULE, CheckContext, invariant


@invariant(
    "SGL-001", "policy",
    """Retraction order: a decode step that retracts requests keeps the ones with more generated
    tokens; every retracted request has generated no more tokens than any request the step still
    decodes, and, among equal counts, has a prompt at least as long.""",
    """SGLang's ``ScheduleBatch.retract_decode`` (managers/schedule_batch.py:3451-3580, 0.5.23)
    sorts the decode batch by (generated tokens, shorter prompt) descending and retracts from the
    end until the rest fit: the work thrown away (a retracted request's KV is recomputed) is the
    smallest, and a long prompt frees the most slots. vLLM picks its victim by arrival or priority
    instead (ORD-003, POL-003).""",
    (C.SEQ_LENGTHS, C.SGLANG_FLOW),
    about=SCHEDULE, when=preempts,
)
def retracts_fewest_generated(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if not rec.output.preempted or not rec.before.seqs:
        return
    views = {v.request_id: v for v in rec.before.seqs.values()}

    def key(rid: str) -> tuple[int, int] | None:
        view, request = views.get(rid), ctx.requests.get(rid)
        if view is None or view.num_tokens is None or request is None:
            return None
        return view.num_tokens - request.prompt_len, -request.prompt_len

    kept = [s.request_id for s in rec.output.scheduled if not s.is_prefill]
    for victim in rec.output.preempted:
        lost = key(victim.request_id)
        if lost is None:
            continue
        for rid in kept:
            mine = key(rid)
            if mine is not None and mine < lost:
                yield (f"retracted {victim.request_id} ({lost[0]} generated, prompt {-lost[1]}) but kept {rid} "
                       f"({mine[0]} generated, prompt {-mine[1]})")
