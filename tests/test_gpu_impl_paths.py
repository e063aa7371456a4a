"""The twin's size-dependent code paths agree with the reference whichever one runs.

`gpu_impl.batched` picks some primitives by tensor size (int32-output comparisons and packed
flag ops from `_WIDE_OP` elements up, scatter-built free-id lists from `FreeIds.LISTS` rows
up); the other tests run at small E, where mostly the small-size paths run. Here each choice
is forced both ways on the same seeded high-pressure batch, in lockstep with the KV plane on."""

from __future__ import annotations

import random

import pytest

import gpu_impl.batched as batched
from gpu_impl.lockstep import run_lockstep
from gpu_impl.workload import random_trace
from reference_impl.scheduler import Scheduler


@pytest.mark.parametrize("wide", [0, 1 << 62], ids=["wide-ops", "plain-ops"])
@pytest.mark.parametrize("lists", [0, 1 << 62], ids=["free-lists", "searchsorted"])
def test_forced_paths(monkeypatch, wide, lists):
    monkeypatch.setattr(batched, "_WIDE_OP", wide)
    monkeypatch.setattr(batched.FreeIds, "LISTS", lists)
    rng = random.Random(11)
    batch = [random_trace(rng, 8, small=True) for _ in range(6)] + [random_trace(rng, 16) for _ in range(6)]
    result = run_lockstep(batch, Scheduler, kv=True)
    assert result.ok, result.divergence.describe()
    assert result.engine_steps > 0
