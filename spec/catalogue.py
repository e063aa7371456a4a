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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from spec.config import MAX_PIPELINE_DEPTH, SchedulerConfig
from spec.errors import InputError
from spec.invariants._evaluation import Evaluation, note_finish_lengths, note_session_inputs
from spec.invariants._views import forget
from spec.observation import Capability, StepFailure, StepRecord
from spec.reservation import NONE, Reservation
from spec.rules import (  # noqa: F401 - re-exported
    CATEGORIES,
    REGISTRY,
    CheckContext,
    EndPredicate,
    FailurePredicate,
    Invariant,
    StepPredicate,
    invariant,
)
from spec.types import request_of

# The declarations live in spec.rules (the families import them from there, so that loading the
# families from here makes no import circle); re-exported for every caller that reads them here.
_REGISTRY = REGISTRY


def catalogue() -> list[Invariant]:
    """Every invariant, in ID order."""
    _load()
    return [_REGISTRY[k] for k in sorted(_REGISTRY, key=_id_order)]


def get(invariant_id: str) -> Invariant:
    _load()
    return _REGISTRY[invariant_id]


_FAMILY_ORDER = (
    "BLK", "RES", "CAP", "COW", "QUE", "BUD", "ENC", "LORA", "PAU", "GRM", "LEN", "ADM", "SWP", "REQ", "OUT", "STR", "CHK", "PFX", "HYB", "PIP",
    "KVC", "POL", "ORD", "LIV",
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
        connector,
        encoder,
        grammar,
        groups,
        liveness,
        order,
        pause,
        placement,
        policy,
        prefix_cache,
        requests,
        sessions,
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
    The step invariants run through the evaluation layer (`spec.invariants._evaluation`), which
    also counts what each exercised (`exercised`).
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
        self._steps = Evaluation([inv for inv in self.active if inv.step is not None and not (planned and inv.synchronous)])
        self._planned = Evaluation([inv for inv in self.active if inv.step is not None and planned and inv.synchronous])
        self._end_checks = [inv for inv in self.active if inv.end is not None]
        self._failure_checks = [inv for inv in self.active if inv.failure is not None]
        self._ended: dict[str, int] = {}  # what the end and failure invariants exercised
        # The in-flight history (`CheckContext.scheduled_in`, `left_at`) is what a failure
        # predicate reads about outcomes still in flight: none are without pipelining, and a
        # pass over every scheduled request per step is then a cost for nothing.
        self._keeps_history = bool(self._failure_checks) and config.pipeline_depth > 0

    @property
    def exercised(self) -> dict[str, int]:
        """Invariant id -> how many subjects it checked with its trigger holding (zero: vacuous)."""
        counts = dict.fromkeys((inv.id for inv in self.active), 0)
        counts.update(self._steps.counts())
        for inv_id, n in self._planned.counts().items():
            counts[inv_id] += n
        for inv_id, n in self._ended.items():
            counts[inv_id] += n
        return counts

    def check_step(self, record: StepRecord) -> list[Violation]:
        ctx = self.context
        for request in record.added:
            ctx.requests[request.request_id] = request
            ctx.arrival[request.request_id] = len(ctx.arrival)
            ctx.last_arrival_step = record.step
            if request.session:
                ctx.sessions.add(request.request_id)
            if request.grammar_ready_step is not None:
                ctx.grammars.add(request.request_id)
            if request.encoder_inputs:
                ctx.encoded.add(request.request_id)
            if any(piece.encoder_inputs for piece in request.session):
                ctx.encoded.add(request.request_id)
                ctx.piece_encoded.add(request.request_id)
            if request.lora_id:
                ctx.loras.add(request.request_id)
            else:  # added again without one: ``ctx.requests`` now holds this request
                ctx.loras.discard(request.request_id)
        ctx.client_aborted.update(record.aborted)
        if record.stopped:  # a stop reaches a request only through a step that ran it (forks are born in one)
            ran = {s.request_id for s in record.output.scheduled}
            ctx.stopped.update(rid for rid in map(request_of, record.stopped) if rid in ran)
        if ctx.piece_encoded:
            note_session_inputs(ctx, record)
        found = [Violation(inv_id, record.step, message) for inv_id, message in self._steps.run(ctx, record)]
        if self._planned.checks:
            from spec.planned_view import planned_record

            planned, whole = planned_record(record), dataclasses.replace(ctx, previous=None)  # whole snapshots
            found += [Violation(inv_id, record.step, f"(as planned) {message}")
                      for inv_id, message in self._planned.run(whole, planned, whole=True)]
        note_finish_lengths(ctx, record)
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
        found = []
        for inv in self._failure_checks:
            if inv.triggered(self.context, failure):
                self._ended[inv.id] = self._ended.get(inv.id, 0) + 1
            found += [Violation(inv.id, failure.step, m) for m in inv.failure(self.context, failure)]  # type: ignore[misc]
        return found

    def check_end(self, drained: bool, ended_at_max_steps: bool) -> list[Violation]:
        self.context.drained = drained
        self.context.ended_at_max_steps = ended_at_max_steps
        found = []
        for inv in self._end_checks:
            if inv.triggered(self.context, self.context):
                self._ended[inv.id] = self._ended.get(inv.id, 0) + 1
            found += [Violation(inv.id, None, m) for m in inv.end(self.context)]  # type: ignore[misc]
        return found


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
