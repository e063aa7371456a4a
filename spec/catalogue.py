"""The invariant catalogue: what a scheduler of the vLLM kind must guarantee.

Each `Invariant` has a stable ID, a category (safety / policy / liveness), a one-line statement,
a rationale citing where it comes from (a seed passage or a vLLM behaviour), the observations it
needs, and one executable predicate. Step predicates see one `StepRecord` at a time (with the
run's context); end predicates see the run as a whole once it stops.

The predicates live in `spec.invariants.*`, one module per family; this module registers them
and runs them (`Checker`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from spec.config import MAX_PIPELINE_DEPTH, SchedulerConfig
from spec.errors import InputError
from spec.invariants._views import forget
from spec.observation import Capability, SeqView, StepFailure, StepRecord
from spec.reservation import NONE, Reservation
from spec.status import Status
from spec.types import Request, request_of

CATEGORIES = ("safety", "policy", "liveness")


@dataclass
class CheckContext:
    """What a predicate may know besides the step: the config and the run so far."""

    config: SchedulerConfig
    requests: dict[str, Request] = field(default_factory=dict)
    arrival: dict[str, int] = field(default_factory=dict)  # add order
    finished: dict[str, Status] = field(default_factory=dict)  # reported before this step
    steps: int = 0
    last_arrival_step: int = 0
    drained: bool = False
    ended_at_max_steps: bool = False
    # The previous step's record when every check passed on it: incremental checks need not
    # look again at what is unchanged since (spec.invariants._views.fresh_*). None: check all.
    previous: StepRecord | None = None
    # What the scheduler declares it reserves beyond its computed tokens (CAP-006).
    reservation: Reservation = NONE
    # Requests one of whose sequences an outcome stopped while it was scheduled, this step
    # included: only those may finish as FINISHED_STOPPED (REQ-005).
    stopped: set[str] = field(default_factory=set)
    # The `Invariant.reads` of the predicate being run (set by `Checker` before each call): the
    # incremental readers (spec.invariants._views.fresh_*) hand it only views where one of those
    # fields changed since it last passed. None: every field.
    reads: frozenset[str] | None = None
    # What one family's predicates carry from step to step, by invariant id (PIP-002, PIP-006).
    flow_state: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The steps that scheduled each request, the last MAX_PIPELINE_DEPTH + 1 of them (the steps
    # whose outcome may still be in flight), and the last step it left the running set in
    # (preempted, aborted or finished), with how: what a failure predicate (PIP-005) reads.
    scheduled_in: dict[str, list[int]] = field(default_factory=dict)
    left_at: dict[str, tuple[int, str]] = field(default_factory=dict)
    # What the scheduler exposes and claims (`Capability`): a few safety statements are scoped by
    # a claim (RES-001, CAP-005, ADM-003 by ORDERED_STEPS; REQ-004, CHK-003 by OUTPUT_AT_FINISH).
    claims: frozenset[Capability] = frozenset()

    def key(self, request_id: str) -> tuple[int, ...]:
        """Policy order (smaller = more urgent): FCFS by arrival, priority by (priority, arrival)."""
        if self.config.policy == "priority":
            return (self.requests[request_id].priority, self.arrival[request_id])
        return (self.arrival[request_id],)


StepPredicate = Callable[[CheckContext, StepRecord], Iterable[str]]
EndPredicate = Callable[[CheckContext], Iterable[str]]
# Called when a scheduler call fails mid-step (`StepFailure`): which failures the invariant forbids.
FailurePredicate = Callable[[CheckContext, StepFailure], Iterable[str]]


@dataclass(frozen=True)
class Invariant:
    id: str
    category: str
    statement: str
    rationale: str
    needs: frozenset[Capability]
    step: StepPredicate | None = None
    end: EndPredicate | None = None
    failure: FailurePredicate | None = None
    # The statement assumes a step's outcome is processed in that step (a synchronous engine):
    # with outcomes pipelined (config.pipeline_depth > 0) a correct scheduler computes ahead of
    # what it has delivered, so there the invariant is checked on the step as the scheduler
    # planned it (`spec.planned_view`: the in-flight counters added back), which needs the
    # IN_FLIGHT observation; without it the invariant does not apply at depth > 0.
    synchronous: bool = False
    # For a synchronous invariant: whether the planned view stands in for it at depth > 0. False
    # where the planned view cannot say it (REQ-004: a preempted request's stale samples are not
    # counted by any counter); other invariants (PIP-001, PIP-002) make its promise there.
    planned: bool = True
    # Claims that make the invariant moot (PIP-004 under ORDERED_STEPS): not applicable where the
    # scheduler makes one of them.
    unless: frozenset[Capability] = frozenset()
    # The `SeqView` fields the predicate reads (None: any). A declaration, not a hint: the
    # incremental readers hand it only the views where one of these changed since the snapshot
    # it last passed (a decode changes every running view's token counts each step but its block
    # table once per block_size tokens, so a check of tables and statuses skips it), which is
    # sound only if its verdict on a view depends on no other field.
    # tests/test_reads_declared.py holds each declaration against the predicate's source.
    reads: frozenset[str] | None = None

    def applicable(self, capabilities: frozenset[Capability], config: SchedulerConfig | None = None) -> bool:
        if self.synchronous and config is not None and config.pipeline_depth > 0 \
                and (not self.planned or Capability.IN_FLIGHT not in capabilities):
            return False
        if self.unless & capabilities:
            return False
        return self.needs <= capabilities

    @property
    def predicate_location(self) -> str:
        fn = self.step or self.end or self.failure
        assert fn is not None
        return f"{fn.__module__}.{fn.__qualname__}"

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "category": self.category,
            "statement": self.statement,
            "rationale": self.rationale,
            "needs": sorted(c.value for c in self.needs),
            "checked": "per step" if self.step else "at the end of a run" if self.end else "when a call fails",
            "synchronous_steps_only": self.synchronous and not self.planned,
            "pipelined_as_planned": self.synchronous and self.planned,
            **({"moot_under": sorted(c.value for c in self.unless)} if self.unless else {}),
            "predicate": self.predicate_location,
        }


_REGISTRY: dict[str, Invariant] = {}


def invariant(
    id: str, category: str, statement: str, rationale: str, needs: Iterable[Capability] = (), *, at_end: bool = False,
    synchronous: bool = False, at_failure: bool = False, unless: Iterable[Capability] = (), planned: bool = True,
    reads: Iterable[str] | None = None,
) -> Callable[[Callable], Callable]:
    """Register the decorated predicate as invariant ``id`` (``synchronous``, ``reads``: see
    `Invariant`; ``at_failure``: a `FailurePredicate`, run only when a scheduler call fails mid-step)."""
    assert category in CATEGORIES, category
    read_set = None if reads is None else frozenset(reads)
    assert read_set is None or (read_set and read_set <= frozenset(SeqView._fields)), f"{id}: reads {read_set}"

    def register(fn: Callable) -> Callable:
        assert id not in _REGISTRY, f"duplicate invariant id {id}"
        needs_set = frozenset(needs) | {Capability.OUTPUT}
        _REGISTRY[id] = Invariant(
            id, category, " ".join(statement.split()), " ".join(rationale.split()), needs_set,
            step=None if at_end or at_failure else fn, end=fn if at_end else None,
            failure=fn if at_failure else None, synchronous=synchronous, unless=frozenset(unless), planned=planned,
            reads=read_set,
        )
        return fn

    return register


def catalogue() -> list[Invariant]:
    """Every invariant, in ID order."""
    _load()
    return [_REGISTRY[k] for k in sorted(_REGISTRY, key=_id_order)]


def get(invariant_id: str) -> Invariant:
    _load()
    return _REGISTRY[invariant_id]


_FAMILY_ORDER = (
    "BLK", "RES", "CAP", "COW", "QUE", "BUD", "ENC", "LORA", "PAU", "LEN", "ADM", "SWP", "REQ", "OUT", "STR", "CHK", "PFX", "PIP", "POL", "ORD", "LIV",
)


def _id_order(invariant_id: str) -> tuple[int, str]:
    family = invariant_id.split("-")[0]
    return (_FAMILY_ORDER.index(family) if family in _FAMILY_ORDER else len(_FAMILY_ORDER), invariant_id)


def completion_bound_for(ctx: CheckContext) -> int:
    """The LIV-002 bound for the requests in ``ctx`` (see `spec.invariants.liveness`)."""
    _load()
    from spec.invariants.liveness import completion_bound_for as bound

    return bound(ctx)


_LOADED: list[bool] = []


def _load() -> None:
    # A flag, not "the registry is non-empty": importing one family directly (the flows registry
    # resolves each flow's families) registers only that family.
    if _LOADED:
        return
    _LOADED.append(True)
    # Importing the families registers their invariants.
    from spec.invariants import (  # noqa: F401
        admission,
        blocks,
        budgets,
        chunked,
        encoder,
        liveness,
        order,
        pause,
        placement,
        policy,
        prefix_cache,
        requests,
        sglang,
        specdec,
        strengthening,
        swap,
    )

    importlib.import_module("spec.invariants.async")  # the async flow's family; `async` is a keyword


@dataclass(frozen=True)
class Violation:
    invariant_id: str
    step: int | None  # None: found at the end of the run
    message: str

    def __str__(self) -> str:
        where = f"step {self.step}" if self.step is not None else "end of run"
        return f"{self.invariant_id} at {where}: {self.message}"


class Checker:
    """Runs the applicable invariants over a run, one step at a time.

    Feed it records with `check_step` as they happen (so a violation is known at once), then
    call `check_end`. Invariants whose needs the scheduler does not meet are `not_applicable`.
    """

    def __init__(
        self,
        config: SchedulerConfig,
        capabilities: frozenset[Capability],
        invariants: Iterable[Invariant] | None = None,
        reservation: Reservation | None = None,
    ) -> None:
        chosen = list(invariants) if invariants is not None else catalogue()
        if reservation is not None and not isinstance(reservation, Reservation):
            raise InputError("adapter.reservation",
                             f"must be a spec.reservation.Reservation or None, got {type(reservation).__name__}")
        self.context = CheckContext(config, reservation=reservation or NONE, claims=frozenset(capabilities))
        self.active = [inv for inv in chosen if inv.applicable(capabilities, config)]
        self.not_applicable = [inv for inv in chosen if not inv.applicable(capabilities, config)]
        planned = config.pipeline_depth > 0  # synchronous invariants read the planned view (spec.planned_view)
        self._step_checks = [inv for inv in self.active if inv.step is not None and not (planned and inv.synchronous)]
        self._planned_checks = [inv for inv in self.active if inv.step is not None and planned and inv.synchronous]
        self._end_checks = [inv for inv in self.active if inv.end is not None]
        self._failure_checks = [inv for inv in self.active if inv.failure is not None]
        # The in-flight history (`CheckContext.scheduled_in`, `left_at`) is what a failure
        # predicate reads about outcomes still in flight: none are without pipelining, and a
        # pass over every scheduled request per step is then a cost for nothing.
        self._keeps_history = bool(self._failure_checks) and config.pipeline_depth > 0

    def check_step(self, record: StepRecord) -> list[Violation]:
        ctx = self.context
        for request in record.added:
            ctx.requests[request.request_id] = request
            ctx.arrival[request.request_id] = len(ctx.arrival)
            ctx.last_arrival_step = record.step
        if record.stopped:  # a stop reaches a request only through a step that ran it (forks are born in one)
            ran = {s.request_id for s in record.output.scheduled}
            ctx.stopped.update(rid for rid in map(request_of, record.stopped) if rid in ran)
        found = []
        for inv in self._step_checks:
            ctx.reads = inv.reads  # what the readers may filter on while this predicate runs
            found += [Violation(inv.id, record.step, message) for message in inv.step(ctx, record)]  # type: ignore[misc]
        ctx.reads = None
        if self._planned_checks:
            from spec.planned_view import planned_record

            planned, whole = planned_record(record), dataclasses.replace(ctx, previous=None)  # whole snapshots
            found += [Violation(inv.id, record.step, f"(as planned) {message}")
                      for inv in self._planned_checks for message in inv.step(whole, planned)]  # type: ignore[misc]
        for f in record.finished:
            ctx.finished.setdefault(f.request_id, f.status)
        if self._keeps_history:
            _note_in_flight_history(ctx, record.step, record.aborted, record.output, record.finished)
        ctx.steps += 1
        if ctx.previous is not None:  # its snapshots are neither a base nor a prior from now on
            for snap in (ctx.previous.before, ctx.previous.mid, ctx.previous.after):
                if snap is not record.before:
                    forget(snap)
        ctx.previous = None if found else record
        return found

    def check_failure(self, failure: StepFailure) -> list[Violation]:
        """The invariants a failed call breaks (PIP-005); the caller still reports the failure
        itself as a fault. The failed step's aborts and output count as history."""
        _note_in_flight_history(self.context, failure.step, failure.aborted, failure.output, ())
        return [Violation(inv.id, failure.step, m)
                for inv in self._failure_checks for m in inv.failure(self.context, failure)]  # type: ignore[misc]

    def check_end(self, drained: bool, ended_at_max_steps: bool) -> list[Violation]:
        self.context.drained = drained
        self.context.ended_at_max_steps = ended_at_max_steps
        return [Violation(inv.id, None, m) for inv in self._end_checks for m in inv.end(self.context)]  # type: ignore[misc]


def _note_in_flight_history(ctx: CheckContext, step: int, aborted: Iterable[str], output: Any,
                            finished: Iterable[Any]) -> None:
    """Keep `CheckContext.scheduled_in` and `left_at` for one step (``output``: its
    SchedulerOutput or None; ``finished``: its Finished list)."""
    if output is not None:
        for item in output.scheduled:
            steps = ctx.scheduled_in.setdefault(item.request_id, [])
            if not steps or steps[-1] != step:
                steps.append(step)
                del steps[:-(MAX_PIPELINE_DEPTH + 1)]
    for rid in aborted:
        ctx.left_at[rid] = (step, "aborted")
    if output is not None:
        for p in output.preempted:
            ctx.left_at[p.request_id] = (step, "preempted")
    for f in finished:
        if ctx.left_at.get(f.request_id, (None, ""))[0] != step:  # an abort of this step says more
            ctx.left_at[f.request_id] = (step, f"finished ({f.status.name})")


def check_records(
    config: SchedulerConfig,
    capabilities: frozenset[Capability],
    records: Iterable[StepRecord],
    drained: bool,
    ended_at_max_steps: bool = False,
    reservation: Reservation | None = None,
) -> Iterator[Violation]:
    """Check a whole recorded run (convenience for tests and replay)."""
    checker = Checker(config, capabilities, reservation=reservation)
    for record in records:
        yield from checker.check_step(record)
    yield from checker.check_end(drained, ended_at_max_steps)
