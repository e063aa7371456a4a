"""Invariants by subject: the declarations the evaluation layer and the coverage counts rest on.

* Every invariant says what it is about and no predicate reads a prior snapshot, a delta or the
  previous step (a grep over spec/invariants/ outside the evaluation layer).
* Each step rule's trigger is right about its rule (a step rule runs every step, its trigger only
  counts): no rule finds anything in a step where its trigger did not hold, on the reference's
  traces and on every mutant's. (For a rule about one sequence, request or pool the trigger is
  the statement's precondition and chooses the subjects it is handed.)
* A vacuous invariant is reported as such: SPD-* on the V0 reference, which never drafts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conformance.generation.v0 import sample_traces, traces
from conformance.selftest.mutants import MUTANTS
from reference_impl import Scheduler
from reference_impl.engine import iter_steps
from spec.catalogue import Checker, catalogue
from spec.rules import SUBJECTS

ROOT = Path(__file__).resolve().parents[1]
EVALUATION_LAYER = {"_views.py", "_evaluation.py"}
# Names that read what an earlier step or snapshot held: only the evaluation layer may.
FORBIDDEN = re.compile(r"\bprior\b|\bchanged_between\b|\bqueue_moves\b|\bchanged_requests_between\b"
                       r"|\bctx\.previous\b|\bchecked_with_prior\b|\bfresh_\w+\(")


def test_no_predicate_reads_a_delta() -> None:
    found = []
    for path in sorted((ROOT / "spec" / "invariants").glob("*.py")):
        if path.name in EVALUATION_LAYER:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                found.append(f"{path.name}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_grep_sees_a_delta() -> None:
    """The grep above is not vacuous."""
    assert FORBIDDEN.search("for label, snap, prior in checked_with_prior(ctx, rec):")
    assert FORBIDDEN.search("moved = queue_moves(snap, older)") and not FORBIDDEN.search("ctx.config.policy == 'priority'")


def test_every_invariant_says_what_it_is_about() -> None:
    for inv in catalogue():
        assert inv.about in SUBJECTS, inv.id
        assert inv.when is None or inv.trigger_text != "<lambda>", f"{inv.id}: name its trigger (a docstring)"


def _untriggered(factory, trace) -> list[tuple[str, str]]:
    scheduler = factory(trace.config)
    checker = Checker(trace.config, scheduler.capabilities)
    try:
        for record in iter_steps(trace, scheduler):
            checker.check_step(record)
    except Exception:  # noqa: BLE001 - a mutant may crash; what was found before counts
        pass
    return checker._steps.untriggered


def test_triggers_hold_where_the_reference_finds_nothing() -> None:
    for trace in sample_traces(traces(max_requests=8), 10, 5):
        assert _untriggered(Scheduler, trace) == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_no_rule_finds_anything_where_its_trigger_does_not_hold(name: str) -> None:
    mutant = MUTANTS[name]
    strategy = mutant.trace_strategy() if mutant.trace_strategy else traces(max_requests=8)
    for trace in sample_traces(strategy, 6, 7):
        assert _untriggered(mutant.factory, trace) == [], name


def test_the_v0_reference_leaves_the_speculative_family_vacuous() -> None:
    counts: dict[str, int] = {}
    for trace in sample_traces(traces(max_requests=8), 10, 11):
        checker = Checker(trace.config, Scheduler(trace.config).capabilities)
        for record in iter_steps(trace, Scheduler(trace.config)):
            checker.check_step(record)
        for inv_id, n in checker.exercised.items():
            counts[inv_id] = counts.get(inv_id, 0) + n
    assert all(counts[i] == 0 for i in counts if i.startswith("SPD-")), counts
    assert counts["BLK-001"] > 0 and counts["RES-001"] > 0 and counts["QUE-001"] > 0
