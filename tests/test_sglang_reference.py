"""The SGLang flow's reference (reference_impl/sglang_scheduler.py) and its radix cache
(reference_impl/radix_cache.py): the rules lockstep pinned down, on small handmade cases, and the
sglang profile on the flow's own traces."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.sglang import sglang_traces
from conformance.generation.v0 import sample_traces
from conformance.selftest.mutants import violated
from reference_impl.engine import iter_steps
from reference_impl.radix_cache import RadixCache
from reference_impl.sglang_scheduler import SglangScheduler, door_limits, sampled_token
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.trace import Arrival, Trace
from spec.types import Request

HOSTS = Path(__file__).resolve().parents[1] / "conformance" / "targets" / "hosts"


def _config(**kw) -> SchedulerConfig:
    base = dict(block_size=1, num_gpu_blocks=20, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=32,
                max_model_len=24, watermark=0.0, preemption_mode="recompute", policy="fcfs",
                enable_prefix_caching=True)
    return SchedulerConfig(**{**base, **kw})


def test_sampled_tokens_are_the_hosts():
    # The host cannot import kvsched; the reference's copy of its token function must stay the same.
    spec = importlib.util.spec_from_file_location("kvsched_host_copy", HOSTS / "kvsched_host.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for rid in ("r0", "r17", "A"):
        assert module.token_ids(rid, 40) == [sampled_token(rid, k) for k in range(40)]


def test_radix_cache_splits_locks_and_evicts_lru():
    freed: list[int] = []
    cache = RadixCache(freed.extend)
    assert cache.insert([1, 2, 3], [10, 11, 12]) == 0
    assert cache.insert([1, 2, 4], [20, 21, 22]) == 2  # [1, 2] was cached: the caller frees 20, 21
    slots, node = cache.match([1, 2, 3, 9])
    assert slots == [10, 11, 12] and cache.evictable_size == 4
    cache.lock(node)
    assert (cache.evictable_size, cache.protected_size) == (1, 3)
    assert cache.evict(5) == 1 and freed == [22]  # only the unlocked leaf [4] can go
    cache.unlock(node)
    cache.match([1, 2])  # splits nothing new; touches [1, 2] after [3]
    assert cache.evict(1) == 1 and freed == [22, 12]  # [3] is a leaf, [1, 2] is not
    assert cache.evict(10) == 2 and freed == [22, 12, 10, 11] and cache.total_size() == 0


def test_retract_decode_on_the_handmade_trace():
    """docs/traces/sglang/handmade/retract-decode.json: three requests on 20 slots, the third
    admitted a step later at the new-token ratio; C (fewest generated, latest in the batch) goes."""
    arrivals = tuple(Arrival(0, Request(rid, prompt_len=1, max_tokens=7)) for rid in "ABCD")
    trace = Trace(_config(), arrivals, (), (), max_steps=60)
    records = list(iter_steps(trace, SglangScheduler(trace.config)))
    assert [s.request_id for s in records[0].output.scheduled] == ["A", "B"]
    assert [s.request_id for s in records[1].output.scheduled] == ["C"]
    retracted = [(r.step, [p.request_id for p in r.output.preempted]) for r in records if r.output.preempted]
    assert retracted == [(7, ["C"])]


def test_door_refuses_at_the_input_limit_and_clips_max_new_tokens():
    config = _config(num_gpu_blocks=16)
    max_req_len, limit = door_limits(config)
    assert (max_req_len, limit) == (15, 10)
    scheduler = SglangScheduler(config)
    scheduler.add_request(Request("long", prompt_len=limit, max_tokens=3))
    scheduler.add_request(Request("ok", prompt_len=4, max_tokens=100))
    out = scheduler.schedule()
    assert out.ignored == ("long",)
    assert scheduler.requests["ok"].max_new == max_req_len - 4 - 1


def test_lpm_puts_the_longest_cached_prefix_first():
    config = _config(policy="lpm", max_num_seqs=1)
    scheduler = SglangScheduler(config)
    first = Request("a", prompt_len=6, max_tokens=1, prompt_tokens=(5, 6, 7, 8, 9, 10))
    scheduler.add_request(first)
    scheduler.schedule()
    scheduler.update(_outcome())
    scheduler.add_request(Request("b", prompt_len=3, max_tokens=1, prompt_tokens=(3, 3, 3)))
    scheduler.add_request(Request("c", prompt_len=6, max_tokens=1, prompt_tokens=(5, 6, 7, 8, 9, 11)))
    out = scheduler.schedule()
    assert [(s.request_id, s.num_tokens) for s in out.scheduled] == [("c", 1)]  # 5 of its 6 tokens cached


def test_a_long_prompt_comes_in_chunks_and_samples_once():
    config = _config(enable_chunked_prefill=True, max_num_batched_tokens=4, max_num_seqs=2)
    scheduler = SglangScheduler(config)
    scheduler.add_request(Request("a", prompt_len=10, max_tokens=2, prompt_tokens=tuple(range(3, 13))))
    chunks = []
    for _ in range(4):
        out = scheduler.schedule()
        chunks.append([(s.num_tokens, s.is_prefill) for s in out.scheduled])
        scheduler.update(_outcome())
    assert chunks == [[(4, True)], [(4, True)], [(2, True)], [(1, False)]]
    assert len(scheduler.requests["a"].output) == 2


def _outcome():
    from spec.types import StepOutcome

    return StepOutcome()


@pytest.mark.parametrize("field,value", [("block_size", 2), ("policy", "priority"), ("preemption_mode", "swap")])
def test_configs_outside_the_flow_are_one_line(field, value):
    kw = {field: value}
    if field == "preemption_mode":
        kw["num_cpu_blocks"] = 4
    with pytest.raises(InputError) as err:
        SglangScheduler(_config(**kw))
    assert "config." in str(err.value) and "\n" not in str(err.value)


def test_the_flows_traces_hold_the_sglang_profile():
    invariants = get_profile("sglang").invariants()
    for trace in sample_traces(sglang_traces(full=False), 60, 7):
        assert violated(SglangScheduler, trace, invariants=invariants) == set()
