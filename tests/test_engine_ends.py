"""Issue 34 item 2: a request the client did not abort ends by its stop, its length, a refusal or an
ignore, or as an engine error with its reason. REQ-007 (safety) holds an unasked abort to its
reason; LIV-004 (liveness) finds an engine-ended request that fits; LEN-004 (safety) a length cap
before the length. Mutants: aborts-victims, errors-victims, caps-one-early (tests/test_mutants.py);
zoo: errors_correctly and its twin (tests/test_zoo.py)."""

from __future__ import annotations

import pytest
from zoo._adapter import zoo_adapter

from conformance.generation.v0 import sample_traces, traces
from conformance.runner.driver import run_checked
from conformance.selftest.mutants import MUTANTS
from conformance.wire.client import WireError
from conformance.wire.codec import finished_from_json
from spec.catalogue import get
from spec.status import Status


def test_an_engine_error_travels_over_the_wire_with_its_reason():
    done = finished_from_json({"request": "r0", "status": "FINISHED_ABORTED",
                               "reason": {"kind": "engine_error", "numbers": {"error": "out of blocks"}}}, "update[0]")
    assert done.status is Status.FINISHED_ABORTED and done.reason.kind == "engine_error"
    assert done.reason.text() == "r0 ended by the engine: out of blocks"
    with pytest.raises(WireError, match=r"update\[0\]\.reason"):
        finished_from_json({"request": "r0", "status": "FINISHED_ABORTED", "reason": "oops"}, "update[0]")


def test_which_half_is_safety_and_which_liveness():
    assert get("REQ-007").category == "safety" and get("LEN-004").category == "safety"
    assert get("LIV-004").category == "liveness"


def test_an_unasked_abort_without_a_reason_fails_safety_and_with_one_only_liveness():
    checked = [get("REQ-007"), get("LIV-004")]
    found = {"aborts-victims": set(), "errors-victims": set()}
    for trace in sample_traces(traces(), 200, 3):
        for name in found:
            adapter = zoo_adapter(name, MUTANTS[name].factory)
            found[name] |= run_checked(adapter, trace, checked, timeout=None, stop_at_first=False).problem_ids
    assert found["aborts-victims"] == {"REQ-007", "LIV-004"}
    assert found["errors-victims"] == {"LIV-004"}
