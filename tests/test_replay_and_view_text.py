"""Issue 34 item 5: what a reader of a counterexample sees. A step without reasons states its
decisions and nothing about the reasons it lacks; replay prints the violated invariant's own
statement beside the violation; an invariant that failed is never "never exercised"."""

from __future__ import annotations

from conformance.reports import report
from conformance.reports.explain import explain_step
from conformance.reports.replay_view import replay_view
from conformance.runner.coverage import Coverage
from conformance.runner.driver import TraceResult
from conformance.runner.fuzz import Finding, FuzzResult
from spec.catalogue import Violation
from spec.trace import Trace
from spec.types import ScheduledSeq, SchedulerOutput


def test_a_step_without_reasons_says_nothing_about_them():
    lines = explain_step(SchedulerOutput(step=0, scheduled=(ScheduledSeq("A#0", "A", 3, True),)))
    assert lines == ["A prefills 3 token(s)"]


def test_replay_puts_the_invariant_statement_beside_the_violation():
    from spec.config import SchedulerConfig

    result = TraceResult(Trace(SchedulerConfig()))
    result.violations.append(Violation("BLK-003", None, "gpu block 2 has ref count 1 but 2 table entries"))
    lines = replay_view(result)["lines"]
    (line,) = [x for x in lines if x.startswith("VIOLATION")]
    assert line.splitlines()[1].strip().startswith("BLK-003: GPU reference counts equal")


def test_a_failed_invariant_is_not_listed_as_never_exercised(capsys):
    result = FuzzResult(adapter="x", profile="safety", seed=1, examples=1, active=["BLK-003", "BLK-001"])
    result.coverage = Coverage(["BLK-003", "BLK-001"])  # no steps counted for either
    result.findings["BLK-003"] = Finding("BLK-003", "m", None, 1)
    report.print_terminal(result)
    text = capsys.readouterr().out
    never = next(line for line in text.splitlines() if "never exercised" in line)
    assert "BLK-001" in never and "BLK-003" not in never
