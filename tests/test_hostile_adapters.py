"""Issue 35, second round: 24 hostile adapters (`tests/hostile_adapters.py`, two of them wire hosts
of `tests/wire_hosts/helper_host.py`), none of which may pass, hang, or leave a process behind.

The corpus runs in a process of its own (``python tests/hostile_adapters.py``), four adapters at a
time, each in the child process the runner owns, under the signal router, as ``kvsched conform``
runs them: several of them signal their runner, and the test's own process must not be that
runner. For each adapter: the verdict the corpus names (a FAULT of the right kind, or the
invariant that catches it; nothing at all for the ones whose only attack is a process that
outlives them), within `BOUND_S` (no hang); then every process any adapter started is gone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from hostile_adapters import CORPUS  # noqa: E402

BOUND_S = 30.0


def test_all_24_hostile_adapters_get_their_verdict_promptly_and_leave_no_process(tmp_path):
    assert len(CORPUS) == 24
    pids = tmp_path / "pids"
    env = {**os.environ, "KVSCHED_TEST_PIDS": str(pids),
           "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(TESTS / "hostile_adapters.py")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    results = report["results"]
    wrong = {}
    for name, (_, expected) in CORPUS.items():
        got = results[name]
        if (expected and expected not in got["problems"]) or (not expected and got["problems"]):
            wrong[name] = got  # a false pass (or the wrong verdict)
        if got["seconds"] > BOUND_S:
            wrong[name] = {**got, "why": "too slow: a hang"}
    assert not wrong, wrong
    assert report["recorded"] == 6, report  # the process attacks ran (a trigger that never held is no pass)
    assert report["left"] == [], report
    assert "SIGTERM" in results["sigterm_to_runner"]["message"]
    assert "SIGUSR1" in results["sigusr1_to_runner"]["message"]
    assert "of the adapter's tree sent the runner SIGTERM" in results["grandchild_signals_runner"]["message"]
    assert "2 processes" in results["grandchild_memory"]["message"]
    assert "of the adapter's tree sent the runner SIGTERM" in results["host_signals_runner"]["message"]
    assert "str() and repr() raise" in results["str_raises"]["message"]
    assert "expected 2 (the step asked for)" in results["step_as_string"]["message"]


def test_checks_past_their_budget_end_the_trace_in_a_fault_budget():
    """The time half of item 1's budget: checks (not the adapter's calls) that take longer than
    ``check_budget`` end the trace in FAULT-budget; without a budget the same trace passes."""
    from conformance.flows.profiles import get_profile
    from conformance.runner.adapter import load_adapter
    from conformance.runner.driver import run_checked
    from spec.trace import Trace

    trace = Trace.from_dict({"version": 1, "config": {}, "requests": [{"id": "r0", "prompt_len": 3, "max_tokens": 4}],
                             "max_steps": 20})
    checks = get_profile("safety").invariants()
    spent = run_checked(load_adapter("reference"), trace, checks, timeout=None, stop_at_first=False, check_budget=0.0)
    assert spent.fault is not None and spent.fault.kind == "budget" and spent.fault_step == 0, spent.fault
    assert "past the budget of 0 s" in spent.fault.message
    plain = run_checked(load_adapter("reference"), trace, checks, timeout=None, stop_at_first=False)
    assert plain.fault is None and not plain.violations and plain.drained
