"""A fused step: the engine schedules and samples in one call (one ``step()`` that returns the
batch it ran and the requests it finished), so there is no instant between the two.

1. schedule(outcome) runs the whole step: it schedules, then applies the step's outcome (which
   sequences sampled a stop token, the model's word) and keeps the finished requests.
2. update(outcome) only returns what the step finished.
Its domain says ``fused_step=True``: the runner hands schedule() the outcome and takes no snapshot
between the two calls (no ``mid_step``; the invariants that read it are not applicable).
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from spec.observation import ALL_CAPABILITIES, Capability
from spec.types import Finished, SchedulerOutput, StepOutcome
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(fused_step=True)


class FusedStep:
    """The reference behind a one-call step."""

    shift_stops = False

    def __init__(self, config: SchedulerConfig) -> None:
        self.engine = Scheduler(config)
        self.done: list[Finished] = []

    def add_request(self, request):
        return self.engine.add_request(request)

    def abort_request(self, request_id):
        return self.engine.abort_request(request_id)

    def schedule(self, outcome: StepOutcome) -> SchedulerOutput:
        output = self.engine.schedule()
        stopped = outcome.stopped
        if self.shift_stops and stopped:  # bug: each stop lands on the next sequence in the batch
            order = [s.seq_id for s in output.scheduled]
            stopped = frozenset(order[(order.index(s) + 1) % len(order)] if s in order else s for s in stopped)
        self.done = self.engine.update(StepOutcome(stopped, outcome.drafts))
        return output

    def update(self, outcome: StepOutcome) -> list[Finished]:
        done, self.done = self.done, []
        return done

    def snapshot(self):
        return self.engine.snapshot()


class MisdeliversStops(FusedStep):
    shift_stops = True


CLAIMS = ALL_CAPABILITIES - {Capability.MID_STEP}


def traces_of():
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-fused-step", FusedStep, capabilities=CLAIMS, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-fused-step-broken", MisdeliversStops, capabilities=CLAIMS, domain=DOMAIN)
