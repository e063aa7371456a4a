"""Per-target expectation files (conformance/targets/expectations/): each known deviation of a
real target is data with a reason and a source, read by default for that target, and a run's
report keeps new findings apart from expected ones (issue 21, item 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.coverage import Coverage
from conformance.expectations import TARGET_EXPECTATIONS_DIR, expectations_from_dict, target_expectations
from conformance.fuzz import Finding, FuzzResult
from conformance.report import to_json
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
