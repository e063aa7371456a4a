"""Policy: the order in which the reference serves requests (vLLM V0's default flow).

A third-party scheduler is held to these only where its profile claims the reference policy.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import admitted
from spec.invariants.connector import loading
from spec.invariants.grammar import grammar_pending
from spec.invariants.sessions import holds_blocks, is_session, passed_over_for_input
from spec.invariants.triggers import (
    a_queue_holds_two,
    others_wait,
    preempts,
    preempts_by_recompute,
    prefills_beside_running,
    some_swapped,
)
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import SCHEDULE, STEP, CheckContext, invariant
from spec.status import QUEUES, PreemptionMode, Status

# Reasons that let a later request overtake this one in FCFS admission (POL-001): budgets that bind
# one request and not the next (spec/encoder.py).
PASSED_OVER = frozenset({"wait_lora_slots", "wait_encoder"})


def passed_for_adapter(ctx: CheckContext, rec: StepRecord) -> set[str]:
    """The waiting requests that admitting would have put over ``max_loras``: each one's adapter is
    new to the running requests and the ones taken before it, which hold ``max_loras`` adapters
    already (vLLM's ``scheduled_loras``, scheduler.py:1040-1047, 1091-1102). Read from the state, so a
    target that gives no reasons is held to the same rule as the reference."""
    limit = ctx.config.max_loras
    if not limit:
        return set()
    taken = set(admitted(rec))
    loras = {r.lora_id for rid in rec.before.running or () if (r := ctx.requests.get(rid)) is not None and r.lora_id}
    passed = set()
    for rid in rec.before.waiting or ():
        request = ctx.requests.get(rid)
        lora = request.lora_id if request is not None else 0
        if rid in taken:
            if lora:
                loras.add(lora)
        elif lora and lora not in loras and len(loras) >= limit:
            passed.add(rid)
    return passed


@invariant(
    "POL-001", "policy",
    """FCFS admission: the requests a step takes out of waiting (admitted or ignored) are a
    prefix of the waiting queue, in order; nobody overtakes a request that cannot be admitted,
    except one the step's reasons pass over for a budget of its own (its LoRA adapter or its next
    encoder input: `PASSED_OVER`), one whose adapter would exceed max_loras, one whose grammar
    is not ready yet (GRM-002), a session waiting for its next input (SES-001), and one whose KV
    load is in flight (KVC-008).""",
    """Seed 000 §3.4 ('first come first served + preemption') and seed 003 §2.2 (stop at the
    first request that does not fit: `break`); vLLM PR #32173 fixed a reorder that let later
    requests pass a skipped one. vLLM 0.33.0 does pass over (skip_request) a request whose adapter
    would exceed max_loras or whose encoder input fits neither the encoder budget nor its cache
    (scheduler.py:1090-1102, 1394-1398): the requests behind it need neither.""",
    (C.QUEUES,),
    about=SCHEDULE, when=others_wait,
)
def fcfs_admission(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    passed = {r.request_id for r in rec.output.reasons if r.kind in PASSED_OVER} | passed_for_adapter(ctx, rec)
    passed |= {rid for rid in rec.before.waiting or ()
               if grammar_pending(ctx, rid, rec.step) or passed_over_for_input(ctx, rec, rid)}  # GRM-002, SES-001
    busy = loading(rec.before, rec.mid)  # a request waiting for its KV load is passed over (KVC-008)
    waiting = [rid for rid in rec.before.waiting or () if rid not in passed and rid not in busy]
    # one admitted although passed over breaks its own rule (GRM-002, LORA-001), not the queue order
    taken = (set(admitted(rec)) | set(rec.output.ignored)) & set(waiting)
    prefix = waiting[: len(taken)]
    if set(prefix) != taken:
        yield f"took {sorted(taken, key=waiting.index)} out of waiting {waiting}: not a prefix"
    order = [s.request_id for s in rec.output.scheduled if s.is_prefill and s.request_id in taken]
    ranks = [waiting.index(r) for r in dict.fromkeys(order)]
    if ranks != sorted(ranks):
        yield f"prefills scheduled out of waiting order: {list(dict.fromkeys(order))}"


@invariant(
    "POL-002", "policy",
    "Swapped requests resume before any new prefill: no waiting request is admitted while a request is swapped out.",
    """Seed 003 §2.2/§3 ('only when swapped is empty are new requests processed') and vLLM's
    _schedule_default (prefills only `if not self.swapped`): a swapped request already holds CPU
    space and has produced output; starving it behind new arrivals (vLLM #5578) wastes both.""",
    (C.QUEUES,),
    about=SCHEDULE, when=some_swapped,
)
def swapped_first(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if rec.before.swapped:
        fresh = admitted(rec)
        if fresh:
            yield f"admitted {fresh} while {list(rec.before.swapped)} were swapped"


@invariant(
    "POL-003", "policy",
    """Victim choice: every preempted request is less urgent than every running request that was
    not preempted (lowest priority first, then latest arrival).""",
    """Seed 000 §3.4 step 5 preempts the later request B for A; vLLM pops victims from the tail
    of the running queue (running_queue.pop()), which policy order makes the least urgent.""",
    (C.QUEUES,),
    about=SCHEDULE, when=preempts,
)
def victim_choice(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    victims = [p.request_id for p in rec.output.preempted]
    if not victims:
        return
    kept = [r for r in rec.before.running or () if r not in victims]
    for v in victims:
        for k in kept:
            if ctx.key(v) < ctx.key(k):
                yield f"preempted {v} (key {ctx.key(v)}) but kept the less urgent {k} (key {ctx.key(k)})"


@invariant(
    "POL-004", "policy",
    """A recompute victim re-enters waiting ahead of every waiting request less urgent than it (at the
    front, under FCFS), except those that hold KV in waiting (a KV load's, a streaming session's).""",
    """Seed 003 §3 (`self.waiting.extendleft(preempted)`) and vLLM's _schedule_default: a
    recomputed request has already waited once; putting it behind new arrivals starves it.""",
    (C.QUEUES,),
    about=SCHEDULE, when=preempts_by_recompute,
)
def recompute_to_front(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    waiting = list(rec.after.waiting or ())
    for p in rec.output.preempted:
        if p.mode is not PreemptionMode.RECOMPUTE or p.request_id not in waiting:
            continue
        position = waiting.index(p.request_id)
        statuses = rec.after.statuses or {}
        for ahead in waiting[:position]:
            if statuses.get(ahead) is Status.WAITING_FOR_REMOTE_KV or (is_session(ctx, ahead) and holds_blocks(rec.after, ahead)):
                continue  # a request holding its loaded KV (or a session's) is served first (vLLM's kv_holding_waiting)
            if ctx.key(ahead) > ctx.key(p.request_id):
                yield f"recompute victim {p.request_id} is behind the less urgent {ahead} in waiting {waiting}"


@invariant(
    "POL-005", "policy",
    "Prefills and decodes never share a step (no chunked prefill): a step that admits prompts schedules no decode.",
    """vLLM V0's _schedule_default skips _schedule_running when prefills were scheduled ('Don't
    schedule decodes if prefills are scheduled'): prompt and decode kernels are separate passes.""",
    about=SCHEDULE, when=prefills_beside_running,
)
def no_mixed_steps(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    kinds = {s.is_prefill for s in rec.output.scheduled}
    if len(kinds) > 1:
        yield f"step mixes {rec.output.num_prefill_seqs} prefill and {len(rec.output.scheduled) - rec.output.num_prefill_seqs} decode sequences"


@invariant(
    "POL-006", "policy",
    "Between steps, each queue is in policy order (FCFS: arrival; priority: priority, then arrival).",
    """The order of waiting decides admission, the order of running decides victims, the order of
    swapped decides swap-ins; seed 003 §5 adds priority as the sort key.""",
    (C.QUEUES,),
    about=STEP, when=a_queue_holds_two,
)
def queues_in_order(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for name in QUEUES:
        queue = [r for r in rec.after.queue(name) or () if r in ctx.arrival]
        keys = [ctx.key(r) for r in queue]
        if keys != sorted(keys):
            yield f"{name} queue {queue} is not in policy order"
