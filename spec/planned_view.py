"""The *planned view* of a pipelined step: the step as a synchronous scheduler would show it, built
from the in-flight counters (`spec.observation.InFlightView`), so that the invariants stated for
synchronous steps (`spec.catalogue.Invariant.synchronous`) still say something at
``pipeline_depth > 0`` (docs/ASYNC.md, section 4).

A pipelined scheduler plans each step as if every in-flight step had already returned
(vLLM: ``num_computed_tokens`` advances when a step is scheduled, ``num_output_placeholders``
stand for the tokens in-flight steps sample). The snapshot shows the *processed* state (the
frontier whose KV is known written, the tokens appended); the planned view adds back what is in
flight, per running sequence:

    planned computed = num_computed + in_flight_tokens - stale      (the scheduler's own count)
    planned tokens   = num_tokens + placeholders                   (placeholders are tokens to be)

    processed frontier    in flight (this step's k last)    placeholders
    |=====================|iiiiiiiiiiiiiiiiiiiiiiii|kkkk|   |pp|
    ^ num_computed        ^ planned computed (after schedule) = num_computed + in_flight_tokens

Mid-step (after ``schedule()``, before the outcome) a synchronous scheduler has not yet counted
the step's own tokens, so the planned view mid-step leaves out this step's ``k`` tokens and the
placeholder it reserved (the placeholders of the ``before`` snapshot). A sequence that finishes
in the step is left out of the planned ``after`` snapshot: its in-flight outcomes are dropped,
and what it computed past its stop is PIP-002's business, not the synchronous invariants'. So is
a streaming session whose turn stopped in the step (running mid-step, waiting after it, not
preempted): the turn's in-flight work is dropped as a finished request's is (vLLM
``_handle_stopped_request``, ``drop_stale_output``).
Waiting sequences are shown as they are (a preempted sequence's in-flight tokens are stale).
At depth 0 nothing is in flight and the planned view is the record itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from spec.observation import InFlightView, Snapshot, StepRecord
from spec.status import Status


def _planned(snap: Snapshot, given: Mapping[str, int] | None = None,
             placeholders_before: Mapping[str, InFlightView] | None = None,
             leave_out: frozenset[str] = frozenset()) -> Snapshot:
    if snap.in_flight is None or snap.seqs is None:
        return snap
    seqs = {sid: v for sid, v in snap.seqs.items() if sid not in leave_out}
    for sid, c in snap.in_flight.items():
        v = seqs.get(sid)
        if v is None or v.status is not Status.RUNNING:
            continue
        placeholders = c.placeholders
        if placeholders_before is not None:
            earlier = placeholders_before.get(sid)
            placeholders = earlier.placeholders if earlier is not None else 0
        computed = None if v.num_computed is None else v.num_computed + c.in_flight_tokens - c.stale - (
            given or {}).get(sid, 0)
        tokens = None if v.num_tokens is None else v.num_tokens + placeholders
        seqs[sid] = v._replace(num_computed=computed, num_tokens=tokens)
    return dataclasses.replace(snap, seqs=seqs, base=None, changed_seqs=None, changed_requests=None)


def planned_record(rec: StepRecord) -> StepRecord:
    """``rec`` as the scheduler planned it (see the module docstring); whole snapshots (no
    deltas), so the checks look at every view."""
    given = {item.seq_id: item.num_tokens for item in rec.output.scheduled}
    finished = {f.request_id for f in rec.finished}
    preempted = {p.request_id for p in rec.output.preempted}
    mid_seqs = (rec.mid or rec.before).seqs or {}
    done = frozenset(sid for sid, v in (rec.after.seqs or {}).items() if v.request_id in finished or (
        v.status in (Status.WAITING, Status.WAITING_FOR_INPUT) and v.request_id not in preempted
        and (m := mid_seqs.get(sid)) is not None and m.status is Status.RUNNING))
    before = _planned(rec.before)
    mid = None if rec.mid is None else _planned(rec.mid, given, rec.before.in_flight or {})
    return dataclasses.replace(rec, before=before, mid=mid, after=_planned(rec.after, leave_out=done))
