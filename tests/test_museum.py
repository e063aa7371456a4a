"""The bug museum: every exhibit re-creates a real, cited scheduler bug, and the runner catches it.

Each exhibit is fuzzed (fixed seed, bounded examples) the way `kvsched museum` does it; it must
be caught by one of its expected invariants with a counterexample of at most MAX_STEPS steps, on
which the reference scheduler shows no problem at all.
"""

from __future__ import annotations

import json
import re

import pytest

from conformance.commands.cli import main
from conformance.flows.profiles import PROFILES, get_profile
from conformance.runner.driver import run_checked
from conformance.selftest.museum import EXHIBITS, MAX_STEPS, run_exhibit
from conformance.selftest.museum.docs import bug_lines, render_markdown
from conformance.selftest.museum.exhibits import sources
from conformance.selftest.museum.run import make_adapter, reference_problems
from spec.catalogue import catalogue

URL = re.compile(r"^https://github\.com/(?P<repo>[\w.-]+/[\w.-]+)/(?P<kind>pull|issues)/(?P<number>\d+)$")

CLASSES = {  # the bug classes issue #9 asks for -> the exhibit that shows each
    "double free with parallel sampling": "fork-double-free",
    "more running sequences than max_num_seqs": "admission-ignores-running",
    "swap-in admitted by a check that ignores the real allocation": "swap-in-undercount",
    "preempted request left in running": "preempted-left-in-running",
    "fits max_model_len, never fits the KV cache, hangs at the head": "never-fits-hang",
    "preemption that does not reset derived counters": "recompute-keeps-computed",
    "failed admission that does not roll back": "partial-allocation-no-rollback",
    "token budget exceeded when decodes mix with other work": "decode-over-token-budget",
    "block freed while still referenced": "block-freed-while-referenced",
}


def test_at_least_fifteen_distinct_exhibits():
    ids = [e.id for e in EXHIBITS]
    assert len(ids) >= 15
    assert len(set(ids)) == len(ids)
    assert len({e.url for e in EXHIBITS}) == len(EXHIBITS), "each exhibit has its own public source"


def test_the_required_bug_classes_are_covered():
    ids = {e.id for e in EXHIBITS}
    assert set(CLASSES.values()) <= ids


@pytest.mark.parametrize("exhibit", EXHIBITS, ids=lambda e: e.id)
def test_exhibit_cites_a_researched_public_source(exhibit):
    known = {entry["url"] for entry in sources().values()}
    assert exhibit.url in known, "cite only sources from the research notes (sources.json)"
    m = URL.match(exhibit.url)
    assert m, exhibit.url
    assert m["repo"] == exhibit.repo
    assert int(m["number"]) == exhibit.number
    assert (m["kind"] == "pull") == (exhibit.kind == "pr")
    assert exhibit.symptom and exhibit.bug_class and exhibit.minimal_change


@pytest.mark.parametrize("exhibit", EXHIBITS, ids=lambda e: e.id)
def test_exhibit_names_checkable_problems_and_marks_its_change(exhibit):
    assert exhibit.profile in PROFILES
    checked = {inv.id for inv in get_profile(exhibit.profile).invariants()}
    for problem in exhibit.expected:
        assert problem in checked or problem.startswith("FAULT-"), f"{problem} is not checked by {exhibit.profile}"
    assert "# bug" in bug_lines(exhibit), "the changed line must be marked '# bug:'"


def test_only_the_fault_exhibits_rely_on_a_fault():
    """A FAULT is the catch only where the upstream symptom is the engine raising: V0's swap space,
    and the async engine's placeholder assert (PIP-005 names that FAULT)."""
    faults = [e.id for e in EXHIBITS if any(p.startswith("FAULT-") for p in e.expected)]
    assert faults == ["swap-space-exhausted", "async-preempt-placeholder-underflow", "async-final-chunk-no-placeholder"]


def test_expected_invariants_exist():
    ids = {inv.id for inv in catalogue()}
    for e in EXHIBITS:
        assert {p for p in e.expected if not p.startswith("FAULT-")} <= ids, e.id


@pytest.mark.parametrize("exhibit", EXHIBITS, ids=lambda e: e.id)
def test_exhibit_is_caught(exhibit, tmp_path):
    result = run_exhibit(exhibit, tmp_path)
    assert result.caught_by in exhibit.expected, f"found {sorted(result.problems)}, expected {exhibit.expected}"
    assert result.steps is not None and result.steps <= MAX_STEPS
    trace = result.finding.trace
    # The counterexample is on disk, replays on the mutant, and the reference passes it.
    assert result.finding.path.exists()
    mutant_problems = run_checked(
        make_adapter(exhibit), trace, get_profile(exhibit.profile).invariants(), timeout=None
    ).problem_ids
    assert result.caught_by in mutant_problems
    assert reference_problems(exhibit, trace) == set()
    assert result.reference_passes and result.caught


def test_cli_json_for_one_exhibit(capsys, tmp_path):
    code = main(["museum", "--json", "--exhibit", "double-release", "--out", str(tmp_path)])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["version"] == 1 and report["all_caught"] is True
    (row,) = report["exhibits"]
    assert row["id"] == "double-release" and row["caught"] and row["steps"] <= MAX_STEPS
    assert row["url"].startswith("https://github.com/") and row["trace"]["version"] == 1
    assert row["counterexample"] and (tmp_path / "double-release" / "counterexamples").is_dir()


def test_cli_table_and_exit_code_when_not_caught(capsys):
    # One example is too few to find the swap-in undercount: the museum must say so and exit 1.
    code = main(["museum", "--exhibit", "swap-in-undercount", "--max-examples", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "swap-in-undercount" in out and "NOT caught" in out


def test_cli_rejects_unknown_exhibit(capsys):
    assert main(["museum", "--exhibit", "no-such-bug"]) == 2
    assert "--exhibit" in capsys.readouterr().err


def test_markdown_lists_every_exhibit():
    text = render_markdown()
    assert text.startswith("# The bug museum")
    for e in EXHIBITS:
        assert f"\n## {e.id}\n" in text
        assert e.url in text
        assert bug_lines(e) in text
