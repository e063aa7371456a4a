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
    refs = [make_reference(t.config) for t in traces]
    E = len(traces)
    unfinished: list[set[str]] = [set() for _ in range(E)]
    active = [True] * E
    engine_steps = 0
    step = 0

    def diverge(e: int, what: str, expected: Any, actual: Any) -> LockstepResult:
        return LockstepResult(E, engine_steps, step, plane.checks if plane else 0,
                              Divergence(e, step, what, expected, actual, traces[e]))

    while any(active):
        live = [e for e in range(E) if active[e]]
        ref_aborts, ref_outs, ref_fins, ref_snaps = {}, {}, {}, {}
        for e in live:
            trace, ref = traces[e], refs[e]
            for request in trace.arrivals_at(step):
                ref.add_request(request)
                unfinished[e].add(request.request_id)
            done = [ref.abort_request(rid) for rid in trace.aborts_at(step)]
            ref_aborts[e] = _fin([f for f in done if f is not None])
            ref_outs[e] = ref.schedule()
            ref_fins[e] = _fin(ref.update(StepOutcome(trace.stops_at(step))))
            if compare_state:
                ref_snaps[e] = ref.snapshot()

        b = run.batch
        try:
            bstep = run.advance(plane.apply if plane is not None else None)
            if plane is not None:
                plane.verify(step, b.names)
        except KVError as err:
            return diverge(err.engine, "kv", "the KV the block tables promise", str(err))
        out, upd = bstep.output, bstep.update
        aborted_slots: dict[int, set[int]] = {}
        for engine, slot in zip(bstep.aborted[0].tolist(), bstep.aborted[1].tolist(), strict=True):
            aborted_slots.setdefault(engine, set()).add(slot)

        outs = step_outputs(out, b.names, live)
        fins = finished_lists(upd, b.names, live)
        snaps = snapshots(twin, b.names, live) if compare_state else [None] * len(live)
        for i, e in enumerate(live):
            engine_steps += 1
            differs = engine_step_difference(
                traces[e], step, b.slot_of[e], aborted_slots.get(e, set()), (ref_aborts[e], ref_outs[e], ref_fins[e]),
                (outs[i], fins[i]), (ref_snaps[e], snaps[i]) if compare_state else None)
            if differs:
                return diverge(e, *differs)
            active[e] = still_active(traces[e], step, unfinished[e], ref_fins[e] + ref_aborts[e])
        twin_active = run.active.tolist()
        for e in live:
            if twin_active[e] != active[e]:
                return diverge(e, "end", f"engine active after step: {active[e]}", f"engine active after step: {twin_active[e]}")
        step += 1
    return LockstepResult(E, engine_steps, step, plane.checks if plane else 0, None)


def engine_step_difference(
    trace: Trace, step: int, slot_of: dict[str, int], aborted_slots: set[int],
    reference: tuple[list, SchedulerOutput, list], twin: tuple[SchedulerOutput, Any],
    snapshots: tuple[Snapshot, Snapshot] | None,
) -> tuple[str, Any, Any] | None:
    """The first part of one engine's step where the twin differs from the reference, as (what,
    reference's, twin's): the aborts (the twin reports aborted slots), the output, the finished
    requests, then (``snapshots``: reference's, twin's) the state; None when they agree."""
    ref_aborts, ref_out, ref_fins = reference
    twin_out, twin_fins = twin
    twin_aborts, seen = [], set()
    for rid in trace.aborts_at(step):
        slot = slot_of.get(rid)
        if slot is not None and slot in aborted_slots and rid not in seen:
            seen.add(rid)
            twin_aborts.append((rid, Status.FINISHED_ABORTED.value))
    if twin_aborts != ref_aborts:
        return "aborts", ref_aborts, twin_aborts
    if _out_dict(twin_out) != _out_dict(ref_out):
        return "output", _out_dict(ref_out), _out_dict(twin_out)
    if (fin := _fin(twin_fins)) != ref_fins:
        return "finished", ref_fins, fin
    return snapshot_difference(*snapshots) if snapshots else None


def still_active(trace: Trace, step: int, unfinished: set[str], ended: list[tuple[str, str]]) -> bool:
    """Whether the engine runs another step: the reference's rule (arrivals left or requests
    unfinished, within max_steps). ``ended``: the step's finished and aborted requests."""
    for rid, _ in ended:
        unfinished.discard(rid)
    return not ((step >= trace.last_arrival_step and not unfinished) or step + 1 >= trace.max_steps)


def snapshot_difference(ref: Snapshot, twin: Snapshot) -> tuple[str, Any, Any] | None:
    """The first compared field where two snapshots differ, as (``snapshot.<field>``, reference's,
    twin's), or None. The delta links (`Snapshot.base`, the changed sets) are not compared."""
    for f in fields(ref):
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
