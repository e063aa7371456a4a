"""Hypothesis stateful test: add, abort, step and finish requests under drawn configs, and check
every catalogue invariant after every rule.

One machine per flow of the registry (conformance/flows/): V0's reference against the whole
catalogue, as before; every other flow's reference on its own configs, against its profile's
invariants (the V0 policy is not theirs), with prompt ids and one sequence per request.

Every rule is one engine step (its arrivals and aborts first, then schedule() and the outcome),
so each rule produces exactly one `StepRecord` and the whole catalogue is checked on it. The
``drain`` rule stops arrivals and runs to completion, then the end-of-run invariants
(LIV-002) are checked too. Failures shrink to short rule sequences.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from conformance.flows import FLOWS, Flow
from conformance.flows.profiles import get_profile
from spec.catalogue import Checker, completion_bound_for
from spec.observation import StepRecord
from spec.status import Status
from spec.types import Request, StepOutcome


class SchedulerMachine(RuleBasedStateMachine):
    flow: Flow = FLOWS["v0"]

    def __init__(self) -> None:
        super().__init__()
        self.ids = itertools.count()
        self.violations: list = []

    @initialize(data=st.data())
    def start(self, data):
        config = data.draw(self.flow.config_strategy())
        reference = self.flow.make_reference()
        self.config = config
        self.scheduler = reference(config)
        invariants = None if self.flow.id == "v0" else get_profile(self.flow.profile).invariants()
        self.checker = Checker(config, reference.capabilities, invariants,
                               reservation=getattr(self.scheduler, "reservation", None))
        self.step_index = 0
        self.known: list[str] = []

    def _step(self, added: list[Request], aborted: list[str], data) -> StepRecord:
        finished = []
        for request in added:
            self.scheduler.add_request(request)
            self.known.append(request.request_id)
        for rid in aborted:
            result = self.scheduler.abort_request(rid)
            if result is not None:
                finished.append(result)
        before = self.scheduler.snapshot()
        output = self.scheduler.schedule()
        mid = self.scheduler.snapshot()
        scheduled = sorted({s.seq_id for s in output.scheduled})
        stopped = frozenset(data.draw(st.sets(st.sampled_from(scheduled))) if scheduled else ())
        finished.extend(self.scheduler.update(StepOutcome(stopped)))
        after = self.scheduler.snapshot()
        record = StepRecord(self.step_index, tuple(added), tuple(aborted), before, output, mid, stopped,
                            tuple(finished), after)
        self.step_index += 1
        self.violations.extend(self.checker.check_step(record))
        return record

    @rule(
        requests=st.lists(
            st.tuples(st.integers(1, 40), st.integers(1, 10), st.integers(1, 3), st.integers(0, 2)), max_size=3
        ),
        data=st.data(),
    )
    def add_and_step(self, requests, data):
        if self.flow.id == "v0":
            added = [Request(f"r{next(self.ids)}", p, m, n, pr) for p, m, n, pr in requests]
        else:  # the token flows: prompt ids (a small vocabulary, so prefixes are shared), n = 1
            added = [Request(f"r{next(self.ids)}", p, m, 1, pr, prompt_tokens=tuple(i % 3 for i in range(p)))
                     for p, m, _n, pr in requests]
        self._step(added, [], data)

    @precondition(lambda self: bool(self.known))
    @rule(data=st.data())
    def abort_and_step(self, data):
        rid = data.draw(st.sampled_from(self.known))
        self._step([], [rid], data)

    @rule(data=st.data())
    def step(self, data):
        self._step([], [], data)

    @rule(data=st.data())
    def drain(self, data):
        """No more arrivals: run until every request has finished (or the liveness bound)."""
        self.checker.context.last_arrival_step = self.step_index
        bound = completion_bound_for(self.checker.context)
        for _ in range(bound):
            if all(s.is_finished for s in self.scheduler.snapshot().statuses.values()):
                break
            self._step([], [], data)
        drained = all(s.is_finished for s in self.scheduler.snapshot().statuses.values())
        self.violations.extend(self.checker.check_end(drained, not drained))

    @invariant()
    def catalogue_holds(self):
        assert not self.violations, "\n".join(map(str, self.violations[:5]))

    @invariant()
    def metrics_agree_with_queues(self):
        if not hasattr(self, "scheduler"):
            return
        m = self.scheduler.metrics()
        statuses = self.scheduler.snapshot().statuses
        assert m["num_waiting"] == sum(1 for s in statuses.values() if s is Status.WAITING)
        assert m["num_running"] == sum(1 for s in statuses.values() if s is Status.RUNNING)
        assert m.get("num_swapped", 0) == sum(1 for s in statuses.values() if s is Status.SWAPPED)


TestScheduler = SchedulerMachine.TestCase  # the V0 flow, under its old name


def _machine(flow: Flow) -> type:
    return type(f"SchedulerMachine_{flow.id}", (SchedulerMachine,), {"flow": flow})


for _flow in FLOWS.values():
    if _flow.id != "v0":
        globals()[f"TestScheduler_{_flow.id}"] = _machine(_flow).TestCase
