"""`BatchedRun` drops engines that are done (steps a smaller scheduler): the result is the same
as stepping all engines, with or without writing the full state back every step."""

from __future__ import annotations

import random

import torch

from gpu_impl.encode import BatchedRun, TraceBatch
from gpu_impl.workload import random_trace

FIELDS = ("status", "tok", "comp", "tlen", "dblk", "alive", "exists", "sstat", "stok", "scomp", "tab", "gpu_ref", "cpu_ref")


def _final(traces, compact: float, sync: bool):
    run = BatchedRun(TraceBatch(traces, "cpu"), sync=sync)
    run.COMPACT = compact
    run.run()
    s = run.scheduler
    return run.engine_steps, run.step, {f: getattr(s, f).clone() for f in FIELDS}


def test_dropping_done_engines_changes_nothing():
    rng = random.Random(5)
    traces = [random_trace(rng, 8, small=True) for _ in range(12)]
    # reference: each engine alone (a single engine never drops out before the end)
    alone = [_final([t], 0.0, True) for t in traces]
    for compact, sync in ((0.75, False), (0.75, True), (1.0, False)):
        steps, _, state = _final(traces, compact, sync)
        assert steps == sum(a[0] for a in alone)
        for e, (_, _, one) in enumerate(alone):
            for f in FIELDS:  # the batch pads R, N, B, G, C to the largest engine
                a = one[f][0]
                got = state[f][e][tuple(slice(0, k) for k in a.shape)]
                assert torch.equal(got, a), (compact, sync, e, f)
