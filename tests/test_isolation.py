"""Adapters run in a child process the runner owns: whatever one does (raise, hang with signals
blocked, swallow every exception, exit 0 or 3, os._exit, segfault, eat memory, print without
end, return None or absurd numbers) ends in a FAULT counterexample with exit 1, never a pass,
a hang or a traceback; a violation does not hide a later one; a found failure survives Ctrl-C
and is found again by the next run with the same --out."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.commands.cli import main
from conformance.flows.profiles import get_profile
from conformance.runner.driver import run_checked
from conformance.runner.isolated import ChildRunner, Limits
from spec.trace import Trace

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from fault_adapters import MATRIX  # noqa: E402


def _conform(spec: str, out: Path, *extra: str) -> tuple[int, dict]:
    report = out / "report.json"
    code = main(["conform", "--adapter", spec, "--max-examples", "5", "--seed", "3", "--quiet", "--timeout", "1",
                 "--max-memory", "512", "--out", str(out), "--json", str(report), *extra])
    return code, json.loads(report.read_text()) if report.exists() else {}


@pytest.mark.parametrize("name", [*MATRIX, "none_in_snapshot"])
def test_every_fault_ends_in_a_fault_counterexample_with_exit_1(tmp_path, monkeypatch, name):
    monkeypatch.syspath_prepend(str(TESTS))
    expected = MATRIX[name][1] if name in MATRIX else "FAULT-malformed"
    started = time.monotonic()
    code, report = _conform(f"fault_adapters:{name}", tmp_path)
    assert code == 1
    rows = {r["id"]: r for r in report["invariants"]}
    assert rows[expected]["status"] == "fail", rows.get(expected)
    saved = Trace.load(rows[expected]["counterexample"])
    assert saved.meta["problem"] == expected and saved.meta["adapter_spec"] == f"fault_adapters:{name}"
    assert saved.max_steps <= 10, saved.meta  # meta: shrunk, flaky, the message
    if name != "os_exit" and expected not in ("FAULT-malformed", "FAULT-output"):  # the adapter's file:line (os._exit leaves none)
        assert "fault_adapters.py:" in rows[expected]["location"], rows[expected]
    assert time.monotonic() - started < 90


def test_a_hang_is_reported_within_the_timeout_plus_one_second(tmp_path):
    runner = ChildRunner("fault_adapters:hangs", Limits(timeout=1.0))  # TESTS is on sys.path: the child's too
    try:
        runner.start()
        trace = Trace.from_dict({"version": 1, "config": {}, "requests": [
            {"id": "r0", "prompt_len": 3, "max_tokens": 8}], "max_steps": 10})
        started = time.monotonic()
        summary = runner.run(trace, [inv.id for inv in get_profile("safety").invariants()])
        elapsed = time.monotonic() - started
    finally:
        runner.close()
    assert "FAULT-hang" in summary.problems and summary.problems["FAULT-hang"].step == 2
    assert elapsed < 1.0 + 1.0, elapsed


def test_a_violation_does_not_hide_a_later_one():
    from fault_adapters import two_bugs

    trace = Trace.from_dict({"version": 1, "config": {}, "requests": [
        {"id": "r0", "prompt_len": 3, "max_tokens": 2}, {"id": "r1", "prompt_len": 2, "max_tokens": 6, "arrival_step": 1}],
        "max_steps": 30})
    result = run_checked(two_bugs(), trace, get_profile("safety").invariants(), stop_at_first=False)
    first = {}
    for v in result.violations:
        first.setdefault(v.invariant_id, v.step)
    assert first["OUT-001"] == 1 and first["REQ-001"] > 3, first


def test_the_adapters_output_stays_out_of_the_report(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "conform", "--adapter", "fault_adapters:chatty", "--max-examples", "10",
         "--seed", "1", "--quiet", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CHATTY" not in proc.stdout and "CHATTY" not in proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "CHATTY: scheduling" in (tmp_path / "out" / "adapter-output.log").read_text()


def test_examples_never_exceed_max_examples(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    code, report = _conform("broken_adapters:fork_without_incref", tmp_path, "--max-examples", "7")
    assert code == 1 and report["examples"] == 7


def _expectations(path: Path, expected: list[str], skip: list[str] = ()) -> Path:
    path.write_text(json.dumps({"version": 1, "expected": [{"id": i, "reason": "known"} for i in expected],
                                "skip": [{"id": i, "reason": "not ours"} for i in skip]}))
    return path


def test_expected_failures_and_skips(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    spec = "broken_adapters:fork_without_incref"
    code, report = _conform(spec, tmp_path / "a", "--max-examples", "60")
    assert code == 1
    failing = [r["id"] for r in report["invariants"] if r["status"] == "fail"]
    assert "BLK-003" in failing
    # Every failure expected, plus one that will not show: exit 0, statuses say which is which.
    expect = _expectations(tmp_path / "expect.json", [*failing, "SWP-001"], skip=["BUD-001"])
    code, report = _conform(spec, tmp_path / "b", "--max-examples", "60", "--expect", str(expect))
    statuses = {r["id"]: r["status"] for r in report["invariants"]}
    assert code == 0 and report["conforming"]
    assert statuses["BLK-003"] == "expected" and statuses["SWP-001"] == "unexpected_pass"
    assert statuses["BUD-001"] == "skipped"
    assert (tmp_path / "b" / "counterexamples" / "BLK-003.json").exists(), "an expected failure is still saved"
    code, report = _conform(spec, tmp_path / "c", "--max-examples", "60", "--skip", ",".join(failing))
    assert code == 0 and {r["id"] for r in report["invariants"] if r["status"] == "skipped"} == set(failing)


@pytest.mark.parametrize("argv", [["--skip", "NOPE-1"], ["--expect", "/nonexistent.json"]])
def test_bad_skip_and_expect_are_one_line(argv, capsys):
    assert main(["conform", "--adapter", "reference", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_run_keeps_its_failure_and_a_rerun_finds_it_again(tmp_path, sig):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "conformance", "conform", "--adapter", "broken_adapters:fork_without_incref",
           "--max-examples", "100000", "--seed", "5", "--quiet", "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    saved = out / "counterexamples" / "BLK-003.json"
    deadline = time.monotonic() + 240
    while not saved.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert saved.exists(), "the failure is on disk as soon as it is found"
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stdout + stderr
    assert "interrupted" in stdout and "Traceback" not in stderr
    assert Trace.load(saved).meta["problem"] == "BLK-003"
    again = subprocess.run([*cmd[:cmd.index("100000")], "1", *cmd[cmd.index("100000") + 1:]],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "saved traces replayed first" in again.stdout and "BLK-003" in again.stdout


def test_printed_replay_command_runs_as_printed(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "conformance", "conform", "--adapter", "broken_adapters:fork_without_incref",
         "--max-examples", "60", "--seed", "1", "--quiet", "--out", "out"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 1
    commands = [line.split("replay: ", 1)[1].removesuffix(" (not shrunk: the run was interrupted)")
                for line in proc.stdout.splitlines() if line.strip().startswith("replay: ")]
    assert commands
    for command in commands:
        assert shlex.split(command)[0] == "kvsched"
        if shutil.which("kvsched") is None:  # not installed as a command here: the same program by module
            command = f"{shlex.quote(sys.executable)} -m conformance{command.removeprefix('kvsched')}"
        replay = subprocess.run(command, shell=True, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        assert replay.returncode == 1 and "VIOLATION" in replay.stdout + replay.stderr, replay.stdout + replay.stderr


@pytest.mark.parametrize(("factory", "fault", "within"), [
    ("slow_reset_declared", None, 8.0),
    ("slow_reset_undeclared", "FAULT-hang", 2.5),
    ("reset_hangs_past_its_declared_time", "FAULT-hang", 4.0),
])
def test_a_declared_reset_time_is_honoured_and_still_bounded(factory, fault, within):
    """An engine built in reset (vLLM) may take longer than --timeout if the adapter declares it;
    every other call keeps --timeout, and a reset past its declared time is still a hang."""
    runner = ChildRunner(f"fault_adapters:{factory}", Limits(timeout=1.0))
    try:
        runner.start()
        trace = Trace.from_dict({"version": 1, "config": {}, "requests": [
            {"id": "r0", "prompt_len": 3, "max_tokens": 2}], "max_steps": 10})
        started = time.monotonic()
        summary = runner.run(trace, [inv.id for inv in get_profile("safety").invariants()])
        elapsed = time.monotonic() - started
    finally:
        runner.close()
    if fault is None:
        assert not summary.problems, summary.problems
    else:
        assert summary.problems[fault].step == 0 and "reset" in summary.problems[fault].message, summary.problems
    assert elapsed < within, elapsed


@pytest.mark.parametrize(("name", "kind"), [("hangs", "hang"), ("segfault", "crash"), ("exit_0", "exit")])
def test_replay_runs_the_adapter_in_a_child_too(tmp_path, capsys, name, kind):
    """`kvsched replay` of a trace that makes the adapter hang, crash or exit reports the FAULT,
    exit 1, within the timeout: the command's own process is never the adapter's."""
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"version": 1, "config": {}, "requests": [
        {"id": "r0", "prompt_len": 3, "max_tokens": 8}], "max_steps": 10}))
    started = time.monotonic()
    assert main(["replay", str(trace), "--adapter", f"fault_adapters:{name}", "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert f"ADAPTER FAULT at step 2: adapter {kind} in schedule" in out, out
    assert time.monotonic() - started < 10
