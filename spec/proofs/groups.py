"""The per-group block layer for every size: KV cache groups over one pool, as a parametric Z3 proof.

The hybrid reference (reference_impl/hybrid_scheduler.py, reference_impl/kv_groups.py) keeps, per
request, one block table per KV cache group (spec/kv_groups.py), every group's blocks taken from
one pool, a position that holds no real block holding the null block. Its state invariants about
blocks are the one-group rows over every group's tables:

- BLK-003: a block's reference count is the number of entries naming it, in every group's table;
- BLK-001 / STR-001 / BLK-005 / BLK-006 over every table (conservation, free exactly at count
  0, a named block is not free, no table names a block twice);
- HYB-001: every real entry names a block of the pool that is not free, and a waiting request
  holds a real block in no group;
- HYB-002, its table half (``HYB-002/tables``): a block is named by the tables of one group only
  (group-owned) and at most once by one table.

As `spec.proofs.parametric` does for one group, block ids, table ids and positions are unbounded
integers (Z3 arrays), the pool size ``NG`` is symbolic and every fact is universally quantified,
so one proof covers every pool size, request count, group count and table length. A table is one
(request, group) pair: ``req[t]`` its request, ``grp[t]`` its group (fixed ghosts); an entry is a
block id or ``NULL`` (-1). Ghosts: ``bg[b]``, the group a block was last taken fresh for (its
prefix-cache key carries that group: ``group_key``), and ``wait[r]``, request ``r`` is waiting.

Every action of the hybrid flow is a finite sequence of seven micro-operations, each changing at
most one entry position or one status:

- ``append(t, b)``: a free block goes to the end of ``t`` with count 1 and group ``grp[t]``
  (`GroupTables.allocate`, `V1Scheduler._allocate`: ``BlockPool.allocate``, evicting its key);
- ``touch(t, b)``: a prefix hit: a block found by group ``grp[t]``'s key (so ``bg[b] == grp[t]``)
  and not yet in ``t`` goes to its end, count + 1 (`GroupTables.add_hits`, ``pool.touch``);
- ``pad(t)``: a null entry goes to the end (a hit's positions a window does not read; the Mamba
  "align" gaps);
- ``skip(t, i)``: a real entry becomes null, one reference less, free at 0
  (`GroupTables.remove_skipped`: behind a window, a state copied forward);
- ``drop(t)``: the last entry goes, one reference less if it is real (`GroupTables.free`, V1's
  `_free_blocks`, tail first);
- ``run(r)`` / ``wait(r)``: the request leaves / enters waiting; ``wait`` only when none of its
  tables names a real block (preemption frees every group first).

``delta`` ties counts to tables as in parametric.py: each micro-op changes at most one entry
position (frame) and each block's count by [the entry it adds names it] - [the entry it removes
names it], so ``ref == holders`` (BLK-003 over every group) holds for every size; conservation
(BLK-001) follows from STR-001 by `parametric.prove_partition`.

What this does not prove: that a reference action is such a sequence (checked on the hybrid
reference by tests/test_group_proofs.py), the rest of HYB-002 (a key is its content's: no flow's
encoding models token contents), and the step rules HYB-003..008 (what one step reads, writes,
frees and schedules: not state invariants). The actions are the synchronous V1 flow's and the
pipelined one's ``process``; the pipelined reference frees on processed tokens, which changes when
``skip`` runs, not what it does (the test replays it too).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import z3

from spec.proofs.parametric import ParametricResult, prove_partition

I = z3.IntSort()  # noqa: E741
B = z3.BoolSort()
NULL = -1  # spec.kv_groups.NULL_BLOCK

GROUP_OPS = ("append", "touch", "pad", "skip", "drop", "run", "wait", "finish")
# The hybrid flow's actions (V1's, over every group) as micro-op sequences (add touches no block);
# ``process`` is the pipelined reference's (HybridAsyncScheduler): a processed outcome that finishes
# a request drops its tables (its ``skip`` runs on the returned steps' tokens, in ``chunk``).
# A request that ends (its chunk's update stops it, an abort, an ignore, a finishing outcome) drops
# every table, then ``finish``es.
GROUP_ACTION_OPS: dict[str, tuple[str, ...]] = {
    "add": (),
    "admit": ("run", "touch", "pad", "append", "drop", "finish"),
    "chunk": ("skip", "pad", "append", "drop", "finish"),
    "preempt_recompute": ("drop", "wait"),
    "abort": ("drop", "finish"),
    "ignore": ("drop", "finish"),
    "process": ("drop", "finish"),
}
GROUP_FACTS = ("counts", "range", "named-not-free", "distinct", "group-owned", "waiting-empty", "finished-empty")
# The rows and the facts each needs (``partition``: parametric.prove_partition).
GROUP_ROW_FACTS: dict[str, tuple[str, ...]] = {
    "BLK-001": ("counts", "range", "partition"),
    "BLK-003": ("range", "delta", "counts"),
    "BLK-005": ("named-not-free",),
    "BLK-006": ("distinct",),
    "STR-001": ("counts",),
    "HYB-001": ("range", "named-not-free", "waiting-empty"),
    "HYB-002/tables": ("group-owned", "distinct"),
    # RES-004 over every group: a finished request's tables name no real block in any group
    "RES-004": ("range", "finished-empty"),
}
# Mutated micro-operations, each with the fact it breaks and what it is in the hybrid reference
# (conformance/selftest/mutants_hybrid.py names the conformance mutant where there is one).
GROUP_MUTANTS: dict[str, tuple[str, str, str]] = {
    "skip-frees-held": ("skip", "named-not-free", "hybrid-evicted-still-named: a window eviction frees a block "
                                                  "a table still names"),
    "hit-ignores-group": ("touch", "group-owned", "a prefix hit takes a block of another group (vLLM's lookup by "
                                                  "BlockHashWithGroupId prevents it; hybrid-keys-without-group drops "
                                                  "the group from the key and is caught by HYB-002's key half)"),
    "hit-not-counted": ("touch", "delta", "hybrid-shared-hit-not-counted: a hit on a held block takes no "
                                          "reference"),
    "finish-keeps-group-blocks": ("finish", "finished-empty", "a request finishes while a table of one of its "
                                                              "groups still names a block (a free that releases "
                                                              "group 0's table only)"),
}


@dataclass
class GState:
    """One parametric state of the groups' block layer."""

    ref: Any  # block -> count
    free: Any  # block -> on the free list
    bg: Any  # block -> the group it was last taken fresh for
    tab: Any  # (table, index) -> block or NULL
    tlen: Any  # table -> length
    grp: Any  # table -> its group (fixed)
    req: Any  # table -> its request (fixed)
    wait: Any  # request -> waiting
    done: Any  # request -> finished


@dataclass
class GOp:
    name: str
    guard: Any
    post: GState
    pos: tuple[Any, Any] | None  # the entry position it changes
    removed: Any  # the entry it removes there (None: no entry)
    added: Any  # the entry it adds there (None: no entry)
    params: dict[str, Any]


class GroupLayer:
    """Groups' tables over one symbolic pool of ``NG`` blocks."""

    def __init__(self, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in GROUP_MUTANTS:
            raise ValueError(f"unknown group-layer mutant {mutant!r} (known: {', '.join(GROUP_MUTANTS)})")
        self.mutant = mutant
        self.NG = z3.Int("NG")

    def state(self, p: str) -> GState:
        return GState(z3.Array(f"{p}_ref", I, I), z3.Array(f"{p}_free", I, B), z3.Array(f"{p}_bg", I, I),
                      z3.Array(f"{p}_tab", I, I, I), z3.Array(f"{p}_tlen", I, I), z3.Array(f"{p}_grp", I, I),
                      z3.Array(f"{p}_req", I, I), z3.Array(f"{p}_wait", I, B), z3.Array(f"{p}_done", I, B))

    def valid(self, b: Any) -> Any:
        return z3.And(b >= 0, b < self.NG)

    @staticmethod
    def entry(st: GState, t: Any, i: Any) -> Any:
        return z3.And(i >= 0, i < st.tlen[t])

    def real(self, st: GState, t: Any, i: Any) -> Any:
        return z3.And(self.entry(st, t, i), st.tab[t, i] != NULL)

    # ------------------------------------------------------------------ facts
    def facts(self, st: GState) -> dict[str, Any]:
        b, t, u, i, j = z3.Ints("g_b g_t g_u g_i g_j")
        R = self.real
        return {
            "counts": z3.ForAll([b], z3.Implies(self.valid(b), z3.And(st.ref[b] >= 0, st.free[b] == (st.ref[b] == 0)))),
            "range": z3.And(z3.ForAll([t], st.tlen[t] >= 0), z3.ForAll([t, i], z3.Implies(
                self.entry(st, t, i), z3.Or(st.tab[t, i] == NULL, self.valid(st.tab[t, i]))))),
            "named-not-free": z3.ForAll([t, i], z3.Implies(R(st, t, i), z3.Not(st.free[st.tab[t, i]]))),
            "distinct": z3.ForAll([t, i, j], z3.Implies(z3.And(i < j, R(st, t, i), R(st, t, j)),
                                                        st.tab[t, i] != st.tab[t, j])),
            "group-owned": z3.ForAll([t, i], z3.Implies(R(st, t, i), st.bg[st.tab[t, i]] == st.grp[t])),
            "waiting-empty": z3.ForAll([t, i], z3.Implies(R(st, t, i), z3.Not(st.wait[st.req[t]]))),
            "finished-empty": z3.ForAll([t, i], z3.Implies(R(st, t, i), z3.Not(st.done[st.req[t]]))),
            # consequences of ref == holders (BLK-003), hypotheses only
            "held-once": z3.ForAll([t, i], z3.Implies(R(st, t, i), st.ref[st.tab[t, i]] >= 1)),
            "held-twice": z3.ForAll([t, i, u, j], z3.Implies(
                z3.And(R(st, t, i), R(st, u, j), z3.Or(t != u, i != j), st.tab[t, i] == st.tab[u, j]),
                st.ref[st.tab[t, i]] >= 2)),
        }

    # ------------------------------------------------------------------ micro-operations
    def op(self, name: str, st: GState) -> GOp:
        return getattr(self, f"_op_{name}")(st)

    @staticmethod
    def _with(st: GState, **kw: Any) -> GState:
        base = dict(ref=st.ref, free=st.free, bg=st.bg, tab=st.tab, tlen=st.tlen, grp=st.grp, req=st.req, wait=st.wait,
                    done=st.done)
        base.update(kw)
        return GState(**base)

    def _decref(self, st: GState, b: Any) -> tuple[Any, Any]:
        r = st.ref[b] - 1
        freed = z3.BoolVal(True) if self.mutant == "skip-frees-held" else z3.Or(st.free[b], r == 0)
        return z3.Store(st.ref, b, r), z3.Store(st.free, b, freed)

    def _op_append(self, st: GState) -> GOp:
        t, b = z3.Ints("p_t p_b")
        n = st.tlen[t]
        post = self._with(st, ref=z3.Store(st.ref, b, 1), free=z3.Store(st.free, b, False),
                          bg=z3.Store(st.bg, b, st.grp[t]), tab=z3.Store(st.tab, t, n, b), tlen=z3.Store(st.tlen, t, n + 1))
        guard = z3.And(self.valid(b), st.free[b], z3.Not(st.wait[st.req[t]]), z3.Not(st.done[st.req[t]]))
        return GOp("append", guard, post, (t, n), None, b, {"t": t, "b": b})

    def _op_touch(self, st: GState) -> GOp:
        t, b, j = z3.Int("p_t"), z3.Int("p_b"), z3.Int("p_j")
        n = st.tlen[t]
        fresh_in_table = z3.ForAll([j], z3.Implies(z3.And(j >= 0, j < n), st.tab[t, j] != b))
        keyed_for_group = z3.BoolVal(True) if self.mutant == "hit-ignores-group" else st.bg[b] == st.grp[t]
        ref = st.ref if self.mutant == "hit-not-counted" else z3.Store(st.ref, b, st.ref[b] + 1)
        post = self._with(st, ref=ref, free=z3.Store(st.free, b, False), tab=z3.Store(st.tab, t, n, b),
                          tlen=z3.Store(st.tlen, t, n + 1))
        guard = z3.And(self.valid(b), keyed_for_group, fresh_in_table, z3.Not(st.wait[st.req[t]]),
                       z3.Not(st.done[st.req[t]]))
        return GOp("touch", guard, post, (t, n), None, b, {"t": t, "b": b})

    def _op_pad(self, st: GState) -> GOp:
        t = z3.Int("p_t")
        n = st.tlen[t]
        post = self._with(st, tab=z3.Store(st.tab, t, n, NULL), tlen=z3.Store(st.tlen, t, n + 1))
        return GOp("pad", z3.BoolVal(True), post, (t, n), None, z3.IntVal(NULL), {"t": t})

    def _op_skip(self, st: GState) -> GOp:
        t, i = z3.Ints("p_t p_i")
        b = st.tab[t, i]
        ref, free = self._decref(st, b)
        post = self._with(st, ref=ref, free=free, tab=z3.Store(st.tab, t, i, NULL))
        return GOp("skip", self.real(st, t, i), post, (t, i), b, z3.IntVal(NULL), {"t": t, "i": i})

    def _op_drop(self, st: GState) -> GOp:
        t = z3.Int("p_t")
        i = st.tlen[t] - 1
        b = st.tab[t, i]
        ref, free = self._decref(st, b)
        is_real = b != NULL
        post = self._with(st, ref=z3.If(is_real, ref, st.ref), free=z3.If(is_real, free, st.free),
                          tlen=z3.Store(st.tlen, t, i))
        return GOp("drop", st.tlen[t] >= 1, post, (t, i), b, None, {"t": t})

    def _op_run(self, st: GState) -> GOp:
        r = z3.Int("p_r")
        return GOp("run", z3.BoolVal(True), self._with(st, wait=z3.Store(st.wait, r, False)), None, None, None, {"r": r})

    def _op_wait(self, st: GState) -> GOp:
        r, t, i = z3.Ints("p_r w_t w_i")
        holds_none = z3.ForAll([t, i], z3.Implies(z3.And(st.req[t] == r, self.real(st, t, i)), z3.BoolVal(False)))
        return GOp("wait", holds_none, self._with(st, wait=z3.Store(st.wait, r, True)), None, None, None, {"r": r})

    def _op_finish(self, st: GState) -> GOp:
        """The request ends: only once no table of it names a real block (every group dropped)."""
        r, t, i = z3.Ints("p_r f_t f_i")
        holds_none = z3.ForAll([t, i], z3.Implies(z3.And(st.req[t] == r, self.real(st, t, i)), z3.BoolVal(False)))
        guard = z3.BoolVal(True) if self.mutant == "finish-keeps-group-blocks" else holds_none
        return GOp("finish", guard, self._with(st, done=z3.Store(st.done, r, True)), None, None, None, {"r": r})

    # ------------------------------------------------------------------ the delta check
    def delta(self, pre: GState, op: GOp) -> Any:
        """Frame (no other entry position changes; groups and requests of tables are fixed) and
        each block's count changes by added minus removed (a null entry names no block)."""
        post = op.post
        t, i, b = z3.Ints("f_t f_i f_b")
        pt, pi = op.pos if op.pos is not None else (z3.IntVal(-1), z3.IntVal(-1))
        elsewhere = z3.Not(z3.And(t == pt, i == pi))
        frame = z3.And(
            z3.ForAll([t, i], z3.Implies(elsewhere, z3.And(
                self.entry(post, t, i) == self.entry(pre, t, i),
                z3.Implies(self.entry(pre, t, i), post.tab[t, i] == pre.tab[t, i])))),
            z3.ForAll([t], z3.And(post.grp[t] == pre.grp[t], post.req[t] == pre.req[t])))
        here = []
        if op.pos is not None:
            for st, e in ((pre, op.removed), (post, op.added)):
                here.append(z3.Not(self.entry(st, pt, pi)) if e is None
                            else z3.And(self.entry(st, pt, pi), st.tab[pt, pi] == e))

        def hit(e: Any) -> Any:
            return 0 if e is None else z3.If(e == b, 1, 0)

        counts = z3.ForAll([b], z3.Implies(self.valid(b), post.ref[b] == pre.ref[b] + hit(op.added) - hit(op.removed)))
        return z3.And(frame, *here, counts)


def _check(hyps: list[Any], goal: Any, timeout_ms: int) -> str:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*hyps, z3.Not(goal))
    r = s.check()
    return "proved" if r == z3.unsat else "counterexample" if r == z3.sat else "unknown"


def prove_group_ops(mutant: str | None = None, ops: tuple[str, ...] = GROUP_OPS,
                    timeout_ms: int = 20_000) -> list[ParametricResult]:
    """Each fact (and ``delta``) after each micro-op, from every fact before it, for every size."""
    L = GroupLayer(mutant)
    out = []
    for name in ops:
        pre = L.state("pre")
        op = L.op(name, pre)
        hyps = [L.NG >= 1, op.guard, *L.facts(pre).values()]
        after = L.facts(op.post)
        goals = {f: after[f] for f in GROUP_FACTS}
        goals["delta"] = L.delta(pre, op)
        for fact, goal in goals.items():
            t0 = time.perf_counter()
            out.append(ParametricResult(fact, name, _check(hyps, goal, timeout_ms), time.perf_counter() - t0))
    return out


def prove_group_init(timeout_ms: int = 20_000) -> bool:
    """The empty scheduler (every block free with count 0, no table) has every fact."""
    L = GroupLayer()
    a, c = z3.Int("a"), z3.Int("c")
    init = GState(z3.K(I, z3.IntVal(0)), z3.K(I, z3.BoolVal(True)), z3.Array("init_bg", I, I),
                  z3.Lambda([a, c], z3.IntVal(NULL)), z3.K(I, z3.IntVal(0)), z3.Array("init_grp", I, I),
                  z3.Array("init_req", I, I), z3.Array("init_wait", I, B), z3.Array("init_done", I, B))
    facts = L.facts(init)
    return all(_check([L.NG >= 1], facts[f], timeout_ms) == "proved" for f in GROUP_FACTS)


@dataclass
class GroupProof:
    results: list[ParametricResult]
    init: bool
    partition: bool
    seconds: float

    def op_ok(self, op: str) -> bool:
        got = {r.fact for r in self.results if r.op == op and r.result == "proved"}
        return {*GROUP_FACTS, "delta"} <= got  # every fact is a hypothesis of the others

    def cells(self) -> set[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for row, facts in GROUP_ROW_FACTS.items():
            if "partition" in facts and not self.partition:
                continue
            if self.init:
                out.add((row, "init"))
            out |= {(row, a) for a, ops in GROUP_ACTION_OPS.items() if all(self.op_ok(o) for o in ops)}
        return out

    def to_dict(self) -> dict[str, Any]:
        ops: dict[str, dict[str, str]] = {}
        for r in self.results:
            ops.setdefault(r.op, {})[r.fact] = r.result
        return {"ops": ops, "init": self.init, "partition": self.partition, "seconds": round(self.seconds, 3)}


_CACHE: dict[tuple[str | None, int], GroupProof] = {}


def prove_groups(mutant: str | None = None, timeout_ms: int = 20_000) -> GroupProof:
    """Every micro-op against every fact, the empty state and the partition lemma (cached)."""
    key = (mutant, timeout_ms)
    if key not in _CACHE:
        t0 = time.perf_counter()
        results = prove_group_ops(mutant, timeout_ms=timeout_ms)
        _CACHE[key] = GroupProof(results, prove_group_init(timeout_ms), prove_partition(timeout_ms),
                                 time.perf_counter() - t0)
    return _CACHE[key]


def concrete(tables: dict[int, tuple[int, int, list[int]]], ng: int, block_groups: dict[int, int],
             waiting: set[int] = frozenset(), finished: set[int] = frozenset()) -> GState:
    """A concrete state: table -> (request, group, entries); counts are the holders, free exactly
    the unheld blocks; ``block_groups`` gives ``bg`` (the group a block was taken for)."""
    a, c = z3.Int("c_a"), z3.Int("c_c")
    held: dict[int, int] = {}
    for _, _, entries in tables.values():
        for e in entries:
            if e != NULL:
                held[e] = held.get(e, 0) + 1

    def table_fn(pick: Any, default: int) -> Any:
        body: Any = z3.IntVal(default)
        for t, row in tables.items():
            body = z3.If(a == t, pick(row), body)
        return z3.Lambda([a], body)

    tab: Any = z3.IntVal(NULL)
    for t, (_, _, entries) in tables.items():
        for i, e in enumerate(entries):
            tab = z3.If(z3.And(a == t, c == i), e, tab)
    ref: Any = z3.IntVal(0)
    for b, k in held.items():
        ref = z3.If(a == b, k, ref)
    bg: Any = z3.IntVal(0)
    for b, g in block_groups.items():
        bg = z3.If(a == b, g, bg)
    wait: Any = z3.BoolVal(False)
    for r in waiting:
        wait = z3.If(a == r, True, wait)
    done: Any = z3.BoolVal(False)
    for r in finished:
        done = z3.If(a == r, True, done)
    del ng
    return GState(z3.Lambda([a], ref), z3.Lambda([a], ref == 0), z3.Lambda([a], bg), z3.Lambda([a, c], tab),
                  table_fn(lambda row: len(row[2]), 0), table_fn(lambda row: row[1], 0),
                  table_fn(lambda row: row[0], 0), z3.Lambda([a], wait), z3.Lambda([a], done))


# A concrete pre-state per mutant (table -> (request, group, entries), pool size, block groups):
# request 0 holds block 0 in group 1 and request 1 holds it too (a shared prefix hit); block 1 is
# a free block last taken for group 2 (its key is group 2's).
MUTANT_WITNESS: dict[str, tuple[dict[int, tuple[int, int, list[int]]], int, dict[int, int]]] = {
    "skip-frees-held": ({0: (0, 1, [0]), 1: (1, 1, [0])}, 3, {0: 1, 1: 2}),
    "hit-ignores-group": ({0: (0, 1, [0]), 2: (1, 1, [])}, 3, {0: 1, 1: 2}),
    "hit-not-counted": ({0: (0, 1, [0]), 2: (1, 1, [])}, 3, {0: 1, 1: 2}),
    "finish-keeps-group-blocks": ({0: (0, 0, []), 1: (0, 1, [0])}, 3, {0: 1, 1: 2}),
}


def mutant_breaks(mutant: str, timeout_ms: int = 20_000) -> dict[str, Any] | None:
    """On the mutant's witness state (where every fact holds), the micro-op parameters Z3 finds
    that break the fact the mutated micro-op breaks, and the cells whose proof it breaks;
    ``None`` when the mutant is not caught there."""
    op_name, fact, _ = GROUP_MUTANTS[mutant]
    tables, ng, block_groups = MUTANT_WITNESS[mutant]
    L = GroupLayer(mutant)
    pre = concrete(tables, ng, block_groups)
    op = L.op(op_name, pre)
    goal = L.delta(pre, op) if fact == "delta" else L.facts(op.post)[fact]
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(L.NG == ng, op.guard, *L.facts(pre).values(), z3.Not(goal))
    if s.check() != z3.sat:
        return None
    m = s.model()
    cells = sorted((row, action) for row, facts in GROUP_ROW_FACTS.items() if fact in facts
                   for action, ops in GROUP_ACTION_OPS.items() if op_name in ops)
    return {"mutant": mutant, "op": op_name, "fact": fact, "cells": [list(c) for c in cells],
            "params": {k: m.eval(v, model_completion=True).as_long() for k, v in op.params.items()}}


def holds(tables: dict[int, tuple[int, int, list[int]]], ng: int, block_groups: dict[int, int],
          waiting: set[int] = frozenset(), timeout_ms: int = 20_000) -> bool:
    """Every group fact holds on the concrete state."""
    L = GroupLayer()
    st = concrete(tables, ng, block_groups, waiting)
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(L.NG == ng, z3.Not(z3.And(*(L.facts(st)[f] for f in GROUP_FACTS))))
    return s.check() == z3.unsat
