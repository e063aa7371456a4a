"""A count-only engine (a simulator): it knows each request's token counts, never token ids,
and cannot be told that a sequence sampled a stop token, so every request it runs ends by its
length (or an abort, or an ignore).

Its domain says ``stops=False``: traces carry no stops. The engine asserts it is never given one.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from spec.domain import ConfigDomain
from spec.status import Status
from spec.types import Finished, StepOutcome
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(stops=False, max_n=1)


class CountOnly(Scheduler):
    def update(self, outcome: StepOutcome) -> list[Finished]:
        assert not outcome.stopped, "a count-only engine has no stop tokens"
        return super().update(outcome)


class StopsOnItsOwn(CountOnly):
    """Bug: ends a request as stopped when its output reaches half its max_tokens."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished = super().update(outcome)
        for group in list(self.running):
            seq = group.seqs[0]
            if group.request.max_tokens > 2 and seq.num_generated * 2 >= group.request.max_tokens:
                self.running.remove(group)
                self._finish(group, Status.FINISHED_STOPPED)
                finished.append(Finished(group.request_id, Status.FINISHED_STOPPED))
        return finished


def traces():
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-count-only", CountOnly, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-count-only-broken", StopsOnItsOwn, domain=DOMAIN)
