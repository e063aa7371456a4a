"""Batched aborts and the ``reset_prefix_cache`` admin call (issue 21): in traces, the reference,
the driver, the wire protocol (optional calls, announced in hello) and PFX-006."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.generation.v1 import token_traces
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from conformance.wire import WireAdapter
from conformance.wire.client import _Batch
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.status import Status
from spec.trace import Arrival, Trace
from spec.types import Request, StepOutcome

HOSTS = Path(__file__).parents[1] / "conformance" / "targets" / "hosts"
RAW = Path(__file__).parent / "wire_hosts" / "raw_host.py"
CONFIG = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2, max_num_batched_tokens=16,
                         max_model_len=12, watermark=0.0, preemption_mode="recompute", enable_prefix_caching=True)
PROMPT = (1, 2, 3, 4, 5, 6)


def _request(rid: str, max_tokens: int = 2) -> Request:
    return Request(rid, len(PROMPT), max_tokens, prompt_tokens=PROMPT)


def test_trace_fields_round_trip_and_bad_input_names_the_field():
    trace = Trace(CONFIG, (Arrival(0, _request("a")),), abort_batches=((1, ("a", "ghost")),),
                  admin=((3, "reset_prefix_cache"),))
    data = trace.to_dict()
    assert data["abort_batches"] == [{"step": 1, "requests": ["a", "ghost"]}]
    assert data["admin"] == [{"step": 3, "op": "reset_prefix_cache"}]
    assert Trace.from_dict(json.loads(json.dumps(data))) == trace
    assert "admin" not in Trace(CONFIG).to_dict()  # older traces read and write unchanged
    with pytest.raises(InputError) as err:
        Trace.from_dict({**data, "admin": [{"step": 1, "op": "flush"}]})
    assert err.value.where == "admin[0].op"
    with pytest.raises(InputError) as err:
        Trace.from_dict({**data, "abort_batches": [{"step": 1, "requests": []}]})
    assert err.value.where == "abort_batches[0].requests"


def test_reference_reset_refuses_while_blocks_are_held_and_empties_the_cache_otherwise():
    s = V1Scheduler(CONFIG)
    s.add_request(_request("a"))
    s.schedule()
    s.update(StepOutcome(frozenset()))
    assert s.reset_prefix_cache() is False  # "a" runs: its blocks are held
    assert any(k is not None for k in s.pool.keys)
    while not s.requests["a"].status.is_finished:
        s.schedule()
        s.update(StepOutcome(frozenset()))
    s.add_request(_request("b"))
    assert s._cache_hits(s.requests["b"])  # the same prompt hits the cache...
    assert s.reset_prefix_cache() is True
    assert all(k is None for k in s.pool.keys) and not s.pool.index
    assert not s._cache_hits(s.requests["b"])  # ...and no longer after the reset


def test_batched_abort_skips_unknown_and_finished_ids():
    s = V1Scheduler(CONFIG)
    for rid in ("a", "b"):
        s.add_request(_request(rid))
    assert s.abort_request("a") is not None
    done = s.abort_requests(["ghost", "a", "b"])
    assert [(f.request_id, f.status) for f in done] == [("b", Status.FINISHED_ABORTED)]


def test_fuzzed_traces_with_admin_calls_pass_on_the_reference():
    adapter = load_adapter("reference-v1")
    invariants = get_profile("vllm-v1").invariants()
    seen = set()
    for trace in sample_traces(token_traces("v1", resets=True, batch_aborts=True), 30, 11):
        result = run_checked(adapter, trace, invariants, lockstep=True, reference_factory=V1Scheduler)
        assert not result.failed, (result.problem_ids, result.violations[:1], result.divergence)
        seen |= {a for r in result.records for a in r.admin} | {"batch" for r in result.records if r.abort_batches}
    assert {("reset_prefix_cache", True), ("reset_prefix_cache", False), "batch"} <= seen


def _raw() -> WireAdapter:
    return WireAdapter("raw", [sys.executable, str(RAW)], profiles=("safety",), timeout=30)


def test_an_old_host_runs_batched_aborts_id_by_id_and_refuses_admin_calls_in_one_line():
    """A host that announces no optional calls (raw_host.py, written before them) still runs a
    trace with batched aborts (the runner sends their ids as single aborts, the same thing for the
    spec); a trace with an admin call is refused up front, naming the field."""
    adapter = _raw()
    trace = Trace(CONFIG, (Arrival(0, _request("a", 6)), Arrival(0, _request("b", 6))),
                  abort_batches=((1, ("ghost", "b")),), max_steps=30)
    result = run_checked(adapter, trace, get_profile("safety").invariants(), timeout=30)
    assert result.fault is None and not result.violations
    aborted = [f for r in result.records for f in r.finished if f.status is Status.FINISHED_ABORTED]
    assert [f.request_id for f in aborted] == ["b"]
    with pytest.raises(InputError) as err:
        run_checked(adapter, Trace(CONFIG, trace.arrivals, admin=((1, "reset_prefix_cache"),)),
                    get_profile("safety").invariants(), timeout=30)
    assert err.value.where == "admin[0].op" and "\n" not in str(err.value)
    adapter.close()


def test_the_client_sends_optional_calls_only_to_a_host_that_announced_them():
    trace = Trace(CONFIG, (Arrival(0, _request("a")),), abort_batches=((1, ("a", "ghost")),),
                  admin=((1, "reset_prefix_cache"),), max_steps=3)

    class Host:  # records the message instead of sending it
        def send(self, method, params):
            self.sent = params
            return 1

    sent = {}
    for calls in (frozenset(), frozenset({"abort_requests", "reset_prefix_cache"})):
        adapter = WireAdapter("spy", [sys.executable, "-c", "pass"])
        adapter.host, adapter.optional_calls = Host(), calls
        adapter._send_steps(_Batch(trace, observe=False, mid_step=False))
        sent[bool(calls)] = adapter.host.sent["steps"][1]
    assert sent[False]["abort"] == ["a", "ghost"] and "abort_batches" not in sent[False]
    assert sent[True]["abort"] == [] and sent[True]["abort_batches"] == [["a", "ghost"]]
    assert sent[True]["admin"] == ["reset_prefix_cache"]


def test_kvsched_host_announces_and_runs_the_optional_calls():
    sys.path.insert(0, str(HOSTS))
    import kvsched_host

    class Engine:
        def __init__(self):
            self.calls = []

        def add_request(self, request):
            return None

        def abort_requests(self, ids):
            self.calls.append(("abort_requests", ids))
            return [{"request": ids[0], "status": "FINISHED_ABORTED"}]

        def reset_prefix_cache(self):
            self.calls.append(("reset_prefix_cache",))
            return True

        def schedule(self):
            return {}

        def update(self, stopped):
            return []

    out = io.StringIO()
    kvsched_host.serve(Engine(), "spy", stdin=io.StringIO('{"id": 1, "method": "hello"}\n'), stdout=out)
    assert json.loads(out.getvalue())["result"]["optional_calls"] == ["abort_requests", "reset_prefix_cache"]
    engine, lines = Engine(), []
    kvsched_host._Steps(engine).run({"steps": [{"step": 0, "add": [{"id": "a"}], "abort": [],
                                                "abort_batches": [["a", "x"]], "admin": ["reset_prefix_cache"]}],
                                     "last_arrival_step": 0}, lines.append)
    assert engine.calls == [("abort_requests", ["a", "x"]), ("reset_prefix_cache",)]
    assert [c[0] for c in lines[0]["calls"]] == ["add_request", "abort_requests", "reset_prefix_cache",
                                                 "schedule", "update"]
