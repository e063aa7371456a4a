"""An engine that ends a request it can never serve with an error, not an ignore: a prompt past
its limit or a request needing more blocks than its cache has is finished FINISHED_ABORTED with
the reason ``engine_error`` (issue 34 item 2: an error with a reason is an allowed end).

Correct: REQ-007 asks an engine-initiated abort to say why, LIV-004 only that a request that
fits is never ended so. The broken twin errors on a preemption victim (which fits): its reason
is stated, so REQ-007 passes; LIV-004 (liveness) catches it.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler, _StepBuilder
from reference_impl.sequence import SequenceGroup
from spec.reasons import Reason
from spec.status import Status
from spec.types import Finished
from zoo._adapter import zoo_adapter


class ErrorsOnUnservable(Scheduler):
    def _ignore(self, queue: list[SequenceGroup], group: SequenceGroup, step: _StepBuilder) -> None:
        if any(p.request_id == group.request_id for p in step.preempted):
            return super()._ignore(queue, group, step)  # preempted in this step: OUT-002 wants it ignored
        queue.remove(group)
        self._finish(group, Status.FINISHED_ABORTED)
        why = step.reasons[-1].text() if step.reasons else "cannot be served"
        self._ignored.append(Finished(group.request_id, Status.FINISHED_ABORTED,
                                      Reason.of("engine_error", group.request_id, error=why)))


class ErrorsOnVictims(ErrorsOnUnservable):
    def _preempt(self, victim: SequenceGroup, step: _StepBuilder, *, needed_by: str, need: int, free: int) -> None:
        self.running.remove(victim)  # bug: ends a victim that fits instead of preempting it
        self._finish(victim, Status.FINISHED_ABORTED)
        self._ignored.append(Finished(victim.request_id, Status.FINISHED_ABORTED,
                                      Reason.of("engine_error", victim.request_id, error="out of KV blocks")))


def make():
    return zoo_adapter("zoo-errors-correctly", ErrorsOnUnservable)


def make_broken():
    return zoo_adapter("zoo-errors-correctly-broken", ErrorsOnVictims)
