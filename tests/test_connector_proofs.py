"""The connector flow's Z3 matrix (spec/proofs/encoding_connector.py): each mutated transition is
caught by the cell of the invariant it breaks, and the same cell is proved on the connector's
transitions as the reference makes them. The whole matrix (every cell, bounded) is a command:
``python3 -m conformance prove --flow connector`` (docs/PROOFS.md, BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from spec.proofs.encoding_connector import CONNECTOR_MUTANTS
from spec.proofs.matrix import COUNTEREXAMPLE, PROVED, prove

# mutant -> the (invariant, action) cell that catches it
CAUGHT_BY = {
    "admit-while-loading": ("KVC-001", "admit"),
    "load-allocates-past-load": ("KVC-004", "load_start"),
    "land-counts-failed": ("KVC-005", "load_land"),
    "send-done-keeps-blocks": ("KVC-007", "send_done"),
    "frees-while-transferring": ("KVC-002", "abort"),
    "fail-policy-ignored": ("KVC-006", "load_land"),
}


def _cell(invariant: str, action: str, mutant: str | None) -> str:
    matrix = prove(flow_name="connector", mutant=mutant, invariants=[invariant], actions=[action], unbounded=False,
                   timeout_ms=60_000)
    return matrix.cell(invariant, action).result


def test_every_mutant_has_its_cell() -> None:
    assert set(CAUGHT_BY) == set(CONNECTOR_MUTANTS)


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
def test_mutant_is_caught_and_the_cell_holds_without_it(mutant: str) -> None:
    invariant, action = CAUGHT_BY[mutant]
    assert _cell(invariant, action, mutant) == COUNTEREXAMPLE
    assert _cell(invariant, action, None) == PROVED


def test_the_connector_cells_are_bounded_only() -> None:
    matrix = prove(flow_name="connector", invariants=["KVC-002"], actions=["load_start"], timeout_ms=60_000)
    assert {c.scope for c in matrix.cells} == {"bounded"} and matrix.all_proved
