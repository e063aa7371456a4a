"""Pause and resume (vLLM 0.33.0 Scheduler.set_pause_state; spec/protocol.py): what a paused engine may do.

Nothing is lost across a pause: a request added while paused waits like any other and is held to
REQ-002 (no request lost) and LIV-002 (bounded completion) once the engine resumes; PAU-001 says what
the pause itself forbids.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import admitted
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import STEP, CheckContext, invariant


# Triggers: when each rule below has something to check (spec/invariants/triggers.py).
def paused(ctx: CheckContext, rec: StepRecord) -> bool:
    """the engine is paused before the step"""
    return rec.before.pause_state not in (None, "unpaused")


@invariant(
    "PAU-001", "safety",
    """While the engine is paused (the snapshot before schedule() says paused_new or paused_all), no
    waiting request is admitted; while paused_all, nothing is scheduled at all.""",
    """vLLM 0.33.0 Scheduler.schedule admits from waiting only when unpaused and schedules nothing under
    PAUSED_ALL (scheduler.py:723, 1050-1066): a pause is the caller's order (a weight update, a drain)
    and the point of it is that no new work touches the model. Safety, not policy: the limit is
    declared by the caller, so every scheduler that offers the call must keep it, whatever its flow.""",
    (C.PAUSE, C.QUEUES, C.STATUSES),
    about=STEP, when=paused,
)
def paused_admits_nothing(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    state = rec.before.pause_state
    if state == "paused_all" and rec.output.scheduled:
        yield f"paused_all, yet scheduled {[s.request_id for s in rec.output.scheduled]}"
    elif state == "paused_new":
        fresh = admitted(rec)
        if fresh:
            yield f"paused_new, yet admitted {fresh} from waiting"
