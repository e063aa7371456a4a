"""Scheduling order of today's engines (vLLM V1, nano-vllm): who runs first and who is preempted.

Policy invariants: a profile claims them (``vllm-v1``, ``nano-vllm``); the V0 flow breaks some of
them by design (it preempts for priority before admitting).
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import admitted
from spec.invariants.triggers import preempts, schedules
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import SCHEDULE, CheckContext, invariant


@invariant(
    "ORD-001", "policy",
    """Running requests first: a step admits a waiting request only if every request that was
    running before the step, and was not preempted, is scheduled in it.""",
    """vLLM V1 schedules RUNNING requests (decodes and prefill chunks alike) before WAITING ones
    and admits only with budget left: a running request holds blocks and has a client waiting on
    its stream, a new one has neither.""",
    (C.QUEUES, C.TOKEN_BUDGET_FLOW),
    about=SCHEDULE, when=schedules,
)
def running_first(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    fresh = admitted(rec)
    if not fresh:
        return
    served = {s.request_id for s in rec.output.scheduled} | {p.request_id for p in rec.output.preempted}
    left = [r for r in rec.before.running or () if r not in served]
    if left:
        yield f"admitted {fresh} while running {left} got nothing"


@invariant(
    "ORD-002", "policy",
    "A step that preempts admits no waiting request.",
    """vLLM V1 schedules WAITING requests only `if not preempted_reqs`, and nano-vllm preempts only
    in decode steps: blocks freed by a victim go to the running requests that needed them, not to
    a newcomer that would be the next victim.""",
    (C.QUEUES, C.TOKEN_BUDGET_FLOW),
    about=SCHEDULE, when=preempts,
)
def no_admission_when_preempting(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    fresh = admitted(rec)
    if rec.output.preempted and fresh:
        yield f"admitted {fresh} in a step that preempted {[p.request_id for p in rec.output.preempted]}"


@invariant(
    "ORD-003", "policy",
    """Victim choice of the token-budget schedulers: under FCFS the victims are the tail of the
    running queue (the last admitted); under priority each victim is less urgent than every
    running request kept (largest priority value, then latest arrival).""",
    """vLLM V1 pops self.running[-1] under FCFS and takes max(running, key=(priority,
    arrival_time)) under priority; nano-vllm pops the running tail. The running queue is in
    admission order there (a resumed request re-joins at the tail), not in arrival order.""",
    (C.QUEUES, C.TOKEN_BUDGET_FLOW),
    about=SCHEDULE, when=preempts,
)
def victims_from_tail(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    victims = [p.request_id for p in rec.output.preempted]
    if not victims:
        return
    running = list(rec.before.running or ())
    if ctx.config.policy == "priority":
        kept = [r for r in running if r not in victims]
        for v in victims:
            for k in kept:
                if v in ctx.arrival and k in ctx.arrival and ctx.key(v) < ctx.key(k):
                    yield f"preempted {v} (key {ctx.key(v)}) but kept the less urgent {k} (key {ctx.key(k)})"
        return
    tail = running[len(running) - len(victims):] if len(victims) <= len(running) else running
    if set(victims) != set(tail):
        yield f"preempted {victims}, but the tail of running {running} is {tail}"
