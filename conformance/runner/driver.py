"""Drive one trace through an adapter: guarded calls, invariant checks after every step, and
(optionally) the reference in lockstep.

With ``stop_at_first`` the run stops at the first step that shows a problem (an invariant
violation, an adapter fault, or a lockstep divergence), and that step's problems are all
reported. Without it (the fuzz driver's way) the run goes on past violations, so a failure early
in a trace does not hide a different one later: every invariant the trace violates is reported,
each at the step it first failed. Only a fault ends the run there (the adapter's state is then
unknown); after a lockstep divergence the reference is no longer a guide, so comparing stops and
checking goes on. The record list always holds the steps run, so the trace can be cut at any
problem's step and replayed.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from conformance.runner.adapter import Adapter, adapter_domain
from conformance.runner.block_ids import shift_output, shift_snapshot
from conformance.runner.guard import AdapterFault, Guard
from conformance.runner.lockstep import Divergence, compare
from conformance.runner.normalize import Bounds, check_finished, check_output, check_snapshot
from spec.catalogue import Checker, Invariant, Violation
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import MAX_CHAIN, Capability, Snapshot, StepFailure, StepRecord
from spec.protocol import supports
from spec.reservation import Reservation
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
    # What the adapter declared it reserves for this trace's config (read after reset: a scheduler's
    # reservation may depend on the config, its k and depth), the one the checker held it to.
    reservation: Reservation | None = None
    # The checker that ran (None: none did): what each invariant exercised is its count.
    checker: Checker | None = field(default=None, repr=False, compare=False)

    @property
    def exercised(self) -> dict[str, int]:
        """Invariant id -> subjects it checked with its trigger holding (`spec.rules`; zero: vacuous)."""
        return self.checker.exercised if self.checker is not None else {}

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
    guard: Guard | None = None,
    stop_on: str | None = None,
    check_budget: float | None = None,
    stream: Callable[[StepRecord], None] | None = None,
) -> TraceResult:
    """Run ``trace`` through ``adapter``, checking ``invariants`` after every step.

    Every value handed to the adapter is its own (a copy of the trace's request, config and
    drafts, or an immutable value), so nothing it changes in place changes what the checks read;
    every answer is validated whole, its sizes bounded by the trace (`normalize.Bounds`), before
    a check reads it. ``check_budget``: seconds the checks (not the adapter's calls) may spend on
    this trace; past it the trace ends in ``FAULT-budget`` (answers too costly to check are the
    adapter's fault, as a hang is).

    ``guard`` times and wraps each adapter call (default: a `Guard` with ``timeout``); the
    isolated worker passes one that stamps each call for the watchdog in the parent instead.
    ``stop_on`` ends the run after the step where that problem (an invariant ID or ``LOCKSTEP``)
    first shows: the shrinker needs no more of a candidate than that. A fault whose step the
    adapter could not tell (``AdapterFault.step_uncertain``: a wire host killed while it held the
    lines of its last steps) is found again by replaying the trace under ``adapter.exact_steps()``.

    ``stream``: the records are streamed rather than kept. Each record is handed to ``stream`` once
    it is checked, and ``result.records`` holds only the last one. Nothing can then be replayed or
    cut from the records: this is for a long run whose cost is measured (benchmarks/bench_scale.py).
    A kept run of 4096 requests holds every step's snapshots, 2 GB on the V1 reference, and each
    new snapshot then lands in fresh memory. The checker keeps what it reads across steps itself
    (`spec.rules.CheckContext`). See `_Streamed` for how old snapshots are let go.
    """
    # The records kept for the trace are acyclic but many; with the cyclic collector running,
    # its full passes over them cost more than the scheduler itself on a large batch
    # (BENCHMARKS.md). Paused for the one trace, restored whatever happens.
    collecting = gc.isenabled()
    gc.disable()
    invariants = list(invariants)
    guard = guard or Guard(timeout)
    try:
        result = _run_checked(adapter, trace, invariants, guard, lockstep, stop_at_first, reference_factory, stop_on,
                              check_budget, stream)
        if result.fault is not None and result.fault.step_uncertain and hasattr(adapter, "exact_steps"):
            result = _replay_exactly(adapter, trace, invariants, guard, lockstep, stop_at_first, reference_factory,
                                     stop_on, check_budget, result, stream)
        end = getattr(adapter, "end_trace", None)  # optional: an adapter that ran ahead of the driver
        if end is not None and result.fault is None:
            end()
        return result
    finally:
        if collecting:
            gc.enable()


def _replay_exactly(adapter: Any, trace: Trace, invariants: list[Invariant], guard: Guard, lockstep: bool,
                    stop_at_first: bool, reference_factory: Callable[[SchedulerConfig], Any] | None,
                    stop_on: str | None, check_budget: float | None, first: TraceResult,
                    stream: Callable[[StepRecord], None] | None = None) -> TraceResult:
    """``first`` ended in a fault whose step the adapter could not tell (a wire host killed while it
    held the lines of its last steps: conformance/wire/client.py): run the trace again from its
    reset with every step answered at once (``adapter.exact_steps()``), so that the fault, the
    records and the checks are those of a run that never held a line. If the replay runs to its
    end without a fault, the death did not come again (a nondeterministic crash): ``first`` is
    kept, its fault at the first step whose answer was missing, and its message says so."""
    with adapter.exact_steps():
        again = _run_checked(adapter, trace, invariants, guard, lockstep, stop_at_first, reference_factory, stop_on,
                             check_budget, stream)
    stopped_early = (stop_at_first and again.failed) or (stop_on is not None and stop_on in again.problem_ids)
    if again.fault is not None or stopped_early:
        return again  # what a run that wrote each line at once reports
    fault = first.fault
    assert fault is not None
    first.fault = AdapterFault(
        fault.kind, fault.call, f"{fault.message} (the adapter held the answers of its last steps and lost them "
        f"when it died; a replay with each step answered at once did not die: a nondeterministic crash, "
        f"reported at the first step whose answer is missing)", fault.location)
    return first


def _run_checked(
    adapter: Adapter,
    trace: Trace,
    invariants: Iterable[Invariant],
    guard: Guard,
    lockstep: bool,
    stop_at_first: bool,
    reference_factory: Callable[[SchedulerConfig], Any] | None,
    stop_on: str | None = None,
    check_budget: float | None = None,
    stream: Callable[[StepRecord], None] | None = None,
) -> TraceResult:
    result = TraceResult(trace)
    streamed = _Streamed(stream) if stream is not None else None
    step = -1
    checker: Checker | None = None
    bounds = Bounds.of(trace)
    guard = _TimedGuard(guard, check_budget)
    aborted: tuple[str, ...] = ()
    output = None
    try:
        domain = adapter_domain(adapter)
        try:
            sized = guard.call("reset", adapter.reset, copy.copy(trace.config))
        except AdapterFault as fault:
            if fault.kind != "raised":
                raise
            # An engine that refuses a config is not the same finding as one that crashes on a
            # trace: the shrinker must not trade one for the other.
            raise AdapterFault("config-rejected", "reset", fault.message) from fault
        config = engine_config(trace.config, sized, domain.engine_pool)
        # What the domain says the engine lacks or always does decides some invariants too.
        caps = frozenset(adapter.capabilities) | {Capability(c) for c in domain.claims()}
        if domain.fused_step:
            caps -= {Capability.MID_STEP}  # schedule() has sampled already: there is no instant between
        shift = domain.first_block_id
        for index, (_, op) in enumerate(trace.admin):
            if not supports(adapter, op):  # refused up front: there is nothing to run it with
                raise InputError(f"admin[{index}].op", f"the trace calls {op} but "
                                 f"{getattr(adapter, 'name', 'the adapter')} has no such call")
        batched = bool(trace.abort_batches) and supports(adapter, "abort_requests")
        result.reservation = getattr(adapter, "reservation", None)
        checker = Checker(config, caps, invariants, reservation=result.reservation)
        result.active, result.not_applicable = checker.active, checker.not_applicable
        result.checker = checker
        needs = set().union(*(inv.needs for inv in checker.active)) if checker.active else set()
        observe = bool(needs - {Capability.OUTPUT})
        mid_step = observe and Capability.MID_STEP in caps
        begin = getattr(adapter, "begin_trace", None)  # optional: an adapter that batches the calls below
        if begin is not None:
            begin(trace, observe, mid_step)
        reference = None
        if lockstep:
            from reference_impl.scheduler import Scheduler

            reference = (reference_factory or Scheduler)(trace.config)  # a profile may name its own
        if trace.connector:  # the KV connector's script (spec/connector.py), to whoever runs one
            for side in (adapter, reference):
                attach = getattr(side, "kv_connector_scripts", None)
                if attach is not None:
                    attach(dict(trace.connector))
        unfinished: set[str] = set()
        aborted: tuple[str, ...] = ()
        output = None
        for step in range(trace.max_steps):
            aborted, output = (), None
            guard.at_step(step)
            added = tuple(trace.arrivals_at(step))
            finished: list[Finished] = []
            ref_finished: list[Finished] = []
            for request in added:
                # An adapter may refuse a request at the door: add_request returns its Finished
                # (FINISHED_IGNORED), which is that request's one finish, reported in this step.
                finished.extend(check_finished(guard.call("add_request", adapter.add_request, copy.copy(request)),
                                               "add_request", bounds))
                if reference:
                    reference.add_request(request)
                unfinished.add(request.request_id)
            refused = frozenset(f.request_id for f in finished)
            aborted = tuple(trace.aborts_at(step))
            for rid in aborted:
                finished.extend(check_finished(guard.call("abort_request", adapter.abort_request, rid), "abort_request",
                                               bounds))
                if reference:
                    done = reference.abort_request(rid)
                    ref_finished.extend([done] if done else [])
            batches = tuple(trace.abort_batches_at(step))
            for ids in batches:
                finished.extend(_abort_batch(guard, adapter, ids, batched))
                if reference:
                    ref_finished.extend(_abort_batch(None, reference, ids, supports(reference, "abort_requests")))
            aborted += tuple(rid for ids in batches for rid in ids)
            admin, ref_admin = [], []
            for op in trace.admin_at(step):
                admin.append((op, _admin_answer(op, guard.call(op, getattr(adapter, op)))))
                if reference:
                    ref_admin.append((op, bool(getattr(reference, op)())))
            # Each snapshot is checked as a delta on the one before (`check_snapshot`'s previous):
            # an adapter that gives whole snapshots is diffed, so checking costs what changed.
            last = result.records[-1].after if result.records and observe else None
            if observe and (added or aborted or admin or not result.records):
                before = last = check_snapshot(shift_snapshot(guard.call("snapshot", adapter.snapshot), shift), caps, last,
                                               bounds)
            else:  # nothing happened since the last step's final snapshot: it is this step's start
                before = result.records[-1].after if result.records else _EMPTY
            stopped = trace.stops_at(step)
            drafts = trace.drafts_at(step)
            if domain.fused_step:  # the engine samples inside schedule(): it is told the outcome there
                answer = guard.call("schedule", adapter.schedule, StepOutcome(stopped, dict(drafts)))
            else:
                answer = guard.call("schedule", adapter.schedule)
            output = check_output(shift_output(answer, shift), step, bounds)  # ``output`` stays None if malformed
            if mid_step:
                mid = last = check_snapshot(shift_snapshot(guard.call("snapshot", adapter.snapshot), shift), caps, last,
                                            bounds)
            else:
                mid = None
            finished.extend(check_finished(guard.call("update", adapter.update, StepOutcome(stopped, dict(drafts))),
                                           "update", bounds))
            after = check_snapshot(shift_snapshot(guard.call("snapshot", adapter.snapshot), shift), caps, last,
                                   bounds) if observe else _EMPTY
            record = StepRecord(step, added, aborted, before, output, mid, stopped, tuple(finished), after,
                                refused=refused, drafts=drafts, abort_batches=batches, admin=tuple(admin))
            result.records.append(record)
            result.violations.extend(checker.check_step(record))
            guard.within_budget("checking step", step)
            if streamed is not None:
                result.records = streamed.checked(record)
            if reference is not None:
                ref_output = reference.schedule()
                ref_finished.extend(reference.update(StepOutcome(stopped, drafts)))
                result.divergence = compare(step, ref_output, tuple(ref_finished), output, tuple(finished), refused)
                if result.divergence is None and ref_admin != admin:
                    result.divergence = Divergence(step, "admin", tuple(ref_admin), tuple(admin), ())
                if result.divergence is not None:
                    reference = None  # diverged: the reference no longer says what should happen
            if stop_at_first and result.failed:
                return result
            if stop_on is not None and stop_on in result.problem_ids:
                return result
            for f in finished:
                unfinished.discard(f.request_id)
            # a KV connector's transfer in flight still holds blocks: the run goes on until it reports
            if step >= trace.last_arrival_step and not unfinished and not after.kv_transfers:
                break
        arrived = {a.request.request_id for a in trace.arrivals}
        result.drained = arrived <= set(checker.context.finished)
        result.violations.extend(checker.check_end(result.drained, not result.drained))
        guard.within_budget("checking the trace's end", step)
    except AdapterFault as fault:
        if fault.call == "reset" and step >= 0:
            # A reset that failed in a later call: a wire adapter sends the reset with its next
            # message, where a refused config (or a crash in reset) surfaces
            # (conformance/wire/client.py). Reported as when reset itself failed: nothing checked.
            if fault.kind == "config-rejected":
                fault = AdapterFault("config-rejected", "reset", fault.message)
            checker = None
            result.active, result.not_applicable, result.reservation, result.records = [], [], None, []
        result.fault, result.fault_step = fault, max(step, 0)
        if checker is not None:  # a failure some invariant names (PIP-005) is also its violation
            result.violations.extend(checker.check_failure(
                StepFailure(max(step, 0), fault.call, fault.message, aborted, output)))
    return result


class _Streamed:
    """A streamed run's records (`run_checked`'s ``stream``): each is handed on once it is
    checked. Only the last few are held, and the snapshots of an older one are let go by cutting
    their ``base`` link. Otherwise each snapshot's base would keep the whole chain back to the
    first step alive, whatever the records hold.

    The cut is `spec.observation.MAX_CHAIN` steps back. A step takes at least one snapshot, and
    no reader follows a chain further than that (`Snapshot.changed_since`; the evaluation layer
    carries derived views at most `spec.invariants._views._DELTA_DEPTH` hops). So no check reads a
    cut link: the checks see what they would see with every record kept. The link is the
    adapter's own delta, a hint that costs nothing to drop: a snapshot without a base reads as
    whole. Cutting it is the same kind of write as the runner's own `_CHECKED` mark on it."""

    def __init__(self, stream: Callable[[StepRecord], None]) -> None:
        self.stream = stream
        self.held: deque[StepRecord] = deque()

    def checked(self, record: StepRecord) -> list[StepRecord]:
        """Hand ``record`` on; the records the result keeps from now on (the last one)."""
        self.stream(record)
        self.held.append(record)
        if len(self.held) > MAX_CHAIN:
            old = self.held.popleft()
            for snap in (old.before, old.mid, old.after):
                if snap is not None and snap.base is not None:
                    object.__setattr__(snap, "base", None)
        return [record]


class _TimedGuard:
    """The driver's guard, timing the adapter's calls so that what is left of a trace's time is
    the checks': `within_budget` raises ``FAULT-budget`` once they pass ``budget`` seconds. Two
    clock readings per call, about 0.1 µs."""

    def __init__(self, guard: Any, budget: float | None) -> None:
        self.inner, self.budget = guard, budget
        self.started, self.in_calls = time.perf_counter(), 0.0

    def at_step(self, step: int) -> None:
        self.inner.at_step(step)

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        began = time.perf_counter()
        try:
            return self.inner.call(name, fn, *args, **kwargs)
        finally:
            self.in_calls += time.perf_counter() - began

    def within_budget(self, doing: str, step: int) -> None:
        if self.budget is None:
            return
        checking = time.perf_counter() - self.started - self.in_calls
        if checking > self.budget:
            raise AdapterFault("budget", "schedule", f"{doing} {step}: checking the adapter's answers took "
                               f"{checking:.1f} s, past the budget of {self.budget:g} s a trace's checks may take: its answers "
                               "are too large or too many to check")


def engine_config(config: SchedulerConfig, sized: Any, engine_pool: bool) -> SchedulerConfig:
    """The config the checks read: the trace's, or, for an engine that sizes its own pool (its
    domain's ``engine_pool``), the one reset() returned, which may differ only in num_gpu_blocks."""
    if not engine_pool:
        return config
    if not isinstance(sized, SchedulerConfig):
        raise AdapterFault("malformed", "reset", "the domain says engine_pool, so reset() must return the "
                           f"config with the engine's num_gpu_blocks, got {type(sized).__name__}")
    if dataclasses.replace(sized, num_gpu_blocks=config.num_gpu_blocks) != config:
        raise AdapterFault("malformed", "reset", "reset() returned a config that differs from the trace's in "
                           "more than num_gpu_blocks")
    return sized


def _abort_batch(guard: Guard | None, scheduler: Any, ids: tuple[str, ...], batched: bool) -> list[Finished]:
    """One batched abort: a single ``abort_requests`` call where the scheduler has it (``batched``),
    else ``abort_request`` for each id in order (the spec's meaning of a batch)."""
    if batched:
        done = guard.call("abort_requests", scheduler.abort_requests, list(ids)) if guard else scheduler.abort_requests(list(ids))
        return check_finished(list(done or ()), "abort_requests")
    out: list[Finished] = []
    for rid in ids:
        one = guard.call("abort_request", scheduler.abort_request, rid) if guard else scheduler.abort_request(rid)
        out.extend(check_finished(one, "abort_request"))
    return out


def _admin_answer(op: str, value: Any) -> bool:
    """An admin call's answer, which must be a bool (``reset_prefix_cache``: whether it reset)."""
    if not isinstance(value, bool):
        raise AdapterFault("malformed", op, f"{op} must answer true or false, got {str(value)[:80]!r}")
    return value
