"""`kvsched conform --workers N`: several isolated adapter processes, each its own seeded search,
one merged report that does not depend on timing, every problem shrunk once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.commands.arguments import available_cores, parse_workers
from conformance.commands.cli import main
from conformance.runner.workers import draw, quotas, worker_seed
from spec.errors import InputError
from spec.trace import Trace

TESTS = Path(__file__).parent
BROKEN = "broken_adapters:fork_without_incref"


def _conform(out: Path, *extra: str) -> tuple[int, dict]:
    report = out / "report.json"
    code = main(["conform", "--adapter", BROKEN, "--seed", "11", "--quiet", "--out", str(out), "--json", str(report),
                 *extra])
    return code, json.loads(report.read_text())


def _verdict(report: dict) -> dict:
    """The report without what legitimately varies between runs (time, where files were written)."""
    return {
        "examples": report["examples"], "steps": report["steps_checked"],
        "invariants": {r["id"]: (r["status"], r["exercised_steps"], r.get("message"), r.get("counterexample_steps"))
                       for r in report["invariants"]},
    }


def test_quotas_and_seeds_are_fixed_by_the_run_seed():
    assert quotas(10, 3) == [4, 3, 3] and sum(quotas(7, 7)) == 7 and quotas(2, 4) == [1, 1, 0, 0]
    assert worker_seed(5, 0) == worker_seed(5, 0) != worker_seed(5, 1) != worker_seed(6, 1)
    from conformance.generation.v0 import traces

    first = [t.to_json() for t in draw(traces(), worker_seed(3, 1), 40)]
    assert len(first) == 40 and first == [t.to_json() for t in draw(traces(), worker_seed(3, 1), 40)]
    assert first != [t.to_json() for t in draw(traces(), worker_seed(3, 0), 40)]


@pytest.mark.parametrize(("value", "expected"), [("1", 1), ("3", 3), ("auto", None), (" AUTO ", None)])
def test_workers_flag(value, expected):
    assert parse_workers(value) == (expected or available_cores())


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5", "100000"])
def test_bad_workers_flag_is_one_line(value, capsys):
    with pytest.raises(InputError) as err:
        parse_workers(value)
    assert err.value.where == "--workers"
    assert main(["conform", "--adapter", "reference", "--workers", value]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_two_workers_give_the_same_verdict_every_run_and_shrink_each_problem_once(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    code_a, a = _conform(tmp_path / "a", "--max-examples", "60", "--workers", "2")
    code_b, b = _conform(tmp_path / "b", "--max-examples", "60", "--workers", "2")
    assert code_a == code_b == 1 and a["examples"] == 60
    assert _verdict(a) == _verdict(b)
    failing = [r["id"] for r in a["invariants"] if r["status"] == "fail"]
    assert "BLK-003" in failing
    for problem in failing:  # one shrunk counterexample per problem, the same trace in both runs
        left = Trace.load(tmp_path / "a" / "counterexamples" / f"{problem}.json")
        right = Trace.load(tmp_path / "b" / "counterexamples" / f"{problem}.json")
        assert left.meta["shrunk"] and left.to_dict() | {"meta": {}} == right.to_dict() | {"meta": {}}
    assert sorted(p.stem for p in (tmp_path / "a" / "counterexamples").glob("*.json")) == sorted(failing)
    assert (tmp_path / "a" / "adapter-output-1.log").exists(), "each worker logs beside the first"


def test_a_fault_in_one_worker_is_a_counterexample_not_a_hang(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    report = tmp_path / "r.json"
    started = time.monotonic()
    code = main(["conform", "--adapter", "fault_adapters:hangs", "--max-examples", "6", "--seed", "3", "--quiet",
                 "--timeout", "1", "--workers", "2", "--out", str(tmp_path / "o"), "--json", str(report)])
    rows = {r["id"]: r for r in json.loads(report.read_text())["invariants"]}
    assert code == 1 and rows["FAULT-hang"]["status"] == "fail"
    assert time.monotonic() - started < 60


def test_interrupted_parallel_run_keeps_its_failure(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "conformance", "conform", "--adapter", BROKEN, "--max-examples", "100000",
           "--seed", "5", "--quiet", "--workers", "2", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    saved = out / "counterexamples" / "BLK-003.json"
    deadline = time.monotonic() + 240
    while not saved.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert saved.exists()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "interrupted" in stdout and "Traceback" not in stderr, stdout + stderr
    assert Trace.load(saved).meta["problem"] == "BLK-003"


def test_pytest_plugin_honours_workers(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    (tmp_path / "test_nothing.py").write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--kvsched-adapter={BROKEN}",
         "--kvsched-examples=30", "--kvsched-seed=2", "--kvsched-workers=2", f"--kvsched-out={tmp_path / 'o'}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1 and "kvsched[BLK-003]" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert (tmp_path / "o" / "adapter-output-1.log").exists() or (tmp_path / "o" / "counterexamples").exists()


def test_the_first_worker_searches_while_the_others_start(tmp_path, monkeypatch):
    """Each worker's child starts in its own worker's thread: a slow start of the second delays
    only the second, so two workers find the first problem no later than one would."""
    from conformance.flows.profiles import get_profile
    from conformance.runner.fuzz import fuzz
    from conformance.runner.isolated import ChildRunner
    from conformance.runner.plan import RunPlan

    monkeypatch.setenv("KVSCHED_TEST_FIRST_LOAD", str(tmp_path / "first-load"))
    monkeypatch.setenv("KVSCHED_TEST_SLOW_START", "30")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    runner = ChildRunner("slow_clone_adapters:broken")
    runner.start()
    found: list[float] = []
    started = time.monotonic()

    def stop_when(problems: frozenset[str]) -> bool:
        if problems and not found:
            found.append(time.monotonic() - started)
            (tmp_path / "found").touch()  # later loads (the shrink's restart) start at once
        return bool(problems)

    try:
        result = fuzz(runner, RunPlan(get_profile("safety"), max_examples=200, seed=3, out_dir=tmp_path / "out", workers=2, timeout=60), stop_when=stop_when)
    finally:
        runner.close()
    assert result.findings and found and found[0] < 20, (found, result.findings.keys())
    assert time.monotonic() - started < 25  # the slow child was ended, not waited for
