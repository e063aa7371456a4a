"""Admission: all of a prompt's blocks at once, and (vLLM's policy) never below the watermark."""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import admitted, freed_by_their_last_step, views_of, waiting_holders
from spec.invariants.triggers import (
    admits_beside_running_under_watermark,
    admits_or_waiting_holds,
    admits_under_watermark,
)
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import SCHEDULE, CheckContext, invariant
from spec.types import request_of


def _waiting_holders(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None
    for sid in sorted(waiting_holders(rec.mid)):
        if request_of(sid) in ctx.sessions:
            continue  # a streaming session keeps its KV in waiting (spec/session.py; SES-003)
        yield f"{sid} is still waiting after schedule() but holds blocks {list(rec.mid.seqs[sid].blocks)}"


@invariant(
    "ADM-001", "policy",
    """Atomic admission: after schedule(), a request admitted in this step holds every block its
    prefill (with chunked prefill: its first chunk) needs, and a request still waiting holds none
    (a streaming session's excepted, which keeps its KV between inputs).""",
    """Seed 000 §3.4 narrates a partial allocation (request B gets block 9 and waits for one more).
    The spec decides against it, as vLLM does: can_allocate answers for the whole prompt and
    allocate takes all its blocks or none. A partial holder waits while holding what others need,
    which deadlocks two such requests. Policy, not safety: *exactly* the prefill's blocks is vLLM's
    allocate; a scheduler that reserves prompt + max_tokens at admission takes more, all at once.
    Safety keeps the atomic part (ADM-003, RES-003).""",
    (C.MID_STEP, C.BLOCK_TABLES, C.STATUSES, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=SCHEDULE, when=admits_or_waiting_holds,
)
def atomic_admission(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.seqs is not None
    bs = ctx.config.block_size
    chunk = {s.seq_id: s.num_tokens for s in rec.output.scheduled}
    excused = freed_by_their_last_step(ctx, rec)
    for rid in admitted(rec):
        for v in views_of(rec.mid, rid):
            if v.status.is_finished or (not v.blocks and v.seq_id in excused):
                continue
            need = -(-(v.num_tokens or 0) // bs)
            if ctx.config.enable_chunked_prefill:  # the blocks of the first chunk, all at once
                need = -(-((v.num_computed or 0) + chunk.get(v.seq_id, 0)) // bs)
            if len(v.blocks or ()) != need:
                yield f"{rid} admitted with {len(v.blocks or ())} of the {need} blocks of {v.seq_id}"
    yield from _waiting_holders(ctx, rec)


@invariant(
    "ADM-002", "policy",
    "In a step that admits a prompt or swaps a request in, at least the watermark of GPU blocks is free after schedule().",
    """vLLM's can_allocate and can_swap_in keep watermark_blocks = int(watermark * num_gpu_blocks)
    free so the running sequences can keep decoding without preempting at once; the seed's
    'preemption overhead' pitfall (seed 000 §3.5) is what the watermark avoids. Decode appends
    may use the watermark (vLLM #255), so only admission steps are checked. Policy, not safety:
    the watermark is vLLM's hedge against preempting at once; a scheduler that reserves a whole
    request at admission never preempts and needs none, and vLLM V1 and nano-vllm have none.""",
    (C.MID_STEP, C.FREE_COUNTS, C.QUEUES),
    about=SCHEDULE, when=admits_under_watermark,
)
def watermark(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.gpu_free is not None
    entered = admitted(rec) + list(rec.output.swapped_in)
    if entered and rec.mid.gpu_free < ctx.config.watermark_blocks:
        yield f"{entered} entered with {rec.mid.gpu_free} GPU blocks left free, watermark {ctx.config.watermark_blocks}"


@invariant(
    "ADM-004", "policy",
    """vLLM V1's watermark: in a step that admits requests, at least the watermark of GPU blocks is
    free after schedule(), unless the step's one admission entered an empty running set.""",
    """vLLM V1 keeps watermark_blocks free only for admissions made while a request is already
    running (KVCacheManager.allocate_slots, v1/core/kv_cache_manager.py:518-525, with
    has_scheduled_reqs=bool(self.running) from Scheduler.schedule, v1/core/sched/scheduler.py:1451):
    the first request into an idle engine may use the whole cache, every later admission leaves the
    watermark for the running requests' decodes. ADM-002 is V0's stricter rule (every admission),
    which V1 does not follow; the vllm-v1 profile checks this one instead.""",
    (C.MID_STEP, C.FREE_COUNTS, C.QUEUES),
    about=SCHEDULE, when=admits_beside_running_under_watermark,
)
def v1_watermark(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.gpu_free is not None
    entered = admitted(rec)
    if not entered or (len(entered) == 1 and not rec.before.running):
        return
    if rec.mid.gpu_free < ctx.config.watermark_blocks:
        yield (f"{entered} entered (running before: {list(rec.before.running or ())}) with {rec.mid.gpu_free} "
               f"GPU blocks left free, watermark {ctx.config.watermark_blocks}")


@invariant(
    "ADM-003", "safety",
    """Atomic admission: after schedule(), a request admitted in this step holds, on the GPU, at
    least every block its prefill needs (with chunked prefill: its first chunk), and a request
    still waiting holds none (a streaming session's excepted, which keeps its KV between inputs). Where the scheduler claims ``ordered_steps``, a sequence whose
    last token this step samples may hold none (its blocks freed early, as RES-001 allows).""",
    """Seed 000 §3.4 narrates a partial allocation (request B gets block 9 and waits for one more);
    the spec decides against it: a partial holder waits while holding what others need, which
    deadlocks two such requests. Engine-neutral form of ADM-001: how much more than the prefill a
    scheduler takes at admission is its policy (CAP-006 bounds it by its declaration). A
    max_tokens=1 request admitted, prefilled and finished in one step is the early free of
    RES-001 (tokasaurus: admitted, scheduled and freed within one schedule()).""",
    (C.MID_STEP, C.BLOCK_TABLES, C.STATUSES, C.SEQ_LENGTHS),
    about=SCHEDULE, when=admits_or_waiting_holds,
)
def admission_all_or_nothing(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.seqs is not None
    bs = ctx.config.block_size
    chunk = {s.seq_id: s.num_tokens for s in rec.output.scheduled}
    excused = freed_by_their_last_step(ctx, rec)
    for rid in admitted(rec):
        for v in views_of(rec.mid, rid):
            if v.status.is_finished or (not v.blocks and v.seq_id in excused):
                continue
            tokens = v.num_tokens or 0
            if ctx.config.enable_chunked_prefill or ctx.config.enable_prefix_caching:
                if v.num_computed is None:
                    continue  # the first chunk's end is unknown without the computed count
                tokens = min(tokens, v.num_computed + chunk.get(v.seq_id, 0))
            need = -(-tokens // bs)
            if len(v.blocks or ()) < need or (need and v.device != "gpu"):
                yield f"{rid} admitted with {len(v.blocks or ())} {v.device} blocks, {v.seq_id}'s prefill needs {need} on gpu"
    yield from _waiting_holders(ctx, rec)
