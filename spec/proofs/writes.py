"""What an action writes and takes, for every size: COW-001 (both flows), ALLOC and ADM-002 (v0).

These three are transition properties over *all* of the touched request's sequences (the blocks a
step writes in place, the blocks it takes from a pool), so neither the per-sequence rule
(`spec.proofs.per_sequence`) nor a quantified block fact (`spec.proofs.parametric`) states them.
Each is proved instead by an argument whose steps are small Z3 lemmas with every size symbolic;
the argument that composes them is written out with each function below and in docs/PROOFS.md.

**COW-001** (every block written in place has count 1), on the parametric block state:

- ``fresh``: the block an ``append`` or a ``replace`` (copy-on-write) puts in a table has count 1;
- ``in-place``: a table entry whose count is at most 1 has count exactly 1 (it is held); v0's
  ``append_slot`` writes in place only when the last block's count is not above 1, else it copies
  (``replace``); v1 writes only in place, and no count is ever above 1 there
  (`parametric.prove_unshared`);
- ``frame``: an ``append`` or ``replace`` at another entry position keeps an entry whose block has
  count 1 at that block, with count 1 (the op adds a free block, and removes a block only at its own
  position, which cannot be the same block: it would be held twice, count >= 2).

A v0 decode (and the decode after a swap-in) writes, for each live sequence in turn, the entry
its ``append_slot`` made or kept, then appends for the next sequences; so after the last append
every written block has count 1 (``fresh`` or ``in-place``, then ``frame`` for each later
append). V1's chunk writes entries of the acted request's table after its appends: ``in-place``
with the unshared fact. Other actions write nothing in place (a prefill writes freshly appended
blocks: ``fresh`` then ``frame``; the bounded encoding checks the decode writes only).

**ALLOC and ADM-002** (v0): an action takes ``A`` blocks from a pool, one at a time, and frees
none of that pool before its last allocation (copy-on-write drops a reference to a block with
count >= 2, which stays held; the length cap frees after the allocations; a move frees on the
other pool). Its guard bounds a sum ``N`` with ``F - N >= W`` (admission, swap-in) or ``F >= N``
(decode on GPU, swap-out on CPU), where ``F`` is the pool's free count before the action and
``W >= 0`` the watermark. ``A`` and ``N`` are sums over the request's sequences (or distinct
blocks) of per-term amounts with ``a <= n`` per term; ``sum`` proves the step that extends
``a <= n`` from the terms to their sums, whatever their number; ``run`` proves that then the
``j``-th allocation finds a free block and ``F - A >= W`` after the last. The per-term facts:

- admit: each live sequence takes ``ceil(tokens / block_size)`` blocks, the guard's term (by
  definition); fork: the parent's prompt blocks (the children share them, ``N`` counts the live
  sequences, i.e. the parent);
- decode: ``decode-term``: ``append_slot`` takes a new block or copies, never both, so ``a <= 1``,
  and the guard's term is 1 per live sequence;
- swap-out: one fresh CPU block per distinct GPU block (the move's ghost map), the guard's ``N``;
- swap-in: ``N`` is the distinct *full* CPU blocks plus one per live sequence. A live sequence's
  entries are full except its last one (``cap-full``, from CAP-001), which is full exactly when the
  decode takes a new block. A non-full block ``b`` held by ``h`` entries of the request, ``m`` of
  them non-full (they are those sequences' last entries): its move takes a block unless ``b`` is
  counted as full by another holder, and then the ``m`` appends copy while the count is above 1:
  ``class-cow`` proves (induction over the appends) at most ``min(m, h - 1)`` copies, so
  ``class`` gives at most ``m`` blocks for ``b``'s class beyond the full count. Summed: at most the
  full distinct blocks, plus one per sequence with a full last block, plus one per sequence in a
  class: ``N``.

Tied to the code: the decomposition into micro-ops (which ops, in which order) is
`tests/test_parametric_matches_reference.py`'s; the allocation counts are checked on the
reference by `tests/test_writes_match_reference.py` (blocks each v0 action takes <= the argument's
``N``, drawn states of every size).
"""

from __future__ import annotations

from typing import Any

import z3

from spec.proofs.encoding import GPU
from spec.proofs.parametric import Parametric, concrete, prove_blocks, prove_unshared

# Mutants of the bounded encoding whose bug one of these lemmas states the absence of.
MUTANTS = {
    "decode-no-cow": ("in-place", "COW-001", ("decode", "swap_in")),
    "admit-ignores-watermark": ("run-watermark", "ADM-002", ("admit", "fork")),
}
ACTIONS_V0 = ("add", "admit", "fork", "decode", "preempt_recompute", "swap_out", "swap_in", "finish", "abort", "ignore")
ACTIONS_V1 = ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore")
ACTIONS_ASYNC = (*ACTIONS_V1, "process")
ACTIONS_SPECDEC = (*ACTIONS_V1, "verify")
ACTIONS_CONNECTOR = (*ACTIONS_V1, "load_start", "load_land", "send_done")  # encoding_connector.CONNECTOR_ACTIONS


def _check(hyps: list[Any], goal: Any, timeout_ms: int) -> str:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.add(*hyps, z3.Not(goal))
    r = s.check()
    return "proved" if r == z3.unsat else "counterexample" if r == z3.sat else "unknown"


# ---------------------------------------------------------------------- COW-001
def prove_cow(mutant: str | None = None, timeout_ms: int = 20_000) -> dict[str, str]:
    """The COW-001 lemmas on the parametric block state (every pool size, table length, count of
    sequences). ``decode-no-cow`` drops ``in-place``'s premise (a decode writes the shared last
    block in place)."""
    P = Parametric()
    out: dict[str, str] = {}
    s, i = z3.Ints("w_s w_i")
    for name in ("append", "replace"):
        pre = P.state("pre")
        op = P.op(name, pre)
        hyps = [P.sizes_ok(), op.guard, *P.facts(pre).values()]
        assert op.added is not None
        d, b = op.added
        out[f"fresh/{name}"] = _check(hyps, op.post.ref[d, b] == 1, timeout_ms)
        # frame: another position's block, held once, stays so
        ps, pi = op.pos  # type: ignore[misc]
        blk = pre.ref[pre.tdv[s, i], pre.tab[s, i]]
        frame = z3.And(P.entry(op.post, s, i), op.post.tab[s, i] == pre.tab[s, i], op.post.tdv[s, i] == pre.tdv[s, i],
                       op.post.ref[pre.tdv[s, i], pre.tab[s, i]] == 1)
        out[f"frame/{name}"] = _check([*hyps, P.entry(pre, s, i), z3.Or(s != ps, i != pi), blk == 1], frame, timeout_ms)
    st = P.state("st")
    held = st.ref[st.tdv[s, i], st.tab[s, i]]
    out["in-place"] = _check([P.sizes_ok(), *P.facts(st).values(), P.entry(st, s, i), held <= 1], held == 1, timeout_ms)
    if mutant == "decode-no-cow":  # in place whatever the count: a forked pair sharing its last block
        w, sizes = concrete({0: [(GPU, 0)], 1: [(GPU, 0)]}, 2, 0)
        shared = w.ref[w.tdv[0, 0], w.tab[0, 0]]
        out["in-place"] = _check([*sizes, P.sizes_ok(), *P.facts(w).values(), P.entry(w, 0, 0)], shared == 1, timeout_ms)
    d2, b2 = z3.Ints("u_d u_b")
    unshared = z3.ForAll([d2, b2], z3.Implies(P.valid(d2, b2), st.ref[d2, b2] <= 1))
    out["in-place/v1"] = _check([P.sizes_ok(), *P.facts(st).values(), unshared, P.entry(st, s, i)], held == 1, timeout_ms)
    return out


# ---------------------------------------------------------------------- ALLOC / ADM-002 (v0)
def prove_alloc(mutant: str | None = None, timeout_ms: int = 20_000) -> dict[str, str]:
    """The counting lemmas behind v0's ALLOC and ADM-002 (plain integers, every size symbolic).
    ``admit-ignores-watermark`` weakens the admission guard to ``F >= N``."""
    out: dict[str, str] = {}
    a, n, A, N, F, W, j = z3.Ints("a n A N F W j")
    # sum: a term at most its counterpart extends a sum at most its counterpart (any number of terms)
    out["sum"] = _check([a <= n, A <= N], a + A <= n + N, timeout_ms)
    # run: A <= N allocations against F free blocks, nothing of the pool freed before the last
    guard = F >= N if mutant == "admit-ignores-watermark" else F - N >= W
    base = [W >= 0, N >= 0, A >= 0, A <= N, guard]
    out["run"] = _check([*base, j >= 0, j < A], F - j >= 1, timeout_ms)
    out["run-watermark"] = _check(base, F - A >= W, timeout_ms)
    out["run-plain"] = _check([N >= 0, A >= 0, A <= N, F >= N, j >= 0, j < A], F - j >= 1, timeout_ms)
    # decode-term: append_slot takes a new block (the position starts a block past the table) or
    # copies (the last block is shared), never both
    pos, tlen, bs = z3.Ints("pos tlen bs")
    shared = z3.Bool("shared")
    new_block = pos / bs == tlen
    cow = z3.And(z3.Not(pos / bs == tlen), shared)
    out["decode-term"] = _check([bs >= 1], z3.If(new_block, 1, 0) + z3.If(cow, 1, 0) <= 1, timeout_ms)
    # cap-full: with CAP-001 (tlen = ceil(computed / bs)), every entry but the last is full, and the
    # last is full exactly when the next token starts a new block
    comp, i = z3.Ints("computed i")
    cap = [bs >= 1, comp >= 1, tlen == (comp + bs - 1) / bs]
    out["cap-full"] = _check([*cap, i >= 0, i < tlen - 1], (i + 1) * bs <= comp, timeout_ms)
    out["cap-last"] = _check(cap, (tlen * bs <= comp) == (comp / bs == tlen), timeout_ms)
    # class-cow: a block held by h entries, m of which append in turn and copy while its count is
    # above 1: after any number k <= m of appends, copies + count == h, count >= 1, copies <= k
    h, m, k, cows, c = z3.Ints("h m k cows c")
    inv = z3.And(cows + c == h, c >= 1, cows >= 0, cows <= k)
    out["class-cow/init"] = _check([h >= 1], z3.substitute(inv, (cows, z3.IntVal(0)), (c, h), (k, z3.IntVal(0))), timeout_ms)
    step = z3.substitute(inv, (cows, z3.If(c > 1, cows + 1, cows)), (c, z3.If(c > 1, c - 1, c)), (k, k + 1))
    out["class-cow/step"] = _check([h >= 1, inv, k >= 0, k < m], step, timeout_ms)
    # class: the class's blocks (its move unless a full holder counts it, then its copies) <= m
    full_holder = z3.Bool("full_holder")
    out["class"] = _check([h >= 1, m >= 0, m <= h, z3.Implies(z3.Not(full_holder), m == h), cows >= 0, cows <= m,
                           cows <= h - 1], z3.If(full_holder, 0, 1) + cows <= m, timeout_ms)
    return out


# ---------------------------------------------------------------------- cells
def _block_layer_ok() -> bool:
    proof = prove_blocks()
    return not proof.failing() and proof.init


def cow_cells(flow_name: str, timeout_ms: int = 20_000) -> set[tuple[str, str]]:
    lemmas = prove_cow(timeout_ms=timeout_ms)
    if not _block_layer_ok():
        return set()
    if flow_name in ("v1", "async", "specdec", "connector"):  # their blocks change as v1's do (append, drop)
        ok = lemmas["in-place/v1"] == "proved" and prove_unshared(timeout_ms)
        actions = {"v1": ACTIONS_V1, "async": ACTIONS_ASYNC, "specdec": ACTIONS_SPECDEC,
                   "connector": ACTIONS_CONNECTOR}[flow_name]
        return {("COW-001", a) for a in actions} if ok else set()
    ok = all(v == "proved" for k, v in lemmas.items() if k != "in-place/v1")
    return {("COW-001", a) for a in ACTIONS_V0} if ok else set()


def alloc_cells(timeout_ms: int = 20_000) -> set[tuple[str, str]]:
    """v0's ALLOC and ADM-002 cells (v1's are proved by `spec.proofs.per_sequence`)."""
    lemmas = prove_alloc(timeout_ms=timeout_ms)
    if any(v != "proved" for v in lemmas.values()):
        return set()
    return {(row, a) for row in ("ALLOC", "ADM-002") for a in ACTIONS_V0}


_CACHE: dict[tuple[str, int], set[tuple[str, str]]] = {}


def proved_cells(flow_name: str, timeout_ms: int = 20_000) -> set[tuple[str, str]]:
    """The COW-001 (both flows), ALLOC and ADM-002 (v0) cells proved for every size (cached)."""
    key = (flow_name, timeout_ms)
    if key not in _CACHE:
        cells = cow_cells(flow_name, timeout_ms)
        if flow_name == "v0":
            cells |= alloc_cells(timeout_ms)
        _CACHE[key] = cells
    return _CACHE[key]


def broken_cells(mutant: str) -> dict[str, Any]:
    """For a mutant whose bug a lemma here rules out: the lemma that fails and the v0 cells whose
    unbounded proof it breaks."""
    lemma, row, actions = MUTANTS[mutant]
    results = prove_cow(mutant) if row == "COW-001" else prove_alloc(mutant)
    if results[lemma] == "proved":
        return {"mutant": mutant, "cells": [], "witness": None}
    step = "append_slot" if row == "COW-001" else "allocation run"
    return {"mutant": mutant, "cells": [[row, a] for a in actions],
            "witness": {"fact": f"writes.py lemma {lemma}", "op": step, "params": {}}}

