"""How an invariant is declared: what it is about, when it has something to check, what it says.

Each invariant is one `Invariant` record, built by the `@invariant` decorator on its predicate.
Besides its ID, category, statement and rationale it declares

* ``about``: its subject, the one thing the predicate states a property of (`SUBJECTS`): one
  sequence or one request in one snapshot, one block pool in one snapshot, one step's schedule,
  one step's outcome, the whole step, the whole run (``at_end``), or one failed call
  (``at_failure``);
* ``when``: its trigger, a statement about that subject (and the run's context: the config)
  saying that the property has something to check there (a running sequence, a swap, a draft, a
  finished request, ...). None: always.

The evaluation layer (`spec.invariants._evaluation`) decides which subjects a step changed, hands
each to every rule about it, and counts for each rule the subjects it checked with its trigger
holding: that count is what a run *exercised*, and a rule whose count stays zero in a run is
*vacuous* there, never a pass.

This module holds only declarations (the registry the families fill); `spec.catalogue` loads the
families and runs them. The families import from here, so nothing here imports them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from spec.config import SchedulerConfig
from spec.encoder import EncoderInput
from spec.observation import Capability, SeqView, StepFailure, StepRecord
from spec.reservation import NONE, Reservation
from spec.status import Status
from spec.types import Request

CATEGORIES = ("safety", "policy", "liveness")

# What an invariant may be about. The first three are handed one at a time by the evaluation
# layer, only where the step may have changed them; the step kinds see the step's record (a
# schedule is what schedule() returned, an outcome what the step's update did with it); ``run``
# is checked once at the end, ``failure`` when a scheduler call fails mid-step.
SEQUENCE, REQUEST, POOL = "sequence", "request", "pool"
SCHEDULE, OUTCOME, STEP = "schedule", "outcome", "step"
RUN, FAILURE = "run", "failure"
SUBJECTS = (SEQUENCE, REQUEST, POOL, SCHEDULE, OUTCOME, STEP, RUN, FAILURE)
ONE_AT_A_TIME = frozenset({SEQUENCE, REQUEST, POOL})
STEP_KINDS = frozenset({SCHEDULE, OUTCOME, STEP})

# The snapshots a sequence, request or pool is read in (`Invariant.at`).
AFTER_SCHEDULE, AFTER_STEP = "after schedule", "after the step"
SNAPSHOTS = (AFTER_SCHEDULE, AFTER_STEP)


@dataclass
class CheckContext:
    """What a predicate may know besides its subject: the config and the run so far."""

    config: SchedulerConfig
    requests: dict[str, Request] = field(default_factory=dict)
    arrival: dict[str, int] = field(default_factory=dict)  # add order
    finished: dict[str, Status] = field(default_factory=dict)  # reported before this step
    steps: int = 0
    last_arrival_step: int = 0
    drained: bool = False
    ended_at_max_steps: bool = False
    # The previous step's record when every check passed on it. Read by the evaluation layer
    # alone (spec.invariants._evaluation), which hands a rule only the subjects changed since;
    # no predicate reads it. None: every subject.
    previous: StepRecord | None = None
    # What the scheduler declares it reserves beyond its computed tokens (CAP-006).
    reservation: Reservation = NONE
    # Requests one of whose sequences an outcome stopped while it was scheduled, this step
    # included: only those may finish as FINISHED_STOPPED (REQ-005).
    stopped: set[str] = field(default_factory=set)
    # Requests the client asked to abort, this step included: a FINISHED_ABORTED of any other
    # request is the engine's own decision (REQ-007, LIV-004).
    client_aborted: set[str] = field(default_factory=set)
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
    # Each sequence's token count in the step its request was reported finished (PIP-002): kept
    # by the evaluation layer after each step's checks.
    finish_lengths: dict[str, int] = field(default_factory=dict)
    # The streaming-input sessions added so far (requests with a ``session``; SES-*).
    sessions: set[str] = field(default_factory=set)
    # The requests added so far with a grammar (``grammar_ready_step``; GRM-*) and with encoder
    # inputs (ENC-*): the rules' triggers read these, not every request or the whole waiting queue.
    grammars: set[str] = field(default_factory=set)
    encoded: set[str] = field(default_factory=set)
    # The requests added so far with a LoRA adapter (``lora_id``; LORA-001's trigger).
    loras: set[str] = field(default_factory=set)
    # The sessions one of whose later inputs carries encoder inputs, and, once such a session took up
    # inputs, how many and its encoder inputs then, the taken-up ones where their tokens landed
    # (spec/session.py): kept by the evaluation layer before each step's checks (ENC-*).
    piece_encoded: set[str] = field(default_factory=set)
    inputs_taken: dict[str, int] = field(default_factory=dict)
    session_encoder_inputs: dict[str, tuple[EncoderInput, ...]] = field(default_factory=dict)

    def encoder_inputs(self, request_id: str) -> tuple[EncoderInput, ...]:
        """The request's encoder inputs as of this step: its own, and a session's taken-up ones."""
        found = self.session_encoder_inputs.get(request_id)
        return found if found is not None else self.requests[request_id].encoder_inputs

    def key(self, request_id: str) -> tuple[int, ...]:
        """Policy order (smaller = more urgent): FCFS by arrival, priority by (priority, arrival)."""
        if self.config.policy == "priority":
            return (self.requests[request_id].priority, self.arrival[request_id])
        return (self.arrival[request_id],)


StepPredicate = Callable[..., Iterable[str]]
EndPredicate = Callable[[CheckContext], Iterable[str]]
# Called when a scheduler call fails mid-step (`StepFailure`): which failures the invariant forbids.
FailurePredicate = Callable[[CheckContext, StepFailure], Iterable[str]]
Trigger = Callable[[CheckContext, Any], bool]  # (context, subject) -> whether it has something to check


@dataclass(frozen=True)
class Invariant:
    id: str
    category: str
    statement: str
    rationale: str
    needs: frozenset[Capability]
    # The predicate: ``step(ctx, record)`` for the step kinds, ``step(ctx, record, subject)`` for
    # a sequence, request or pool (`spec.invariants._evaluation`: SeqAt, RequestAt, PoolAt).
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
    # For a rule about sequences: the `SeqView` fields the predicate reads (None: any). A
    # declaration, not a hint: the evaluation layer hands it only the views where one of these
    # changed since it last passed (a decode changes every running view's token counts each step
    # but its block table once per block_size tokens, so a check of tables and statuses skips
    # it), which is sound only if its verdict on a view depends on no other field.
    # tests/test_reads_declared.py holds each declaration against the predicate's source.
    reads: frozenset[str] | None = None
    # What the invariant is about (`SUBJECTS`) and when it has something to check (its trigger,
    # a statement about one subject; None: always).
    about: str = STEP
    when: Trigger | None = None
    # The snapshots a sequence, request or pool rule reads its subjects in (`SNAPSHOTS`).
    at: tuple[str, ...] = SNAPSHOTS

    def applicable(self, capabilities: frozenset[Capability], config: SchedulerConfig | None = None) -> bool:
        if self.synchronous and config is not None and config.pipeline_depth > 0 \
                and (not self.planned or Capability.IN_FLIGHT not in capabilities):
            return False
        if self.unless & capabilities:
            return False
        return self.needs <= capabilities

    def triggered(self, ctx: CheckContext, subject: Any) -> bool:
        """Whether the trigger holds for ``subject`` (a record, a view, a pool...)."""
        return self.when is None or bool(self.when(ctx, subject))

    @property
    def predicate_location(self) -> str:
        fn = self.step or self.end or self.failure
        assert fn is not None
        return f"{fn.__module__}.{fn.__qualname__}"

    @property
    def trigger_text(self) -> str:
        """The trigger as its docstring or source names it, for the docs ("always" without one)."""
        if self.when is None:
            return "always"
        return (self.when.__doc__ or self.when.__name__).strip()

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "category": self.category,
            "statement": self.statement,
            "rationale": self.rationale,
            "needs": sorted(c.value for c in self.needs),
            "about": self.about,
            "when": self.trigger_text,
            "checked": "per step" if self.step else "at the end of a run" if self.end else "when a call fails",
            "synchronous_steps_only": self.synchronous and not self.planned,
            "pipelined_as_planned": self.synchronous and self.planned,
            **({"moot_under": sorted(c.value for c in self.unless)} if self.unless else {}),
            "predicate": self.predicate_location,
        }


REGISTRY: dict[str, Invariant] = {}


def invariant(
    id: str, category: str, statement: str, rationale: str, needs: Iterable[Capability] = (), *, at_end: bool = False,
    synchronous: bool = False, at_failure: bool = False, unless: Iterable[Capability] = (), planned: bool = True,
    reads: Iterable[str] | None = None, about: str | None = None, when: Trigger | None = None,
    at: Iterable[str] = SNAPSHOTS,
) -> Callable[[Callable], Callable]:
    """Register the decorated predicate as invariant ``id`` (``synchronous``, ``reads``, ``about``,
    ``when``, ``at``: see `Invariant`; ``at_end``: about the run; ``at_failure``: about a failed
    call, a `FailurePredicate` run only when a scheduler call fails mid-step)."""
    assert category in CATEGORIES, category
    subject = RUN if at_end else FAILURE if at_failure else about
    assert subject in SUBJECTS, f"{id}: say what it is about ({', '.join(SUBJECTS)}), got {subject!r}"
    read_set = None if reads is None else frozenset(reads)
    assert read_set is None or (read_set and read_set <= frozenset(SeqView._fields)), f"{id}: reads {read_set}"
    assert read_set is None or subject == SEQUENCE, f"{id}: only a rule about sequences declares the view fields it reads"
    snapshots = tuple(at)
    assert snapshots and set(snapshots) <= set(SNAPSHOTS), f"{id}: at {snapshots}"

    def register(fn: Callable) -> Callable:
        assert id not in REGISTRY, f"duplicate invariant id {id}"
        needs_set = frozenset(needs) | {Capability.OUTPUT}
        REGISTRY[id] = Invariant(
            id, category, " ".join(statement.split()), " ".join(rationale.split()), needs_set,
            step=None if at_end or at_failure else fn, end=fn if at_end else None,
            failure=fn if at_failure else None, synchronous=synchronous, unless=frozenset(unless), planned=planned,
            reads=read_set, about=subject, when=when, at=snapshots,
        )
        return fn

    return register
