"""The block layer for every size: a parametric Z3 encoding of pools and block tables.

The bounded encoding (``spec.proofs.encoding``) unrolls every pool, table and sequence, so its
proofs hold only up to the bound. Here block ids, sequence ids and table indices are unbounded
integers (Z3 arrays), the pool sizes ``NG`` / ``NC`` are symbolic, and the block invariants are
universally quantified, so one proof covers every pool size, sequence count, request count and
table length.

Why micro-operations. A scheduler action touches a number of table entries that grows with the
size (a prefill allocates ``ceil(prompt / block_size)`` blocks, a swap moves every block of a
request), so it cannot be one quantifier-free transition for all sizes. Every action of both
flows is instead a finite sequence of five *micro-operations*, each changing at most one table
entry (or none):

- ``append(s, d, b)``: a free block ``b`` of device ``d`` goes to the end of ``s``'s table
  (BlockPool.allocate then the table grows: prefill, a decode's new block, a V1 chunk);
- ``share(t, s)``: child ``t`` takes the next entry of parent ``s``'s table, reference count + 1
  (BlockManager.fork, entry by entry, in order);
- ``replace(s, i, b)``: entry ``i`` of ``s`` becomes the free block ``b`` and the old block loses
  a reference (copy-on-write: allocate, then decref);
- ``drop(s)``: the last entry of ``s`` goes, one reference less, free at zero (BlockManager.free,
  the length cap, preemption by recompute, finish, abort, ignore);
- ``move(s, i, c)``: entry ``i`` of ``s`` moves to the other device, to the block its source
  already went to in this move (``map``) or to a free block ``c`` (BlockManager.swap_out/in:
  each distinct block once, to a fresh block, in order of first appearance).

Ghost state, maintained by the micro-operations, makes every fact local: the move's block map
(``mapped``/``map``, reset by every other micro-operation) and the per-entry device (a table is
on one device between actions, mixed only in the middle of a move). Reference counts are tied to
the tables by a *delta* check: each micro-operation changes at most one entry position (frame,
checked for all other positions) and changes each block's count by exactly the number of entries
naming it that it added minus those it removed. Since ``holders(d, b)`` is a sum over entries,
``ref == holders`` (BLK-003/004) is then preserved for every size; its two consequences used as
hypotheses (a named block has count >= 1, a block named twice has count >= 2) follow from it.
Conservation (BLK-001/002) follows from STR-001 and non-negative counts by a partition of
``[0, N)``, proved here by induction on ``N`` (``prove_partition``).

What this does not prove: that a reference action *is* such a sequence. That is checked against
the reference scheduler, on the states Hypothesis draws, by
``tests/test_parametric_matches_reference.py`` (``decompose`` below builds the sequence).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from spec.proofs.encoding import CPU, GPU

I = z3.IntSort()  # noqa: E741
B = z3.BoolSort()

# The micro-operations each action of each flow is made of (add touches no block).
ACTION_OPS: dict[str, dict[str, tuple[str, ...]]] = {
    "v0": {
        "add": (),
        "admit": ("append", "drop"),
        "fork": ("append", "share", "drop"),
        "decode": ("append", "replace", "drop"),
        "preempt_recompute": ("drop",),
        "swap_out": ("move",),
        "swap_in": ("move", "append", "replace", "drop"),
        "finish": ("drop",),
        "abort": ("drop",),
        "ignore": ("drop",),
    },
    "v1": {
        "add": (),
        "admit": ("append", "drop"),
        "chunk": ("append", "drop"),
        "preempt_recompute": ("drop",),
        "abort": ("drop",),
        "ignore": ("drop",),
    },
}
# The pipelined V1 flow (spec/proofs/encoding_async.py): schedule() appends like a V1 chunk, a
# processed outcome that finishes a request releases its table
ACTION_OPS["async"] = {**ACTION_OPS["v1"], "process": ("drop",)}
# The speculative V1 flow (spec/proofs/encoding_specdec.py): a verifying step appends the slots of
# its drafts like a chunk's; a rejection frees no block (the slots are kept), a finish drops the table
ACTION_OPS["specdec"] = {**ACTION_OPS["v1"], "verify": ("append", "drop")}
# V1 with a KV connector (spec/proofs/encoding_connector.py): a load appends its fresh blocks, a landed
# load that frees (aborted, failed under fail, nothing valid), a reported send and an abort release the
# table tail first; a table kept for a transfer (an abort during a load, a delayed free) is no op at all
ACTION_OPS["connector"] = {**ACTION_OPS["v1"], "load_start": ("append",), "load_land": ("drop",),
                           "send_done": ("drop",)}
OPS = ("append", "share", "replace", "drop", "move")

# The block rows of the matrix and the parametric facts each needs (for every micro-op).
ROW_FACTS: dict[str, tuple[str, ...]] = {
    "BLK-001": ("counts", "range", "partition"),
    "BLK-002": ("counts", "range", "partition"),
    "BLK-003": ("range", "delta", "counts"),
    "BLK-004": ("range", "delta", "counts"),
    "BLK-005": ("named-not-free",),
    "BLK-006": ("distinct",),
    "STR-001": ("counts",),
}

# Mutated micro-operations: the block-layer halves of the bounded encoding's mutants.
MUTANTS = {
    "fork-no-incref": "share", "swapin-busy-block": "move",
    # the connector flow's (spec/proofs/encoding_connector.py): a load appends a block another table names
    "load-into-held-block": "append",
}
# A mutant whose mutated micro-op runs in some of its flow's actions only: those actions (else every
# action made of that op)
MUTANT_ACTIONS = {"load-into-held-block": ("load_start",)}


@dataclass
class PState:
    """One parametric block-layer state (plus the move's ghost map)."""

    ref: Any  # (device, block) -> count
    free: Any  # (device, block) -> on the free list
    tab: Any  # (seq, index) -> block
    tdv: Any  # (seq, index) -> device of that entry
    tlen: Any  # seq -> table length
    mapped: Any  # source block -> moved in this move
    map: Any  # source block -> destination block
    msrc: Any  # the move's source device


@dataclass
class Op:
    """One micro-operation: guard, post-state, and the (at most one) entry position it changes
    with the entry it removes and the one it adds (``None``: no entry)."""

    name: str
    guard: Any
    post: PState
    pos: tuple[Any, Any] | None
    removed: tuple[Any, Any] | None
    added: tuple[Any, Any] | None
    params: dict[str, Any] = field(default_factory=dict)


class Parametric:
    """Symbolic pools of every size: ``NG`` GPU and ``NC`` CPU blocks, unbounded tables."""

    def __init__(self, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in MUTANTS:
            raise ValueError(f"unknown parametric mutant {mutant!r}")
        self.mutant = mutant
        self.NG, self.NC = z3.Ints("NG NC")

    def state(self, p: str) -> PState:
        return PState(
            z3.Array(f"{p}_ref", I, I, I), z3.Array(f"{p}_free", I, I, B), z3.Array(f"{p}_tab", I, I, I),
            z3.Array(f"{p}_tdv", I, I, I), z3.Array(f"{p}_tlen", I, I), z3.Array(f"{p}_mapped", I, B),
            z3.Array(f"{p}_map", I, I), z3.Int(f"{p}_msrc"),
        )

    def sizes_ok(self) -> Any:
        return z3.And(self.NG >= 1, self.NC >= 0)

    def npool(self, d: Any) -> Any:
        return z3.If(d == GPU, self.NG, self.NC)

    def valid(self, d: Any, b: Any) -> Any:
        return z3.And(z3.Or(d == GPU, d == CPU), b >= 0, b < self.npool(d))

    @staticmethod
    def other(d: Any) -> Any:
        return z3.If(d == GPU, CPU, GPU)

    @staticmethod
    def entry(st: PState, s: Any, i: Any) -> Any:
        return z3.And(i >= 0, i < st.tlen[s])

    @staticmethod
    def at(st: PState, s: Any, i: Any) -> tuple[Any, Any]:
        return st.tdv[s, i], st.tab[s, i]

    # ------------------------------------------------------------------ invariants (quantified)
    def facts(self, st: PState) -> dict[str, Any]:
        """The block layer's invariants, by name (``delta`` and ``partition`` are not state facts)."""
        d, b, s, t, i, j, x = z3.Ints("q_d q_b q_s q_t q_i q_j q_x")
        E = self.entry
        same = lambda s1, i1, s2, i2: z3.And(st.tdv[s1, i1] == st.tdv[s2, i2], st.tab[s1, i1] == st.tab[s2, i2])  # noqa: E731
        msrc, mdst = st.msrc, self.other(st.msrc)
        return {
            # STR-001 and non-negative counts, per block of each pool
            "counts": z3.ForAll([d, b], z3.Implies(self.valid(d, b), z3.And(
                st.ref[d, b] >= 0, st.free[d, b] == (st.ref[d, b] == 0)))),
            # entries name blocks of their pool (the validity half of BLK-003/004); lengths >= 0
            "range": z3.And(
                z3.ForAll([s], st.tlen[s] >= 0),
                z3.ForAll([s, i], z3.Implies(E(st, s, i), self.valid(st.tdv[s, i], st.tab[s, i])))),
            "named-not-free": z3.ForAll([s, i], z3.Implies(E(st, s, i), z3.Not(st.free[st.tdv[s, i], st.tab[s, i]]))),
            "distinct": z3.ForAll([s, i, j], z3.Implies(z3.And(i >= 0, i < j, j < st.tlen[s]), z3.Not(same(s, i, s, j)))),
            # the move's ghost map: onto held destination blocks, injective, and no table holds
            # both a moved block and its copy
            "map": z3.And(
                z3.Or(msrc == GPU, msrc == CPU),
                z3.ForAll([x], z3.Implies(st.mapped[x], z3.And(
                    self.valid(mdst, st.map[x]), z3.Not(st.free[mdst, st.map[x]])))),
                z3.ForAll([x, b], z3.Implies(z3.And(st.mapped[x], st.mapped[b], x != b), st.map[x] != st.map[b])),
                z3.ForAll([s, i, j, x], z3.Not(z3.And(
                    st.mapped[x], E(st, s, i), E(st, s, j), st.tdv[s, i] == msrc, st.tab[s, i] == x,
                    st.tdv[s, j] == mdst, st.tab[s, j] == st.map[x])))),
            # consequences of ref == holders (BLK-003/004), used as hypotheses only
            "held-once": z3.ForAll([s, i], z3.Implies(E(st, s, i), st.ref[st.tdv[s, i], st.tab[s, i]] >= 1)),
            "held-twice": z3.ForAll([s, i, t, j], z3.Implies(
                z3.And(E(st, s, i), E(st, t, j), z3.Or(s != t, i != j), same(s, i, t, j)),
                st.ref[st.tdv[s, i], st.tab[s, i]] >= 2)),
        }

    PROVED_FACTS = ("counts", "range", "named-not-free", "distinct", "map")

    # ------------------------------------------------------------------ pool steps
    def _take(self, st: PState, d: Any, b: Any) -> tuple[Any, Any]:
        return z3.Store(st.ref, d, b, 1), z3.Store(st.free, d, b, False)

    def _decref(self, ref: Any, free: Any, d: Any, b: Any) -> tuple[Any, Any]:
        r = ref[d, b] - 1
        return z3.Store(ref, d, b, r), z3.Store(free, d, b, z3.Or(free[d, b], r == 0))

    @staticmethod
    def _reset(st: PState, **kw: Any) -> PState:
        """A post-state; every micro-op but ``move`` ends a move (the ghost map is emptied)."""
        base = dict(ref=st.ref, free=st.free, tab=st.tab, tdv=st.tdv, tlen=st.tlen,
                    mapped=z3.K(I, z3.BoolVal(False)), map=st.map, msrc=st.msrc)
        base.update(kw)
        return PState(**base)

    # ------------------------------------------------------------------ micro-operations
    def op(self, name: str, st: PState) -> Op:
        return getattr(self, f"_op_{name}")(st)

    def _op_append(self, st: PState) -> Op:
        s, d, b = z3.Ints("p_s p_d p_b")
        n = st.tlen[s]
        ref, free = self._take(st, d, b)
        post = self._reset(st, ref=ref, free=free, tab=z3.Store(st.tab, s, n, b), tdv=z3.Store(st.tdv, s, n, d),
                           tlen=z3.Store(st.tlen, s, n + 1))
        taken = z3.BoolVal(True) if self.mutant == "load-into-held-block" else st.free[d, b]
        return Op("append", z3.And(self.valid(d, b), taken), post, (s, n), None, (d, b),
                  {"s": s, "d": d, "b": b})

    def _op_share(self, st: PState) -> Op:
        t, s, j = z3.Int("p_t"), z3.Int("p_s"), z3.Int("p_j")
        n = st.tlen[t]
        d, b = self.at(st, s, n)
        prefix = z3.ForAll([j], z3.Implies(z3.And(j >= 0, j < n), z3.And(
            st.tab[t, j] == st.tab[s, j], st.tdv[t, j] == st.tdv[s, j])))
        ref = st.ref if self.mutant == "fork-no-incref" else z3.Store(st.ref, d, b, st.ref[d, b] + 1)
        post = self._reset(st, ref=ref, tab=z3.Store(st.tab, t, n, b), tdv=z3.Store(st.tdv, t, n, d),
                           tlen=z3.Store(st.tlen, t, n + 1))
        return Op("share", z3.And(t != s, n < st.tlen[s], prefix), post, (t, n), None, (d, b), {"t": t, "s": s})

    def _op_replace(self, st: PState) -> Op:
        s, i, b = z3.Ints("p_s p_i p_b")
        d, old = self.at(st, s, i)
        ref, free = self._take(st, d, b)
        ref, free = self._decref(ref, free, d, old)
        post = self._reset(st, ref=ref, free=free, tab=z3.Store(st.tab, s, i, b))
        return Op("replace", z3.And(self.entry(st, s, i), self.valid(d, b), st.free[d, b]), post,
                  (s, i), (d, old), (d, b), {"s": s, "i": i, "b": b})

    def _op_drop(self, st: PState) -> Op:
        s = z3.Int("p_s")
        i = st.tlen[s] - 1
        d, b = self.at(st, s, i)
        ref, free = self._decref(st.ref, st.free, d, b)
        post = self._reset(st, ref=ref, free=free, tlen=z3.Store(st.tlen, s, i))
        return Op("drop", st.tlen[s] >= 1, post, (s, i), (d, b), None, {"s": s})

    def _op_move(self, st: PState) -> Op:
        s, i, c, x, start = z3.Int("p_s"), z3.Int("p_i"), z3.Int("p_c"), z3.Int("p_x"), z3.Int("p_start")
        d, b = self.at(st, s, i)
        d2 = self.other(d)
        # a new move (``start`` = 1: the first entry of a swap) starts from an empty map; a move
        # goes on only in its own direction
        mapped = z3.If(z3.And(start == 0, st.msrc == d), st.mapped, z3.K(I, z3.BoolVal(False)))
        again = mapped[b]
        fresh_ok = z3.And(self.valid(d2, c), st.free[d2, c])
        if self.mutant == "swapin-busy-block":  # the lowest block not taken in this move, free or not
            fresh_ok = z3.And(self.valid(d2, c), z3.ForAll([x], z3.Implies(mapped[x], st.map[x] != c)))
        dest = z3.If(again, st.map[b], c)
        ref = z3.If(again, z3.Store(st.ref, d2, dest, st.ref[d2, dest] + 1), z3.Store(st.ref, d2, c, 1))
        free = z3.If(again, st.free, z3.Store(st.free, d2, c, False))
        ref, free = self._decref(ref, free, d, b)
        post = PState(ref, free, z3.Store(st.tab, s, i, dest), z3.Store(st.tdv, s, i, d2), st.tlen,
                      z3.Store(mapped, b, True), z3.Store(st.map, b, dest), d)
        guard = z3.And(self.entry(st, s, i), z3.Or(again, fresh_ok))
        return Op("move", guard, post, (s, i), (d, b), (d2, dest), {"s": s, "i": i, "c": c, "start": start})

    # ------------------------------------------------------------------ the delta check
    def delta(self, pre: PState, op: Op) -> Any:
        """Frame (no other entry position changes) and counts change by added minus removed."""
        post = op.post
        s, i, d, b = z3.Ints("f_s f_i f_d f_b")
        ps, pi = op.pos if op.pos is not None else (z3.IntVal(-1), z3.IntVal(-1))
        elsewhere = z3.Not(z3.And(s == ps, i == pi))
        frame = z3.ForAll([s, i], z3.Implies(elsewhere, z3.And(
            self.entry(post, s, i) == self.entry(pre, s, i),
            z3.Implies(self.entry(pre, s, i), z3.And(post.tab[s, i] == pre.tab[s, i], post.tdv[s, i] == pre.tdv[s, i])))))
        here = []
        if op.pos is not None:
            for when, st, e in ((pre, pre, op.removed), (post, post, op.added)):
                del when
                if e is None:
                    here.append(z3.Not(self.entry(st, ps, pi)))
                else:
                    here.append(z3.And(self.entry(st, ps, pi), st.tdv[ps, pi] == e[0], st.tab[ps, pi] == e[1]))

        def hit(e: tuple[Any, Any] | None) -> Any:
            return 0 if e is None else z3.If(z3.And(e[0] == d, e[1] == b), 1, 0)

        counts = z3.ForAll([d, b], z3.Implies(self.valid(d, b),
                                              post.ref[d, b] == pre.ref[d, b] + hit(op.added) - hit(op.removed)))
        return z3.And(frame, *here, counts)


@dataclass
class ParametricResult:
    fact: str
    op: str
    result: str  # proved | counterexample | unknown
    seconds: float


def _check(hyps: list[Any], goal: Any, timeout_ms: int) -> str:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*hyps, z3.Not(goal))
    r = s.check()
    return "proved" if r == z3.unsat else "counterexample" if r == z3.sat else "unknown"


def prove_ops(mutant: str | None = None, ops: tuple[str, ...] = OPS, timeout_ms: int = 20_000) -> list[ParametricResult]:
    """Each block fact is preserved by each micro-operation, for every size."""
    P = Parametric(mutant)
    out = []
    for name in ops:
        pre = P.state("pre")
        op = P.op(name, pre)
        before = P.facts(pre)
        after = P.facts(op.post)
        hyps = [P.sizes_ok(), op.guard, *before.values()]
        goals: dict[str, Any] = {f: after[f] for f in Parametric.PROVED_FACTS}
        goals["delta"] = P.delta(pre, op)
        for fact, goal in goals.items():
            t0 = time.perf_counter()
            out.append(ParametricResult(fact, name, _check(hyps, goal, timeout_ms), time.perf_counter() - t0))
    return out


def prove_unshared(timeout_ms: int = 20_000) -> bool:
    """The v1 flow's ops (append, drop) keep every count at most 1 (n = 1, no prefix caching: v1's
    WF says no block is shared)."""
    P = Parametric()
    d, b = z3.Ints("u_d u_b")

    def unshared(st: PState) -> Any:
        return z3.ForAll([d, b], z3.Implies(P.valid(d, b), st.ref[d, b] <= 1))

    ok = True
    for name in sorted({o for ops in ACTION_OPS["v1"].values() for o in ops}):
        pre = P.state("pre")
        op = P.op(name, pre)
        hyps = [P.sizes_ok(), op.guard, *P.facts(pre).values(), unshared(pre)]
        ok = ok and _check(hyps, unshared(op.post), timeout_ms) == "proved"
    return ok


def prove_init(timeout_ms: int = 20_000) -> bool:
    """The empty scheduler (every block free with count 0, no table, no move) has every fact."""
    P = Parametric()
    ref = z3.Lambda([z3.Int("a"), z3.Int("c")], z3.IntVal(0))
    free = z3.Lambda([z3.Int("a"), z3.Int("c")], z3.BoolVal(True))
    zero = z3.Lambda([z3.Int("a"), z3.Int("c")], z3.IntVal(0))
    init = PState(ref, free, zero, zero, z3.K(I, z3.IntVal(0)), z3.K(I, z3.BoolVal(False)), z3.K(I, z3.IntVal(0)),
                  z3.IntVal(GPU))
    facts = P.facts(init)
    return all(_check([P.sizes_ok()], facts[f], timeout_ms) == "proved" for f in Parametric.PROVED_FACTS)


_PARTITION_RUNS = 0


def prove_partition(timeout_ms: int = 20_000) -> bool:
    """BLK-001/002 from STR-001 and non-negative counts, for every pool size N, by induction on N:
    free(N) + in_use(N) == N when every block below N is free exactly when its count is zero."""
    A_i, A_b = z3.ArraySort(I, I), z3.ArraySort(I, B)
    global _PARTITION_RUNS
    _PARTITION_RUNS += 1  # a recursive function is defined once per name in Z3's context
    nfree = z3.RecFunction(f"nfree_{_PARTITION_RUNS}", A_b, I, I)
    nused = z3.RecFunction(f"nused_{_PARTITION_RUNS}", A_i, I, I)
    fr, rf, n = z3.Const("fr", A_b), z3.Const("rf", A_i), z3.Int("n")
    z3.RecAddDefinition(nfree, [fr, n], z3.If(n <= 0, 0, nfree(fr, n - 1) + z3.If(fr[n - 1], 1, 0)))
    z3.RecAddDefinition(nused, [rf, n], z3.If(n <= 0, 0, nused(rf, n - 1) + z3.If(rf[n - 1] > 0, 1, 0)))
    k = z3.Int("k")
    pointwise = z3.ForAll([k], z3.Implies(z3.And(k >= 0, k <= n), z3.And(rf[k] >= 0, fr[k] == (rf[k] == 0))))
    base = _check([], nfree(fr, 0) + nused(rf, 0) == 0, timeout_ms) == "proved"
    step = _check([n >= 0, pointwise, nfree(fr, n) + nused(rf, n) == n],
                  nfree(fr, n + 1) + nused(rf, n + 1) == n + 1, timeout_ms) == "proved"
    return base and step


@dataclass
class BlockProof:
    """What the parametric block proof establishes: per micro-op and fact, and per matrix row."""

    results: list[ParametricResult]
    init: bool
    partition: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        ops: dict[str, dict[str, str]] = {}
        for r in self.results:
            ops.setdefault(r.op, {})[r.fact] = r.result
        return {"ops": ops, "init": self.init, "partition": self.partition, "seconds": round(self.seconds, 3)}

    def failing(self) -> list[ParametricResult]:
        return [r for r in self.results if r.result != "proved"]

    def op_ok(self, op: str, facts: tuple[str, ...]) -> bool:
        need = {f for f in facts if f != "partition"}
        if "counts" in need or "delta" in need:
            need |= {"range"}
        got = {r.fact for r in self.results if r.op == op and r.result == "proved"}
        # every proved fact is needed as a hypothesis of the others: all must hold
        return {*Parametric.PROVED_FACTS, "delta"} <= got and need <= got

    def cells(self, flow_name: str) -> set[tuple[str, str]]:
        """The (row, action) cells of the flow's matrix proved for every size, plus ``init``."""
        out: set[tuple[str, str]] = set()
        for row, facts in ROW_FACTS.items():
            if "partition" in facts and not self.partition:
                continue
            if self.init:
                out.add((row, "init"))
            for action, ops in ACTION_OPS[flow_name].items():
                if all(self.op_ok(o, facts) for o in ops):
                    out.add((row, action))
        return out


_CACHE: dict[tuple[str | None, int], BlockProof] = {}


def prove_blocks(mutant: str | None = None, timeout_ms: int = 20_000) -> BlockProof:
    """Every micro-op against every fact, the empty state, and the partition lemma (cached: the
    proof does not depend on the bound or the flow)."""
    key = (mutant, timeout_ms)
    if key not in _CACHE:
        t0 = time.perf_counter()
        results = prove_ops(mutant, timeout_ms=timeout_ms)
        _CACHE[key] = BlockProof(results, prove_init(timeout_ms), prove_partition(timeout_ms), time.perf_counter() - t0)
    return _CACHE[key]



def concrete(tables: dict[int, list[tuple[int, int]]], ng: int, nc: int,
             moved: dict[int, int] | None = None, msrc: int = GPU) -> tuple[PState, list[Any]]:
    """A concrete parametric state: ``tables`` maps a sequence to its (device, block) entries;
    counts are the holders, free exactly the unheld blocks. Returns the state and the pool sizes'
    constraints (for non-vacuity checks and counterexamples)."""
    a, c = z3.Int("c_a"), z3.Int("c_c")
    held: dict[tuple[int, int], int] = {}
    for entries in tables.values():
        for e in entries:
            held[e] = held.get(e, 0) + 1

    def table_fn(pick: Callable[[tuple[int, int]], int]) -> Any:
        body: Any = z3.IntVal(0)
        for s, entries in tables.items():
            for i, e in enumerate(entries):
                body = z3.If(z3.And(a == s, c == i), pick(e), body)
        return z3.Lambda([a, c], body)

    ref_body: Any = z3.IntVal(0)
    for (d, b), k in held.items():
        ref_body = z3.If(z3.And(a == d, c == b), k, ref_body)
    ref = z3.Lambda([a, c], ref_body)
    free = z3.Lambda([a, c], ref_body == 0)
    tlen_body: Any = z3.IntVal(0)
    for s, entries in tables.items():
        tlen_body = z3.If(a == s, len(entries), tlen_body)
    mapped_body: Any = z3.BoolVal(False)
    map_body: Any = z3.IntVal(0)
    for src, dst in (moved or {}).items():
        mapped_body = z3.If(a == src, True, mapped_body)
        map_body = z3.If(a == src, dst, map_body)
    P = Parametric()
    st = PState(ref, free, table_fn(lambda e: e[1]), table_fn(lambda e: e[0]), z3.Lambda([a], tlen_body),
                z3.Lambda([a], mapped_body), z3.Lambda([a], map_body), z3.IntVal(msrc))
    return st, [P.NG == ng, P.NC == nc]


# A concrete pre-state per mutant on which Z3 finds the micro-op parameters that break a fact
# (the quantified proof of that fact then does not go through: ``unknown`` within its timeout).
MUTANT_WITNESS: dict[str, tuple[dict[int, list[tuple[int, int]]], int, int, str]] = {
    "fork-no-incref": ({0: [(GPU, 0), (GPU, 1)], 1: []}, 4, 2, "delta"),
    "swapin-busy-block": ({0: [(CPU, 0)], 1: [(GPU, 0)]}, 2, 2, "delta"),
    "load-into-held-block": ({0: [(GPU, 0)], 1: []}, 2, 0, "delta"),
}


def mutant_counterexample(mutant: str, timeout_ms: int = 20_000) -> dict[str, Any] | None:
    """The fact and micro-op a mutated micro-op breaks on its witness state, with the parameters
    Z3 found; ``None`` when the mutant is not caught there."""
    tables, ng, nc, fact = MUTANT_WITNESS[mutant]
    P = Parametric(mutant)
    pre, sizes = concrete(tables, ng, nc)
    op = P.op(MUTANTS[mutant], pre)
    goal = P.delta(pre, op) if fact == "delta" else P.facts(op.post)[fact]
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*sizes, P.sizes_ok(), op.guard, *P.facts(pre).values(), z3.Not(goal))
    if s.check() != z3.sat:
        return None
    m = s.model()
    return {"mutant": mutant, "op": op.name, "fact": fact, "pre": {str(k): v for k, v in tables.items()},
            "params": {k: m.eval(v, model_completion=True).as_long() for k, v in op.params.items()}}


# ---------------------------------------------------------------------- concrete execution
@dataclass
class Snapshot:
    """A concrete block layer: what the reference's BlockManager holds (sequences numbered)."""

    ng: int
    nc: int
    ref: dict[tuple[int, int], int]  # every (device, block) of both pools
    free: set[tuple[int, int]]
    tables: dict[int, list[tuple[int, int]]]  # seq -> (device, block) entries
    mapped: dict[int, int] = field(default_factory=dict)
    msrc: int = GPU

    def blocks(self) -> list[tuple[int, int]]:
        return [(GPU, b) for b in range(self.ng)] + [(CPU, b) for b in range(self.nc)]

    def layer(self) -> tuple[Any, ...]:
        """What the reference shows: counts, free set, non-empty tables (not the ghost map)."""
        return (self.ref, self.free, {s: e for s, e in self.tables.items() if e})


def state_of(snap: Snapshot) -> tuple[PState, list[Any]]:
    """The parametric state equal to ``snap`` (arrays as lambdas), with the pool sizes pinned."""
    a, c = z3.Int("c_a"), z3.Int("c_c")

    def table_fn(k: int) -> Any:
        body: Any = z3.IntVal(0)
        for s, entries in snap.tables.items():
            for i, e in enumerate(entries):
                body = z3.If(z3.And(a == s, c == i), e[k], body)
        return z3.Lambda([a, c], body)

    ref_body: Any = z3.IntVal(0)
    free_body: Any = z3.BoolVal(True)
    for (d, b), r in snap.ref.items():
        ref_body = z3.If(z3.And(a == d, c == b), r, ref_body)
        free_body = z3.If(z3.And(a == d, c == b), (d, b) in snap.free, free_body)
    tlen: Any = z3.IntVal(0)
    for s, entries in snap.tables.items():
        tlen = z3.If(a == s, len(entries), tlen)
    mapped: Any = z3.BoolVal(False)
    mp: Any = z3.IntVal(0)
    for src, dst in snap.mapped.items():
        mapped = z3.If(a == src, True, mapped)
        mp = z3.If(a == src, dst, mp)
    P = Parametric()
    st = PState(z3.Lambda([a, c], ref_body), z3.Lambda([a, c], free_body), table_fn(1), table_fn(0),
                z3.Lambda([a], tlen), z3.Lambda([a], mapped), z3.Lambda([a], mp), z3.IntVal(snap.msrc))
    return st, [P.NG == snap.ng, P.NC == snap.nc]


class GuardFails(AssertionError):
    pass


def step(snap: Snapshot, name: str, params: dict[str, int], mutant: str | None = None) -> Snapshot:
    """Run one micro-operation on a concrete state through its Z3 encoding: the guard must hold
    (else ``GuardFails``), and the post-state is read back by evaluating the encoding."""
    P = Parametric(mutant)
    st, sizes = state_of(snap)
    op = P.op(name, st)
    pins = [(op.params[k], z3.IntVal(v)) for k, v in params.items()]
    solver = z3.Solver()
    solver.set("timeout", 20_000)
    solver.add(*sizes, z3.Not(z3.substitute(op.guard, *pins)))
    if solver.check() != z3.unsat:
        raise GuardFails(f"{name}{params}: guard does not hold on {snap}")

    def ev(e: Any) -> Any:
        v = z3.simplify(z3.substitute(e, *pins, (P.NG, z3.IntVal(snap.ng)), (P.NC, z3.IntVal(snap.nc))))
        if z3.is_int_value(v):
            return v.as_long()
        if z3.is_true(v) or z3.is_false(v):
            return z3.is_true(v)
        raise AssertionError(f"{name}: not a constant after evaluation: {v}")

    post = op.post
    ref = {(d, b): ev(post.ref[d, b]) for d, b in snap.blocks()}
    free = {(d, b) for d, b in snap.blocks() if ev(post.free[d, b])}
    seqs = set(snap.tables) | {v for k, v in params.items() if k in ("s", "t")}
    tables = {}
    for s in sorted(seqs):
        n = ev(post.tlen[s])
        tables[s] = [(ev(post.tdv[s, i]), ev(post.tab[s, i])) for i in range(n)]
    msrc = ev(post.msrc)
    src_n = snap.ng if msrc == GPU else snap.nc
    mapped = {x: ev(post.map[x]) for x in range(src_n) if ev(post.mapped[x])}
    return Snapshot(snap.ng, snap.nc, ref, free, tables, mapped, msrc)


def holds(snap: Snapshot) -> bool:
    """Every block fact (quantified) holds on the concrete state."""
    P = Parametric()
    st, sizes = state_of(snap)
    solver = z3.Solver()
    solver.set("timeout", 20_000)
    solver.add(*sizes, z3.Not(z3.And(*P.facts(st).values())))
    return solver.check() == z3.unsat


def broken_cells(mutant: str, flow_name: str) -> dict[str, Any]:
    """For a block-layer mutant: the unbounded cells of the flow whose proof the mutated
    micro-op breaks (rows that need the broken fact, actions made of that op) and the witness."""
    cex = mutant_counterexample(mutant)
    if cex is None:
        return {"mutant": mutant, "cells": [], "witness": None}
    only = MUTANT_ACTIONS.get(mutant)
    cells = sorted((row, action) for row, facts in ROW_FACTS.items() if cex["fact"] in facts
                   for action, ops in ACTION_OPS[flow_name].items() if cex["op"] in ops and (only is None or action in only))
    return {"mutant": mutant, "cells": [list(c) for c in cells], "witness": cex}
