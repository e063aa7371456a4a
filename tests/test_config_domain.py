"""ConfigDomain: the config space an adapter supports; generation and shrinking stay inside it."""

from __future__ import annotations

import pytest

from conformance.generation.domain import traces_in
from conformance.generation.v0 import traces
from conformance.runner.adapter import BUILTIN_DOMAINS, traces_for
from conformance.runner.shrink import shrink
from conformance.targets import TARGET_SPECS
from spec.config import SchedulerConfig
from spec.domain import UNBOUNDED_SEQS, ConfigDomain
from spec.errors import InputError

# Narrow domains, each shutting off something a real engine lacks.
NARROW = {
    "no-swap-no-cpu": ConfigDomain(swap=False, cpu_pool=False),
    "fixed-watermark-fcfs": ConfigDomain(watermark=0.01, priority=False, max_n=1),
    "no-limits": ConfigDomain(seq_limit=False, token_budget=False, aborts=False),
    "nano-like": ConfigDomain(flow="nano", swap=False, cpu_pool=False, max_n=1, priority=False,
                              prefix_caching=True, budget_covers_model_len=True, cache_holds_model_len=True),
    "v1-chunked": ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, chunked_prefill=True,
                               budget_covers_model_len=True),
}


def _draw(strategy, count: int = 25, seed_value: int = 3):
    from conformance.generation.v0 import sample_traces

    return sample_traces(strategy, count, seed_value)


def test_round_trip_and_version():
    for domain in [ConfigDomain(), *NARROW.values()]:
        assert ConfigDomain.from_dict(domain.to_dict()) == domain
    assert ConfigDomain().to_dict()["version"] == 1


@pytest.mark.parametrize("data, where", [
    ({"flow": "v0"}, "domain.version"),
    ({"version": 1, "swapp": False}, "domain.swapp"),
    ({"version": 1, "swap": "no"}, "domain.swap"),
    ({"version": 1, "max_n": 0}, "domain.max_n"),
    ({"version": 1, "watermark": 1.5}, "domain.watermark"),
    ({"version": 1, "flow": "sglang"}, "domain.flow"),
    ({"version": 1, "flow": "v1", "max_n": 2}, "domain.max_n"),
    ([], "domain"),
])
def test_bad_declarations_name_the_field(data, where):
    with pytest.raises(InputError) as err:
        ConfigDomain.from_dict(data)
    assert err.value.where == where


def test_why_not_names_the_field():
    config = SchedulerConfig(num_cpu_blocks=4, preemption_mode="swap", policy="priority", watermark=0.1)
    cases = {
        ConfigDomain(swap=False): "config.preemption_mode",
        ConfigDomain(cpu_pool=False): "config.num_cpu_blocks",
        ConfigDomain(watermark=0.01): "config.watermark",
        ConfigDomain(priority=False): "config.policy",
        ConfigDomain(seq_limit=False): "config.max_num_seqs",
        ConfigDomain(token_budget=False): "config.max_num_batched_tokens",
        ConfigDomain(cache_holds_model_len=True): None,
    }
    for domain, field_name in cases.items():
        reason = domain.why_not(config)
        assert (reason is None) if field_name is None else reason.startswith(field_name), (domain, reason)
    small = SchedulerConfig(num_gpu_blocks=2, block_size=16, max_model_len=256, max_num_batched_tokens=512)
    assert ConfigDomain(cache_holds_model_len=True).why_not(small).startswith("config.num_gpu_blocks")
    short = SchedulerConfig(max_num_batched_tokens=128, max_model_len=256)
    assert ConfigDomain(budget_covers_model_len=True).why_not(short).startswith("config.max_num_batched_tokens")


def test_why_not_a_trace():
    trace = next(t for t in _draw(traces(), 40) if t.aborts and any(a.request.n > 1 for a in t.arrivals))
    assert ConfigDomain(max_n=1).why_not(trace).startswith("request ")
    assert ConfigDomain(aborts=False).why_not(trace).startswith("aborts")
    assert "prompt_tokens" in ConfigDomain(flow="v1", max_n=1, swap=True).why_not(trace.__class__(
        trace.config, tuple(a for a in trace.arrivals if a.request.n == 1), (), (), trace.max_steps))


@pytest.mark.parametrize("name", sorted(NARROW))
def test_generated_traces_stay_inside(name):
    domain = NARROW[name]
    drawn = _draw(traces_in(domain))
    assert len(drawn) == 25
    for trace in drawn:
        assert domain.why_not(trace) is None
    if not domain.seq_limit:
        assert all(t.config.max_num_seqs >= min(UNBOUNDED_SEQS, t.config.max_num_batched_tokens) for t in drawn)


def test_default_domain_draws_the_default_traces():
    """An adapter that declares nothing is tested exactly as before domains existed."""
    assert [t.to_json() for t in _draw(traces_in(ConfigDomain()), 10)] == [t.to_json() for t in _draw(traces(), 10)]


@pytest.mark.parametrize("spec", sorted(BUILTIN_DOMAINS))
def test_builtin_strategies_stay_inside_their_domains(spec):
    domain = BUILTIN_DOMAINS[spec]
    for trace in _draw(traces_for(spec, domain.to_dict()), 20):
        assert domain.why_not(trace) is None, spec


@pytest.mark.parametrize("name", sorted(TARGET_SPECS))
def test_target_strategies_stay_inside_their_domains(name):
    target = TARGET_SPECS[name]
    assert target.domain is not None
    for trace in _draw(target.strategy(), 20):
        assert target.domain.why_not(trace) is None, name


def test_a_user_domain_reaches_generation_through_the_hello():
    domain = NARROW["no-limits"]
    for trace in _draw(traces_for("my_adapter.py:make", domain.to_dict()), 10):
        assert domain.admits(trace)


def test_shrink_never_leaves_the_domain():
    """Every candidate the shrinker runs is inside the domain, and so is its answer, though
    simpler configs (watermark 0, FCFS, fewer sequences, a smaller budget) lie just outside."""
    domain = ConfigDomain(watermark=0.25, priority=True, seq_limit=False, token_budget=False, cpu_pool=True)
    trace = next(t for t in _draw(traces_in(domain), 40) if len(t.arrivals) >= 3 and t.config.policy == "priority")
    seen = []

    def failing(candidate):
        seen.append(candidate)
        return candidate.arrivals[0].step if candidate.arrivals else None  # "fails" while a request is left

    small, step = shrink(trace, failing, budget=200, seconds=20, domain=domain)
    assert step == small.arrivals[0].step and len(small.arrivals) == 1
    assert all(domain.admits(c) for c in seen) and domain.admits(small)
    assert small.config.watermark == 0.25
    assert small.config.max_num_seqs >= min(UNBOUNDED_SEQS, small.config.max_num_batched_tokens)
    # Without the domain the same shrink leaves it (so the check above is not vacuous).
    seen.clear()
    shrink(trace, failing, budget=200, seconds=20)
    assert not all(domain.admits(c) for c in seen)


def test_shrinking_a_trace_with_encoder_inputs_and_sessions_offers_only_valid_requests():
    """A shorter prompt takes the encoder inputs within it; dropping an encoder input or a later
    input is a candidate of its own. Before this, a shorter prompt than an input's end raised
    InputError out of the shrinker (the spec refuses such a request)."""
    from conformance.generation.budgets import budget_traces, mixed_session_traces
    from conformance.generation.v0 import sample_traces
    from conformance.runner.shrink import _candidates

    seen = set()
    for trace in sample_traces(budget_traces(), 20, 5) + sample_traces(mixed_session_traces(), 20, 5):
        before = {a.request.request_id: a.request for a in trace.arrivals}
        for candidate in _candidates(trace):  # each is a Trace: every request passed spec.types.Request's checks
            for a in candidate.arrivals:
                old = before.get(a.request.request_id)
                if old is not None and len(a.request.encoder_inputs) < len(old.encoder_inputs):
                    seen.add("encoder input dropped")
                if old is not None and len(a.request.session) < len(old.session):
                    seen.add("session input dropped")
    assert seen == {"encoder input dropped", "session input dropped"}
