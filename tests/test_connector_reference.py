"""The KV-connector flow's reference (reference_impl/kv_connector.py, docs/CONNECTORS.md).

* With no connector configured, the V1 and async references run every committed trace exactly
  as they did before the connector existed (digests taken before the change).
* The connector's trace field round-trips, and bad input names its field.
* On drawn connector traces the reference passes its profile, and the paths the KVC family is
  about were exercised (asynchronous loads, failures under both policies, delayed frees, aborts
  during a load).
* Worked examples pin the moves one by one.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from conformance.flows.profiles import get_profile
from conformance.generation.connector import connector_traces
from conformance.selftest.mutants import violated
from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.engine import run_trace
from reference_impl.kv_connector_scheduler import ConnectorScheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.status import Status
from spec.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
DIGESTS = json.loads((Path(__file__).parent / "data" / "connector_off_digests.json").read_text())["digests"]


def _digest(trace: Trace, make) -> str:  # the same digest as the one the fixture was made with
    import hashlib

    h = hashlib.sha256()
    try:
        run = run_trace(trace, make)
    except (InputError, ValueError) as err:
        return f"refused: {type(err).__name__}"
    for r in run.records:
        s = r.after
        h.update(repr((r.step, r.output.scheduled, r.output.preempted, r.output.ignored,
                       tuple(sorted((f.request_id, f.status.value) for f in r.finished)),
                       s.waiting, s.running, s.gpu_free_ids,
                       tuple(sorted((k, v.status.value, v.num_tokens, v.num_computed, v.blocks)
                                    for k, v in s.seqs.items())))).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("path", sorted(DIGESTS))
def test_no_connector_runs_unchanged(path):
    trace = Trace.load(ROOT / path)
    assert not trace.config.kv_connector
    assert _digest(trace, V1Scheduler) == DIGESTS[path]["v1"]
    assert _digest(trace, lambda c: AsyncV1Scheduler(c, c.pipeline_depth)) == DIGESTS[path]["async"]


def _trace(connector: list, **config) -> Trace:
    base = {"kv_connector": True, "block_size": 4, "num_gpu_blocks": 16, "max_num_seqs": 4,
            "max_num_batched_tokens": 32, "max_model_len": 64, "watermark": 0.0, "enable_chunked_prefill": True}
    return Trace.from_dict({"version": 1, "config": {**base, **config},
                            "requests": [{"id": "A", "prompt_len": 20, "max_tokens": 3},
                                         {"id": "B", "prompt_len": 10, "max_tokens": 2, "arrival_step": 1}],
                            "connector": {"version": 1, "requests": connector}})


def test_trace_field_round_trips():
    trace = _trace([{"request": "A", "external_tokens": 16, "load_async": True, "load_steps": 2,
                     "failed_blocks": [1], "send_steps": 3}])
    again = Trace.from_dict(json.loads(trace.to_json()))
    assert again.connector == trace.connector and again.config == trace.config
    assert "connector" not in Trace(SchedulerConfig()).to_dict()  # left out when empty: old traces unchanged


@pytest.mark.parametrize(("connector", "config", "where"), [
    ([{"request": "Z"}], {}, "connector.requests[0].request"),
    ([{"request": "A", "load_steps": 0}], {}, "connector.requests[0].load_steps"),
    ([{"request": "A", "failed_blocks": "1"}], {}, "connector.requests[0].failed_blocks"),
    ([{"request": "A", "colour": 1}], {}, "connector.requests[0].colour"),
    ([{"request": "A"}], {"kv_connector": False}, "connector"),
    ([], {"kv_load_failure_policy": "retry"}, "config.kv_load_failure_policy"),
    ([], {"max_loras": 2}, "config.kv_connector"),  # the connector's waiting pass plans no adapter
    ([], {"encoder_compute_budget": 64, "encoder_cache_size": 64}, "config.kv_connector"),
])
def test_bad_connector_input_names_the_field(connector, config, where):
    with pytest.raises(InputError) as err:
        _trace(connector, **config)
    assert err.value.where == where


def _run(trace: Trace):
    run = run_trace(trace, ConnectorScheduler)
    assert run.drained
    return run


def test_async_load_waits_then_runs():
    run = _run(_trace([{"request": "A", "external_tokens": 16, "load_async": True, "load_steps": 3}]))
    loading = [r.step for r in run.records if "A" in (r.after.kv_transfers or {})]
    first_run = min(r.step for r in run.records if any(s.request_id == "A" for s in r.output.scheduled))
    assert loading == [0, 1] and first_run == 3  # reported in step 2's outcome, promoted in step 3
    assert run.records[0].after.statuses["A"] is Status.WAITING_FOR_REMOTE_KV
    first = next(s for s in run.records[3].output.scheduled if s.request_id == "A")
    assert first.num_tokens == 4  # the 16 loaded tokens count as computed: 4 left of 20


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_failed_load_cuts_or_fails(policy):
    run = _run(_trace([{"request": "A", "external_tokens": 16, "load_async": True, "failed_blocks": [2]}],
                      kv_load_failure_policy=policy))
    reported = run.records[0].after
    assert reported.kv_reported["A"].failed == (run.records[0].mid.seqs["A#0"].blocks[2],)
    if policy == "fail":
        assert [(f.request_id, f.status) for f in run.records[0].finished] == [("A", Status.FINISHED_ERROR)]
        assert not reported.seqs["A#0"].blocks
    else:
        assert reported.seqs["A#0"].num_computed == 8  # cut at its first failed block (index 2, 4 tokens each)
        first = next(s for r in run.records for s in r.output.scheduled if s.request_id == "A")
        assert first.num_tokens == 12


def test_delayed_free_returns_when_the_send_finishes():
    run = _run(_trace([{"request": "B", "send_steps": 2}]))
    done = next(r.step for r in run.records if any(f.request_id == "B" for f in r.finished))
    held = [r.step for r in run.records if r.step >= done and r.after.seqs["B#0"].blocks]
    assert held == [done, done + 1]  # reported in the outcome of the 2nd step after the finish
    assert not run.records[-1].after.seqs["B#0"].blocks


def test_abort_during_a_load_leaks_nothing():
    trace = _trace([{"request": "A", "external_tokens": 16, "load_async": True, "load_steps": 4}])
    trace = Trace.from_dict({**trace.to_dict(), "aborts": [{"step": 1, "request": "A"}]})
    run = _run(trace)
    assert run.records[1].after.seqs["A#0"].blocks  # the load still writes them
    assert not run.records[3].after.seqs["A#0"].blocks and run.records[-1].after.gpu_free == 16


CONNECTOR = get_profile("connector").invariants()


@settings(max_examples=300, database=None, derandomize=True, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck), deadline=None)
@given(connector_traces())
def _reference_passes(trace: Trace) -> None:
    assert violated(ConnectorScheduler, trace, invariants=CONNECTOR) == set()
    for r in run_trace(trace, ConnectorScheduler).records:
        for t in (r.after.kv_reported or {}).values():
            _SEEN[(t.kind, t.load_async, bool(t.failed), trace.config.kv_load_failure_policy)] += 1
        _SEEN["abort-while-loading"] += sum(1 for rid in r.aborted if rid in (r.before.kv_transfers or {}))


_SEEN: Counter = Counter()


def test_reference_passes_its_profile_and_reaches_every_path():
    _reference_passes()
    for path in [("load", True, False, "recompute"), ("load", False, False, "recompute"),
                 ("load", True, True, "recompute"), ("load", False, True, "recompute"),
                 ("load", True, True, "fail"), ("load", False, True, "fail"), ("send", False, False, "recompute"),
                 "abort-while-loading"]:
        assert _SEEN[path] > 0, f"the generator never reached {path}"


def test_kvc008_counts_the_block_a_running_step_opens():
    """KVC-008's bound is the blocks left once the step's running requests have theirs: at depth 1
    a running request's in-flight token holds its table's last slot, so its next step opens a block
    in schedule(). On this async-offload trace (the one KVC-008 of the 1000-trace async-offload run,
    vLLM and the reference in its terms agreeing) the step's schedule takes 1 of the 2 free blocks
    and the head needs 1 above the watermark's 1: it does not fit, and KVC-008 holds."""
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from reference_impl.kv_connector_scheduler import EngineConnectorAsyncV1

    trace = Trace.load(ROOT / "docs/traces/connector/async-running-step-opens-a-block.json")
    result = run_checked(SchedulerAdapter("engine-terms", EngineConnectorAsyncV1), trace,
                         get_profile("connector").invariants(), timeout=60, stop_at_first=False)
    assert "KVC-008" in {i.id for i in result.active} and not result.problem_ids, result.violations[:2]
    step9 = result.records[9]
    assert step9.before.gpu_free == 2 and not step9.output.ignored and len(step9.output.scheduled) == 2


def test_async_load_reservation_counts_only_inflight_prefills():
    """vLLM reserves for the requests in ``_inflight_prefills`` only (scheduler.py:3432-3436): a
    request admitted earlier in the same pass with its last prompt chunk is not one. On this
    remote-async+spec trace (a first trace of the 1000-trace run) r4's load fits beside it: the
    reference in vLLM's terms starts it in step 5, as vLLM does (it waited under the old rule)."""
    from conformance.selftest.campaigns.lockstep_connector import RecordingConnectorSpecV1

    trace = Trace.load(ROOT / "docs/traces/connector/spec-reservation-counts-inflight-prefills.json")
    run = run_trace(trace, RecordingConnectorSpecV1)
    assert run.records[5].after.statuses["r4"] is Status.WAITING_FOR_REMOTE_KV


def test_failed_block_drops_the_keys_a_sharing_request_computed_over_it():
    """The spec's rule for a failed synchronous load (``keeps_failed_blocks_cached`` off) also
    drops the keys of the blocks after the failed block in a request that shares it and redoes
    its step; vLLM keeps them (scheduler.py:3669-3670, 3759-3760), and SPD-007 sees r2#0's block
    keyed past its computed tokens. The first trace of fail-recompute+spec's SPD-007."""
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from conformance.selftest.campaigns.lockstep_connector import FINDINGS, RecordingConnectorSpecV1

    trace = Trace.load(ROOT / "docs/traces/connector/spec-shared-failed-block-keys.json")
    invariants = get_profile("connector").invariants()
    engine = run_checked(SchedulerAdapter("engine-terms", RecordingConnectorSpecV1), trace, invariants,
                         timeout=60, stop_at_first=False)
    spec = run_checked(SchedulerAdapter("spec-rule", FINDINGS["failed-blocks-stay-cached"][(False, True)]), trace,
                       invariants, timeout=60, stop_at_first=False)
    assert "SPD-007" in engine.problem_ids and "SPD-007" not in spec.problem_ids
    assert any("r2#0" in v.message for v in engine.violations if v.invariant_id == "SPD-007")
