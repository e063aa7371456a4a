"""The Z3 proofs of the async flow (pipelined V1; spec/proofs/encoding_async.py): the matrix is
proved at its bound for every depth 0..2 and every cell for every size, no action is proved
vacuously (each can fire from an invariant state, the in-flight paths included, at the bound and
for the generic request past it), each mutated transition is caught by the cells it names, bounded
and unbounded, and the CLI runs the flow."""

from __future__ import annotations

import json

import pytest
import z3

import conformance.selftest.mutants_async as mutants_async
from conformance.commands.cli import main
from spec.catalogue import catalogue
from spec.proofs.encoding import FIN, RUN, WAIT
from spec.proofs.encoding_async import (
    ASYNC_ACTIONS,
    ASYNC_BOUND,
    ASYNC_MUTANTS,
    ASYNC_STATE_INVARIANTS,
    ASYNC_TRANSITION_PROPERTIES,
    AsyncEncoder,
    GenericAsync,
    grp_ok_async,
)
from spec.proofs.matrix import prove

CATALOGUE = {inv.id for inv in catalogue()}


def test_async_matrix_is_proved():
    m = prove(flow_name="async", jobs=1, catalogue_ids=sorted(CATALOGUE))
    assert m.all_proved, [(c.invariant, c.action, c.result) for c in m.failing()]
    assert {c.action for c in m.cells} == {"init", *ASYNC_ACTIONS}
    assert {c.invariant for c in m.cells} >= {"PIP-002", "PIP-003", "PIP-005", "PIP-007", "BLK-001", "BLK-003", "BLK-005",
                                               "QUE-001", "RES-001", "STR-001", "COW-001", "ALLOC", "WF"}
    assert all(c.flow == "async" for c in m.cells)
    # every cell for every size: the block layer (parametric, v1's micro-ops), QUE-001 and COW-001
    # as in v1, the seat counts (counting.py), and every other row on the generic request
    assert all(c.scope == "unbounded" for c in m.cells), sorted({(c.invariant, c.action) for c in m.cells
                                                                 if c.scope != "unbounded"})
    covered = set(ASYNC_STATE_INVARIANTS) | set(ASYNC_TRANSITION_PROPERTIES) | set(m.out_of_scope)
    assert CATALOGUE <= covered  # nothing silently omitted
    for synchronous in ("CAP-001", "CAP-003", "LEN-001", "CHK-004"):
        assert "outcome lands in the same step" in m.out_of_scope[synchronous]


def _fires(action: str, *extra) -> bool:
    """Whether ``action`` can fire from a state satisfying every async invariant, with ``extra``
    (a function of the encoder and the action's encoding) on top."""
    enc = AsyncEncoder(ASYNC_BOUND)
    ae = enc.encode(action)
    s = z3.Solver()
    s.add(enc.config_ok(), grp_ok_async(enc), *[f(enc, ae.pre) for f in ASYNC_STATE_INVARIANTS.values()],
          ae.guard, *ae.defs, *[e(enc, ae) for e in extra])
    return s.check() == z3.sat


def _on_acted(field: str, cond):
    return lambda enc, ae: z3.Or([z3.And(ae.params["group"] == s, cond(getattr(ae.pre, field)[s], enc, ae, s))
                                  for s in range(enc.S)])


@pytest.mark.parametrize("action", ASYNC_ACTIONS)
def test_no_async_action_is_vacuous(action):
    assert _fires(action)


def test_the_in_flight_paths_are_reachable_by_the_hypotheses():
    depth1 = lambda enc, ae: enc.DP == 1  # noqa: E731
    # a decode scheduled while the previous token is still a placeholder (vLLM's steady state)
    assert _fires("chunk", depth1, _on_acted("ph", lambda v, *_: v == 1))
    # preemption of a request with a step in flight; its stale outcome processed later
    assert _fires("preempt_recompute", _on_acted("inf", lambda v, *_: v >= 1))
    assert _fires("process", _on_acted("stl", lambda v, *_: v >= 1))
    # a stale outcome that stops the (waiting) request
    assert _fires("process", _on_acted("stl", lambda v, *_: v >= 1),
                  lambda enc, ae: z3.Or([z3.And(ae.params["group"] == s, ae.post.sstat[s] == FIN) for s in range(enc.S)]))
    # an outcome of an aborted request, dropped; an abort with two steps in flight (depth 2)
    assert _fires("process", _on_acted("sstat", lambda v, *_: v == FIN))
    assert _fires("abort", _on_acted("qn", lambda v, *_: v == 2), _on_acted("sstat", lambda v, *_: v == RUN))
    # a processed outcome that leaves a token computed past the stop (depth >= 1)
    assert _fires("process", depth1, lambda enc, ae: z3.Or([z3.And(
        ae.params["group"] == s, ae.pre.sstat[s] == RUN, ae.post.sstat[s] == FIN,
        ae.post.ncomp[s] == ae.post.ntok[s]) for s in range(enc.S)]))
    assert not _fires("admit", _on_acted("stl", lambda v, *_: v >= 1))  # the spec decision: wait for stale steps
    assert _fires("admit", _on_acted("sstat", lambda v, *_: v == WAIT))


def _generic_fires(action: str, extra) -> bool:
    """Whether ``action`` can fire for the generic request (every size: its table longer than the
    bound's, other requests mid-prefill) from a state with every per-request fact, with ``extra``
    (a function of the generic request, its pre- and post-state) on top."""
    G = GenericAsync()
    q = G.seq("pre")
    guard, post = G.effect(action, q, q)
    s = z3.Solver()
    s.add(G.base(), G.inv(q), guard, q.tl <= G.L, G.in_bound(action, q, q), G.L >= 5, G.rest_partial >= 1,
          extra(G, q, post))
    return s.check() == z3.sat


def test_the_in_flight_paths_are_reachable_by_the_generic_hypotheses():
    """The generic request's hypotheses are not vacuous where the bounded ones could not look: a
    table past the bound's 3 entries with a step in flight at depth 2, a preemption and a stale
    outcome of such a request."""
    assert _generic_fires("chunk", lambda G, q, post: z3.And(G.DP == 2, q.qn == 2, q.ph == 2, post.tl == 5))
    assert _generic_fires("preempt_recompute", lambda G, q, post: z3.And(q.tl == 5, q.inf >= 2, post.stl == q.inf))
    assert _generic_fires("process", lambda G, q, post: z3.And(q.stl >= 1, q.nt >= 9, post.st == FIN))
    assert _generic_fires("process", lambda G, q, post: z3.And(q.st == RUN, q.tl == 6, post.st == FIN,
                                                               post.nc == post.nt + 1))
    assert _generic_fires("abort", lambda G, q, post: z3.And(q.st == RUN, q.qn == 3, q.tl == 7))
    assert not _generic_fires("admit", lambda G, q, post: q.stl >= 1)  # the spec decision, as bounded


def test_each_async_strengthening_fact_is_needed():
    """The async WF's facts beside v1's: each of the strengthening ones is used by the induction
    for every size (without it, the generic request fails the cell it names, a cell other than
    WF), and the others (CAP-001's and CAP-003's readings) are proved without being needed."""
    from spec.proofs.encoding_async import STRENGTHENING_FACTS
    from spec.proofs.sequence_cells import prove_sequences

    names = list(GenericAsync().async_facts(GenericAsync().seq("x")))
    assert set(STRENGTHENING_FACTS) < set(names)
    for name in names:
        failing = {(r.row, r.action) for r in prove_sequences(flow_name="async", rules=GenericAsync(without=(name,)))
                   if r.result != "proved"}
        if name in STRENGTHENING_FACTS:
            assert STRENGTHENING_FACTS[name] in failing, (name, failing)
        else:
            assert not failing, (name, failing)


@pytest.mark.parametrize("mutant, action, fact", [("final-chunk-no-placeholder", "chunk", "frontier"),
                                                  ("schedules-past-depth", "chunk", "entries")])
def test_async_mutants_break_strengthening_facts(mutant, action, fact):
    """Two of the strengthening facts each catch a proof mutant on the generic request: from a
    state with every per-request fact, the mutated action leaves one without it."""
    G = GenericAsync(mutant)
    q = G.seq("pre")
    guard, post = G.effect(action, q, q)
    s = z3.Solver()
    s.add(G.base(), G.inv(q), guard, q.tl <= G.L, G.in_bound(action, q, q), z3.Not(G.async_facts(post)[fact]))
    assert s.check() == z3.sat
    s = z3.Solver()
    G = GenericAsync()
    guard, post = G.effect(action, q, q)
    s.add(G.base(), G.inv(q), guard, q.tl <= G.L, G.in_bound(action, q, q), z3.Not(G.async_facts(post)[fact]))
    assert s.check() == z3.unsat


# mutant -> (the cells that must fail, the conformance mutant of the async reference with the same bug)
CAUGHT = {
    "preempt-forgets-in-flight": ({("PIP-003", "preempt_recompute")}, mutants_async.ForgetsInFlightOnPreempt),
    "final-chunk-no-placeholder": ({("PIP-007", "chunk"), ("PIP-003", "chunk")},
                                   mutants_async.FinalChunkWithoutPlaceholder),
    "applies-outcomes-of-finished": ({("PIP-002", "process"), ("PIP-005", "process")},
                                     mutants_async.AppliesOutcomesOfFinished),
    "schedules-past-depth": ({("PIP-007", "chunk"), ("PIP-003", "chunk")}, mutants_async.OneStepLater),
}


def test_every_async_mutant_is_listed():
    assert set(CAUGHT) == set(ASYNC_MUTANTS)


@pytest.mark.parametrize("mutant", sorted(CAUGHT))
def test_async_mutant_is_caught(mutant):
    cells, _ = CAUGHT[mutant]
    m = prove(flow_name="async", mutant=mutant, actions=sorted({a for _, a in cells}),
              invariants=sorted({i for i, _ in cells}), jobs=1)
    failed = {(c.invariant, c.action) for c in m.cells if c.result == "counterexample"}
    assert cells <= failed, (mutant, failed)
    # and the generic request's rule breaks the same cells, so no unbounded cell hides the mutant
    assert cells <= {tuple(c) for c in m.parametric["cells"]}, m.parametric
    for c in m.cells:
        if (c.invariant, c.action) in cells:
            cex = c.counterexample
            assert cex["flow"] == "async" and "in_flight" in cex["pre"]["seqs"][0], cex


def test_a_forgotten_in_flight_share_kills_the_engine_on_the_next_outcome():
    """#48245's shape end to end: from a state satisfying every invariant, the mutated preemption
    then the victim's returning outcome fails an engine check (PIP-005), which the unmutated
    preemption never does."""
    for mutant, want in (("preempt-forgets-in-flight", z3.sat), (None, z3.unsat)):
        enc = AsyncEncoder(ASYNC_BOUND, mutant)
        first = enc.encode("preempt_recompute")
        facts = [first.guard, *first.defs]
        g = first.params["group"]
        second = enc.encode("process", pre=first.post)
        renamed = [(second.params["group"], g), (second.params["stop"], z3.Int("stop2"))]
        facts += [z3.substitute(f, *renamed) for f in (second.guard, *second.defs, z3.Not(z3.And(enc.engine_ok)))]
        s = z3.Solver()
        s.add(enc.config_ok(), grp_ok_async(enc), *[f(enc, first.pre) for f in ASYNC_STATE_INVARIANTS.values()], *facts)
        assert s.check() == want, mutant


def test_cli_prove_flow_async(capsys):
    assert main(["prove", "--flow", "async", "--json", "--action", "process", "--invariant", "PIP-005", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["all_proved"] and out["flow"] == "async"
    assert {(c["action"], c["flow"]) for c in out["cells"]} == {("process", "async")}
    assert main(["prove", "--mutant", "applies-outcomes-of-finished", "--action", "process", "--invariant", "PIP-005",
                 "--jobs", "1"]) == 1
    assert "cex" in capsys.readouterr().out
    assert main(["prove", "--flow", "v1", "--mutant", "schedules-past-depth"]) == 2
