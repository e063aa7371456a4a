"""vLLM 0.33.0's V1 Scheduler with the scripted KV connector (conformance/targets/hosts/
vllm_kv_connector.py), in strict lockstep with the connector reference in vLLM's terms, on a few
traces of every path of conformance/selftest/campaigns/lockstep_connector.py, and the own-reservation
stall found by the hunt (docs/CONNECTORS.md, section 6) reproduced on the engine. Skips unless
``kvsched targets install vllm-v1`` has run."""

from __future__ import annotations

import pytest

from conformance.selftest.campaigns.async_smoke import async_installed

pytestmark = pytest.mark.skipif(not async_installed(), reason="vllm-v1 target not installed")


@pytest.fixture(scope="module")
def adapter():  # type: ignore[no-untyped-def]
    from conformance.runner.adapter import load_adapter

    # Not closed at the end: its host stays in the wire's pool (shut down at exit) for the next
    # file that drives vllm-v1, rather than each file paying vLLM's start again.
    return load_adapter("vllm-v1")


@pytest.mark.parametrize("path", ["remote-sync", "remote-async", "offload", "fail-recompute", "fail-fail",
                                  "delayed-free"])
def test_engine_agrees_with_the_reference(adapter, path: str) -> None:
    from conformance.flows.profiles import get_profile
    from conformance.generation.v0 import sample_traces
    from conformance.selftest.campaigns.lockstep_connector import CLASSES, RecordingConnectorV1, classify, path_strategy
    from conformance.selftest.campaigns.lockstep_v1 import run_one

    reached = 0
    for trace in sample_traces(path_strategy(path), 6, 7):
        outcome = run_one(adapter, trace, get_profile("safety").invariants(), reference=RecordingConnectorV1)
        cls = classify(outcome)  # None: agrees; else a classified engine deviation (set-order frees)
        assert cls is None or cls in CLASSES, outcome.describe()
        reached += sum(bool(r.after.kv_reported) for r in outcome.result.records)
    assert reached, f"no transfer was reported on the {path} path"


@pytest.mark.parametrize("path", ["remote-async+spec", "fail-recompute+spec"])
def test_engine_agrees_with_the_reference_with_drafts(adapter, path: str) -> None:
    """The +spec paths: drafts beside the connector against the reference with the speculative
    lockstep's vLLM knobs and vLLM's speculative-step reservation (`RecordingConnectorSpecV1`);
    every trace agrees or is classified, and drafts were scheduled."""
    from conformance.flows.profiles import get_profile
    from conformance.generation.v0 import sample_traces
    from conformance.selftest.campaigns.lockstep_connector import CLASSES, classify, path_strategy, run_one

    drafted = 0
    for trace in sample_traces(path_strategy(path), 4, 7):
        outcome = run_one(adapter, trace, get_profile("safety").invariants(), path)
        cls = classify(outcome)
        assert cls is None or cls in CLASSES, outcome.describe()
        drafted += sum(s.num_drafts for r in outcome.result.records for s in r.output.scheduled)
    assert drafted, f"no draft was scheduled on the {path} path"


def test_retried_load_stalls_on_its_own_reservation(adapter) -> None:
    from pathlib import Path

    from conformance.flows.profiles import get_profile
    from conformance.runner.driver import run_checked
    from spec.trace import Trace

    trace = Trace.load(Path(__file__).resolve().parent.parent / "docs/traces/connector/own-reservation-stall.json")
    result = run_checked(adapter, trace, get_profile("connector").invariants(), timeout=120)
    assert {"KVC-009", "LIV-003"} <= result.problem_ids, result.problem_ids


def test_speculative_decoding_beside_the_connector_runs(adapter) -> None:
    """With num_speculative_tokens > 0 and a connector, the host's drafter reads the step's batch,
    not every request it reports on (it raised on every such trace before): a few hunt traces run
    to their end with no fault."""
    from conformance.flows.profiles import invariants_of
    from conformance.generation.v0 import sample_traces
    from conformance.runner.driver import run_checked
    from conformance.selftest.campaigns.connector_hunt import hunt_traces

    drafted = 0
    for trace in sample_traces(hunt_traces(2), 4, 11):
        result = run_checked(adapter, trace, invariants_of(["safety", "liveness", "connector"]), timeout=120)
        assert result.fault is None, result.fault
        drafted += sum(s.num_drafts for r in result.records for s in r.output.scheduled)
    assert drafted, "no step scheduled a draft"


def test_async_load_stalls_on_its_own_speculative_step(adapter) -> None:
    """The candidate finding of the spec-decode hunt (docs/CONNECTORS.md, section 7): one request
    of 3 tokens loading 2 asynchronously, a pool of 2 blocks, k = 2: vLLM reserves the load's own
    speculative step beside it and never admits it; the spec's reference serves it."""
    from pathlib import Path

    from conformance.flows.profiles import invariants_of
    from conformance.runner.driver import run_checked
    from reference_impl.engine import run_trace
    from reference_impl.kv_connector_scheduler import ConnectorScheduler
    from spec.trace import Trace

    trace = Trace.load(Path(__file__).resolve().parent.parent / "docs/traces/connector/spec-step-reservation-stall.json")
    result = run_checked(adapter, trace, invariants_of(["safety", "liveness", "connector"]), timeout=120)
    assert {"LIV-001", "LIV-003"} <= result.problem_ids, result.problem_ids
    assert run_trace(trace, ConnectorScheduler).drained


@pytest.mark.parametrize("name", ["spec-failed-load-pads-admission", "spec-failed-load-pads-admission-left-out"])
def test_failed_load_pads_admission_is_classified(adapter, name: str) -> None:
    """fail-recompute+spec traces of class failed-load-pads-admission: after a failed synchronous
    load vLLM pads a one-token admission to 1 + k beside the failed request's recompute (its stale
    ``is_prefill_chunk``, scheduler.py:998, 1308-1330), or, with the budget left short of 1 + k,
    leaves it out (:1326-1328); the classifier recognises both."""
    from pathlib import Path

    from conformance.flows.profiles import get_profile
    from conformance.selftest.campaigns.lockstep_connector import classify, run_one
    from spec.trace import Trace

    trace = Trace.load(Path(__file__).resolve().parent.parent / "docs/traces/connector" / f"{name}.json")
    outcome = run_one(adapter, trace, get_profile("connector").invariants(), "fail-recompute+spec")
    assert classify(outcome) == "failed-load-pads-admission", outcome.describe()


def test_a_failed_loads_recompute_is_chunked_without_chunked_prefill(adapter) -> None:
    """r3 hits r1's first block in the step whose outcome reports r1's synchronous load failed on
    it, so r3 redoes its step: a 12-token recompute, running. With chunked prefill off vLLM's running
    loop still gives it the 10 tokens the budget leaves (scheduler.py:838-847; only the waiting loop
    reads the flag, :1337-1344), breaking BUD-004 and REQ-004 in step with the reference in its
    terms; the spec's reference runs it whole a step later, and so does the finding's fixed one."""
    from pathlib import Path

    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from conformance.selftest.campaigns.lockstep_connector import FINDINGS, classify, explain_violations, run_one
    from reference_impl.kv_connector_scheduler import ConnectorScheduler
    from spec.trace import Trace

    trace = Trace.load(Path(__file__).resolve().parent.parent
                       / "docs/traces/connector/recompute-chunked-without-chunked-prefill.json")
    invariants = get_profile("connector").invariants()
    engine = run_one(adapter, trace, invariants, "fail-recompute")
    assert classify(engine) is None, engine.describe()
    assert {"BUD-004", "REQ-004"} <= engine.result.problem_ids, engine.result.problem_ids
    why = explain_violations(trace, "fail-recompute", engine.result.problem_ids - {"LOCKSTEP"}, invariants)
    assert why.get("BUD-004") == why.get("REQ-004") == "recompute-chunked-without-chunked-prefill", why
    for reference in (ConnectorScheduler, FINDINGS["recompute-chunked-without-chunked-prefill"][(False, False)]):
        result = run_checked(SchedulerAdapter("reference", reference), trace, invariants, timeout=60, stop_at_first=False)
        assert not result.problem_ids & {"BUD-004", "REQ-004"}, (reference, result.problem_ids)


def test_a_later_request_reads_a_failed_block_before_its_owner_recomputed_it(adapter) -> None:
    """The hunt of failed_block_readers (docs/CONNECTORS.md section 8): under the recompute policy vLLM
    keeps a failed block keyed (scheduler.py:3755-3760); the owner's recompute, one token a step under
    the long-prefill threshold, has rewritten 3 of its 4 positions when a request with the same prompt
    arrives, hits it and runs a chunk from position 12: it attends to position 3, garbage (KVC-011,
    the rule the hunt led to).
    The spec's reference drops the failed block's key, and nothing reads it there."""
    import json
    from pathlib import Path

    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from reference_impl.v1_scheduler import V1Scheduler
    from spec.trace import Trace

    trace = Trace.from_dict(json.loads((Path(__file__).resolve().parent.parent / "docs" / "traces" / "connector" /
                                        "failed-block-read-before-recompute.json").read_text()))
    invariants = get_profile("connector").invariants()
    result = run_checked(adapter, trace, invariants, timeout=60, stop_at_first=False)
    reads = [(v.step, v.message) for v in result.violations if v.invariant_id == "KVC-011"]
    assert reads[0] == (3, "sharer#0's chunk from position 12 attends to block 0 (table index 0) from position 3, "
                           "which a failed load left invalid and nothing has computed again")
    spec = run_checked(SchedulerAdapter("reference-v1", V1Scheduler), trace, invariants, timeout=60, stop_at_first=False)
    assert "KVC-011" not in spec.problem_ids
