"""The Z3 proofs of the v1 flow (vLLM V1, chunked prefill; spec/proofs/chunked.py): the matrix is
proved, each mutated chunk transition is caught and its counterexample replays on the mutated V1
reference, and the CLI runs the flow."""

from __future__ import annotations

import json

import pytest

from conformance.commands.cli import main
from conformance.selftest.proof_bridge import find_violation, v1_counterexample_trace
from reference_impl.v1_scheduler import V1Scheduler
from spec.catalogue import catalogue
from spec.proofs.chunked import V1_ACTIONS, V1_MUTANTS, V1_STATE_INVARIANTS, V1_TRANSITION_PROPERTIES
from spec.proofs.matrix import prove
from spec.trace import Trace
from tests.proof_mutants import V1_MUTATED_REFERENCES

CATALOGUE = {inv.id for inv in catalogue()}
CHK = {f"CHK-00{i}" for i in range(1, 7)}


def test_v1_matrix_is_proved():
    m = prove(flow_name="v1", jobs=2, catalogue_ids=sorted(CATALOGUE))
    assert m.all_proved, [(c.invariant, c.action, c.result) for c in m.failing()]
    assert {c.action for c in m.cells} == {"init", *V1_ACTIONS}
    assert {c.invariant for c in m.cells} >= CHK | {"CAP-001", "CAP-003", "BLK-003", "RES-001", "LEN-001"}
    assert all(c.flow == "v1" for c in m.cells)
    assert all(c.scope == "unbounded" for c in m.cells if c.invariant == "QUE-001")
    lifted = {"QUE-001", "QUE-002", "STR-002", "BUD-003", "WF", "CHK-001", "CHK-002", "CHK-003", "CHK-004", "CHK-005", "CHK-006", "ALLOC", "ADM-002", "COW-001", "BLK-001", "BLK-002", "BLK-003", "BLK-004",
              "BLK-005", "BLK-006", "STR-001", "RES-001", "RES-002", "RES-003", "RES-004", "CAP-001", "CAP-003", "LEN-001"}
    assert all(c.scope == ("unbounded" if c.invariant in lifted else "bounded") for c in m.cells), \
        sorted({(c.invariant, c.scope) for c in m.cells})
    assert not CHK & set(m.out_of_scope)
    covered = set(V1_STATE_INVARIANTS) | set(V1_TRANSITION_PROPERTIES) | set(m.out_of_scope)
    assert CATALOGUE <= covered  # nothing silently omitted


def test_every_v1_encoding_mutant_has_a_mutated_reference():
    assert set(V1_MUTANTS) == set(V1_MUTATED_REFERENCES)


@pytest.mark.parametrize("mutant", sorted(V1_MUTATED_REFERENCES))
def test_v1_mutated_transition_is_caught_and_replays(mutant, tmp_path):
    scheduler_class, actions, invariant = V1_MUTATED_REFERENCES[mutant]
    matrix = prove(flow_name="v1", mutant=mutant, actions=actions, invariants=[invariant], jobs=1)
    failing = [c for c in matrix.failing() if c.result == "counterexample"]
    assert failing, f"{mutant}: prove found no counterexample for {invariant}"
    found = None
    for cell in failing:
        found = v1_counterexample_trace(cell.counterexample, cell.invariant, scheduler_class, tries=600)
        if found:
            break
    assert found is not None, f"{mutant}: no trace reproduces {invariant}"
    trace, violations = found
    assert all(v.step is not None for v in violations), violations  # a real violation, not a crash
    path = trace.save(tmp_path / f"{mutant}.json")
    data = json.loads(path.read_text())
    assert data["meta"]["counterexample"]["flow"] == "v1" and data["meta"]["counterexample"]["invariant"] == invariant
    replayed = Trace.load(path)
    assert find_violation(replayed, scheduler_class, invariant), "the saved trace does not replay the violation"
    assert not find_violation(replayed, V1Scheduler, invariant), "the unmutated V1 reference violates it too"


def test_cli_prove_flow_v1(capsys):
    assert main(["prove", "--flow", "v1", "--json", "--action", "chunk", "--invariant", "CHK-002", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["all_proved"] and out["flow"] == "v1"
    assert {(c["action"], c["flow"]) for c in out["cells"]} == {("init", "v1"), ("chunk", "v1")}
    assert main(["prove", "--mutant", "chunk-no-alloc", "--action", "chunk", "--invariant", "CAP-001", "--jobs", "1"]) == 1
    assert "cex" in capsys.readouterr().out
    assert main(["prove", "--flow", "v0", "--mutant", "chunk-no-alloc"]) == 2
    assert main(["prove", "--flow", "v1", "--bound", "seqs=3,groups=2"]) == 2
