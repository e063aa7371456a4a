"""The config domain's fields for what an engine lacks or always does (issue 34 item 1): one
test per field, that generation keeps to it, that a config outside it is named by the field,
and (for the fields the runner reads) that the run takes it into account. The zoo members that
use each field, and their broken twins, are in tests/zoo/ (tests/test_zoo.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.domain import traces_in
from conformance.generation.v0 import sample_traces
from conformance.runner.block_ids import shift_output, shift_snapshot
from conformance.runner.driver import run_checked
from conformance.runner.shrink import shrink
from spec.config import SchedulerConfig
from spec.domain import UNBOUNDED_LEN, ConfigDomain
from spec.errors import InputError
from spec.observation import SeqView, Snapshot
from spec.status import Status
from spec.types import SchedulerOutput

sys.path.insert(0, str(Path(__file__).parent))
LIVENESS = get_profile("liveness").invariants()


def _draw(domain: ConfigDomain, count: int = 40):
    drawn = sample_traces(traces_in(domain), count, 5)
    assert len(drawn) == count and all(domain.why_not(t) is None for t in drawn)
    return drawn


def _active(result) -> set[str]:
    return {inv.id for inv in result.active}


def test_no_length_limit_draws_unbounded_configs_and_lengths_from_max_tokens():
    domain = ConfigDomain(length_limit=False)
    drawn = _draw(domain, 60)
    assert all(t.config.max_model_len == UNBOUNDED_LEN for t in drawn)
    prompts = [a.request.prompt_len for t in drawn for a in t.arrivals]
    assert max(prompts) <= 8 * 12 + 1  # on the scale a limit would have had, not UNBOUNDED_LEN's
    assert max(a.request.max_tokens for t in drawn for a in t.arrivals) > 12  # long outputs too
    assert domain.why_not(SchedulerConfig()).startswith("config.max_model_len")
    with pytest.raises(InputError) as err:
        ConfigDomain(length_limit=False, budget_covers_model_len=True)
    assert err.value.where == "domain.length_limit"
    from zoo.no_length_limit import make

    result = run_checked(make(), drawn[0], LIVENESS, timeout=None)
    assert "LEN-001" in {inv.id for inv in result.not_applicable} and "LEN-002" in _active(result)


def test_no_seq_limit_keeps_every_budget_so_prompts_are_split():
    domain = ConfigDomain(flow="v1", max_n=1, swap=False, cpu_pool=False, seq_limit=False, chunked_prefill=True)
    drawn = _draw(domain, 100)
    # Issue 34: 300 draws of the old domain had no config whose prompts could be split.
    assert sum(t.config.enable_chunked_prefill and t.config.max_num_batched_tokens < t.config.max_model_len
               for t in drawn) >= 10
    assert all(t.config.max_num_seqs == min(64, t.config.max_num_batched_tokens) for t in drawn)
    from zoo.no_seq_limit import make

    result = run_checked(make(), drawn[0], LIVENESS, timeout=None)
    assert {"BUD-002", "BUD-003", "STR-002"} & {inv.id for inv in result.not_applicable} == {"BUD-002"}
    assert ConfigDomain(seq_limit=False).why_not(SchedulerConfig(max_num_seqs=8)).startswith("config.max_num_seqs")


def test_prefix_caching_always_on():
    domain = ConfigDomain(flow="v1", max_n=1, swap=False, cpu_pool=False, prefix_caching=True, uncached=False)
    assert all(t.config.enable_prefix_caching for t in _draw(domain))
    assert domain.why_not(SchedulerConfig(preemption_mode="recompute", num_cpu_blocks=0)).startswith(
        "config.enable_prefix_caching: the domain always caches")
    mixed = ConfigDomain(flow="v1", max_n=1, swap=False, cpu_pool=False, prefix_caching=True)
    assert {t.config.enable_prefix_caching for t in _draw(mixed)} == {True, False}


def test_one_preemption_mode_only():
    domain = ConfigDomain(preemption_mode="swap")
    assert {t.config.preemption_mode for t in _draw(domain)} == {"swap"}
    assert domain.why_not(SchedulerConfig(preemption_mode="auto")).startswith("config.preemption_mode")
    with pytest.raises(InputError) as err:
        ConfigDomain(swap=False, preemption_mode="swap")
    assert err.value.where == "domain.preemption_mode"
    with pytest.raises(InputError):
        ConfigDomain(preemption_mode="sometimes")


def test_a_cache_that_holds_references_is_a_holder_only_when_the_domain_says_so():
    from zoo import cache_holds

    unclaimed = cache_holds.make()
    unclaimed.domain = _without_claim(cache_holds.DOMAIN)
    told_apart = 0
    for trace in _draw(cache_holds.DOMAIN, 20):
        assert not run_checked(cache_holds.make(), trace, LIVENESS, timeout=None, stop_at_first=False).problem_ids
        told_apart += "BLK-003" in run_checked(unclaimed, trace, LIVENESS, timeout=None).problem_ids
    assert told_apart >= 5  # a trace that caches a block: without the claim its hold is a leak


def _without_claim(domain: ConfigDomain) -> ConfigDomain:
    data = domain.to_dict()
    data["cache_holds_refs"] = False
    return ConfigDomain.from_dict(data)


def test_a_fused_step_is_told_the_outcome_in_schedule():
    from zoo.fused_step import DOMAIN, make

    told = []
    adapter = make()
    real = adapter.schedule

    def schedule(*outcome):
        told.append(outcome)
        return real(*outcome)

    adapter.schedule = schedule
    trace = next(t for t in _draw(DOMAIN, 40) if t.stops)
    result = run_checked(adapter, trace, LIVENESS, timeout=None, stop_at_first=False)
    assert told and all(len(o) == 1 for o in told) and not result.problem_ids
    assert "OUT-002" in {inv.id for inv in result.not_applicable}  # it reads the mid-step snapshot


def test_a_count_only_engine_gets_no_stops():
    domain = ConfigDomain(stops=False)
    assert all(not t.stops for t in _draw(domain))
    with_stops = next(t for t in sample_traces(traces_in(ConfigDomain(max_n=2)), 40, 5) if t.stops)
    assert domain.why_not(with_stops).startswith("stops")


def test_an_engine_sized_pool_is_the_one_checked():
    from zoo.engine_pool import DOMAIN, make

    trace = _draw(DOMAIN, 5)[0]
    adapter = make()
    result = run_checked(adapter, trace, LIVENESS, timeout=None, stop_at_first=False)
    assert not result.problem_ids
    assert adapter.reset(trace.config).num_gpu_blocks == max(2, trace.config.num_gpu_blocks // 2)

    class Liar:
        def __init__(self, config):
            from dataclasses import replace

            from reference_impl.scheduler import Scheduler

            self._s = Scheduler(config)
            self.engine_config = replace(config, watermark=0.5)  # not only the pool differs

        def __getattr__(self, name):
            return getattr(self._s, name)

    from zoo._adapter import zoo_adapter

    liar = run_checked(zoo_adapter("liar", Liar, domain=DOMAIN), trace, LIVENESS, timeout=None)
    assert liar.fault is not None and liar.fault.kind == "malformed"


def test_preconditions_are_parsed_kept_and_named():
    domain = ConfigDomain(requires=("max_num_batched_tokens >= max_num_seqs * 2",
                                    "num_gpu_blocks * block_size >= max_num_seqs * max_model_len"))
    assert ConfigDomain.from_dict(json.loads(json.dumps(domain.to_dict()))) == domain
    for trace in _draw(domain, 30):
        c = trace.config
        assert c.max_num_batched_tokens >= 2 * c.max_num_seqs
        assert c.num_gpu_blocks * c.block_size >= c.max_num_seqs * c.max_model_len
    reason = domain.why_not(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10))
    assert reason.startswith("config.max_num_batched_tokens: the domain requires")
    for bad in (["max_num_seqs"], ["budget >= 1"], ["a + b * c >= 1"], "x >= 1"):
        with pytest.raises(InputError) as err:
            ConfigDomain.from_dict({"version": 1, "requires": bad})
        assert err.value.where.startswith("domain.requires")


def test_block_ids_from_one_are_shifted_down():
    snap = Snapshot(seqs={"r0#0": SeqView("r0#0", "r0", Status.RUNNING, 3, 2, (1, 2), "gpu")},
                    gpu_free_ids=(3,), gpu_ref_counts=(1, 1, 0), cache_index={"k": (2,)})
    shifted = shift_snapshot(snap, 1)
    assert shifted.seqs["r0#0"].blocks == (0, 1) and shifted.gpu_free_ids == (2,)
    assert shifted.gpu_ref_counts == (1, 1, 0) and shifted.cache_index == {"k": (1,)}
    out = shift_output(SchedulerOutput(step=0, swap_out=((1, 3),), copies=((2, 1),)), 1)
    assert out.swap_out == ((0, 2),) and out.copies == ((1, 0),)
    with pytest.raises(InputError):
        ConfigDomain(first_block_id=2)
    from zoo.null_block import DOMAIN, make

    trace = _draw(DOMAIN, 5)[1]
    assert not run_checked(make(), trace, LIVENESS, timeout=None, stop_at_first=False).problem_ids


def test_no_length_limit_and_no_token_budget_together():
    """A stranger's first run (docs/examples/smol_vllm): the budget of an engine with neither
    was drawn from the length scale, so it bound, and traces fell outside the domain."""
    domain = ConfigDomain(length_limit=False, token_budget=False, aborts=False)
    for trace in _draw(domain, 30):
        assert trace.config.max_num_batched_tokens >= trace.config.max_num_seqs * UNBOUNDED_LEN


@pytest.mark.parametrize("domain", [
    ConfigDomain(length_limit=False, stops=False, preemption_mode="swap"),
    ConfigDomain(flow="v1", max_n=1, swap=False, cpu_pool=False, seq_limit=False, chunked_prefill=True,
                 prefix_caching=True, uncached=False),
    ConfigDomain(requires=("num_gpu_blocks * block_size >= max_num_seqs * max_model_len",)),
], ids=["no-length-no-stops-swap", "no-seqs-always-cached", "preconditions"])
def test_shrinking_stays_inside_the_new_fields(domain):
    trace = next(t for t in _draw(domain, 40) if len(t.arrivals) >= 3)
    seen = []

    def failing(candidate):
        seen.append(candidate)
        return candidate.arrivals[0].step if candidate.arrivals else None  # "fails" while a request is left

    small, _ = shrink(trace, failing, budget=200, seconds=20, domain=domain)
    assert len(seen) > 1 and all(domain.admits(c) for c in seen) and domain.admits(small)
    assert 1 <= len(small.arrivals) < len(trace.arrivals)
