"""Drive one trace through an adapter: guarded calls, invariant checks after every step, and
(optionally) the reference in lockstep.

The run stops at the first step that shows a problem (an invariant violation, an adapter fault,
or a lockstep divergence); that step's problems are all reported. The record list always holds
the steps up to it, so the trace can be cut there and replayed.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from conformance.adapter import Adapter
from conformance.guard import AdapterFault, Guard
from conformance.lockstep import Divergence, compare
from conformance.normalize import check_finished, check_output, check_snapshot
from spec.catalogue import Checker, Invariant, Violation
from spec.config import SchedulerConfig
from spec.observation import Capability, Snapshot, StepRecord
from spec.trace import Trace
from spec.types import Finished, StepOutcome

_EMPTY = Snapshot()


@dataclass
class TraceResult:
    trace: Trace
    records: list[StepRecord] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    fault: AdapterFault | None = None
    fault_step: int | None = None
    divergence: Divergence | None = None
    drained: bool = False
    active: list[Invariant] = field(default_factory=list)
    not_applicable: list[Invariant] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return bool(self.violations or self.fault or self.divergence)

    @property
    def problem_ids(self) -> set[str]:
        """Names of what went wrong: invariant IDs, ``FAULT-<kind>``, ``LOCKSTEP``."""
        ids = {v.invariant_id for v in self.violations}
        if self.fault:
            ids.add(f"FAULT-{self.fault.kind}")
        if self.divergence:
            ids.add("LOCKSTEP")
        return ids

    @property
    def failure_step(self) -> int | None:
        steps = [v.step for v in self.violations if v.step is not None]
        if self.fault_step is not None:
            steps.append(self.fault_step)
        if self.divergence:
            steps.append(self.divergence.step)
        return min(steps) if steps else None


def run_checked(
    adapter: Adapter,
    trace: Trace,
    invariants: Iterable[Invariant],
    *,
    timeout: float | None = 10.0,
    lockstep: bool = False,
    stop_at_first: bool = True,
    reference_factory: Callable[[SchedulerConfig], Any] | None = None,
) -> TraceResult:
    # The records kept for the trace are acyclic but many; with the cyclic collector running,
    # its full passes over them cost more than the scheduler itself on a large batch
    # (BENCHMARKS.md). Paused for the one trace, restored whatever happens.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _run_checked(adapter, trace, invariants, timeout, lockstep, stop_at_first, reference_factory)
    finally:
        if collecting:
            gc.enable()


def _run_checked(
    adapter: Adapter,
    trace: Trace,
    invariants: Iterable[Invariant],
    timeout: float | None,
    lockstep: bool,
    stop_at_first: bool,
    reference_factory: Callable[[SchedulerConfig], Any] | None,
) -> TraceResult:
    result = TraceResult(trace)
    guard = Guard(timeout)
    step = -1
    try:
        try:
            guard.call("reset", adapter.reset, trace.config)
        except AdapterFault as fault:
            if fault.kind != "raised":
                raise
            # An engine that refuses a config is not the same finding as one that crashes on a
            # trace: the shrinker must not trade one for the other.
            raise AdapterFault("config-rejected", "reset", fault.message) from fault
        caps = frozenset(adapter.capabilities)
        checker = Checker(trace.config, caps, invariants)
        result.active, result.not_applicable = checker.active, checker.not_applicable
        needs = set().union(*(inv.needs for inv in checker.active)) if checker.active else set()
        observe = bool(needs - {Capability.OUTPUT})
        mid_step = observe and Capability.MID_STEP in caps
        reference = None
        if lockstep:
            from reference_impl.scheduler import Scheduler

            reference = (reference_factory or Scheduler)(trace.config)  # a profile may name its own
        unfinished: set[str] = set()
        for step in range(trace.max_steps):
            added = tuple(trace.arrivals_at(step))
            for request in added:
                guard.call("add_request", adapter.add_request, request)
                if reference:
                    reference.add_request(request)
                unfinished.add(request.request_id)
            finished: list[Finished] = []
            ref_finished: list[Finished] = []
            aborted = tuple(trace.aborts_at(step))
            for rid in aborted:
                finished.extend(check_finished(guard.call("abort_request", adapter.abort_request, rid), "abort_request"))
                if reference:
                    done = reference.abort_request(rid)
                    ref_finished.extend([done] if done else [])
            if observe and (added or aborted or not result.records):
                before = check_snapshot(guard.call("snapshot", adapter.snapshot))
            else:  # nothing happened since the last step's final snapshot: it is this step's start
                before = result.records[-1].after if result.records else _EMPTY
            output = check_output(guard.call("schedule", adapter.schedule), step)
            mid = check_snapshot(guard.call("snapshot", adapter.snapshot)) if mid_step else None
            stopped = trace.stops_at(step)
            finished.extend(check_finished(guard.call("update", adapter.update, StepOutcome(stopped)), "update"))
            after = check_snapshot(guard.call("snapshot", adapter.snapshot)) if observe else _EMPTY
            record = StepRecord(step, added, aborted, before, output, mid, stopped, tuple(finished), after)
            result.records.append(record)
            result.violations.extend(checker.check_step(record))
            if reference is not None:
                ref_output = reference.schedule()
                ref_finished.extend(reference.update(StepOutcome(stopped)))
                result.divergence = compare(step, ref_output, tuple(ref_finished), output, tuple(finished))
            if stop_at_first and result.failed:
                return result
            for f in finished:
                unfinished.discard(f.request_id)
            if step >= trace.last_arrival_step and not unfinished:
                break
        arrived = {a.request.request_id for a in trace.arrivals}
        result.drained = arrived <= set(checker.context.finished)
        result.violations.extend(checker.check_end(result.drained, not result.drained))
    except AdapterFault as fault:
        result.fault, result.fault_step = fault, max(step, 0)
    return result
