"""Per-target expectation files (conformance/targets/expectations/): each known deviation of a
real target is data with a reason and a source, read by default for that target, and a run's
report keeps new findings apart from expected ones (issue 21, item 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.reports.report import to_json
from conformance.runner.coverage import Coverage
from conformance.runner.expectations import TARGET_EXPECTATIONS_DIR, expectations_from_dict, target_expectations
from conformance.runner.fuzz import Finding, FuzzResult
from conformance.targets import TARGET_SPECS

FILES = sorted(TARGET_EXPECTATIONS_DIR.glob("*.json"))


def test_the_three_engines_of_issue_21_have_a_file():
    assert {"vllm-v0", "vllm-v1", "nano-vllm"} <= {p.stem for p in FILES}


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_each_file_is_valid_and_says_why_and_where(path):
    data = json.loads(path.read_text())
    assert path.stem in TARGET_SPECS and data["adapter"] == path.stem
    assert data["pinned"] == TARGET_SPECS[path.stem].version, "a file is about one pinned version"
    expectations = expectations_from_dict(data, str(path))  # ids are real, each has a reason
    for entry in data.get("expected", []):
        assert entry.get("source") and entry.get("kind"), f"{entry['id']}: name the engine's file and the kind"
    assert set(expectations.expected) == {e["id"] for e in data.get("expected", [])}


def test_a_target_reads_its_own_file_and_other_adapters_none():
    v0 = target_expectations("vllm-v0")
    assert v0.source and v0.source.endswith("vllm-v0.json")
    assert {"FAULT-raised", "SWP-001", "RES-005"} <= set(v0.expected)
    assert target_expectations("reference").expected == {} and target_expectations("reference").source is None
    assert target_expectations("tests/broken_adapters.py:make").source is None


def test_the_report_separates_new_findings_from_expected_ones():
    result = FuzzResult("vllm-v0", "safety", 1, examples=1, active=["RES-005", "BLK-001"],
                        expected={"RES-005": "known leak"}, expectations_file="x.json")
    result.coverage = Coverage(result.active)
    result.findings = {p: Finding(p, "m", None, 1) for p in ("RES-005", "BLK-001")}
    report = to_json(result)
    assert report["new_findings"] == ["BLK-001"] and report["expected_findings"] == ["RES-005"]
    assert report["expectations_file"] == "x.json" and not report["conforming"]


def test_expect_and_no_expect_are_one_choice(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "conformance", "conform", "--adapter", "reference", "--no-expect",
                           "--expect", str(tmp_path / "e.json")], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 2 and "not allowed with" in proc.stderr


def test_every_expected_fault_says_where_it_is_expected():
    """Every exception an engine raises is FAULT-raised: an entry without ``where`` would hide a
    new crash behind the known one."""
    for path in FILES:
        for entry in json.loads(path.read_text()).get("expected", []):
            if entry["id"].startswith("FAULT-"):
                assert entry.get("where"), f"{path.name}: {entry['id']} needs 'where'"


def test_a_fault_raised_elsewhere_is_a_new_finding():
    from conformance.runner.summary import Problem

    expectations = expectations_from_dict({"version": 1, "expected": [
        {"id": "FAULT-raised", "reason": "known assert", "where": ["scheduler.py:57 in schedule"]}]})
    known = Problem("FAULT-raised", 0, "host error: AssertionError", "scheduler.py:57 in schedule")
    new = Problem("FAULT-raised", 3, "host error: KeyError: 7", "block_pool.py:212 in free")
    assert expectations.relabel({"FAULT-raised": known}) == {"FAULT-raised": known}
    relabeled = expectations.relabel({"FAULT-raised": new, "BLK-001": known})
    assert set(relabeled) == {"FAULT-raised@block_pool.py:212 in free", "BLK-001"}
    assert relabeled["FAULT-raised@block_pool.py:212 in free"].id == "FAULT-raised@block_pool.py:212 in free"


@pytest.mark.parametrize(("where", "new"), [(["scheduler exploded"], False), (["somewhere else"], True)])
def test_a_run_reports_a_misplaced_fault_as_new(tmp_path, monkeypatch, where, new):
    from conformance.commands.cli import main

    tests = Path(__file__).resolve().parent
    monkeypatch.syspath_prepend(str(tests))
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"version": 1, "expected": [
        {"id": "FAULT-raised", "reason": "the fault adapter raises at step 2", "where": where}]}))
    report = tmp_path / "report.json"
    code = main(["conform", "--adapter", "fault_adapters:raises", "--max-examples", "3", "--seed", "3", "--quiet",
                 "--out", str(tmp_path / "out"), "--json", str(report), "--expect", str(expect)])
    data = json.loads(report.read_text())
    if new:
        assert code == 1 and len(data["new_findings"]) == 1 and data["new_findings"][0].startswith("FAULT-raised@")
        assert "fault_adapters.py:" in data["new_findings"][0]
        saved = list((tmp_path / "out" / "counterexamples").glob("FAULT-raised_*.json"))
        assert len(saved) == 1, saved
    else:
        assert code == 0 and data["expected_findings"] == ["FAULT-raised"] and data["new_findings"] == []


def test_where_is_only_for_faults_and_must_be_strings():
    from spec.errors import InputError

    for entry, field in ([{"id": "BLK-001", "reason": "r", "where": ["x"]}, "where"],
                         [{"id": "FAULT-raised", "reason": "r", "where": "x"}, "where"]):
        with pytest.raises(InputError, match=field):
            expectations_from_dict({"version": 1, "expected": [entry]})
