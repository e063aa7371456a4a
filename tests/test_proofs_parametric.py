"""The block layer proved for every size (spec/proofs/parametric.py): each micro-operation keeps
every block fact, the hypotheses are satisfiable (not a vacuous proof), the mutated micro-ops are
caught, and the matrix marks the block rows unbounded."""

from __future__ import annotations

import pytest
import z3

from spec.proofs.encoding import CPU, GPU
from spec.proofs.matrix import prove
from spec.proofs.parametric import (
    ACTION_OPS,
    MUTANTS,
    OPS,
    ROW_FACTS,
    Parametric,
    concrete,
    mutant_counterexample,
    prove_blocks,
)


def test_every_micro_op_keeps_every_block_fact():
    proof = prove_blocks()
    assert not proof.failing(), proof.failing()
    assert proof.init and proof.partition
    assert {r.op for r in proof.results} == set(OPS)


@pytest.mark.parametrize("name", OPS)
def test_hypotheses_are_satisfiable(name):
    """A concrete state (two sequences sharing a GPU block, one swapped) satisfies every fact and
    the op's guard: the proofs are not about an empty set of states."""
    P = Parametric()
    st, sizes = concrete({0: [(GPU, 0), (GPU, 1)], 1: [(GPU, 0), (GPU, 2)], 2: [(CPU, 0)]}, 4, 2)
    op = P.op(name, st)
    s = z3.Solver()
    s.set("timeout", 20_000)
    s.add(*sizes, P.sizes_ok(), op.guard, *P.facts(st).values())
    assert s.check() == z3.sat


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutated_micro_ops_are_caught(mutant):
    cex = mutant_counterexample(mutant)
    assert cex is not None and cex["op"] == MUTANTS[mutant]
    # the real micro-op has no counterexample on the same state
    P = Parametric()
    from spec.proofs.parametric import MUTANT_WITNESS

    tables, ng, nc, _ = MUTANT_WITNESS[mutant]
    pre, sizes = concrete(tables, ng, nc)
    op = P.op(MUTANTS[mutant], pre)
    s = z3.Solver()
    s.add(*sizes, op.guard, z3.Not(P.delta(pre, op)))
    assert s.check() == z3.unsat


def test_every_action_is_made_of_micro_ops():
    for flow_name, actions in ACTION_OPS.items():
        assert all(set(ops) <= set(OPS) for ops in actions.values()), flow_name
    proof = prove_blocks()
    for flow_name, actions in ACTION_OPS.items():
        cells = proof.cells(flow_name)
        assert {(row, a) for row in ROW_FACTS for a in ("init", *actions)} <= cells


def test_block_rows_are_unbounded_in_the_matrix():
    m = prove(invariants=["BLK-003", "STR-001", "ALLOC"], actions=["swap_out", "decode"])
    for c in m.cells:
        assert c.result == "proved"
        assert c.scope == "unbounded", c  # ALLOC by spec/proofs/writes.py
    alone = prove(invariants=["BLK-006"], actions=["abort"], alone=True)
    assert all(c.scope == "bounded" for c in alone.cells)  # the parametric proof assumes more


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_block_mutants_are_caught_by_an_unbounded_cell(mutant):
    """Issue 19 item 5: the mutated transition breaks the unbounded proof of a cell that the
    bounded matrix also refutes with a concrete counterexample."""
    flow_name, action = {"fork-no-incref": ("v0", "fork"), "swapin-busy-block": ("v0", "swap_in"),
                         "load-into-held-block": ("connector", "load_start")}[mutant]
    m = prove(mutant=mutant, actions=[action], invariants=["BLK-003", "BLK-004", "BLK-005", "STR-001"],
              flow_name=flow_name)
    broken = {tuple(c) for c in m.parametric["cells"]}
    refuted = {(c.invariant, c.action) for c in m.cells if c.result == "counterexample"}
    assert broken & refuted, (broken, refuted)
    assert m.to_dict()["parametric"]["witness"]["op"] == MUTANTS[mutant]


def test_v1_ops_keep_blocks_unshared():
    """v1's WF says no block is shared: append and drop keep every count <= 1; share does not."""
    from spec.proofs.parametric import prove_unshared

    assert prove_unshared()
    assert set(o for ops in ACTION_OPS["v1"].values() for o in ops) == {"append", "drop"}
