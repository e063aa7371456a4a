"""Carry an abort out only once the request's prefill is done (tokasaurus: other sequences may
share the prompt blocks still being computed). On the V1 flow, whose chunked prefill spans steps.

1. abort_request on a running request that has sampled no token since its admission marks it
   and returns None: the request stays in running, keeps its blocks and is scheduled.
2. The update() of the step that ends its prefill drops it (blocks freed, out of running) and
   reports Finished(FINISHED_ABORTED); an abort of any other request is carried out at once.

Correct: a request the scheduler still runs is live, and it is finished (in no queue, holding
nothing by the end of the next step) once the scheduler lets go of it (docs/ADAPTERS.md).
"""

from __future__ import annotations

from typing import Any

from reference_impl.v1_scheduler import CAPABILITIES, V1Scheduler
from spec.config import SchedulerConfig
from spec.status import Status
from spec.types import Finished, StepOutcome
from zoo._adapter import zoo_adapter


class AbortAfterPrefill(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._pending: list[str] = []  # aborted requests whose prefill is still under way

    def _prefilling(self, request_id: str) -> bool:
        tracked = self.requests.get(request_id)
        return tracked is not None and tracked.status is Status.RUNNING and tracked.in_prefill

    def abort_request(self, request_id: str) -> Finished | None:
        if request_id in self._pending:
            return None
        if self._prefilling(request_id):
            self._pending.append(request_id)
            return None
        return super().abort_request(request_id)

    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished = super().update(outcome)
        for rid in list(self._pending):
            if self.requests[rid].status.is_finished:
                self._pending.remove(rid)  # it finished before the abort was carried out
            elif not self._prefilling(rid):
                self._pending.remove(rid)
                finished.extend(f for f in [self._carry_out(rid)] if f is not None)
        return finished

    def _carry_out(self, request_id: str) -> Finished | None:
        return super().abort_request(request_id)


class AnswersAtOnce(AbortAfterPrefill):
    """Bug: reports the deferred abort at once (what the tokasaurus host did before the audit)
    while the request keeps running: reported finished, yet live."""

    def abort_request(self, request_id: str) -> Finished | None:
        deferred = self._prefilling(request_id) and request_id not in self._pending
        result = super().abort_request(request_id)
        return Finished(request_id, Status.FINISHED_ABORTED) if deferred else result

    def _carry_out(self, request_id: str) -> Finished | None:
        super()._carry_out(request_id)
        return None  # already reported


def traces() -> Any:
    from conformance.generation.v1 import token_traces

    return token_traces("v1")


def make():
    adapter = zoo_adapter("zoo-deferred-abort", AbortAfterPrefill, capabilities=CAPABILITIES)
    adapter.trace_strategy = traces  # type: ignore[attr-defined]
    return adapter


def make_broken():
    adapter = zoo_adapter("zoo-deferred-abort-broken", AnswersAtOnce, capabilities=CAPABILITIES)
    adapter.trace_strategy = traces  # type: ignore[attr-defined]
    return adapter
