"""Mutants of gpu_impl are caught by the lockstep harness (the harness can fail)."""

from __future__ import annotations

import random

import pytest

import gpu_impl.batched as batched
from gpu_impl.kv import KVPlane
from gpu_impl.lockstep import run_lockstep
from gpu_impl.workload import random_trace
from reference_impl.scheduler import Scheduler
from reference_impl.workloads import BUILTIN


def _batch():
    rng = random.Random(11)
    return [BUILTIN["tour"]()] + [random_trace(rng, 8, small=True) for _ in range(15)]


def test_unmutated_passes():
    assert run_lockstep(_batch(), Scheduler, kv=True).ok


def test_off_by_one_in_admission_prefix_sum_is_caught(monkeypatch):
    monkeypatch.setattr(batched, "admission_cumsum", lambda x: x.cumsum(-1, dtype=batched.I32) - x)
    result = run_lockstep(_batch(), Scheduler)
    assert not result.ok
    assert result.divergence.what in ("output", "snapshot.running", "snapshot.waiting", "finished")


def test_wrong_victim_is_caught(monkeypatch):
    """Victims taken from the head of the running queue instead of its tail."""

    def head_first(m, width):
        import torch

        return torch.arange(width, device=m.device).expand(m.shape[0], width).minimum((m[:, None] - 1).clamp(min=0)).long()

    monkeypatch.setattr(batched, "tail_positions", head_first)
    result = run_lockstep(_batch(), Scheduler)
    assert not result.ok
    assert result.divergence.what == "output"


@pytest.mark.parametrize("method", ["_swap_out", "_swap_in", "_copy"])
def test_map_not_applied_to_kv_tensor_is_caught(monkeypatch, method):
    monkeypatch.setattr(KVPlane, method, lambda self, out: None)
    result = run_lockstep(_batch(), Scheduler, kv=True)
    assert not result.ok
    assert result.divergence.what == "kv"
