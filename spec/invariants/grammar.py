"""Grammar waits (issue 32): a structured-output request waits for its grammar to compile.

A request with ``grammar_ready_step`` k (spec/types.py) cannot sample a token before step k: the
grammar is what masks the tokens it may sample (vLLM 0.33.0 v1/structured_output: the bitmask of
``StructuredOutputManager.grammar_bitmask``). vLLM keeps such a request in the waiting queue as
WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and passes over it (``skip_request``) until the grammar is
there (scheduler.py:3519-3545, ``_handle_blocked_waiting_request``), then admits it as any other.

Who else reads `grammar_pending`: LIV-001 and LIV-003 do not count a request waiting for its
grammar as work left undone, and POL-001 lets the requests behind it overtake it, but only before
its ready step: from then on FCFS holds it again, which is how "admitted once ready" is checked.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import STEP, CheckContext, invariant
from spec.status import Status
from spec.types import seq_id


def grammar_pending(ctx: CheckContext, request_id: str, step: int) -> bool:
    """Whether the request's grammar is not ready yet at ``step`` (False for a request without one)."""
    request = ctx.requests.get(request_id)
    return request is not None and request.grammar_ready_step is not None and step < request.grammar_ready_step


# Triggers: when each rule below has something to check (spec/invariants/triggers.py).
def some_grammar_pending(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request waits for its grammar before the step"""
    return bool(ctx.grammars) and any(grammar_pending(ctx, rid, rec.step) for rid in rec.before.waiting or ())


@invariant(
    "GRM-001", "safety",
    """No token is sampled for a structured-output request before its grammar is ready: after every
    step before its grammar_ready_step, its sequence holds no more tokens than its prompt.""",
    """A token sampled without the grammar's mask may break the structure the client asked for (a JSON
    schema, a regex), and no later step can take it back: vLLM 0.33.0 samples a structured-output request
    only through StructuredOutputManager.grammar_bitmask, which needs the compiled grammar. Safety: every
    design that offers structured output must mask every token it samples.""",
    (C.GRAMMAR, C.SEQ_LENGTHS),
    about=STEP, when=some_grammar_pending,
)
def no_token_before_grammar(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    seqs = rec.after.seqs or {}
    for rid in rec.before.waiting or ():
        if not grammar_pending(ctx, rid, rec.step):
            continue
        request = ctx.requests[rid]
        view = seqs.get(seq_id(rid, 0))
        if view is not None and view.num_tokens is not None and view.num_tokens > request.prompt_len:
            yield (f"{rid} holds {view.num_tokens} tokens after step {rec.step}, past its prompt of "
                   f"{request.prompt_len}, but its grammar is ready only at step {request.grammar_ready_step}")


@invariant(
    "GRM-002", "policy",
    """A request waiting for its grammar is never scheduled before its grammar_ready_step, and until
    then its status is WAITING_FOR_GRAMMAR.""",
    """vLLM 0.33.0 gives a structured-output request the status WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    on arrival (v1/request.py:116-117) and passes over it while its grammar compiles (scheduler.py:
    1078-1081 and 3535-3545). Policy, not safety: a correct design could prefill the prompt while the
    grammar compiles and hold back only the first sampled token (GRM-001 is that safety half).""",
    (C.GRAMMAR, C.QUEUES, C.STATUSES),
    about=STEP, when=some_grammar_pending,
)
def waits_for_grammar(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    scheduled = {s.request_id for s in rec.output.scheduled}
    statuses = rec.before.statuses or {}
    for rid in rec.before.waiting or ():
        if not grammar_pending(ctx, rid, rec.step):
            continue
        ready = ctx.requests[rid].grammar_ready_step
        if rid in scheduled:
            yield f"{rid} scheduled at step {rec.step}, before its grammar is ready (step {ready})"
        status = statuses.get(rid)
        if status is not None and status is not Status.WAITING_FOR_GRAMMAR:
            yield f"{rid} is {status.value} before step {rec.step}, but its grammar is ready only at step {ready}"
