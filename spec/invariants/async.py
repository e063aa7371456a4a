"""The async flow: a step's outcome is processed ``config.pipeline_depth`` steps after the step
was scheduled (vLLM's ``AsyncScheduler``, docs/ASYNC.md). What is promised to the client when
outcomes lag.

They hold at depth 0 too (each says what a synchronous scheduler already does), so they are stated
for every scheduler; the family is named for the flow that makes them non-trivial. The file is
named by the flow id (STYLE.md rule 1); ``async`` is a keyword, so `spec.catalogue` imports it by
name. PIP-003 (in-flight counters), PIP-004 (blocks an in-flight step writes) and PIP-005 (no
failure on a stale outcome) need observations the wire does not carry yet; they are checked on the
reference in process (`conformance.selftest.async_checks`) and, for PIP-005, by the runner as a FAULT.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import fresh_in_snapshots
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.status import Status
from spec.types import generated_token

_DELIVERED = (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH_CAPPED)


@invariant(
    "PIP-001", "safety",
    """Every generated token of a sequence is the model's sample at its position: the token at
    position p of sequence i of request r is ``generated_token(r, i, p)``. No token is repeated,
    lost or invented, across preemption, aborts, chunk boundaries and stops.""",
    """The client cannot tell a pipelined engine from a synchronous one except by latency. An
    in-flight token kept across a preemption and then sampled again is delivered twice
    (vllm-project/vllm#38624, #47900); output ids lost on preemption (#28787) shift every later
    token; an outcome applied to a request that finished meanwhile invents one. The sampled
    tokens are a fixed function of the position (`spec.types.generated_token`), which every
    implementation and engine host uses, so the stream a synchronous run delivers is known.""",
    (C.PREFIX_CACHE, C.SEQ_LENGTHS),
)
def tokens_are_the_samples(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, sid, v in fresh_in_snapshots(ctx, rec):
        request = ctx.requests.get(v.request_id)
        if request is None or v.token_ids is None:
            continue
        index = int(sid.rsplit("#", 1)[1]) if "#" in sid else 0
        for position in range(request.prompt_len, len(v.token_ids)):
            want = generated_token(v.request_id, index, position)
            if v.token_ids[position] != want:
                yield (f"{label}: {sid} has token {v.token_ids[position]} at position {position}, "
                       f"the model sampled {want} there")
                break


@invariant(
    "PIP-002", "safety",
    """No token is delivered to a request after its finish is reported: a finished request's
    sequences keep the token count they had in the step that finished it.""",
    """An in-flight step cannot be recalled, but its output for a request that finished (a stop,
    a length cap or an abort) while it was in flight must be dropped (vLLM:
    vllm/v1/core/sched/scheduler.py:2327-2334); a token after the finish reaches a client that
    was told the stream ended. The other half of the promise, at most pipeline_depth tokens
    computed past the last delivered one, reads in-flight tokens the snapshot does not carry yet
    (`conformance.selftest.async_checks`).""",
    (C.SEQ_LENGTHS,),
)
def no_token_after_finish(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.after.seqs is not None
    lengths = ctx.flow_state.setdefault("PIP-002", {})
    for label, sid, v in fresh_in_snapshots(ctx, rec):
        rid = v.request_id
        if rid in ctx.finished and sid in lengths and v.num_tokens is not None and v.num_tokens != lengths[sid]:
            yield (f"{label}: {sid} has {v.num_tokens} tokens, {lengths[sid]} when {rid} finished "
                   f"({ctx.finished[rid].name})")
    for done in rec.finished:
        for v in rec.after.seqs_of(done.request_id):
            if v.num_tokens is not None:
                lengths.setdefault(v.seq_id, v.num_tokens)


@invariant(
    "PIP-006", "policy",
    """A request that finishes stopped or length-capped is reported finished at most
    ``pipeline_depth`` steps after the last step that scheduled it (in that very step when the
    depth is 0).""",
    """A finish is known once the step that sampled the last token returns, which is
    pipeline_depth steps after it was scheduled; the steps in between may still schedule the
    request (computing past its stop), so its last scheduled step is at or after the sampling
    step. Latency beyond that is a queue deeper than declared or stale in-flight frames that
    delay a stop (vllm-project/vllm#49860). A policy claim: a scheduler may legitimately report
    later, but then it declares a deeper pipeline.""",
)
def finish_within_depth(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    last = ctx.flow_state.setdefault("PIP-006", {})
    for item in rec.output.scheduled:
        last[item.request_id] = rec.step
    aborted = set(rec.aborted)
    for done in rec.finished:
        rid = done.request_id
        if done.status not in _DELIVERED or rid in aborted or rid not in last:
            continue
        late = rec.step - last[rid]
        if late > ctx.config.pipeline_depth:
            yield (f"{rid} finished ({done.status.name}) {late} steps after the last step that scheduled it "
                   f"(step {last[rid]}), pipeline_depth {ctx.config.pipeline_depth}")

