"""COW-001 (both flows), ALLOC and ADM-002 (v0) for every size (spec/proofs/writes.py, issue 19
items 1, 2 and 5): every lemma is proved, none is vacuous, the matrix marks the cells unbounded,
and each proof mutant whose bug a lemma rules out breaks an unbounded cell that the bounded matrix
also refutes with a concrete counterexample."""

from __future__ import annotations

import pytest
import z3

from spec.proofs import writes as W
from spec.proofs.matrix import prove


def test_every_lemma_is_proved():
    assert set(W.prove_cow().values()) == {"proved"}, W.prove_cow()
    assert set(W.prove_alloc().values()) == {"proved"}, W.prove_alloc()


def test_the_counting_lemmas_are_not_vacuous():
    """The premises of the two lemmas with the most of them have models (with sizes above any
    bound the bounded matrix uses)."""
    h, m, cows, c, k = z3.Ints("h m cows c k")
    s = z3.Solver()
    s.add(h == 40, m == 25, k == 10, cows + c == h, c >= 1, cows >= 0, cows <= k)
    assert s.check() == z3.sat
    F, N, A, W_, j = z3.Ints("F N A W j")
    s = z3.Solver()
    s.add(W_ == 3, N == 50, A == 50, F - N >= W_, j == 49)
    assert s.check() == z3.sat


def test_the_cells_are_unbounded_in_the_matrix():
    m = prove(invariants=["COW-001", "ALLOC", "ADM-002"], actions=["decode", "swap_in", "admit", "fork"], jobs=1)
    assert m.all_proved and all(c.scope == "unbounded" for c in m.cells), [(c.invariant, c.action, c.scope) for c in m.cells]
    v1 = prove(flow_name="v1", invariants=["COW-001"], actions=["chunk", "admit"], jobs=1)
    assert v1.all_proved and all(c.scope == "unbounded" for c in v1.cells)


@pytest.mark.parametrize("mutant", sorted(W.MUTANTS))
def test_mutants_are_caught_by_an_unbounded_cell(mutant):
    lemma, row, actions = W.MUTANTS[mutant]
    m = prove(mutant=mutant, actions=list(actions), invariants=[row], jobs=1)
    broken = {tuple(c) for c in m.parametric["cells"]}
    refuted = {(c.invariant, c.action) for c in m.cells if c.result == "counterexample"}
    assert broken & refuted, (broken, refuted)
    assert m.parametric["witness"]["fact"] == f"writes.py lemma {lemma}"
    assert broken <= W.proved_cells("v0")  # the unmutated proof holds them
