"""Budgets beyond tokens and KV blocks: the encoder's compute budget and cache, and LoRA slots.

What a multimodal or LoRA request needs is described in spec/encoder.py. The ENC-* invariants read
what a scheduler that shows Capability.ENCODER reports: the encoder inputs each step computes
(`SchedulerOutput.encoder_inputs`) and the encoder cache in each snapshot (`Snapshot.encoder_cache`,
``encoder_free``). LORA-001 reads only the output and the trace's ``lora_id``s, for a scheduler that
claims Capability.LORA. Without those capabilities they are not applicable, never passed.

A request's encoder inputs are ``ctx.encoder_inputs(rid)``: its own, and for a streaming session the
ones its later inputs carried, from the step it took each up, at the positions its tokens landed on
(spec/session.py; the evaluation layer reads the take-up from the snapshots, `note_session_inputs`).
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter

from spec.invariants._views import snapshots
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import STEP, CheckContext, invariant
from spec.status import Status
from spec.types import seq_id


# Triggers: when each rule below has something to check (spec/invariants/triggers.py).
def computes_encoder_inputs(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step computes an encoder input"""
    return bool(rec.output.encoder_inputs)


def encoder_cache_in_use(ctx: CheckContext, rec: StepRecord) -> bool:
    """the engine has an encoder cache"""
    return ctx.config.encoder_cache_size > 0


def encoder_output_held(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request with encoder inputs is unfinished"""
    return any(rid not in ctx.finished for rid in ctx.encoded)


def encoder_output_read(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request with encoder inputs is unfinished"""
    return any(rid not in ctx.finished for rid in ctx.encoded)


def nothing_scheduled_beside_encoder_entries(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step schedules nothing while the encoder cache holds an entry"""
    return not rec.output.scheduled and bool(rec.after.encoder_cache)


def lora_slots_bind(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step passes a request over for its LoRA adapter, or schedules a LoRA request"""
    # The reasons' kinds are searched at C speed, and only a run with a LoRA request reads the schedule.
    return "wait_lora_slots" in map(_KIND, rec.output.reasons) or (
        bool(ctx.loras) and any(s.request_id in ctx.loras for s in rec.output.scheduled))


_KIND = attrgetter("kind")


@invariant(
    "ENC-001", "safety",
    "The encoder embeddings computed in one step never exceed encoder_compute_budget, and each names an encoder input of a scheduled request.",
    """The encoder's batch is sized by its budget (vLLM 0.33.0 compute_mm_encoder_budget and
    Scheduler._try_schedule_encoder_inputs: encoder_compute_budget -= num_encoder_embeds). Safety,
    not policy: it is a declared limit, which every correct scheduler keeps whatever it chooses to
    encode; computing an input for a request that runs no chunk this step is encoder work nobody
    reads (vLLM allocates only for a request it schedules).""",
    (C.ENCODER,),
    about=STEP, when=computes_encoder_inputs,
)
def encoder_budget(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if not rec.output.encoder_inputs:
        return
    scheduled = {s.request_id for s in rec.output.scheduled}
    total = 0
    for rid, index in rec.output.encoder_inputs:
        request = ctx.requests.get(rid)
        if request is None or not 0 <= index < len(ctx.encoder_inputs(rid)):
            yield f"computed encoder input {rid}[{index}], which no request has"
            continue
        if rid not in scheduled:
            yield f"computed encoder input {rid}[{index}] for a request not scheduled in the step"
        total += ctx.encoder_inputs(rid)[index].length
    if total > ctx.config.encoder_compute_budget:
        yield f"computed {total} encoder embeddings, encoder_compute_budget {ctx.config.encoder_compute_budget}"


@invariant(
    "ENC-002", "safety",
    """Encoder cache conservation: the embeddings of every cached entry plus the free embeddings equal
    encoder_cache_size; an output shared by requests (one content hash) is one entry, counted once;
    and an entry is held only by unfinished requests that have an input with its hash.""",
    """vLLM 0.33.0 EncoderCacheManager keeps num_free_slots = cache_size minus the embeddings of every
    cached mm_hash (held or freeable), and cached[mm_hash] names the requests holding it. A count
    that drifts (an output allocated twice for two requests that share it, a free that forgets an
    entry) either overfills the cache the model runner sized or strands space forever. Safety: it
    is arithmetic about one pool, true of any design; a finished request still holding an entry
    would pin space nothing can free.""",
    (C.ENCODER, C.STATUSES),
    about=STEP, when=encoder_cache_in_use,
)
def encoder_cache_conserved(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    capacity = ctx.config.encoder_cache_size
    for label, snap in snapshots(rec):
        cache, free = snap.encoder_cache, snap.encoder_free
        if cache is None or free is None:
            continue
        used = sum(entry.size for entry in cache.values())
        if used + free != capacity or free < 0:
            yield f"{label}: encoder cache free {free} + in use {used} = {used + free}, expected {capacity}"
        statuses = snap.statuses or {}
        for digest, entry in cache.items():
            for rid in sorted(entry.users):
                request = ctx.requests.get(rid)
                status = statuses.get(rid)
                if request is None or all(item.content_hash != digest for item in ctx.encoder_inputs(rid)):
                    yield f"{label}: encoder entry {digest} is held by {rid}, which has no input with that hash"
                elif status is None or status.is_finished:
                    yield f"{label}: encoder entry {digest} is held by {rid}, which is {status}"


@invariant(
    "ENC-003", "policy",
    """An encoder output that a running request has begun to consume (its chunk reached the input's
    first position but not its last) stays in the encoder cache, held by that request, until the
    request has computed the input's last position.""",
    """vLLM 0.33.0 Scheduler._free_encoder_inputs frees a request's input only once start_pos +
    num_tokens <= num_computed_tokens, and can_allocate evicts only unheld (freeable) entries. Policy,
    not safety: a correct design could evict a half-consumed output under cache pressure and compute
    it again for the next chunk (encoder outputs are deterministic); it wastes encoder compute but
    never reads a missing output (ENC-004 holds it to that).""",
    (C.ENCODER, C.STATUSES, C.COMPUTED_TOKENS),
    about=STEP, when=encoder_output_held,
)
def encoder_output_held_while_needed(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    snap = rec.after
    cache, seqs = snap.encoder_cache, snap.seqs
    if cache is None or seqs is None or snap.running is None:
        return
    for rid in snap.running:
        inputs = ctx.encoder_inputs(rid) if rid in ctx.requests else ()
        view = seqs.get(seq_id(rid, 0))
        if not inputs or view is None or view.num_computed is None:
            continue
        for index, item in enumerate(inputs):
            if item.position < view.num_computed < item.end:
                entry = cache.get(item.content_hash)
                if entry is None or rid not in entry.users:
                    yield (f"{rid} has computed {view.num_computed} tokens, inside encoder input {index} "
                           f"(positions {item.position}..{item.end - 1}), but does not hold its output")


@invariant(
    "ENC-004", "safety",
    """An encoder output that a scheduled chunk reads is in the encoder cache after schedule(), held
    by the chunk's request, and was either cached before the step or computed in it: no chunk runs
    on a missing encoder output.""",
    """The chunk's positions are filled with the encoder output (vLLM's model runner gathers them from
    the encoder cache and fails on a miss); Scheduler._try_schedule_encoder_inputs therefore stops a
    chunk before any input it can neither find cached nor fit in the budget and the cache. Safety:
    a chunk run without its encoder output computes wrong KV whatever the design.""",
    (C.ENCODER, C.MID_STEP, C.COMPUTED_TOKENS),
    synchronous=True,
    about=STEP, when=encoder_output_read,
)
def encoder_output_ready(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    mid = rec.mid
    assert mid is not None
    if mid.encoder_cache is None or mid.seqs is None:
        return
    before = rec.before.encoder_cache or {}
    computed = {ctx.encoder_inputs(rid)[i].content_hash for rid, i in rec.output.encoder_inputs
                if rid in ctx.requests and 0 <= i < len(ctx.encoder_inputs(rid))}
    for item in rec.output.scheduled:
        inputs = ctx.encoder_inputs(item.request_id) if item.request_id in ctx.requests else ()
        view = mid.seqs.get(item.seq_id)
        if not inputs or view is None or view.num_computed is None:
            continue
        start, end = view.num_computed, view.num_computed + item.num_tokens
        for index, enc in enumerate(inputs):
            if not enc.overlaps(start, end):
                continue
            entry = mid.encoder_cache.get(enc.content_hash)
            if entry is None or item.request_id not in entry.users:
                yield (f"{item.request_id} computes positions {start}..{end - 1}, which read encoder input {index} "
                       f"({enc.content_hash}), not in the cache for it after schedule()")
            elif enc.content_hash not in before and enc.content_hash not in computed:
                yield (f"{item.request_id} reads encoder input {index} ({enc.content_hash}), neither cached before "
                       f"the step nor computed in it")


@invariant(
    "ENC-005", "liveness",
    """A step that schedules no token while requests are unfinished leaves no encoder cache space held
    by a waiting request.""",
    """vllm-project/vllm PR #31857: waiting requests kept the encoder cache space allocated for them,
    the cache filled with it, and every running chunk that needed an encoder output got
    num_new_tokens == 0 while the waiting requests waited for KV blocks the running ones held: the
    scheduler spun forever. Liveness: held space is fine while the engine makes progress (an engine
    may reserve encoder space for the next admission); it must never be what stops all of it.""",
    (C.ENCODER, C.STATUSES),
    about=STEP, when=nothing_scheduled_beside_encoder_entries,
)
def waiting_encoder_space_never_blocks(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    snap = rec.after
    if rec.output.scheduled or snap.encoder_cache is None or snap.statuses is None:
        return
    held = sorted({rid for entry in snap.encoder_cache.values() for rid in entry.users
                   if snap.statuses.get(rid) is Status.WAITING})
    if held:
        used = sum(e.size for e in snap.encoder_cache.values() if e.users & set(held))
        yield f"no token scheduled while waiting requests {held} hold {used} embeddings of encoder cache"


@invariant(
    "LORA-001", "safety",
    """The requests scheduled in one step use at most max_loras distinct LoRA adapters, a chunked
    request carried over from the step before included.""",
    """The adapters of a batch are loaded into max_loras GPU slots (vLLM LoRAConfig.max_loras;
    SGLang max_loras_per_batch, whose LoRAManager.fetch_new_loras asserts it). sgl-project/sglang
    #25865 and #23141: admission counted the adapters of the running batch but not those of the
    chunked request already staged for the batch, so a batch held max_loras + 1 adapters. Safety: a
    declared limit on one step's batch; a design may load and unload adapters between steps as it
    likes (which is why the residency of running requests' adapters, vLLM's scheduled_loras, is not
    stated here).""",
    (C.LORA,),
    about=STEP, when=lora_slots_bind,
)
def lora_slots(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    adapters: set[int] = set()
    for item in rec.output.scheduled:
        request = ctx.requests.get(item.request_id)
        if request is not None and request.lora_id:
            adapters.add(request.lora_id)
    if len(adapters) > ctx.config.max_loras:
        yield f"scheduled {len(adapters)} LoRA adapters {sorted(adapters)}, max_loras {ctx.config.max_loras}"
