"""The engine loop: drive any `SchedulerLike` through a `Trace`, recording every step.

Per step: the trace's arrivals are added, its aborts (single, then batched) and admin calls
applied, a snapshot is taken, ``schedule()`` runs, a second snapshot is taken (when the scheduler offers one), the outcome
(the trace's stop decisions) is fed back, and a final snapshot closes the step. The loop ends
when every request has arrived and finished, or at ``trace.max_steps``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from spec.observation import Capability, Snapshot, StepFailure, StepRecord
from spec.protocol import SchedulerLike
from spec.trace import Trace
from spec.types import Finished, StepOutcome

_EMPTY = Snapshot()


@dataclass
class Run:
    trace: Trace
    records: list[StepRecord]
    drained: bool  # every request arrived and finished

    @property
    def finished(self) -> list[Finished]:
        return [f for r in self.records for f in r.finished]


class StepFailed(Exception):
    """A scheduler call failed mid-step; ``failure`` says which step and what it knew
    (`spec.catalogue.Checker.check_failure` reads it). Chained to the scheduler's own exception."""

    def __init__(self, failure: StepFailure) -> None:
        super().__init__(f"step {failure.step}: {failure.call} failed: {failure.message}")
        self.failure = failure


def iter_steps(trace: Trace, scheduler: SchedulerLike, observe: bool = True) -> Iterator[StepRecord]:
    """Yield one `StepRecord` per step; stops when drained or at ``max_steps``."""
    caps = scheduler.capabilities
    mid_step = observe and Capability.MID_STEP in caps
    unfinished: set[str] = set()
    if trace.connector:  # the KV connector's script (spec/connector.py), for a scheduler that has one
        attach = getattr(scheduler, "kv_connector_scripts", None)
        if attach is not None:
            attach(trace.connector)
    for step in range(trace.max_steps):
        added = tuple(trace.arrivals_at(step))
        for request in added:
            scheduler.add_request(request)
            unfinished.add(request.request_id)
        finished: list[Finished] = []
        aborted = tuple(trace.aborts_at(step))
        for rid in aborted:
            result = scheduler.abort_request(rid)
            if result is not None:
                finished.append(result)
        batches = tuple(trace.abort_batches_at(step))
        for ids in batches:  # spec/protocol.py: one call where the scheduler has it, else id by id
            if callable(getattr(scheduler, "abort_requests", None)):
                finished.extend(scheduler.abort_requests(list(ids)))
            else:
                finished.extend(f for f in map(scheduler.abort_request, ids) if f is not None)
        aborted += tuple(rid for ids in batches for rid in ids)
        admin = tuple((op, bool(getattr(scheduler, op)())) for op in trace.admin_at(step))
        before = scheduler.snapshot() if observe else _EMPTY
        output = scheduler.schedule()
        mid = scheduler.snapshot() if mid_step else None
        stopped = trace.stops_at(step)
        drafts = trace.drafts_at(step)
        try:
            finished.extend(scheduler.update(StepOutcome(stopped, drafts)))
        except Exception as err:  # noqa: BLE001 - said where it happened, for a failure predicate (PIP-005)
            raise StepFailed(StepFailure(step, "update", f"{type(err).__name__}: {err}", aborted, output)) from err
        after = scheduler.snapshot() if observe else _EMPTY
        for f in finished:
            unfinished.discard(f.request_id)
        yield StepRecord(step, added, aborted, before, output, mid, stopped, tuple(finished), after, drafts=drafts,
                         abort_batches=batches, admin=admin)
        if step >= trace.last_arrival_step and not unfinished and not transfers_in_flight(scheduler, after):
            return


def transfers_in_flight(scheduler: SchedulerLike, after: Snapshot) -> bool:
    """Whether a KV connector still holds blocks for a transfer (spec/connector.py): a run goes on
    until the connector has reported each one done, so that what it held is seen freed."""
    if after.kv_transfers is not None:
        return bool(after.kv_transfers)
    connector = getattr(scheduler, "connector", None)
    return bool(getattr(connector, "transfers", None))


def run_trace(
    trace: Trace, make_scheduler: Callable[..., SchedulerLike] | None = None, observe: bool = True
) -> Run:
    if make_scheduler is None:
        from reference_impl.scheduler import Scheduler

        make_scheduler = Scheduler
    scheduler = make_scheduler(trace.config)
    records = list(iter_steps(trace, scheduler, observe))
    arrived = {r.request_id for r in trace.requests}
    done = {f.request_id for r in records for f in r.finished}
    return Run(trace, records, drained=arrived <= done)
