"""gpu_impl agrees with the reference step by step (outputs, finished requests, full snapshots),
and its KV data plane holds what the block tables promise."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.generation.v0 import traces
from gpu_impl.adapter import make
from gpu_impl.lockstep import run_lockstep
from gpu_impl.workload import random_trace
from reference_impl.engine import iter_steps
from reference_impl.scheduler import Scheduler
from reference_impl.workloads import BUILTIN
from spec.protocol import SchedulerLike
from tests.conftest import examples

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _check(result) -> None:
    assert result.ok, result.divergence.describe()


@settings(max_examples=examples(60))
@given(st.lists(traces(max_requests=6), min_size=1, max_size=3))
def test_lockstep_drawn_batches(batch):
    """Each example is a batch of 1-3 engines with their own drawn configs and traces
    (60 examples: 100+ drawn traces per CI run)."""
    _check(run_lockstep(batch, Scheduler))


@settings(max_examples=examples(10))
@given(st.lists(traces(max_requests=4), min_size=1, max_size=2))
def test_lockstep_drawn_with_kv_plane(batch):
    result = run_lockstep(batch, Scheduler, kv=True)
    _check(result)
    assert result.kv_checks == result.steps


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_workloads_with_kv(name, device):
    result = run_lockstep([BUILTIN[name]()], Scheduler, device=device, kv=True)
    _check(result)
    assert result.engine_steps > 0 and result.kv_checks > 0


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_pressure_batch(device):
    """16 engines of seeded high-pressure traces in one batch: preemption by swap and
    recompute, swap fallback, swap-in, copy-on-write, ignore, abort all occur."""
    rng = random.Random(7)
    batch = [random_trace(rng, 8, small=True) for _ in range(16)]
    _check(run_lockstep(batch, Scheduler, device=device, kv=True))


def test_adapter_matches_reference_engine_loop():
    """`gpu_impl.adapter.make` is a SchedulerLike whose records equal the reference's."""
    rng = random.Random(3)
    for trace in [BUILTIN["tour"]()] + [random_trace(rng, 8, small=True) for _ in range(4)]:
        twin = make(trace.config)
        assert isinstance(twin, SchedulerLike)
        ref_records = list(iter_steps(trace, Scheduler(trace.config)))
        twin_records = list(iter_steps(trace, make(trace.config)))
        assert len(ref_records) == len(twin_records)
        for a, b in zip(ref_records, twin_records, strict=True):
            assert a.output.scheduled == b.output.scheduled, a.step
            assert (a.output.preempted, a.output.swap_out, a.output.swap_in, a.output.copies, a.output.ignored) == (
                b.output.preempted, b.output.swap_out, b.output.swap_in, b.output.copies, b.output.ignored)
            assert [(f.request_id, f.status) for f in a.finished] == [(f.request_id, f.status) for f in b.finished]
            assert a.after == b.after, a.step
