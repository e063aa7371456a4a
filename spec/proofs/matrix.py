"""The invariant x action matrix: initiation and inductive step, one Z3 query per cell.

For a state invariant I and an action a the cell asks whether

    Config and WF and Inv(pre) and Guard_a and Trans_a and not I(post)

is satisfiable, where Inv is the conjunction of every state invariant in `STATE_INVARIANTS`
(the catalogue's plus the strengthening STR-*): relative induction, so proving every cell proves
the conjunction inductive. ``unsat`` is ``proved``; ``sat`` is a ``counterexample`` (a concrete
pre-state, action and post-state read from the model); a timeout is ``unknown``. Transition
properties (ADM-002, COW-001, ALLOC) are checked the same way on (pre, post). The initial state
(empty scheduler) is checked once per invariant in the ``init`` column.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import z3

from spec.proofs.bound import DEFAULT, Bound
from spec.proofs.encoding import ACTIONS, MUTANTS, ActionEncoding, Encoder
from spec.proofs.properties import (
    SCOPE,
    SCOPE_BY_FAMILY,
    STATE_INVARIANTS,
    STRENGTHENING,
    TRANSITION_PROPERTIES,
    UNCLASSIFIED,
    grp_ok,
)

FLOW_NAMES = ("v0", "v1", "async", "specdec", "connector")
# The flows the arguments for every size cover (spec/proofs/parametric.py, per_sequence.py, counting.py,
# unbounded.py, writes.py; the connector flow's per-request rows by encoding_connector.GenericConnector).
UNBOUNDED_FLOWS = ("v0", "v1", "async", "specdec", "connector")
# KV cache groups over one pool (spec/proofs/groups.py): no bounded encoding, every cell by the
# parametric group-layer argument; proved by `prove_hybrid`, not by `prove`
HYBRID_FLOW = "hybrid"
HYBRID_SIZE = "every size (no bounded encoding: spec/proofs/groups.py)"


@dataclass(frozen=True)
class Flow:
    """One encoded scheduler flow: its encoder, actions and the properties proved about it."""

    name: str
    encoder: type[Encoder]
    actions: tuple[str, ...]
    state_invariants: dict[str, Any]
    transition_properties: dict[str, Any]
    step_parts: dict[str, Any]
    grp_ok: Any
    default_bound: Bound
    mutants: dict[str, str]
    scope: dict[str, str]


def flow(name: str) -> Flow:
    """``v0``: vLLM V0's flow (reference_impl/scheduler.py); ``v1``: vLLM V1's flow with chunked
    prefill (reference_impl/v1_scheduler.py, prefix caching off; spec/proofs/chunked.py);
    ``async``: pipelined V1 (spec/proofs/encoding_async.py); ``specdec``: V1 with speculative
    decoding (reference_impl/specdec_scheduler.py; spec/proofs/encoding_specdec.py); ``connector``:
    V1 with a KV connector's loads, failures and sends (reference_impl/kv_connector.py;
    spec/proofs/encoding_connector.py)."""
    if name == "v0":
        return Flow("v0", Encoder, ACTIONS, STATE_INVARIANTS, TRANSITION_PROPERTIES, {}, grp_ok, DEFAULT, MUTANTS, SCOPE)
    if name == "v1":
        from spec.proofs import chunked as C

        return Flow("v1", C.ChunkedEncoder, C.V1_ACTIONS, C.V1_STATE_INVARIANTS, C.V1_TRANSITION_PROPERTIES,
                    C.V1_STEP_PARTS, C.grp_ok_v1, C.V1_BOUND, C.V1_MUTANTS, {**SCOPE, **C.V1_SCOPE})
    if name == "async":
        from spec.proofs import encoding_async as A

        return Flow("async", A.AsyncEncoder, A.ASYNC_ACTIONS, A.ASYNC_STATE_INVARIANTS, A.ASYNC_TRANSITION_PROPERTIES,
                    A.ASYNC_STEP_PARTS, A.grp_ok_async, A.ASYNC_BOUND, A.ASYNC_MUTANTS, {**SCOPE, **A.ASYNC_SCOPE})
    if name == "specdec":
        from spec.proofs import chunked as C
        from spec.proofs import encoding_specdec as D

        return Flow("specdec", D.SpecDecEncoder, D.SPECDEC_ACTIONS, D.SPECDEC_STATE_INVARIANTS,
                    D.SPECDEC_TRANSITION_PROPERTIES, D.SPECDEC_STEP_PARTS, D.grp_ok_specdec, D.SPECDEC_BOUND,
                    D.SPECDEC_MUTANTS, {**SCOPE, **C.V1_SCOPE, **D.SPECDEC_SCOPE})
    if name == "connector":
        from spec.proofs import chunked as C
        from spec.proofs import encoding_connector as K

        return Flow("connector", K.ConnectorEncoder, K.CONNECTOR_ACTIONS, K.CONNECTOR_STATE_INVARIANTS,
                    K.CONNECTOR_TRANSITION_PROPERTIES, K.CONNECTOR_STEP_PARTS, K.grp_ok_connector, K.CONNECTOR_BOUND,
                    K.CONNECTOR_MUTANTS, {**SCOPE, **C.V1_SCOPE, **K.CONNECTOR_SCOPE})
    raise ValueError(f"unknown flow {name!r} (known: {', '.join(FLOW_NAMES)})")

MATRIX_VERSION = 1
PROVED, COUNTEREXAMPLE, UNKNOWN, NOT_APPLICABLE = "proved", "counterexample", "unknown", "n/a"


@dataclass
class Cell:
    invariant: str
    action: str
    result: str
    seconds: float
    scope: str = "bounded"  # bounded | unbounded
    counterexample: dict[str, Any] | None = None
    flow: str = "v0"
    via: str | None = None  # set when the bounded query was not run: the cell follows from this proof

    def to_dict(self) -> dict[str, Any]:
        out = {"invariant": self.invariant, "action": self.action, "result": self.result,
               "seconds": round(self.seconds, 4), "scope": self.scope, "flow": self.flow}
        if self.via is not None:
            out["via"] = self.via
        if self.counterexample is not None:
            out["counterexample"] = self.counterexample
        return out


@dataclass
class Matrix:
    bound: Bound
    mutant: str | None
    strengthened: bool
    alone: bool = False
    cells: list[Cell] = field(default_factory=list)
    out_of_scope: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    flow: str = "v0"  # v0, v1, or "all" (merged; bounds per flow in ``bounds``)
    bounds: dict[str, Bound] = field(default_factory=dict)
    # the parametric block proof behind the block rows' unbounded cells (spec/proofs/parametric.py);
    # for a block-layer mutant, the unbounded cells it breaks and the concrete witness
    parametric: dict[str, Any] = field(default_factory=dict)

    @property
    def all_proved(self) -> bool:
        return all(c.result == PROVED for c in self.cells)

    def failing(self) -> list[Cell]:
        return [c for c in self.cells if c.result != PROVED]

    def cell(self, invariant: str, action: str, flow: str | None = None) -> Cell:
        return next(c for c in self.cells if c.invariant == invariant and c.action == action
                     and (flow is None or c.flow == flow))

    def _bound_text(self) -> Any:
        """The bound per flow (merged) or this flow's; the hybrid flow has none (every size)."""
        if len(self.bounds) > 1:
            return {name: HYBRID_SIZE if name == HYBRID_FLOW else str(b) for name, b in self.bounds.items()}
        return HYBRID_SIZE if self.flow == HYBRID_FLOW else self.bound.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": MATRIX_VERSION,
            "flow": self.flow,
            # merged flows: one text per flow (what `kvsched docs` prints as the bound of a row)
            "bound": self._bound_text(),
            "bounds": {name: b.to_dict() for name, b in (self.bounds or {self.flow: self.bound}).items()
                       if name != HYBRID_FLOW},
            "mutant": self.mutant,
            "strengthened": self.strengthened,
            "hypothesis": "each invariant alone (plus WF)" if self.alone else "conjunction of the state invariants",
            "seconds": round(self.seconds, 3),
            "all_proved": self.all_proved,
            "cells": [c.to_dict() for c in self.cells],
            "not_state_invariants": self.out_of_scope,
            **({"parametric": self.parametric} if self.parametric else {}),
        }


def _solver(timeout_ms: int) -> Any:
    s = z3.Then("simplify", "propagate-values", "solve-eqs", "smt").solver()
    s.set("timeout", timeout_ms)
    return s


def _counterexample(model: Any, ae: ActionEncoding | None, enc: Encoder, pre_state: Any, post_state: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"config": enc.read_config(model), "bound": enc.bound.to_dict()}
    if ae is not None:
        out["action"] = ae.action
        out["params"] = {k: model.eval(v, model_completion=True).as_long() for k, v in ae.params.items()}
    out["pre"] = enc.read_state(model, pre_state)
    if post_state is not None:
        out["post"] = enc.read_state(model, post_state)
    return out


def out_of_scope(catalogue_ids: Iterable[str], flow_name: str = "v0") -> dict[str, str]:
    """Catalogue invariants that the matrix does not prove, each with the reason."""
    fl = flow(flow_name)
    proved = set(fl.state_invariants) | set(fl.transition_properties)
    found = {}
    for iid in catalogue_ids:
        if iid in proved:
            continue
        family = iid.split("-")[0]
        if family == "PIP" and flow_name != "async":
            pipelined = flow("async")
            if iid in pipelined.state_invariants or iid in pipelined.transition_properties:
                found[iid] = "pipelined steps: proved in the async flow (kvsched prove --flow async)"
            else:
                found[iid] = pipelined.scope.get(iid, UNCLASSIFIED)
            continue
        if family == "SPD" and flow_name != "specdec":
            speculative = flow("specdec")
            if iid in speculative.state_invariants or iid in speculative.transition_properties:
                found[iid] = "speculative decoding: proved in the specdec flow (kvsched prove --flow specdec)"
            else:
                found[iid] = speculative.scope.get(iid, UNCLASSIFIED)
            continue
        if family == "KVC" and flow_name != "connector":
            connector = flow("connector")
            if iid in connector.state_invariants or iid in connector.transition_properties:
                found[iid] = "KV connectors: proved in the connector flow (kvsched prove --flow connector)"
            else:
                found[iid] = connector.scope.get(iid, UNCLASSIFIED)
            continue
        if family == "CHK" and flow_name == "v0":
            found[iid] = "chunked prefill: proved in the v1 flow (kvsched prove --flow v1)"
            continue
        found[iid] = fl.scope.get(iid) or SCOPE_BY_FAMILY.get(family, UNCLASSIFIED)
    return found


def merge(matrices: list[Matrix]) -> Matrix:
    """Several flows' matrices as one (cells tagged with their flow); an invariant is out of scope
    only when no flow proves it."""
    first = matrices[0]
    proved = {c.invariant for m in matrices for c in m.cells}
    scope: dict[str, str] = {}
    for m in matrices:
        for iid, why in m.out_of_scope.items():
            if iid not in proved:
                scope.setdefault(iid, why)
    return Matrix(first.bound, first.mutant, first.strengthened, first.alone,
                  [c for m in matrices for c in m.cells], scope, sum(m.seconds for m in matrices), "all",
                  {m.flow: m.bound for m in matrices}, next((m.parametric for m in matrices if m.parametric), {}))


def prove(
    bound: Bound | None = None,
    *,
    flow_name: str = "v0",
    mutant: str | None = None,
    strengthen: bool = True,
    alone: bool = False,
    invariants: Iterable[str] | None = None,
    actions: Iterable[str] | None = None,
    timeout_ms: int = 60_000,
    catalogue_ids: Iterable[str] = (),
    unbounded: bool = True,
    jobs: int = 1,
    reuse_unbounded: bool | None = None,
) -> Matrix:
    """Run the matrix. ``strengthen=False`` drops the STR-* invariants from the hypothesis
    (they are still checked as cells), which shows which cells need them.

    ``reuse_unbounded`` (default: on at any bound but the flow's default one): a cell proved for
    every size is proved at this bound too, so its bounded query is not run (the cell says
    ``via``). At the default bound every cell is also solved bounded, an independent check of
    the bounded encoding."""
    started = time.perf_counter()
    fl = flow(flow_name)
    unbounded = unbounded and flow_name in UNBOUNDED_FLOWS
    bound = bound if bound is not None else fl.default_bound
    states, transitions = fl.state_invariants, fl.transition_properties
    wanted = list(invariants) if invariants is not None else list(states) + list(transitions)
    for iid in wanted:
        if iid not in states and iid not in transitions:
            raise ValueError(f"unknown invariant {iid!r} for the {flow_name} matrix")
    chosen_actions = list(actions) if actions is not None else list(fl.actions)
    for action in chosen_actions:
        if action not in fl.actions:
            raise ValueError(f"unknown action {action!r} for the {flow_name} flow")
    matrix = Matrix(bound, mutant, strengthen, alone, out_of_scope=out_of_scope(catalogue_ids, flow_name),
                    flow=flow_name)
    hyp_ids = [i for i in states if strengthen or i not in STRENGTHENING]
    if alone:  # each invariant on its own (plus the model's WF): which are inductive alone
        hyp_ids = ["WF"]

    from spec.proofs import parametric as P

    upgraded: set[tuple[str, str]] = set()
    from spec.proofs import sequence_cells as PS

    # every flow has every argument below (the async flow's per-request rows: its generic request,
    # `spec.proofs.encoding_async.GenericAsync`, with the in-flight share; the connector flow's:
    # `spec.proofs.encoding_connector.GenericConnector`, with the request's transfer)
    sequences = flow_name in ("v0", "v1", "async", "specdec", "connector")
    if unbounded and mutant in P.MUTANTS:
        matrix.parametric = P.broken_cells(mutant, flow_name)
    if unbounded and sequences and mutant in PS.mutants_of(flow_name):
        matrix.parametric = {"mutant": mutant, "cells": PS.broken_cells(mutant, flow_name), "witness": None}
    from spec.proofs import writes as WR

    if unbounded and mutant in WR.MUTANTS and flow_name == "v0":
        matrix.parametric = WR.broken_cells(mutant)
    if unbounded and mutant is None:
        from spec.proofs.unbounded import QUE_QUEUES, prove_unbounded

        upgraded = prove_unbounded(timeout_ms=timeout_ms, flow_name=flow_name)
        # the block rows (spec/proofs/parametric.py); its hypotheses are the block invariants
        # with STR-001, so a cell proved alone or without the strengthening keeps its bound
        if strengthen and not alone and any(iid in P.ROW_FACTS or iid == "KVC-002" for iid in wanted):
            proof = P.prove_blocks(timeout_ms=min(timeout_ms, 20_000))
            upgraded |= proof.cells(flow_name)
            matrix.parametric = proof.to_dict()
        # COW-001 (both flows), ALLOC and ADM-002 (v0): spec/proofs/writes.py's lemmas over the
        # block facts (with STR-001) and the counts
        if strengthen and not alone and any(iid in ("COW-001", "ALLOC", "ADM-002") for iid in wanted):
            upgraded |= WR.proved_cells(flow_name, timeout_ms=min(timeout_ms, 20_000))
        # the per-sequence rows (spec/proofs/per_sequence.py): one generic sequence
        if sequences and not alone and any(iid in (*PS.rows_actions(flow_name)[0], *PS.steps_of(flow_name)) for iid in wanted):
            upgraded |= PS.proved_cells(timeout_ms=min(timeout_ms, 20_000), flow_name=flow_name)
        # STR-002 / BUD-003: the touched request's term plus the rest (spec/proofs/counting.py)
        if sequences and strengthen and not alone and any(iid in ("STR-002", "BUD-003") for iid in wanted):
            from spec.proofs.counting import proved_cells as count_cells

            upgraded |= count_cells(flow_name, timeout_ms=min(timeout_ms, 20_000))
        # WF = its per-sequence part (per_sequence.py) and its per-request part (counting.py);
        # v1's also says no block is shared (parametric.prove_unshared)
        if sequences and strengthen and not alone and "WF" in wanted and (flow_name == "v0" or P.prove_unshared()):
            from spec.proofs.counting import WF_REQUESTS
            from spec.proofs.counting import proved_cells as count_cells

            seqs = PS.proved_cells(timeout_ms=min(timeout_ms, 20_000), flow_name=flow_name)
            reqs = count_cells(flow_name, timeout_ms=min(timeout_ms, 20_000))
            upgraded |= {("WF", a) for a in ("init", *fl.actions) if (PS.WF_SEQS, a) in seqs and (WF_REQUESTS, a) in reqs}
        # QUE-002 = its per-request half (unbounded.py) and its per-sequence half (per_sequence.py)
        if sequences and not alone and "QUE-002" in wanted:
            seqs = PS.proved_cells(timeout_ms=min(timeout_ms, 20_000), flow_name=flow_name)
            upgraded |= {("QUE-002", a) for (iid, a) in upgraded if iid == QUE_QUEUES and (PS.QUE_SEQS, a) in seqs}
        # KVC-002 = its per-request half (a transfer's request holds a table on the GPU: the generic
        # request) and the block facts (a named block is not free: BLK-005's cell; it has count >= 1:
        # BLK-003's; no count is above 1: parametric.prove_unshared), so each block of it has count 1
        if flow_name == "connector" and strengthen and not alone and "KVC-002" in wanted and P.prove_unshared():
            from spec.proofs.encoding_connector import KVC_SEQS

            seqs = PS.proved_cells(timeout_ms=min(timeout_ms, 20_000), flow_name=flow_name)
            upgraded |= {("KVC-002", a) for a in ("init", *fl.actions)
                         if {(KVC_SEQS, a), ("BLK-005", a), ("BLK-003", a)} <= upgraded | seqs}
    reuse = (bound != fl.default_bound) if reuse_unbounded is None else reuse_unbounded
    skip = upgraded if reuse else set()

    # init column
    enc = fl.encoder(bound, mutant)
    init = enc.initial()
    for iid in wanted:
        if iid not in states:
            continue
        if (iid, "init") in skip:
            matrix.cells.append(Cell(iid, "init", PROVED, 0.0, flow=flow_name, via=VIA))
            continue
        t0 = time.perf_counter()
        s = _solver(timeout_ms)
        s.add(enc.config_ok(), fl.grp_ok(enc), z3.Not(states[iid](enc, init)))
        r = s.check()
        cex = _counterexample(s.model(), None, enc, init, None) if r == z3.sat else None
        matrix.cells.append(Cell(iid, "init", _result(r), time.perf_counter() - t0, counterexample=cex, flow=flow_name))

    tasks = [(flow_name, bound, mutant, action, hyp_ids, wanted, timeout_ms, alone,
              {iid for iid in wanted if (iid, action) in skip}) for action in chosen_actions]
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # heaviest actions first so the workers finish together
        order = sorted(range(len(tasks)), key=lambda k: _WEIGHT.get(tasks[k][3], 1), reverse=True)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            done = dict(zip(order, pool.map(_prove_action, [tasks[k] for k in order]), strict=True))
        results = [done[k] for k in range(len(tasks))]
    else:
        results = [_prove_action(t) for t in tasks]
    for cells in results:
        matrix.cells += [Cell(**c) for c in cells]

    if upgraded:
        for cell in matrix.cells:
            if cell.result == PROVED and (cell.invariant, cell.action) in upgraded:
                cell.scope = "unbounded"
    matrix.seconds = time.perf_counter() - started
    return matrix


VIA = "proved for every size (spec/proofs/parametric.py, unbounded.py, writes.py, ...); bounded query not run"
_WEIGHT = {"swap_in": 5, "decode": 4, "swap_out": 3, "fork": 3, "admit": 2, "chunk": 4, "verify": 5}


def _prove_action(task: tuple[Any, ...]) -> list[dict[str, Any]]:
    flow_name, bound, mutant, action, hyp_ids, wanted, timeout_ms, alone, skip = task
    fl = flow(flow_name)
    states, transitions = fl.state_invariants, fl.transition_properties
    enc = fl.encoder(bound, mutant)
    ae = enc.encode(action)
    base = [enc.config_ok(), fl.grp_ok(enc), *[states[i](enc, ae.pre) for i in hyp_ids], ae.guard, *ae.defs]
    cells = []
    for iid in wanted:
        if iid in skip:
            cells.append({"invariant": iid, "action": action, "result": PROVED, "seconds": 0.0,
                          "counterexample": None, "flow": flow_name, "via": VIA})
            continue
        t0 = time.perf_counter()
        hypothesis = [*base, states[iid](enc, ae.pre)] if alone and iid in states else base
        goal = states[iid](enc, ae.post) if iid in states else transitions[iid](ae)
        if iid in fl.step_parts:
            goal = z3.And(goal, fl.step_parts[iid](ae))
        # A fresh solver per cell: preprocessing (solve-eqs eliminates the transition's
        # definitions) is off in incremental mode and is worth 2-3x here.
        s = _solver(timeout_ms)
        s.add(*hypothesis)
        s.add(z3.Not(goal))
        r = s.check()
        cex = _counterexample(s.model(), ae, enc, ae.pre, ae.post) if r == z3.sat else None
        if cex is not None:
            cex["flow"] = flow_name
        cells.append({"invariant": iid, "action": action, "result": _result(r), "seconds": time.perf_counter() - t0,
                      "counterexample": cex, "flow": flow_name})
    return cells


def _result(r: Any) -> str:
    return PROVED if r == z3.unsat else COUNTEREXAMPLE if r == z3.sat else UNKNOWN


HYBRID_VIA = "spec/proofs/groups.py: the per-group block layer for every size (no bounded encoding)"
HYBRID_SCOPE = {
    "HYB-002": "its table half is the row HYB-002/tables; its key half (a keyed block carries its group's key "
               "of its own tokens) needs token contents, which no flow's encoding models",
    "HYB-003": "a step property: what one step reads and writes after schedule()",
    "HYB-004": "policy over one step: where a windowed group is null after schedule()",
    "HYB-005": "policy over one step: which states a Mamba group keeps after schedule()",
    "HYB-006": "a step property over a prefix hit's keys and contents",
    "HYB-007": "a step property over a cached state's content",
    "HYB-008": "liveness (not safety); check-config covers feasibility",
}


def prove_hybrid(*, mutant: str | None = None, invariants: Iterable[str] | None = None,
                 actions: Iterable[str] | None = None, timeout_ms: int = 20_000) -> Matrix:
    """The hybrid flow's matrix (V1's actions over KV cache groups): each cell is proved for every
    size when every micro-op of its action keeps every group fact (spec/proofs/groups.py). With a
    group-layer mutant, the cells of the rows that need the fact its micro-op breaks, in the actions
    made of that op, are counterexamples (Z3's witness in ``parametric``); the other cells of those
    actions are unknown (each fact is a hypothesis of the others)."""
    from spec.proofs import groups as G

    started = time.perf_counter()
    rows = list(invariants) if invariants is not None else list(G.GROUP_ROW_FACTS)
    for iid in rows:
        if iid not in G.GROUP_ROW_FACTS:
            raise ValueError(f"unknown invariant {iid!r} for the hybrid matrix")
    columns = ["init", *(actions if actions is not None else G.GROUP_ACTION_OPS)]
    proof = G.prove_groups(timeout_ms=min(timeout_ms, 20_000))
    proved = proof.cells()
    broken: set[tuple[str, str]] = set()
    doubtful: set[str] = set()
    matrix = Matrix(DEFAULT, mutant, True, flow=HYBRID_FLOW, out_of_scope=dict(HYBRID_SCOPE),
                    parametric=proof.to_dict())
    if mutant is not None:
        found = G.mutant_breaks(mutant, timeout_ms=min(timeout_ms, 20_000))
        op = G.GROUP_MUTANTS[mutant][0]
        doubtful = {a for a, ops in G.GROUP_ACTION_OPS.items() if op in ops}
        broken = {tuple(c) for c in found["cells"]} if found else set()
        matrix.parametric = {"mutant": mutant, "cells": sorted(list(c) for c in broken),
                             "witness": {k: v for k, v in (found or {}).items() if k != "cells"} or None}
    share = proof.seconds / max(len(proved), 1)
    for iid in rows:
        for action in columns:
            if (iid, action) in broken:
                result = COUNTEREXAMPLE
            elif action in doubtful or (iid, action) not in proved:
                result = UNKNOWN
            else:
                result = PROVED
            matrix.cells.append(Cell(iid, action, result, share, scope="unbounded" if result == PROVED else "bounded",
                                     flow=HYBRID_FLOW, via=HYBRID_VIA))
    matrix.seconds = time.perf_counter() - started
    return matrix

