"""The ``in_flight`` snapshot part (PIP-003) on the wire and in the runner, and PIP-005 naming a
failed ``update`` (docs/PROTOCOL.md, docs/ASYNC.md)."""

from __future__ import annotations

import pytest

from conformance.runner.normalize import check_snapshot
from conformance.wire.codec import WireError, snapshot_from_json, snapshot_to_json
from spec.catalogue import Checker, get
from spec.config import SchedulerConfig
from spec.observation import Capability, InFlightView, Snapshot, StepFailure
from spec.types import Preempted, ScheduledSeq, SchedulerOutput

WIRE = {"in_flight": {"version": 1, "seqs": {"A#0": {"placeholders": -1, "in_flight_tokens": 2, "stale": 0}}}}


def test_in_flight_round_trips_negative_counts_included():
    snap = snapshot_from_json(WIRE)
    assert snap.in_flight == {"A#0": InFlightView(-1, 2, 0)}
    assert snapshot_to_json(snap) == WIRE
    check_snapshot(snap, frozenset({Capability.OUTPUT, Capability.IN_FLIGHT}), None)  # well formed


def test_old_hosts_send_none():
    assert snapshot_from_json({"gpu_free": 3}).in_flight is None
    assert "in_flight" not in snapshot_to_json(Snapshot(gpu_free=3))


@pytest.mark.parametrize(("bad", "field"), [
    ({"version": 2, "seqs": {}}, "in_flight.version"),
    ({"seqs": {}}, "in_flight.version"),
    ({"version": 1, "seqs": []}, "in_flight.seqs"),
    ({"version": 1, "seqs": {"A#0": {"placeholders": 1}}}, "in_flight.seqs.A#0"),
    ({"version": 1, "seqs": {"A#0": {"placeholders": 1.5, "in_flight_tokens": 1, "stale": 0}}}, "placeholders"),
])
def test_malformed_in_flight_names_the_field(bad, field):
    with pytest.raises(WireError, match=field.replace(".", r"\.")):
        snapshot_from_json({"in_flight": bad})


def test_a_claimed_in_flight_part_must_be_there():
    from conformance.runner.guard import AdapterFault

    with pytest.raises(AdapterFault, match="in_flight"):
        check_snapshot(Snapshot(), frozenset({Capability.OUTPUT, Capability.IN_FLIGHT}), None)


def _output(step, scheduled=(), preempted=()):
    return SchedulerOutput(step=step, scheduled=tuple(ScheduledSeq(f"{r}#0", r, 1, False) for r in scheduled),
                           preempted=tuple(Preempted(r, "recompute") for r in preempted))


def test_pip005_names_a_failed_update_on_a_preempted_request_in_flight():
    config = SchedulerConfig(pipeline_depth=1)
    checker = Checker(config, frozenset({Capability.OUTPUT}), [get("PIP-005")])

    checker.context.scheduled_in["A"] = [4]  # the driver keeps this from the steps run
    found = checker.check_failure(StepFailure(5, "update", "AssertionError", (), _output(5, (), ("A",))))
    assert [v.invariant_id for v in found] == ["PIP-005"] and "A (scheduled at step 4, preempted at step 5)" in found[0].message
    # the same failure with nothing stale in flight is only a fault
    assert Checker(config, frozenset({Capability.OUTPUT}), [get("PIP-005")]).check_failure(
        StepFailure(5, "update", "AssertionError", (), _output(5, ("A",)))) == []
    # and a synchronous engine has nothing in flight
    sync = Checker(SchedulerConfig(), frozenset({Capability.OUTPUT}), [get("PIP-005")])
    sync.context.scheduled_in["A"] = [4]
    assert sync.check_failure(StepFailure(5, "update", "AssertionError", (), _output(5, (), ("A",)))) == []


def test_the_runner_reports_the_engine_dying_on_a_stale_outcome_as_pip005():
    """Through the driver (an adapter, a guarded call): the fault stays, and PIP-005 names it."""
    from hypothesis import HealthCheck, Phase, find, settings

    from conformance.flows import get_flow
    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from conformance.selftest.mutants import violated
    from conformance.selftest.mutants_async import ForgetsInFlightOnPreempt

    flow = get_flow("async")
    trace = find(flow.trace_strategy(), lambda t: "PIP-005" in violated(ForgetsInFlightOnPreempt, t),
                 settings=settings(max_examples=2000, database=None, derandomize=True, phases=[Phase.generate],
                                   suppress_health_check=list(HealthCheck), deadline=None))
    adapter = SchedulerAdapter("forgets", ForgetsInFlightOnPreempt, capabilities=ForgetsInFlightOnPreempt.capabilities)
    checked = [i for i in get_profile("async").invariants() if i.id != "PIP-003"]  # PIP-003 sees it sooner
    result = run_checked(adapter, trace, checked)
    assert {"FAULT-raised", "PIP-005"} <= result.problem_ids


def test_gpu_fenced_round_trips():
    snap = snapshot_from_json({"gpu_fenced": [3, 3, 5]})
    assert snap.gpu_fenced == (3, 3, 5) and snapshot_to_json(snap) == {"gpu_fenced": [3, 3, 5]}


def test_pip004_is_moot_for_an_engine_with_ordered_steps():
    from reference_impl.async_scheduler import AsyncV1Scheduler, DeferredFreeAsyncV1Scheduler

    pip004, config = get("PIP-004"), SchedulerConfig(pipeline_depth=1)
    assert not pip004.applicable(frozenset(AsyncV1Scheduler.capabilities), config)
    assert pip004.applicable(frozenset(DeferredFreeAsyncV1Scheduler.capabilities), config)


@pytest.mark.parametrize("depth", [1, 2])
def test_the_deferred_free_reference_fences_and_passes_safety(depth):
    """Held-back blocks are counted (BLK-003), never free or another's before their step returns
    (PIP-004), and an engine waiting for them is not idle (LIV-003)."""
    import dataclasses

    from conformance.flows import get_flow
    from conformance.flows.profiles import get_profile
    from conformance.generation.v0 import sample_traces
    from conformance.selftest.mutants import violated
    from reference_impl.async_scheduler import DeferredFreeAsyncV1Scheduler

    checked = get_profile("async").invariants()
    assert get("PIP-004") in checked
    fenced_steps = 0
    for trace in sample_traces(get_flow("async").trace_strategy(), 40, 16):
        trace = dataclasses.replace(trace, config=dataclasses.replace(trace.config, pipeline_depth=depth))
        assert violated(DeferredFreeAsyncV1Scheduler, trace, invariants=checked) == set()
        from reference_impl.engine import iter_steps

        fenced_steps += sum(bool(r.after.gpu_fenced or (r.mid and r.mid.gpu_fenced))
                            for r in iter_steps(trace, DeferredFreeAsyncV1Scheduler(trace.config)))
    assert fenced_steps > 0, "no trace held a block back: the test shows nothing"
