"""The per-sequence cells of each flow's proof matrix: which generic member a flow's rows are
proved on, the proofs, and the cells they prove or a mutant breaks.

`spec.proofs.per_sequence` states the argument (one generic sequence of the touched request, for
every size) and the v0 and v1 members; the async, specdec and connector flows extend the v1 member
in their own encodings (`spec.proofs.encoding_async`, `spec.proofs.encoding_specdec`,
`spec.proofs.encoding_connector`), which import it. This
module picks a flow's member and runs its queries, so that the argument does not import the
flows that build on it (no import circle in `spec`; pyproject.toml's acyclic contract).
"""

from __future__ import annotations

import time

import z3

from spec.proofs.encoding_async import (
    ACTIONS_ASYNC_SEQ,
    ASYNC_MUTANT_ACTIONS,
    ROWS_ASYNC_SEQ,
    STEPS_ASYNC_SEQ,
    GenericAsync,
)
from spec.proofs.encoding_connector import (
    ACTIONS_CONNECTOR_SEQ,
    CONNECTOR_MUTANT_ACTIONS,
    ROWS_CONNECTOR_SEQ,
    STEPS_CONNECTOR_SEQ,
    GenericConnector,
)
from spec.proofs.encoding_specdec import (
    ACTIONS_SPECDEC_SEQ,
    ROWS_SPECDEC_SEQ,
    SPECDEC_MUTANTS,
    STEPS_SPECDEC_SEQ,
    GenericSpecDec,
)
from spec.proofs.per_sequence import (
    ACTIONS,
    ACTIONS_V1,
    MUTANTS,
    MUTANTS_V1,
    QUE_SEQS,
    ROWS,
    ROWS_V1,
    STEPS_V1,
    WF_SEQS,
    Generic,
    GenericV1,
    SeqResult,
)


def generic(flow_name: str, mutant: str | None = None) -> Generic:
    if flow_name == "async":
        return GenericAsync(mutant)
    if flow_name == "specdec":
        return GenericSpecDec(mutant)
    if flow_name == "connector":
        return GenericConnector(mutant)
    return GenericV1(mutant) if flow_name == "v1" else Generic(mutant)


def rows_actions(flow_name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if flow_name == "async":
        return ROWS_ASYNC_SEQ, ACTIONS_ASYNC_SEQ
    if flow_name == "specdec":
        return ROWS_SPECDEC_SEQ, ACTIONS_SPECDEC_SEQ
    if flow_name == "connector":
        return ROWS_CONNECTOR_SEQ, ACTIONS_CONNECTOR_SEQ
    return (ROWS_V1, ACTIONS_V1) if flow_name == "v1" else (ROWS, ACTIONS)


def hypotheses_satisfiable(action: str, flow_name: str = "v0") -> bool:
    """The hypotheses of an action's queries have a model with a live member (not vacuous)."""
    G = generic(flow_name)
    q, parent = G.seq("pre"), G.seq("parent")
    guard, _ = G.effect(action, q, parent)
    s = z3.Solver()
    s.add(G.base(), G.inv(q), guard, G.inv(parent) if action == "fork" else True)
    if action not in ("add", "fork"):
        s.add(G.live(q))
    return s.check() == z3.sat


def prove_sequences(timeout_ms: int = 20_000, mutant: str | None = None,
                    actions: tuple[str, ...] | None = None, flow_name: str = "v0",
                    rules: Generic | None = None) -> list[SeqResult]:
    """Each per-sequence row after each action, for one generic member (and the init column);
    ``rules``: a generic member to use instead of the flow's (a weakened one, in the tests)."""
    G = generic(flow_name, mutant) if rules is None else rules
    rows, all_actions = rows_actions(flow_name)
    out = []
    for action in actions if actions is not None else all_actions:
        q, parent = G.seq("pre"), G.seq("parent")
        guard, post = G.effect(action, q, parent)
        hyps = [G.base(), G.inv(q), guard]
        if action == "fork":  # the parent is the first slot: q itself when q is first
            same = z3.And(q.st == parent.st, q.dv == parent.dv, q.tl == parent.tl, q.nt == parent.nt, q.nc == parent.nc)
            hyps += [G.inv(parent), z3.Implies(G.first, same)]
        after = G.rows(post)
        after[QUE_SEQS] = z3.Implies(G.live(post), post.st == G.target(action))
        names = (*rows, QUE_SEQS)
        if True:  # WF's per-sequence part, both flows
            link, gs2, forked2 = G.request_after(action, post)
            hyps += [q.tl <= G.L, G.in_bound(action, q, parent), link]
            if action == "fork":
                hyps += [parent.tl <= G.L]
            after[WF_SEQS] = z3.And(G.wf(post, gs2, forked2), post.tl <= G.L)
            names = (*names, WF_SEQS)
        if isinstance(G, GenericV1):
            steps = G.transition_goals(action, q, post)
            for part in [name for name in steps if name.endswith("/step")]:  # a row with a step part (CHK-002)
                row = part.removesuffix("/step")
                after[row] = z3.And(after[row], steps.pop(part))
            after.update(steps)
            names = (*names, *steps)
        for row in names:
            t0 = time.perf_counter()
            s = z3.Solver()
            s.set("timeout", timeout_ms)
            s.add(*hyps, z3.Not(after[row]))
            r = s.check()
            out.append(SeqResult(row, action, "proved" if r == z3.unsat else "counterexample" if r == z3.sat else "unknown",
                                 time.perf_counter() - t0))
    out.append(SeqResult(QUE_SEQS, "init", "proved", 0.0))  # nothing is live
    out.append(SeqResult(WF_SEQS, "init", "proved", 0.0))  # every slot unborn, no request
    for row in rows:  # the empty scheduler: every slot unborn
        q = G.unborn()
        s = z3.Solver()
        empty = G.rest_partial == 0 if isinstance(G, GenericV1) else z3.BoolVal(True)  # no other request either
        s.add(G.base(), empty, z3.Not(G.rows(q)[row]))
        out.append(SeqResult(row, "init", "proved" if s.check() == z3.unsat else "counterexample", 0.0))
    return out


def cells(results: list[SeqResult]) -> set[tuple[str, str]]:
    return {(r.row, r.action) for r in results if r.result == "proved"}


_CACHE: dict[tuple[int, str], set[tuple[str, str]]] = {}


def proved_cells(timeout_ms: int = 20_000, flow_name: str = "v0") -> set[tuple[str, str]]:
    """The flow's per-sequence cells proved for every size (cached: independent of the bound)."""
    key = (timeout_ms, flow_name)
    if key not in _CACHE:
        _CACHE[key] = cells(prove_sequences(timeout_ms, flow_name=flow_name))
    return _CACHE[key]


def steps_of(flow_name: str) -> tuple[str, ...]:
    """The flow's transition properties proved on the generic request (v0 has none here)."""
    if flow_name == "async":
        return STEPS_ASYNC_SEQ
    if flow_name == "specdec":
        return STEPS_SPECDEC_SEQ
    if flow_name == "connector":
        return STEPS_CONNECTOR_SEQ
    return STEPS_V1


def mutants_of(flow_name: str) -> dict[str, tuple[str, ...]]:
    """The flow's proof mutants whose mutated transition is a per-sequence rule, with their actions."""
    if flow_name == "async":  # every one of them (spec.proofs.encoding_async.ASYNC_MUTANTS)
        return ASYNC_MUTANT_ACTIONS
    if flow_name == "specdec":  # every one of them (spec.proofs.encoding_specdec.SPECDEC_MUTANTS)
        return {m: ("admit", "chunk", "verify") for m in SPECDEC_MUTANTS}
    if flow_name == "connector":  # every one of them (spec.proofs.encoding_connector.CONNECTOR_MUTANTS)
        return CONNECTOR_MUTANT_ACTIONS
    return MUTANTS_V1 if flow_name == "v1" else MUTANTS


def broken_cells(mutant: str, flow_name: str = "v0") -> list[list[str]]:
    """The unbounded cells a per-sequence mutant breaks (its actions' rows that fail)."""
    actions = mutants_of(flow_name)[mutant]
    out: list[list[str]] = []
    for r in prove_sequences(mutant=mutant, actions=actions, flow_name=flow_name):
        cell = [r.row.split("/")[0], r.action]  # WF/seqs is part of WF's cell, QUE-002/seqs of QUE-002's
        if r.result != "proved" and cell not in out:
            out.append(cell)
    return out
