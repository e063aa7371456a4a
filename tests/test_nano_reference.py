"""The nano-vllm reference: worked examples, and its profile's catalogue on fuzzed traces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.flows.profiles import get_profile
from conformance.generation.v1 import token_traces
from conformance.selftest.mutants import violated
from reference_impl.engine import run_trace
from reference_impl.nano_scheduler import NanoScheduler
from spec.catalogue import check_records
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.trace import Arrival, Trace
from spec.types import Request

NANO_INVARIANTS = get_profile("nano-vllm").invariants()


def cfg(**kw) -> SchedulerConfig:
    base = dict(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=64,
                max_model_len=64, watermark=0.0, preemption_mode="recompute", enable_prefix_caching=True)
    return SchedulerConfig(**{**base, **kw})


def run(config: SchedulerConfig, *arrivals: tuple[int, Request]):
    trace = Trace(config, tuple(Arrival(s, r) for s, r in arrivals), max_steps=100)
    result = run_trace(trace, NanoScheduler)
    checked = {i.id for i in NANO_INVARIANTS}
    problems = [v for v in check_records(config, NanoScheduler.capabilities, result.records, result.drained)
                if v.invariant_id in checked]
    assert problems == []
    return result


def steps(result):
    return [[(s.seq_id, s.num_tokens, s.is_prefill) for s in rec.output.scheduled] for rec in result.records]


def test_prefill_steps_never_mix_with_decodes():
    result = run(cfg(), (0, Request("a", 5, max_tokens=3)), (1, Request("b", 6, max_tokens=2)))
    assert steps(result)[:3] == [[("a#0", 5, True)], [("b#0", 2, True)], [("a#0", 1, False), ("b#0", 1, False)]]  # b hits a's first block


def test_prefix_hit_and_fifo_block_reuse():
    prompt = tuple(range(9))
    result = run(cfg(), (0, Request("a", 9, max_tokens=1, prompt_tokens=prompt)),
                 (2, Request("b", 9, max_tokens=1, prompt_tokens=prompt)))
    after_a = result.records[0].after
    assert after_a.gpu_free_ids[-3:] == (2, 1, 0), "freed blocks go to the back, the table's tail first"
    b = result.records[2].mid.seqs["b#0"]
    assert b.num_computed == 8 and b.blocks[:2] == (0, 1) and steps(result)[2] == [("b#0", 1, True)]


def test_new_block_only_when_the_token_starts_one_and_tail_preempted():
    config = cfg(num_gpu_blocks=4, enable_prefix_caching=False)
    result = run(config, (0, Request("a", 4, max_tokens=6)), (0, Request("b", 4, max_tokens=6)))
    rec = next(r for r in result.records if r.output.preempted)
    assert [p.request_id for p in rec.output.preempted] == ["b"] and rec.mid.waiting[0] == "b"
    assert result.drained


def test_running_never_exceeds_max_num_seqs():
    result = run(cfg(max_num_seqs=1), (0, Request("a", 4, max_tokens=3)), (1, Request("b", 4, max_tokens=3)))
    assert all(len(rec.after.running) <= 1 for rec in result.records)


def test_nano_has_no_priority_and_no_chunking():
    with pytest.raises(InputError):
        NanoScheduler(cfg(policy="priority"))
    with pytest.raises(InputError):
        NanoScheduler(cfg(enable_chunked_prefill=True))


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(token_traces("nano"))
def test_nano_reference_satisfies_its_profile(trace):
    assert violated(NanoScheduler, trace, invariants=NANO_INVARIANTS) == set()
