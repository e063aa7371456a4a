"""Lockstep differential harness: E traces through E reference schedulers and one batched twin.

Every step, for every engine still running, it compares the whole step: the requests the
step's aborts finished, the `SchedulerOutput` (scheduled sequences and token counts,
preempted with modes, swapped-in, swap-out / swap-in maps, copies, ignored; reasons are not
compared, the twin has none), the finished requests `update()` reports, and the full snapshot
after the step (statuses, queues, every sequence's tokens, computed tokens, block table and
device, reference counts, free ids). With ``kv=True`` the KV data plane follows the twin and is
verified after every step. The first divergence is reported with engine index, step, what
differed and both sides.

This module imports only `spec` (and the twin): the reference is passed in as a factory
``make_reference(config) -> SchedulerLike`` (the tests pass ``reference_impl.Scheduler``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from gpu_impl.encode import BatchedRun, TraceBatch
from gpu_impl.kv import KVError, KVPlane
from gpu_impl.materialize import finished_lists, snapshots, step_outputs
from spec.config import SchedulerConfig
from spec.observation import Snapshot
from spec.protocol import SchedulerLike
from spec.status import Status
from spec.trace import Trace
from spec.types import SchedulerOutput, StepOutcome


@dataclass
class Divergence:
    engine: int
    step: int
    what: str  # "aborts", "output", "finished", "snapshot.<field>", "kv", "end"
    expected: Any  # the reference's side
    actual: Any  # the twin's side
    trace: Trace

    def describe(self) -> str:
        def show(x: Any) -> str:
            return json.dumps(x, indent=1, sort_keys=True, default=str) if not isinstance(x, str) else x

        return (
            f"gpu_impl diverges from the reference: engine {self.engine}, step {self.step}, {self.what}\n"
            f"--- reference\n{show(self.expected)}\n--- gpu_impl\n{show(self.actual)}"
        )


@dataclass
class LockstepResult:
    engines: int
    engine_steps: int
    steps: int
    kv_checks: int
    divergence: Divergence | None

    @property
    def ok(self) -> bool:
        return self.divergence is None


def _out_dict(out: SchedulerOutput) -> dict[str, Any]:
    d = replace(out, reasons=()).to_dict()
    d.pop("reasons")
    return d


def _fin(items: Sequence[Any]) -> list[tuple[str, str]]:
    return [(f.request_id, Status(f.status).value) for f in items]


def run_lockstep(
    traces: Sequence[Trace],
    make_reference: Callable[[SchedulerConfig], SchedulerLike],
    device: str | torch.device | None = "cpu",
    compare_state: bool = True,
    kv: bool = False,
) -> LockstepResult:
    batch = TraceBatch(traces, device)
    run = BatchedRun(batch)
    twin = run.scheduler
    plane = KVPlane(twin) if kv else None

    def step_twin(step: int, live: list[int]) -> tuple[TwinSteps, list[bool]]:
        try:
            bstep = run.advance(plane.apply if plane is not None else None)
            if plane is not None:
                plane.verify(step, batch.names)
        except KVError as err:
            raise TwinDiverged(err.engine, "kv", "the KV the block tables promise", str(err)) from err
        steps = TwinSteps(
            step_outputs(bstep.output, batch.names, live), finished_lists(bstep.update, batch.names, live),
            snapshots(twin, batch.names, live) if compare_state else None, aborted_slots_by_engine(bstep.aborted))
        return steps, run.active.tolist()

    return drive_lockstep(traces, make_reference, compare_state, batch.slot_of, step_twin,
                          lambda: plane.checks if plane else 0)


class TwinDiverged(Exception):
    """Raised by a harness's twin step when the twin fails before its outputs can be compared
    (the KV data plane's check): engine, what, the reference's side, the twin's side."""

    def __init__(self, engine: int, what: str, expected: Any, actual: Any) -> None:
        super().__init__(what)
        self.engine, self.what, self.expected, self.actual = engine, what, expected, actual


def drive_lockstep(
    traces: Sequence[Trace],
    make_reference: Callable[[SchedulerConfig], SchedulerLike],
    compare_state: bool,
    slot_of: Sequence[dict[str, int]],
    step_twin: Callable[[int, list[int]], tuple[TwinSteps, list[bool]]],
    kv_checks: Callable[[], int] = lambda: 0,
) -> LockstepResult:
    """The lockstep loop both twins share: each step, run the live engines' references, then
    ``step_twin(step, live)`` (the twin's step for the live engines, and which engines it keeps
    active), and compare; stop at the first divergence. ``slot_of``: each engine's request id ->
    slot, to read the twin's aborted slots back as requests."""
    refs = [make_reference(t.config) for t in traces]
    E = len(traces)
    unfinished: list[set[str]] = [set() for _ in range(E)]
    active = [True] * E
    engine_steps = step = 0

    def result(found: tuple[int, str, Any, Any] | None) -> LockstepResult:
        divergence = Divergence(found[0], step, *found[1:], traces[found[0]]) if found else None
        return LockstepResult(E, engine_steps, step, kv_checks(), divergence)

    while any(active):
        live = [e for e in range(E) if active[e]]
        reference = step_references(traces, refs, live, step, unfinished, compare_state)
        try:
            twin, twin_active = step_twin(step, live)
        except TwinDiverged as d:
            return result((d.engine, d.what, d.expected, d.actual))
        compared, differs = first_difference(traces, step, live, slot_of, reference, twin, active, unfinished, twin_active)
        engine_steps += compared
        if differs:
            return result(differs)
        step += 1
    return result(None)


@dataclass
class ReferenceStep:
    """One reference engine's step, as the twin's is compared with it: the requests its aborts
    finished, its output, the requests `update()` finished (both as (id, status)), its snapshot."""

    aborts: list[tuple[str, str]]
    output: SchedulerOutput
    finished: list[tuple[str, str]]
    snapshot: Snapshot | None


@dataclass
class TwinSteps:
    """The twin's step for the live engines (lists in ``live`` order), with the slots its aborts
    hit per engine; ``snapshots`` is None when the state is not compared."""

    outputs: list[SchedulerOutput]
    finished: list[Any]
    snapshots: list[Snapshot] | None
    aborted_slots: dict[int, set[int]]


def step_references(
    traces: Sequence[Trace], refs: Sequence[SchedulerLike], live: Sequence[int], step: int,
    unfinished: list[set[str]], compare_state: bool,
) -> dict[int, ReferenceStep]:
    """Run step ``step`` of each live engine's trace on its reference (arrivals, aborts,
    schedule, update), noting arrivals in ``unfinished``."""
    done: dict[int, ReferenceStep] = {}
    for e in live:
        trace, ref = traces[e], refs[e]
        for request in trace.arrivals_at(step):
            ref.add_request(request)
            unfinished[e].add(request.request_id)
        aborted = [ref.abort_request(rid) for rid in trace.aborts_at(step)]
        aborts = _fin([f for f in aborted if f is not None])
        output = ref.schedule()
        finished = _fin(ref.update(StepOutcome(trace.stops_at(step))))
        done[e] = ReferenceStep(aborts, output, finished, ref.snapshot() if compare_state else None)
    return done


def aborted_slots_by_engine(aborted: tuple[torch.Tensor, ...], engine_of_row: Sequence[int] | None = None) -> dict[int, set[int]]:
    """The twin's aborted (row, slot) pairs as engine -> slots (``engine_of_row``: the trace
    index of each row of a compacted scheduler; None: rows are engines)."""
    slots: dict[int, set[int]] = {}
    for row, slot in zip(aborted[0].tolist(), aborted[1].tolist(), strict=True):
        slots.setdefault(engine_of_row[row] if engine_of_row is not None else row, set()).add(slot)
    return slots


def first_difference(
    traces: Sequence[Trace], step: int, live: Sequence[int], slot_of: Sequence[dict[str, int]],
    reference: dict[int, ReferenceStep], twin: TwinSteps, active: list[bool], unfinished: list[set[str]],
    twin_active: Sequence[bool],
) -> tuple[int, tuple[int, str, Any, Any] | None]:
    """Compare each live engine's step, then whether each runs on (updating ``active`` by the
    reference's rule). Returns the engine-steps compared and the first difference as (engine,
    what, reference's, twin's), or None."""
    compared = 0
    for i, e in enumerate(live):
        compared += 1
        snaps = (reference[e].snapshot, twin.snapshots[i]) if twin.snapshots is not None else None
        differs = engine_step_difference(traces[e], step, slot_of[e], twin.aborted_slots.get(e, set()),
                                         reference[e], twin.outputs[i], twin.finished[i], snaps)
        if differs:
            return compared, (e, *differs)
        active[e] = still_active(traces[e], step, unfinished[e], reference[e].finished + reference[e].aborts)
    for e in live:
        if twin_active[e] != active[e]:
            return compared, (e, "end", f"engine active after step: {active[e]}", f"engine active after step: {twin_active[e]}")
    return compared, None


def engine_step_difference(
    trace: Trace, step: int, slot_of: dict[str, int], aborted_slots: set[int], reference: ReferenceStep,
    twin_out: SchedulerOutput, twin_fins: Any, snapshots: tuple[Snapshot, Snapshot] | None,
) -> tuple[str, Any, Any] | None:
    """The first part of one engine's step where the twin differs from the reference, as (what,
    reference's, twin's): the aborts (the twin reports aborted slots), the output, the finished
    requests, then (``snapshots``: reference's, twin's) the state; None when they agree."""
    twin_aborts, seen = [], set()
    for rid in trace.aborts_at(step):
        slot = slot_of.get(rid)
        if slot is not None and slot in aborted_slots and rid not in seen:
            seen.add(rid)
            twin_aborts.append((rid, Status.FINISHED_ABORTED.value))
    if twin_aborts != reference.aborts:
        return "aborts", reference.aborts, twin_aborts
    if _out_dict(twin_out) != _out_dict(reference.output):
        return "output", _out_dict(reference.output), _out_dict(twin_out)
    if (fin := _fin(twin_fins)) != reference.finished:
        return "finished", reference.finished, fin
    return snapshot_difference(*snapshots) if snapshots else None


def still_active(trace: Trace, step: int, unfinished: set[str], ended: list[tuple[str, str]]) -> bool:
    """Whether the engine runs another step: the reference's rule (arrivals left or requests
    unfinished, within max_steps). ``ended``: the step's finished and aborted requests."""
    for rid, _ in ended:
        unfinished.discard(rid)
    return not ((step >= trace.last_arrival_step and not unfinished) or step + 1 >= trace.max_steps)


# Snapshot parts of features the twin does not have (issue 32: no encoder cache, no pause calls;
# its adapter refuses traces that use them): the V1 reference reports its empty encoder cache and
# its "unpaused" state, the twin reports none, and neither says anything about the other's schedule.
_REFERENCE_ONLY = frozenset({"encoder_cache", "encoder_free", "pause_state"})


def snapshot_difference(ref: Snapshot, twin: Snapshot) -> tuple[str, Any, Any] | None:
    """The first compared field where two snapshots differ, as (``snapshot.<field>``, reference's,
    twin's), or None. The delta links (`Snapshot.base`, the changed sets) are not compared, nor a
    part of a feature the twin lacks where the twin reports none (`_REFERENCE_ONLY`)."""
    for f in fields(ref):
        if f.name in _REFERENCE_ONLY and getattr(twin, f.name) is None:
            continue
        if f.compare and getattr(ref, f.name) != getattr(twin, f.name):
            return f"snapshot.{f.name}", _plain(getattr(ref, f.name)), _plain(getattr(twin, f.name))
    return None


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if hasattr(x, "_asdict"):  # a named tuple (SeqView)
        return {k: _plain(v) for k, v in x._asdict().items()}
    if isinstance(x, (tuple, list)):
        return [_plain(v) for v in x]
    if hasattr(x, "__dataclass_fields__"):
        return {f.name: _plain(getattr(x, f.name)) for f in fields(x)}
    if isinstance(x, Status):
        return x.value
    return x
