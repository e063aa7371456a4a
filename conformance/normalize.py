"""Check that what an adapter returned has the shape the spec defines, before anything reads it.

A malformed observation is the adapter's fault, reported as such with the step; it must never
crash the runner or be mistaken for an invariant violation.
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any

from conformance.guard import AdapterFault
from spec.observation import Snapshot
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput

_SEQ_ID, _REQUEST_ID, _NUM_TOKENS = attrgetter("seq_id"), attrgetter("request_id"), attrgetter("num_tokens")


def _fail(call: str, message: str) -> AdapterFault:
    return AdapterFault("malformed", call, message)


def check_output(value: Any, step: int) -> SchedulerOutput:
    if not isinstance(value, SchedulerOutput):
        raise _fail("schedule", f"returned {type(value).__name__}, expected SchedulerOutput")
    scheduled = value.scheduled
    # Fast path (types checked a whole column at a time, at C speed); the loop below names the
    # first bad entry when it fails.
    if (not scheduled or (
            set(map(type, scheduled)) == {ScheduledSeq}
            and set(map(type, map(_SEQ_ID, scheduled))) == {str}
            and set(map(type, map(_REQUEST_ID, scheduled))) == {str}
            and set(map(type, map(_NUM_TOKENS, scheduled))) == {int}
            and min(map(_NUM_TOKENS, scheduled)) >= 0)):
        scheduled = ()
    for item in scheduled:
        if not isinstance(item, ScheduledSeq) or not isinstance(item.seq_id, str) or not isinstance(item.request_id, str):
            raise _fail("schedule", f"scheduled entry {item!r} is not a ScheduledSeq of strings")
        if not isinstance(item.num_tokens, int) or isinstance(item.num_tokens, bool) or item.num_tokens < 0:
            raise _fail("schedule", f"{item.seq_id} has token count {item.num_tokens!r}")
    for p in value.preempted:
        if not isinstance(p, Preempted) or not isinstance(p.mode, PreemptionMode):
            raise _fail("schedule", f"preempted entry {p!r} is not a Preempted with a PreemptionMode")
    for name in ("swap_out", "swap_in", "copies"):
        for pair in getattr(value, name):
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(b, int) for b in pair)):
                raise _fail("schedule", f"{name} entry {pair!r} is not a pair of block ids")
    for rid in (*value.ignored, *value.swapped_in):
        if not isinstance(rid, str):
            raise _fail("schedule", f"request id {rid!r} is not a string")
    return value


def check_finished(value: Any, call: str) -> tuple[Finished, ...]:
    if value is None and call == "abort_request":
        return ()
    items = (value,) if isinstance(value, Finished) else value
    try:
        items = tuple(items)
    except TypeError:
        raise _fail(call, f"returned {type(value).__name__}, expected Finished entries") from None
    for f in items:
        if not isinstance(f, Finished) or not isinstance(f.status, Status) or not f.status.is_finished:
            raise _fail(call, f"entry {f!r} is not a Finished with a final status")
    return items


def check_snapshot(value: Any) -> Snapshot:
    if not isinstance(value, Snapshot):
        raise _fail("snapshot", f"returned {type(value).__name__}, expected Snapshot")
    return value
