"""The vLLM V1 reference: worked examples, and the whole applicable catalogue on fuzzed traces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from conformance.flows.profiles import get_profile
from conformance.generation.v1 import token_traces
from conformance.selftest.mutants import violated
from reference_impl.engine import run_trace
from reference_impl.v1_scheduler import V1Scheduler
from spec.catalogue import check_records
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.status import Status
from spec.trace import Arrival, Trace
from spec.types import Request

V1_INVARIANTS = get_profile("vllm-v1").invariants()


def cfg(**kw) -> SchedulerConfig:
    base = dict(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=8,
                max_model_len=64, watermark=0.0, preemption_mode="recompute")
    return SchedulerConfig(**{**base, **kw})


def run(config: SchedulerConfig, *arrivals: tuple[int, Request], stops=(), max_steps: int = 100):
    trace = Trace(config, tuple(Arrival(s, r) for s, r in arrivals), stops=tuple(stops), max_steps=max_steps)
    result = run_trace(trace, V1Scheduler)
    problems = list(check_records(config, V1Scheduler.capabilities, result.records, result.drained))
    policy = {i.id for i in V1_INVARIANTS}
    assert [v for v in problems if v.invariant_id in policy] == []
    return result


def steps(result):
    return [[(s.seq_id, s.num_tokens, s.is_prefill) for s in rec.output.scheduled] for rec in result.records]


def test_long_prompt_is_chunked_over_steps():
    result = run(cfg(enable_chunked_prefill=True), (0, Request("a", 20, max_tokens=2)))
    assert steps(result)[:4] == [[("a#0", 8, True)], [("a#0", 8, True)], [("a#0", 4, True)], [("a#0", 1, False)]]
    after_chunk = result.records[0].after.seqs["a#0"]
    assert (after_chunk.num_computed, after_chunk.num_tokens) == (8, 20), "a partial chunk samples nothing"
    assert result.records[2].after.seqs["a#0"].num_tokens == 21, "the last chunk samples the first token"
    assert result.drained


def test_without_chunked_prefill_a_prompt_waits_for_a_whole_budget():
    config = cfg(max_num_batched_tokens=64, num_gpu_blocks=40)
    result = run(config, (0, Request("a", 4, max_tokens=3)), (1, Request("b", 62, max_tokens=1)),
                 (1, Request("c", 63, max_tokens=1)))
    # step 1: a decodes (1 token), b takes 62 of the 63 left in the same step (V1 mixes them);
    # c (63 tokens) does not fit the 1 left and, without chunked prefill, waits
    assert steps(result)[1] == [("a#0", 1, False), ("b#0", 62, True)]
    assert steps(result)[2] == [("a#0", 1, False), ("c#0", 63, True)]


def test_decodes_and_chunks_share_one_budget_running_first():
    result = run(cfg(enable_chunked_prefill=True), (0, Request("a", 4, max_tokens=5)), (1, Request("b", 30, max_tokens=1)))
    assert steps(result)[1] == [("a#0", 1, False), ("b#0", 7, True)]
    assert steps(result)[2] == [("a#0", 1, False), ("b#0", 7, True)]


def test_long_prefill_threshold_caps_chunks_only_when_others_wait():
    config = cfg(enable_chunked_prefill=True, long_prefill_token_threshold=3)
    alone = run(config, (0, Request("a", 10, max_tokens=1)))
    assert steps(alone)[0] == [("a#0", 8, True)], "nobody to starve: the whole budget"
    two = run(config, (0, Request("a", 10, max_tokens=1)), (0, Request("b", 10, max_tokens=1)))
    assert steps(two)[0] == [("a#0", 3, True), ("b#0", 3, True)]


def test_partial_prefill_limit():
    config = cfg(enable_chunked_prefill=True, max_num_batched_tokens=16, max_num_partial_prefills=1)
    result = run(config, (0, Request("a", 20, max_tokens=1)), (0, Request("b", 20, max_tokens=1)))
    assert steps(result)[0] == [("a#0", 16, True)]
    assert steps(result)[1] == [("a#0", 4, True), ("b#0", 12, True)]


def test_shared_prompt_prefix_hits_the_cache():
    config = cfg(max_num_batched_tokens=64, enable_prefix_caching=True)
    prompt = tuple(range(10))
    result = run(config, (0, Request("a", 10, max_tokens=4, prompt_tokens=prompt)),
                 (1, Request("b", 10, max_tokens=2, prompt_tokens=prompt)))
    rec = result.records[1]
    b = rec.mid.seqs["b#0"]
    a = rec.mid.seqs["a#0"]
    assert b.num_computed == 8, "two full blocks hit; the last token is computed anyway"
    assert steps(result)[1] == [("a#0", 1, False), ("b#0", 2, True)]
    assert a.blocks[:2] == b.blocks[:2] and a.blocks[2] != b.blocks[2]
    assert rec.mid.gpu_ref_counts[a.blocks[0]] == 2


def test_whole_prompt_in_cache_still_computes_one_block():
    config = cfg(max_num_batched_tokens=64, enable_prefix_caching=True)
    prompt = tuple(range(8))
    result = run(config, (0, Request("a", 8, max_tokens=1, prompt_tokens=prompt)),
                 (2, Request("b", 8, max_tokens=1, prompt_tokens=prompt)))
    b = result.records[2].mid.seqs["b#0"]
    assert b.num_computed == 4 and steps(result)[2] == [("b#0", 4, True)], "hit capped at num_tokens - 1 -> 1 block"


def test_cached_blocks_survive_their_request_until_evicted():
    config = cfg(num_gpu_blocks=4, max_num_batched_tokens=64, enable_prefix_caching=True)
    result = run(config, (0, Request("a", 8, max_tokens=1, prompt_tokens=tuple(range(8)))),
                 (2, Request("c", 12, max_tokens=1, prompt_tokens=tuple(range(100, 112)))),
                 (4, Request("b", 12, max_tokens=1, prompt_tokens=(*range(8), 200, 201, 202, 203))))
    after_a = result.records[0].after
    # a held blocks 0, 1 (full, cached) and 2 (its sampled token): freed tail first, the uncached
    # block to the front, the cached ones to the back
    assert after_a.gpu_free_ids == (2, 3, 1, 0) and len(after_a.cache_index) == 2
    # c takes 2, 3 and then 1, the least recently used cached block (evicted: no longer findable)
    assert result.records[2].mid.seqs["c#0"].blocks == (2, 3, 1)
    assert result.records[2].after.gpu_block_keys[1] != after_a.gpu_block_keys[1]
    b = result.records[4].mid.seqs["b#0"]
    assert b.num_computed == 4 and b.blocks[0] == 0, "a's first block is still cached, its second was evicted"


def test_preemption_is_recompute_of_the_running_tail():
    config = cfg(num_gpu_blocks=4, max_num_batched_tokens=16)
    result = run(config, (0, Request("a", 7, max_tokens=8)), (0, Request("b", 7, max_tokens=8)))
    first = next(rec for rec in result.records if rec.output.preempted)
    assert [(p.request_id, p.mode.value) for p in first.output.preempted] == [("b", "recompute")]
    victim = first.mid.seqs["b#0"]
    before = first.before.seqs["b#0"]
    assert (victim.num_computed, victim.blocks, victim.num_tokens) == (0, (), before.num_tokens)
    assert first.mid.waiting[0] == "b" and not any(s.request_id == "b" for s in first.output.scheduled)
    assert result.drained and {f.status for r in result.records for f in r.finished} == {Status.FINISHED_LENGTH_CAPPED}


def test_priority_victim_is_the_least_urgent():
    config = cfg(num_gpu_blocks=4, max_num_batched_tokens=16, policy="priority")
    result = run(config, (0, Request("a", 7, max_tokens=8, priority=1)), (0, Request("b", 7, max_tokens=8, priority=0)))
    first = next(rec for rec in result.records if rec.output.preempted)
    assert [p.request_id for p in first.output.preempted] == ["a"]


def test_over_long_prompt_is_ignored_and_n_must_be_one():
    result = run(cfg(enable_chunked_prefill=True), (0, Request("a", 65, max_tokens=1)))
    assert result.records[0].output.ignored == ("a",)
    with pytest.raises(InputError) as err:
        V1Scheduler(cfg()).add_request(Request("x", 4, n=2))
    assert err.value.where == "request 'x'.n"


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(token_traces("v1"))
def test_v1_reference_satisfies_its_profile(trace):
    assert violated(V1Scheduler, trace, invariants=V1_INVARIANTS) == set()


def test_config_and_trace_fields_are_optional_and_validated(tmp_path):
    assert "enable_chunked_prefill" not in SchedulerConfig().to_dict(), "V0 configs write as before"
    for bad, where in (({"enable_prefix_caching": 1}, "config.enable_prefix_caching"),
                       ({"long_prefill_token_threshold": 4}, "config.long_prefill_token_threshold"),
                       ({"enable_chunked_prefill": True, "max_num_partial_prefills": -1}, "config.max_num_partial_prefills")):
        with pytest.raises(InputError) as err:
            SchedulerConfig.from_dict(bad)
        assert err.value.where == where
    trace = Trace(cfg(enable_chunked_prefill=True, enable_prefix_caching=True),
                  (Arrival(0, Request("a", 3, prompt_tokens=(5, 6, 7))), Arrival(1, Request("b", 2))))
    assert Trace.load(trace.save(tmp_path / "t.json")) == trace
    with pytest.raises(InputError) as err:
        Trace.from_dict({"version": 1, "requests": [{"id": "a", "prompt_len": 2, "prompt_tokens": [1]}]})
    assert err.value.where == "requests[0].prompt_tokens"


def test_conform_cli_runs_the_v1_reference_in_lockstep(tmp_path, capsys):
    from conformance.commands.cli import main

    assert main(["conform", "--adapter", "reference-v1", "--max-examples", "25", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "profile vllm-v1" in out and "conforming" in out
