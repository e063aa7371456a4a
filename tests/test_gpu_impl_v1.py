"""The V1 torch twin (`gpu_impl.batched_v1`: vLLM V1's flow with chunked prefill, prefix caching
left out) agrees with `reference_impl.v1_scheduler` step by step: outputs (scheduled requests,
token counts and prefill flags in order, victims in order, ignored), finished requests and full
snapshots (queues, block tables, the free queue in order); and the lockstep catches its mutants."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gpu_impl.batched_v1 as bv
from conformance.flows.profiles import get_profile
from conformance.generation.v1 import token_configs, token_traces
from conformance.runner.adapter import load_adapter
from conformance.runner.fuzz import fuzz
from conformance.runner.plan import RunPlan
from gpu_impl.adapter_v1 import make
from gpu_impl.batched_v1 import BatchedV1Scheduler
from gpu_impl.lockstep import snapshot_difference
from gpu_impl.lockstep_v1 import V1TraceBatch, run_lockstep_v1
from gpu_impl.workload_v1 import random_v1_trace
from reference_impl.engine import iter_steps
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import Capability
from spec.protocol import SchedulerLike
from spec.trace import Trace
from tests.conftest import examples

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _no_caching(config: SchedulerConfig) -> SchedulerConfig:
    return replace(config, enable_prefix_caching=False)


def _no_chunking(config: SchedulerConfig) -> SchedulerConfig:
    """Chunked prefill off, with V1's budget rule for that case (the budget covers max_model_len)."""
    return replace(config, enable_prefix_caching=False, enable_chunked_prefill=False, max_num_partial_prefills=0,
                   long_prefill_token_threshold=0,
                   max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_model_len))


def v1_traces(chunked: bool | None = None) -> st.SearchStrategy[Trace]:
    """`conformance.generation.v1.token_traces` with prefix caching forced off (and chunked prefill
    forced off when ``chunked`` is False; drawn, mostly on, when None)."""
    configs = token_configs("v1").map(_no_chunking if chunked is False else _no_caching)
    return configs.flatmap(lambda c: token_traces("v1", config=c))


def _check(result) -> None:
    assert result.ok, result.divergence.describe()


@settings(max_examples=examples(80))
@given(st.lists(v1_traces(), min_size=1, max_size=3))
def test_lockstep_drawn_batches(batch):
    """A batch of 1-3 engines with their own drawn configs and traces, chunked prefill mostly on
    (80 examples: about 160 drawn traces per CI run)."""
    _check(run_lockstep_v1(batch, V1Scheduler))


@settings(max_examples=examples(30))
@given(st.lists(v1_traces(chunked=False), min_size=1, max_size=3))
def test_lockstep_drawn_batches_without_chunked_prefill(batch):
    _check(run_lockstep_v1(batch, V1Scheduler))


def _pressure_batch(seed: int, tight_priority: bool = False, engines: int = 16) -> list[Trace]:
    rng = random.Random(seed)
    return [random_v1_trace(rng, tight_priority=tight_priority) for _ in range(engines)]


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_pressure_batches(device, monkeypatch):
    """32 engines of tight configs in two batches: both the closed-form running phase and the
    per-front loop run, several victims fall in one step, priority victims scheduled earlier in
    the same step give their tokens back, and the run drops engines that are done."""
    seen = {"loop_engines": 0, "multi_victim": 0, "given_back": 0, "compactions": 0}
    loop, give, take = bv.BatchedV1Scheduler._running_loop, bv.given_back, bv.BatchedV1Scheduler.take

    def counting_take(self, rows):
        seen["compactions"] += 1
        return take(self, rows)

    def counting_loop(self, Q, *args):
        seen["loop_engines"] += Q.numel()
        return loop(self, Q, *args)

    def counting_give(granted, victims):
        seen["multi_victim"] += int((victims.sum(1) > 1).sum())
        back = give(granted, victims)
        seen["given_back"] += int((back > 0).sum())
        return back

    monkeypatch.setattr(bv.BatchedV1Scheduler, "_running_loop", counting_loop)
    monkeypatch.setattr(bv.BatchedV1Scheduler, "take", counting_take)
    monkeypatch.setattr(bv, "given_back", counting_give)
    for batch in (_pressure_batch(3), _pressure_batch(11, tight_priority=True)):
        result = run_lockstep_v1(batch, V1Scheduler, device=device)
        _check(result)
        assert result.engine_steps > 500
    assert all(seen.values()), seen


# ---------------------------------------------------------------------- mutants
def _mutant_batch() -> list[Trace]:
    return _pressure_batch(3) + _pressure_batch(11, tight_priority=True)


def test_unmutated_mutant_batch_passes():
    _check(run_lockstep_v1(_mutant_batch(), V1Scheduler))


MUTANTS = {
    # the long-prefill threshold clamps one token late
    "chunk-clamp-off-by-one": ("chunk_clamp", lambda t, th: torch.where((th > 0) & (t > th), th + 1, t)),
    # every running request takes its tokens from the whole budget instead of what is left
    "budget-not-shared": ("budget_prefix", lambda want, budget: torch.minimum(want, budget[:, None])),
    # FCFS preempts the running head instead of the tail
    "fcfs-victim-head": ("victim_rank", lambda pos, pkey, prio: torch.where(prio, pkey, -pos)),
    # priority preempts the most urgent running request instead of the least
    "priority-victim-most-urgent": ("victim_rank", lambda pos, pkey, prio: torch.where(prio, -pkey, pos)),
    # a freed table goes onto the free queue head block first (V1 frees the tail first)
    "free-order-head-first": ("push_columns", lambda j, lens: (lens[:, None] - 1 - j).clamp(min=0)),
    # admission counts each waiting head as if it were already admitted (inclusive prefix sums)
    "admission-prefix-off-by-one": ("admission_prefix", lambda x: x.cumsum(1)),
    # a priority victim scheduled earlier in the step keeps its tokens' budget
    "no-budget-given-back": ("given_back", lambda granted, victims: torch.zeros_like(granted[:, 0])),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name, monkeypatch):
    attr, mutant = MUTANTS[name]
    monkeypatch.setattr(bv, attr, mutant)
    result = run_lockstep_v1(_mutant_batch(), V1Scheduler)
    assert not result.ok, name
    assert result.divergence.what in ("output", "snapshot.gpu_free_ids", "snapshot.seqs"), result.divergence.what


# ---------------------------------------------------------------------- scope and adapter
def test_prefix_caching_is_refused():
    config = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=8, max_model_len=8, enable_prefix_caching=True)
    with pytest.raises(ValueError, match="prefix caching"):
        BatchedV1Scheduler([config], 1, "cpu")
    with pytest.raises(InputError, match="enable_prefix_caching"):
        V1TraceBatch([Trace(config)], "cpu")
    with pytest.raises(InputError, match="enable_prefix_caching"):
        make(config)


def test_adapter_matches_reference_engine_loop():
    """`gpu_impl.adapter_v1.make` is a SchedulerLike whose records (mid-step snapshots too)
    equal the V1 reference's."""
    rng = random.Random(3)
    for trace in [random_v1_trace(rng) for _ in range(4)]:
        assert isinstance(make(trace.config), SchedulerLike)
        ref = list(iter_steps(trace, V1Scheduler(trace.config)))
        twin = list(iter_steps(trace, make(trace.config)))
        assert len(ref) == len(twin)
        for a, b in zip(ref, twin, strict=True):
            assert (a.output.scheduled, a.output.preempted, a.output.ignored) == (
                b.output.scheduled, b.output.preempted, b.output.ignored), a.step
            assert [(f.request_id, f.status) for f in a.finished] == [(f.request_id, f.status) for f in b.finished]
            # every compared part but those of features the twin lacks (gpu_impl.lockstep._REFERENCE_ONLY)
            assert [snapshot_difference(x, y) for x, y in ((a.before, b.before), (a.mid, b.mid), (a.after, b.after))] \
                == [None, None, None], a.step


def test_builtin_adapter_says_prefix_caching_is_left_out():
    adapter = load_adapter("gpu-v1")
    assert adapter.name == "gpu-v1" and "vllm-v1" in adapter.profiles
    assert Capability.PREFIX_CACHE not in adapter.capabilities
    assert Capability.TOKEN_BUDGET_FLOW in adapter.capabilities

    @settings(max_examples=10, database=None)
    @given(adapter.trace_strategy())
    def drawn(trace):
        assert not trace.config.enable_prefix_caching

    drawn()


def test_gpu_v1_conforms_to_the_vllm_v1_profile(tmp_path):
    """The built-in adapter through the runner: every invariant of the ``vllm-v1`` profile and the
    lockstep with the V1 reference hold; only what reads token ids is not applicable."""
    result = fuzz(lambda: load_adapter("gpu-v1"), RunPlan(get_profile("vllm-v1"), max_examples=examples(25), seed=7, out_dir=tmp_path))
    assert result.findings == {}
    assert result.lockstep
    # Only what reads token ids (the prefix cache, PIP-001) or in-flight counters (the twin is synchronous) is not
    # applicable: the twin leaves prefix caching out.
    from spec.catalogue import get
    from spec.observation import Capability

    # One full-attention group; the twin has no encoder cache, LoRA slots, pause, KV connector, grammar waits or sessions.
    left_out = {Capability.PREFIX_CACHE, Capability.IN_FLIGHT, Capability.KV_GROUPS, Capability.ENCODER,
                Capability.LORA, Capability.PAUSE, Capability.KV_TRANSFERS, Capability.GRAMMAR,
                Capability.STREAMING}
    assert result.not_applicable and all(get(i).needs & left_out for i in result.not_applicable), \
        result.not_applicable
    assert result.steps_checked > 100
