"""The speculative-decoding flow (``config.num_speculative_tokens`` = k > 0; spec/speculative.py):
what draft tokens may cost and what their rejection must undo.

A step may schedule a decoding sequence for its next token plus d drafts (``ScheduledSeq.
num_drafts``); the outcome accepts j of them and commits j + 1 tokens (`StepRecord.drafts` holds
the trace's decision). Every predicate here is vacuous for a step without drafts, so the family
is stated for every scheduler; it is named for the flow that makes it non-trivial. The delivered
stream is held to the non-speculative run's by PIP-001 (each token is the model's sample at its
position) together with SPD-006 (a stop ends the stream where it fell).

Positions before the step come from the snapshot taken before ``schedule()``; at
``pipeline_depth`` > 0 that is the processed frontier, which is at most the engine's own count,
so a bound checked on it is implied by the true one and a violation found is real.

What an outcome did (SPD-005..008) is read at the step that processed it, ``pipeline_depth``
steps after its step was scheduled: `spec.invariants._views.returned_step` hands each predicate
that step's scheduled sequences, decisions and stops, so every SPD invariant applies at every
depth.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import returned_step, void_outcomes
from spec.invariants.triggers import drafts, returns_speculative, speculative, speculative_keys
from spec.observation import Capability as C
from spec.observation import SeqView, StepRecord
from spec.rules import OUTCOME, SCHEDULE, CheckContext, invariant
from spec.status import Status


def _drafted(rec: StepRecord) -> Iterator[tuple[object, SeqView]]:
    """(scheduled item, its view before the step) for each sequence scheduled with drafts."""
    seqs = rec.before.seqs or {}
    for item in rec.output.scheduled:
        if item.num_drafts and item.seq_id in seqs:
            yield item, seqs[item.seq_id]


@invariant(
    "SPD-001", "safety",
    """Draft tokens are paid for like any other: the step's scheduled tokens, drafts included,
    stay within max_num_batched_tokens, and after schedule() a sequence scheduled with drafts
    holds the blocks for its computed tokens plus every token scheduled now, drafts included.""",
    """The model computes a draft's KV in the verifying step, so it needs a slot and a token of
    the step's budget. A scheduler that reserves the next token but not the drafts overruns the
    batch the model runner was sized for: TensorRT-LLM's one-model MTP path skipped the draft
    reservation and the batch exceeded max_num_tokens under chunked prefill, killing requests
    (NVIDIA/TensorRT-LLM#16101); writing past the table corrupts another request's block.""",
    (C.MID_STEP, C.BLOCK_TABLES, C.COMPUTED_TOKENS),
    about=SCHEDULE, when=drafts,
)
def drafts_paid_for(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if not any(item.num_drafts for item in rec.output.scheduled):
        return
    total = rec.output.num_batched_tokens
    if total > ctx.config.max_num_batched_tokens:
        drafts = sum(item.num_drafts for item in rec.output.scheduled)
        yield (f"the step schedules {total} tokens ({drafts} of them drafts), "
               f"max_num_batched_tokens {ctx.config.max_num_batched_tokens}")
    assert rec.mid is not None and rec.mid.seqs is not None
    bs = ctx.config.block_size
    for item in rec.output.scheduled:
        v = rec.mid.seqs.get(item.seq_id)
        if not item.num_drafts or v is None or v.num_computed is None or v.blocks is None:
            continue
        need = -(-(v.num_computed + item.num_tokens) // bs)
        if len(v.blocks) < need:
            yield (f"after schedule: {item.seq_id} scheduled for {item.num_tokens} tokens ({item.num_drafts} drafts) "
                   f"after {v.num_computed} computed holds {len(v.blocks)} blocks, needs {need}")


@invariant(
    "SPD-002", "policy",
    """Drafts only extend a decode: a sequence scheduled with drafts has exactly one other token
    scheduled, its last known token, so no prefill chunk carries drafts, not even the chunk that
    completes the prompt.""",
    """vLLM's design: the drafter proposes after a step that sampled, and ``update_draft_token_ids``
    drops a proposal for a request still in prefill (vllm/v1/core/sched/scheduler.py:2870-2875;
    vllm-project/vllm#30618 was a prefill chunk that carried drafts, corrupting a hybrid model's
    state). A policy, not safety: a correct engine with a prompt-lookup (n-gram) drafter can
    propose drafts from the prompt itself and verify them on the final prefill chunk, right
    after the last prompt token, saving a step; it violates this and nothing else. What every
    correct scheduler guarantees, drafts at most k and right after the last known token, is
    SPD-009.""",
    (C.SEQ_LENGTHS,),
    about=SCHEDULE, when=drafts,
)
def drafts_only_on_a_decode(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for item, _v in _drafted(rec):
        if item.num_tokens - item.num_drafts != 1:
            yield (f"{item.seq_id} scheduled for {item.num_tokens} tokens with {item.num_drafts} drafts: "
                   f"{item.num_tokens - item.num_drafts} known tokens besides them, a decode has one")


@invariant(
    "SPD-009", "safety",
    """Drafts sit right after the known tokens: a sequence scheduled with drafts gets at most
    num_speculative_tokens of them and at least one other token, and the chunk before the drafts
    ends at its last known token (computed + scheduled - drafts = its tokens; at depth > 0 the
    scheduler's own count, ``num_computed + in_flight_tokens - stale``, and its tokens plus the
    in-flight placeholders, from the IN_FLIGHT snapshot part).""",
    """A draft is verified against the logits of the token before it, so the first draft's input
    is the last known token's sample; drafts placed after a chunk that stops short of the
    prompt's end sit at positions whose input is still unknown, and their rejection rolls back
    prompt tokens instead (vllm-project/vllm#30618's harm, when the chunk was not the last). More
    than k drafts is more than the verifying kernels and the reservation were sized for. A final
    prefill chunk with drafts right after it (SPD-002, a policy) keeps this.""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=SCHEDULE, when=drafts,
)
def drafts_after_the_known_tokens(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    k = ctx.config.num_speculative_tokens
    in_flight = rec.before.in_flight
    for item, v in _drafted(rec):
        if item.num_drafts > k or item.num_tokens <= item.num_drafts:
            yield f"{item.seq_id} scheduled for {item.num_tokens} tokens with {item.num_drafts} drafts, k {k}"
            continue
        if v.num_computed is None or v.num_tokens is None or v.status is not Status.RUNNING:
            continue
        computed, known = v.num_computed, v.num_tokens
        if ctx.config.pipeline_depth:
            c = in_flight.get(item.seq_id) if in_flight is not None else None
            if c is None:
                continue  # the scheduler's own count needs its in-flight counters
            computed, known = computed + c.in_flight_tokens - c.stale, known + c.placeholders
        end = computed + item.num_tokens - item.num_drafts
        if end != known:
            yield (f"{item.seq_id}: {item.num_drafts} drafts after a chunk ending at position {end}, "
                   f"its known tokens end at {known}")


@invariant(
    "SPD-003", "safety",
    """No draft is scheduled past the model length: a sequence scheduled with drafts has, after
    its computed tokens and every token scheduled now, room left for the token sampled after
    the last draft (computed + scheduled + 1 <= max_model_len).""",
    """If every draft is accepted the step samples one more token after the last; a position at
    or past max_model_len has no rotary embedding or KV slot the model was sized for. vLLM caps
    the running chunk at max_model_len - num_computed_tokens - 1 "when using spec decoding"
    (vllm/v1/core/sched/scheduler.py:851-857); vllm-project/vllm#53812 is the engine-killing
    assert ("Sampled token IDs exceed the max model length") where a padded path forgot it.""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=SCHEDULE, when=drafts,
)
def drafts_within_model_len(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    limit = ctx.config.max_model_len
    for item, v in _drafted(rec):
        if v.num_computed is not None and v.num_computed + item.num_tokens + 1 > limit:
            yield (f"{item.seq_id} scheduled for {item.num_tokens} tokens ({item.num_drafts} drafts) after "
                   f"{v.num_computed} computed: the token after the last draft is at {v.num_computed + item.num_tokens}, "
                   f"max_model_len {limit}")


@invariant(
    "SPD-004", "policy",
    """No draft is scheduled whose acceptance could never be delivered: a sequence scheduled with
    d drafts has generated at most max_tokens - d - 1 tokens, so the bonus token after an
    all-accepted run is still within max_tokens.""",
    """A draft past max_tokens is computed and then trimmed by the stop check: budget and KV spent
    on tokens no client receives. A policy: vLLM 0.33.0 does not cap drafts at max_tokens in the
    running loop (vllm/v1/core/sched/scheduler.py:838-857; check_stop trims the excess), and the
    output is still right.""",
    (C.SEQ_LENGTHS,),
    about=SCHEDULE, when=drafts,
)
def drafts_within_max_tokens(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for item, v in _drafted(rec):
        request = ctx.requests.get(item.request_id)
        if request is None or v.num_tokens is None:
            continue
        generated = v.num_tokens - request.prompt_len
        if generated + item.num_drafts + 1 > request.max_tokens:
            yield (f"{item.seq_id} scheduled with {item.num_drafts} drafts after {generated} generated tokens, "
                   f"max_tokens {request.max_tokens}")


@invariant(
    "SPD-005", "safety",
    """Once a step's outcome is processed, a running sequence the step scheduled with drafts (or
    whose outcome committed no token) has every token but its last computed and no more: rejected
    drafts are rolled back, and so is a step whose outcome committed nothing. The outcome of a
    step is processed ``pipeline_depth`` steps after the step was scheduled (in the same step at
    depth 0); "computed" is then the processed frontier (tokens whose KV a processed step wrote).""",
    """A rejected draft's KV is garbage: counting it as computed makes the next step read it as
    context, and counting positions past the tokens leaves the request with nothing to schedule.
    vLLM skipped the rollback when the model runner returned no token for a request with drafts
    (vllm-project/vllm#42722, closed unmerged): computed tokens stayed above the tokens, the
    request became unschedulable and the engine looped. The last token's KV is never there
    after an outcome: it was sampled, not computed. At depth > 0 the steps still in flight have
    computed further, but the snapshot's frontier leaves them out, so the bound is the same.""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=OUTCOME, when=returns_speculative,
)
def rejected_drafts_roll_back(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    returned = returned_step(ctx, rec)
    if returned is None:
        return
    assert rec.after.seqs is not None
    for item in returned.live():
        empty = returned.decision(item.seq_id).empty
        if not item.num_drafts and not empty:
            continue
        v = rec.after.seqs.get(item.seq_id)
        if v is None or v.status is not Status.RUNNING or v.num_computed is None or v.num_tokens is None:
            continue
        if v.num_computed > v.num_tokens - 1:
            what = "an outcome with no token" if empty else f"{item.num_drafts} drafts"
            late = f" (step {returned.step}'s outcome)" if returned.step != rec.step else ""
            yield f"{item.seq_id} has {v.num_computed} computed of {v.num_tokens} tokens after {what}{late}"


@invariant(
    "SPD-006", "safety",
    """A stop inside an accepted run ends the stream there: a sequence stopped in a step whose
    stop fell on its i-th committed token has, once that step's outcome is processed, at most
    i + 1 tokens more than before it was, and the request finishes stopped. The outcome of a step
    is processed ``pipeline_depth`` steps after the step was scheduled (in the same step at depth 0).""",
    """The model verifies the whole run before the stop check sees it; the tokens after a stop
    were computed but the client must never receive them (vLLM trims them in
    _update_request_with_output, vllm/v1/core/sched/scheduler.py:2744-2770, and rolls computed
    tokens back to the stop). Delivering them is output after the end of the answer. Stated at
    the step that processes the outcome, not the one that scheduled it: at depth > 0 the planned
    view counts every in-flight draft as accepted and knows no stop yet, so checking it there
    flags every pipelined stop; the processed snapshots before and after the outcome's step hold
    exactly that outcome's tokens (steps return in order, one per step), so the bound is the
    synchronous one.""",
    (C.SEQ_LENGTHS,),
    about=OUTCOME, when=returns_speculative,
)
def stop_truncates_run(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    returned = returned_step(ctx, rec)
    if returned is None:
        return
    stops = {item.seq_id: stop_at for item in returned.live() if item.num_drafts and item.seq_id in returned.stopped
             for stop_at in (returned.decision(item.seq_id).stop_at,) if stop_at is not None}
    if not stops:
        return
    assert rec.before.seqs is not None and rec.after.seqs is not None
    stopped = {f.request_id for f in rec.finished if f.status is Status.FINISHED_STOPPED}
    for sid, stop_at in sorted(stops.items()):
        old, new = rec.before.seqs.get(sid), rec.after.seqs.get(sid)
        if old is None or new is None or old.num_tokens is None or new.num_tokens is None:
            continue
        if new.num_tokens > old.num_tokens + stop_at + 1:
            yield (f"{sid} went from {old.num_tokens} to {new.num_tokens} tokens, its stop was committed token "
                   f"{stop_at} of the step")
        elif new.request_id not in stopped and new.status is Status.RUNNING and new.num_tokens > old.num_tokens:
            yield f"{sid} committed its stop (token {stop_at} of the step) and is still running"


@invariant(
    "SPD-007", "safety",
    """A block is keyed for prefix caching only over KV computed from committed tokens: between
    steps, every keyed block in a running sequence's table lies within its known tokens and
    within the positions a processed step wrote or a step still in flight writes (at depth 0:
    within its computed tokens, plus one, its last known token, when its last outcome committed
    no token; at depth > 0: within ``num_computed + in_flight_tokens - stale`` of the IN_FLIGHT
    snapshot part), so a block whose slots hold a rejected draft's KV is never found under the
    accepted content's key.""",
    """When a draft is rejected the model samples another token at its position, so the block
    holds KV for a token the sequence does not have until that position is computed again.
    Keying it by the accepted tokens hands that garbage KV to the next request with the same
    prefix. vLLM keys blocks only up to the tokens without drafts at allocation
    (vllm/v1/core/kv_cache_manager.py:616-625) and up to the processed frontier after an outcome
    (scheduler.py:2402-2415); vllm-project/vllm#18668 made the first count the drafts actually
    scheduled. With outcomes in flight a block may be keyed while the step that writes it runs
    (steps run in order, so the write lands before any reader's: PIP-004), which is why the
    positions in flight count; an in-flight step writes a known token's KV at every position
    below the tokens (vLLM's runner shifts the next step's positions past the rejected drafts).
    After an outcome with no token (vllm-project/vllm#42722's empty output) the computed tokens
    roll back to the last known token but one, but the step's forward pass ran and wrote the
    last known token's KV (vLLM's runner clears a request's sampled tokens after the forward
    pass: gpu_model_runner.py:2062-2065, 3462-3505); only the drafts past it are rejected KV, so
    that one position counts as written until the next outcome (`void_outcomes`).
    At depth > 0 an adapter that shows no in-flight counters is not checked.""",
    (C.BLOCK_TABLES, C.COMPUTED_TOKENS),
    about=OUTCOME, when=speculative_keys,
)
def no_key_over_rejected_kv(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    returned = returned_step(ctx, rec)
    void = void_outcomes(ctx, rec).after
    if not ctx.config.num_speculative_tokens:
        return  # every keyed block's KV is computed: PFX-001 says so without drafts
    snap = rec.after
    keys = snap.gpu_block_keys
    in_flight = snap.in_flight
    if keys is None or snap.seqs is None or (ctx.config.pipeline_depth and in_flight is None):
        return
    bs = ctx.config.block_size
    touched = {item.seq_id for item in rec.output.scheduled} | set(returned.scheduled if returned else ())
    for sid in sorted(touched):  # a sequence neither scheduled nor given an outcome keys nothing new
        v = snap.seqs.get(sid)
        if v is None or v.status is not Status.RUNNING or v.num_computed is None or not v.blocks:
            continue
        written = v.num_computed + (1 if sid in void else 0)
        c = in_flight.get(sid) if in_flight is not None else None
        if c is not None:
            written = min(written + c.in_flight_tokens - c.stale, v.num_tokens or 0)
        for index, block in enumerate(v.blocks):
            if (index + 1) * bs > written and 0 <= block < len(keys) and keys[block] is not None:
                yield (f"after the step: {sid} block {block} (index {index}) is keyed but holds positions up to "
                       f"{(index + 1) * bs - 1}, {v.num_computed} computed"
                       + (f", {c.in_flight_tokens - c.stale} in flight" if c is not None else ""))
                break


@invariant(
    "SPD-008", "policy",
    """No draft the drafter did not propose is spent: a step's outcome commits at most one token
    more than the drafts the drafter proposed after the last processed step that sampled for the
    sequence (none after a preemption, before its first sample, or when drafting was skipped),
    whatever the step scheduled; and a scheduler that knows the proposal when it schedules
    (``pipeline_depth`` 0) schedules no more drafts than that.""",
    """A draft nobody proposed is padding: it is always rejected, takes a slot and a token of
    budget, and counted as a draft it drives the acceptance rate to zero (vllm-project/vllm#54054:
    when the input no longer fit the drafter, the runner zero-filled the drafts, the scheduler
    scheduled the padding for verification and reported 0 % acceptance); counted as accepted it
    delivers a token nobody verified. A policy: a pipelined engine schedules k placeholders
    before the proposal exists (vLLM's AsyncScheduler, async_scheduler.py:24-56), which is why
    only the outcome half applies at depth > 0, and vLLM 0.33.0 pads a one-token admission to
    full width for CUDA graphs (scheduler.py:1306-1330). An outcome of a request that left the
    running set while it was in flight is PIP-001's business.""",
    (C.SEQ_LENGTHS,),
    about=OUTCOME, when=speculative,
)
def drafts_were_proposed(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    returned = returned_step(ctx, rec)
    proposals = ctx.flow_state.setdefault("SPD-008", {})
    k = ctx.config.num_speculative_tokens
    for p in rec.output.preempted:
        for sid in [s for s in proposals if s.rsplit("#", 1)[0] == p.request_id]:
            proposals[sid] = 0
    valid = dict(proposals)  # what the drafter had proposed when the returned step was verified
    if not ctx.config.pipeline_depth:  # the scheduler knew the proposal: it may spend no more
        for item in rec.output.scheduled:
            if item.num_drafts > proposals.get(item.seq_id, 0):
                yield (f"{item.seq_id} scheduled with {item.num_drafts} drafts, "
                       f"the drafter proposed {proposals.get(item.seq_id, 0)}")
            proposals[item.seq_id] = 0  # spent, however many fitted
    if returned is None or not k or rec.before.seqs is None or rec.after.seqs is None:
        return
    for item in returned.live():
        old, new = rec.before.seqs.get(item.seq_id), rec.after.seqs.get(item.seq_id)
        if old is None or new is None or old.num_tokens is None or new.num_tokens is None:
            continue
        committed = new.num_tokens - old.num_tokens
        if committed > 1 + valid.get(item.seq_id, 0):
            yield (f"{item.seq_id} committed {committed} tokens in step {returned.step}'s outcome, "
                   f"the drafter had proposed {valid.get(item.seq_id, 0)} drafts")
        if committed > 0 and new.status is Status.RUNNING:  # it sampled: the drafter proposes for its next decode
            proposals[item.seq_id] = returned.decision(item.seq_id).num_proposed(k)
