"""The conformance runner: correct adapters conform, broken ones are caught with short traces,
and misbehaving adapters are reported without the runner crashing or losing evidence."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance.commands.cli import main
from conformance.flows.profiles import get_profile
from conformance.runner.adapter import load_adapter
from conformance.runner.fuzz import fuzz
from conformance.runner.plan import RunPlan

TESTS = Path(__file__).parent


def _fuzz(spec: str, profile: str, tmp_path: Path, examples: int = 150, **kw):
    sys.path.insert(0, str(TESTS))
    try:
        return fuzz(lambda: load_adapter(spec), RunPlan(get_profile(profile), max_examples=examples, seed=7, out_dir=tmp_path, **kw))
    finally:
        sys.path.remove(str(TESTS))


def test_reference_conforms_to_its_own_profile(tmp_path):
    result = _fuzz("reference", "vllm-v0", tmp_path, examples=150)
    assert result.findings == {}
    assert result.lockstep
    # Only the invariants that read token ids (prefix cache, PIP-001), in-flight counters (a synchronous
    # scheduler has none), KV groups beside group 0, an encoder cache, LoRA slots, a pause, a KV connector,
    # grammar waits or streaming sessions (V0 has none of these) need what a V0 scheduler does not have.
    from spec.catalogue import get
    from spec.observation import Capability

    v0_lacks = {Capability.PREFIX_CACHE, Capability.IN_FLIGHT, Capability.KV_GROUPS, Capability.ENCODER,
                Capability.LORA, Capability.PAUSE, Capability.KV_TRANSFERS, Capability.GRAMMAR,
                Capability.STREAMING}
    assert all(get(i).needs & v0_lacks for i in result.not_applicable), \
        result.not_applicable
    assert result.steps_checked > 500


def test_only_the_chosen_problems_are_shrunk(tmp_path):
    """``shrink_only`` (the museum's: an exhibit's expected invariants) leaves every other problem
    with the trace it was found with, marked unshrunk and on disk; the chosen one is shrunk."""
    sys.path.insert(0, str(TESTS))
    try:
        result = fuzz(lambda: load_adapter("broken_adapters:fork_without_incref"),
                      RunPlan(get_profile("safety"), max_examples=60, seed=7, out_dir=tmp_path),
                      stop_when=lambda problems: "BLK-003" in problems, shrink_only={"BLK-003"}.__contains__)
    finally:
        sys.path.remove(str(TESTS))
    assert result.findings["BLK-003"].shrunk
    others = [f for p, f in result.findings.items() if p != "BLK-003"]
    assert others and all(not f.shrunk and f.path.exists() for f in others)


@pytest.fixture(scope="module")
def victim_run(tmp_path_factory):
    """One run of a policy-breaking adapter, shared by the tests that read it."""
    return _fuzz("broken_adapters:victim_from_head", "vllm-v0", tmp_path_factory.mktemp("victim"), examples=150)


@pytest.mark.parametrize(
    ("spec", "profile", "expected"),
    [
        ("broken_adapters:fork_without_incref", "safety", "BLK-003"),
        ("broken_adapters:victim_from_head", "vllm-v0", "POL-003"),
        ("broken_adapters:never_fits_waits", "liveness", "LIV-003"),
    ],
)
def test_broken_adapters_are_caught_with_short_traces(tmp_path, victim_run, spec, profile, expected):
    if spec.endswith("victim_from_head"):
        result, tmp_path = victim_run, victim_run.findings[expected].path.parent.parent
    else:
        result = _fuzz(spec, profile, tmp_path, examples=150)
    assert expected in result.findings
    finding = result.findings[expected]
    assert finding.steps <= 10
    assert finding.path is not None and finding.path.exists()
    saved = json.loads(finding.path.read_text())
    assert saved["version"] == 1 and saved["meta"]["problem"] == expected
    assert (tmp_path / "found" / f"{expected}.json").exists(), "the first failing trace is kept before shrinking"


def test_lockstep_reports_the_divergence_with_the_reference_reasons(victim_run):
    assert "LOCKSTEP" in victim_run.findings
    message = victim_run.findings["LOCKSTEP"].message
    assert "reference:" in message and "target:" in message and "because" in message


@pytest.mark.parametrize(("spec", "kind"), [("raises", "raised"), ("hangs", "hang"), ("garbage", "malformed")])
def test_fault_matrix_is_reported_and_survived(tmp_path, spec, kind):
    result = _fuzz(f"broken_adapters:{spec}", "safety", tmp_path, examples=20, timeout=0.5)
    finding = result.findings[f"FAULT-{kind}"]
    assert finding.path.exists() and finding.steps <= 10
    assert "step" in finding.message


def test_missing_observations_are_not_applicable_never_pass(tmp_path):
    result = _fuzz("broken_adapters:outputs_only", "safety", tmp_path, examples=30)
    assert "BLK-001" in result.not_applicable and "RES-001" in result.not_applicable
    assert "BUD-001" in result.active  # output-only invariants still run
    from conformance.reports.report import rows

    statuses = {r["id"]: r["status"] for r in rows(result)}
    assert statuses["BLK-001"] == "not_applicable" and statuses["BUD-001"] == "pass"


def test_cli_conform_reports_json_and_junit(tmp_path, capsys):
    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["conform", "--adapter", "reference", "--max-examples", "40", "--seed", "3", "--quiet",
                 "--json", str(report), "--junit", str(junit), "--out", str(tmp_path / "out")])
    assert code == 0
    data = json.loads(report.read_text())
    assert data["version"] == 1 and data["adapter"] == "reference" and data["seed"] == 3
    assert data["conforming"] and data["summary"]["fail"] == 0
    assert {"invariant_steps", "lifecycle_edges"} <= set(data["coverage"])
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and int(suite.get("failures")) == 0 and int(suite.get("tests")) >= 40
    assert "lifecycle edge" in capsys.readouterr().out  # the coverage line is printed


def test_cli_finding_exits_1_and_replay_reproduces(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(TESTS))
    out = tmp_path / "out"
    code = main(["conform", "--adapter", "broken_adapters:fork_without_incref", "--max-examples", "100",
                 "--seed", "1", "--quiet", "--out", str(out)])
    assert code == 1
    trace = out / "counterexamples" / "BLK-003.json"
    assert main(["replay", str(trace), "--adapter", "broken_adapters:fork_without_incref"]) == 1
    assert "VIOLATION BLK-003" in capsys.readouterr().out
    assert main(["replay", str(trace), "--adapter", "reference", "--profile", "safety"]) == 0


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["conform", "--adapter", "nope"], "--adapter"),
        (["conform", "--adapter", "no_such_module:make"], "--adapter"),
        (["conform", "--adapter", "reference", "--profile", "x"], "--profile"),
        (["conform", "--adapter", "reference", "--max-examples", "0"], "--max-examples"),
        (["replay", "/nonexistent.json"], "no such file"),
    ],
)
def test_cli_usage_errors_are_one_line(argv, where, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert where in err and err.count("\n") == 1 and "Traceback" not in err


def test_pytest_plugin_gives_one_test_per_invariant(tmp_path):
    (tmp_path / "test_placeholder.py").write_text("def test_ok():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kvsched-adapter=broken_adapters:fork_without_incref",
         "--kvsched-examples=60", "--kvsched-seed=1", f"--kvsched-out={tmp_path / 'out'}", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "kvsched[BLK-003]" in proc.stdout and "replay: kvsched replay" in proc.stdout
    assert " passed" in proc.stdout and " failed" in proc.stdout


def test_pytest_plugin_takes_skips_and_expectations(tmp_path):
    """--kvsched-expect: the file's known failures are xfail (an expected one that does not show
    is XPASS, not a failure) and its skips skipped; --kvsched-skip adds skips; with every failure
    expected the session passes."""
    (tmp_path / "test_placeholder.py").write_text("def test_ok():\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    base = [sys.executable, "-m", "pytest", "-q", "-rfxXs", "-p", "no:cacheprovider",
            "--kvsched-adapter=broken_adapters:fork_without_incref", "--kvsched-examples=60", "--kvsched-seed=1",
            f"--kvsched-out={tmp_path / 'out'}", str(tmp_path)]
    first = subprocess.run(base, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    failing = sorted(set(re.findall(r"FAILED ::kvsched\[([A-Z]+-\d+)\]", first.stdout)))
    assert first.returncode == 1 and "BLK-003" in failing, first.stdout[-3000:]
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"version": 1, "expected": [{"id": i, "reason": "known"} for i in [*failing, "SWP-001"]],
                                  "skip": [{"id": "BUD-001", "reason": "not ours"}]}))
    second = subprocess.run([*base, f"--kvsched-expect={expect}", "--kvsched-skip=BUD-002"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    assert "xfailed" in second.stdout and "xpassed" in second.stdout and "skipped" in second.stdout
    assert "not ours" in second.stdout and "--skip" in second.stdout
    bad = subprocess.run([*base, "--kvsched-skip=NOPE-9"], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=600)
    assert bad.returncode == 4 and "--kvsched-skip" in bad.stderr and "INTERNALERROR" not in bad.stdout + bad.stderr
