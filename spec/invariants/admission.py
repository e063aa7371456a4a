"""Admission: all of a prompt's blocks at once, and never below the watermark."""

from __future__ import annotations

from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import admitted, fresh_mid
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.status import Status


@invariant(
    "ADM-001", "safety",
    """Atomic admission: after schedule(), a request admitted in this step holds every block its
    prefill (with chunked prefill: its first chunk) needs, and a request still waiting holds none.""",
    """Seed 000 §3.4 narrates a partial allocation (request B gets block 9 and waits for one more).
    The spec decides against it, as vLLM does: can_allocate answers for the whole prompt and
    allocate takes all its blocks or none. A partial holder waits while holding what others need,
    which deadlocks two such requests.""",
    (C.MID_STEP, C.BLOCK_TABLES, C.STATUSES, C.SEQ_LENGTHS),
)
def atomic_admission(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.seqs is not None
    bs = ctx.config.block_size
    chunk = {s.seq_id: s.num_tokens for s in rec.output.scheduled}
    for rid in admitted(rec):
        for v in rec.mid.seqs_of(rid):
            if v.status.is_finished:
                continue
            need = -(-(v.num_tokens or 0) // bs)
            if ctx.config.enable_chunked_prefill:  # the blocks of the first chunk, all at once
                need = -(-((v.num_computed or 0) + chunk.get(v.seq_id, 0)) // bs)
            if len(v.blocks or ()) != need:
                yield f"{rid} admitted with {len(v.blocks or ())} of the {need} blocks of {v.seq_id}"
    for sid, v in fresh_mid(ctx, rec):
        if v.status is Status.WAITING and v.blocks:
            yield f"{sid} is still waiting after schedule() but holds blocks {list(v.blocks)}"


@invariant(
    "ADM-002", "safety",
    "In a step that admits a prompt or swaps a request in, at least the watermark of GPU blocks is free after schedule().",
    """vLLM's can_allocate and can_swap_in keep watermark_blocks = int(watermark * num_gpu_blocks)
    free so the running sequences can keep decoding without preempting at once; the seed's
    'preemption overhead' pitfall (seed 000 §3.5) is what the watermark avoids. Decode appends
    may use the watermark (vLLM #255), so only admission steps are checked.""",
    (C.MID_STEP, C.FREE_COUNTS, C.QUEUES),
)
def watermark(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.gpu_free is not None
    entered = admitted(rec) + list(rec.output.swapped_in)
    if entered and rec.mid.gpu_free < ctx.config.watermark_blocks:
        yield f"{entered} entered with {rec.mid.gpu_free} GPU blocks left free, watermark {ctx.config.watermark_blocks}"
