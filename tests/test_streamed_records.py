"""A streamed run (`run_checked`'s ``stream``) checks exactly what a kept run checks.

Streaming hands each record on once it is checked and keeps only the last one. It lets go of
older snapshots by cutting their ``base`` link `spec.observation.MAX_CHAIN` steps back
(`conformance.runner.driver._Streamed`). These tests hold it to a run that keeps every record:
the same violations and the same exercised counts, on the references and on mutants that fail
early and late. They also hold it to its purpose: no snapshot chain longer than the window
survives the run.
"""

from __future__ import annotations

import pytest

from conformance.flows import get_flow
from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces, traces
from conformance.runner.adapter import SchedulerAdapter
from conformance.runner.driver import run_checked
from conformance.selftest.mutants import MUTANTS
from reference_impl import Scheduler
from spec.config import SchedulerConfig
from spec.observation import MAX_CHAIN
from spec.trace import Arrival, Trace
from spec.types import Request

SAFETY = get_profile("safety").invariants()


def _both(factory, trace, invariants=SAFETY):  # type: ignore[no-untyped-def]
    kept = run_checked(SchedulerAdapter("kept", factory), trace, invariants, timeout=None, stop_at_first=False)
    handed = []
    streamed = run_checked(SchedulerAdapter("streamed", factory), trace, invariants, timeout=None,
                           stop_at_first=False, stream=handed.append)
    return kept, streamed, handed


def _same(kept, streamed, handed) -> None:  # type: ignore[no-untyped-def]
    assert [(v.invariant_id, v.step, v.message) for v in streamed.violations] == \
        [(v.invariant_id, v.step, v.message) for v in kept.violations]
    assert streamed.exercised == kept.exercised
    assert (streamed.fault is None) == (kept.fault is None)
    assert [r.step for r in handed] == [r.step for r in kept.records]
    assert [r.output for r in handed] == [r.output for r in kept.records]
    assert streamed.records == handed[-1:]


def _chain(snap) -> int:  # type: ignore[no-untyped-def]
    hops = 0
    while snap is not None and snap.base is not None:
        snap, hops = snap.base, hops + 1
    return hops


def test_reference_streamed_equals_kept():
    for trace in sample_traces(traces(max_requests=10), 40, 3):
        kept, streamed, handed = _both(Scheduler, trace)
        assert not kept.violations
        _same(kept, streamed, handed)


@pytest.mark.parametrize("flow", ["v1", "async"])
def test_token_budget_reference_streamed_equals_kept(flow):
    spec = get_flow(flow)
    for trace in sample_traces(spec.trace_strategy(), 20, 4):
        _same(*_both(spec.make_reference(), trace))


@pytest.mark.parametrize("name", sorted(MUTANTS)[::7])
def test_mutant_streamed_equals_kept(name):
    """Every seventh mutant (the whole list is held to the whole evaluation by
    tests/test_incremental_check.py; this is about the driver's records, not the checks)."""
    mutant = MUTANTS[name]
    strategy = mutant.trace_strategy() if mutant.trace_strategy else traces(max_requests=8)
    invariants = get_profile(mutant.profile).invariants() if mutant.profile else SAFETY
    for trace in sample_traces(strategy, 6, 9):
        try:
            kept, streamed, handed = _both(mutant.factory, trace, invariants)
        except Exception:  # noqa: BLE001 - a mutant may be unable to take a trace at all
            continue
        _same(kept, streamed, handed)


def test_streamed_run_lets_old_snapshots_go():
    config = SchedulerConfig(block_size=4, num_gpu_blocks=64, num_cpu_blocks=0, max_num_seqs=4, max_model_len=64,
                             preemption_mode="recompute")
    trace = Trace(config, tuple(Arrival(0, Request(f"r{i}", 8, 20)) for i in range(8)), max_steps=200)
    handed = []
    result = run_checked(SchedulerAdapter("streamed", Scheduler), trace, SAFETY, timeout=None,
                         stop_at_first=False, stream=handed.append)
    assert len(handed) > 2 * MAX_CHAIN
    assert _chain(result.records[-1].after) <= 3 * (MAX_CHAIN + 1)
    assert all(r.before.base is None and r.after.base is None for r in handed[: -MAX_CHAIN - 1])
