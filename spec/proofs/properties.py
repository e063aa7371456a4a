"""The catalogue's state invariants (and two transition properties) as Z3 formulas.

Each state invariant is a predicate on one symbolic `State`; it is the Z3 reading of the
catalogue predicate with the same ID (``spec.invariants.*``), restricted to what a state shows.
``WF`` is not a catalogue invariant: it is the well-formedness of the model itself (a slot whose
sequence does not exist holds nothing, a request that has not arrived has no sequence, ...),
proved inductive like the others.

Which catalogue invariants are not here, and why, is in `SCOPE`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from spec.proofs.encoding import CPU, FIN, GPU, NODEV, NONE, RUN, SWAP, WAIT, ActionEncoding, Encoder, State

StatePredicate = Callable[[Encoder, State], Any]


def _all(items: list[Any]) -> Any:
    return z3.And(items) if items else z3.BoolVal(True)


def _conservation(enc: Encoder, st: State, device: int) -> Any:
    pool = st.pool(device)
    in_use = z3.Sum([z3.If(r > 0, 1, 0) for r in pool.ref])
    return z3.And(_all([r >= 0 for r in pool.ref]), enc.free_count(pool) + in_use == enc.nblocks[device])


def _ref_counts(enc: Encoder, st: State, device: int) -> Any:
    n = enc.nblocks[device]
    valid = [
        z3.Implies(enc.entry(st, s, i, device), z3.And(st.tab[s][i] >= 0, st.tab[s][i] < n))
        for s in range(enc.S) for i in range(enc.L)
    ]
    return z3.And(_all(valid), _all([st.pool(device).ref[b] == enc.holders(st, device, b) for b in range(n)]))


def blk001(enc: Encoder, st: State) -> Any:
    return _conservation(enc, st, GPU)


def blk002(enc: Encoder, st: State) -> Any:
    return _conservation(enc, st, CPU)


def blk003(enc: Encoder, st: State) -> Any:
    return _ref_counts(enc, st, GPU)


def blk004(enc: Encoder, st: State) -> Any:
    return _ref_counts(enc, st, CPU)


def blk005(enc: Encoder, st: State) -> Any:
    """No table entry names a free block (free ids are a set here, so 'listed once' is by construction)."""
    out = []
    for device in (GPU, CPU):
        pool = st.pool(device)
        for s in range(enc.S):
            for i in range(enc.L):
                for b in range(enc.nblocks[device]):
                    out.append(z3.Implies(z3.And(enc.entry(st, s, i, device), st.tab[s][i] == b), z3.Not(pool.free[b])))
    return _all(out)


def blk006(enc: Encoder, st: State) -> Any:
    return _all([
        z3.Implies(j < st.tlen[s], st.tab[s][i] != st.tab[s][j])
        for s in range(enc.S) for i in range(enc.L) for j in range(i + 1, enc.L)
    ])


def _holds(enc: Encoder, st: State, s: int, device: int) -> Any:
    return z3.And(st.dev[s] == device, st.tlen[s] >= 1)


def res001(enc: Encoder, st: State) -> Any:
    return _all([z3.Implies(st.sstat[s] == RUN, _holds(enc, st, s, GPU)) for s in range(enc.S)])


def res002(enc: Encoder, st: State) -> Any:
    return _all([z3.Implies(st.sstat[s] == SWAP, _holds(enc, st, s, CPU)) for s in range(enc.S)])


def res003(enc: Encoder, st: State) -> Any:
    return _all([z3.Implies(st.sstat[s] == WAIT, st.tlen[s] == 0) for s in range(enc.S)])


def res004(enc: Encoder, st: State) -> Any:
    return _all([z3.Implies(st.sstat[s] == FIN, st.tlen[s] == 0) for s in range(enc.S)])


def _admitted(st: State, s: int) -> Any:
    return z3.Or(st.sstat[s] == RUN, st.sstat[s] == SWAP)


def cap001(enc: Encoder, st: State) -> Any:
    return _all([z3.Implies(_admitted(st, s), st.tlen[s] == enc.ceil_blocks(st.ncomp[s])) for s in range(enc.S)])


def cap003(enc: Encoder, st: State) -> Any:
    """V0's exact lag (computed = tokens - 1), which implies the catalogue's relaxed CAP-003."""
    return _all([
        z3.And(
            z3.Implies(_admitted(st, s), st.ncomp[s] == st.ntok[s] - 1),
            z3.Implies(st.sstat[s] == WAIT, st.ncomp[s] == 0),
        )
        for s in range(enc.S)
    ])


def que001(enc: Encoder, st: State) -> Any:
    out = []
    for j in range(enc.G):
        n = z3.Sum([z3.If(q[j], 1, 0) for q in (st.in_w, st.in_r, st.in_s)])
        unfinished = z3.Or(st.gstat[j] == WAIT, st.gstat[j] == RUN, st.gstat[j] == SWAP)
        out.append(z3.If(unfinished, n == 1, n == 0))
    return _all(out)


def que002(enc: Encoder, st: State) -> Any:
    out = []
    for j in range(enc.G):
        out += [z3.Implies(st.in_w[j], st.gstat[j] == WAIT), z3.Implies(st.in_r[j], st.gstat[j] == RUN),
                z3.Implies(st.in_s[j], st.gstat[j] == SWAP)]
    for s in range(enc.S):
        group = enc.gsel(st.gstat, enc.grp[s])
        unfinished = z3.Or(group == WAIT, group == RUN, group == SWAP)
        out.append(z3.Implies(z3.And(unfinished, enc.live(st, s)), st.sstat[s] == group))
    return _all(out)


def len001(enc: Encoder, st: State) -> Any:
    return _all([z3.Implies(_admitted(st, s), st.ntok[s] <= enc.ML) for s in range(enc.S)])


def bud003(enc: Encoder, st: State) -> Any:
    return z3.Sum([z3.If(st.sstat[s] == RUN, 1, 0) for s in range(enc.S)]) <= enc.M


def str001(enc: Encoder, st: State) -> Any:
    """STR-001: a block is free exactly when its reference count is zero."""
    return _all([
        pool.free[b] == (pool.ref[b] == 0)
        for pool in (st.gpu, st.cpu) for b in range(len(pool.ref))
    ])


def str002(enc: Encoder, st: State) -> Any:
    """STR-002: the seats of the running requests (n before the fork) fit max_num_seqs."""
    return enc.running_seats(st) <= enc.M


def wf(enc: Encoder, st: State) -> Any:
    """The model's own well-formedness (no catalogue counterpart)."""
    out = []
    for s in range(enc.S):
        g = enc.grp[s]
        gs = enc.gsel(st.gstat, g)
        born = st.sstat[s] != NONE
        out += [
            st.sstat[s] >= NONE, st.sstat[s] <= FIN, st.dev[s] >= NODEV, st.dev[s] <= CPU,
            st.tlen[s] >= 0, st.tlen[s] <= enc.L, (st.dev[s] == NODEV) == (st.tlen[s] == 0),
            z3.Implies(born, z3.And(st.ntok[s] >= 1, st.ncomp[s] >= 0)),
            z3.Implies(z3.Not(born), st.tlen[s] == 0),
            z3.Implies(gs == NONE, z3.Not(born)),
            z3.Implies(gs == FIN, z3.Not(enc.live(st, s))),
        ]
        out.append(z3.Implies(enc.is_first(s), born == (gs != NONE)))
        out.append(z3.Implies(z3.Not(enc.is_first(s)), born == z3.And(gs != NONE, enc.gsel(st.forked, g))))
    for j in range(enc.G):
        gs = st.gstat[j]
        unfinished = z3.Or(gs == WAIT, gs == RUN, gs == SWAP)
        out += [
            gs >= NONE, gs <= FIN,
            z3.Implies(unfinished, enc.live_count(st, j) >= 1),
            z3.Implies(z3.And(gs != NONE, enc.nslots(j) == 1), st.forked[j]),
            z3.Implies(gs != NONE, z3.And(st.plen[j] >= 1, st.mtok[j] >= 1)),
        ]
    return _all(out)


def grp_ok(enc: Encoder) -> Any:
    """Slots of one request are contiguous and in sequence-index order (static)."""
    out = [z3.And(g >= 0, g < enc.G) for g in enc.grp]
    out += [enc.grp[s] <= enc.grp[s + 1] for s in range(enc.S - 1)]
    return _all(out)


# ---------------------------------------------------------------- transition properties
def adm002(ae: ActionEncoding) -> Any:
    """ADM-002 for one action: a request that enters running leaves the watermark free."""
    if ae.action not in ("admit", "fork", "swap_in"):
        return z3.BoolVal(True)
    after = ae.mid if ae.mid is not None else ae.post
    return ae.enc.free_count(after.gpu) >= ae.enc.W


def cow001(ae: ActionEncoding) -> Any:
    """COW-001 for one action: every block a scheduled token is written into is held once."""
    if ae.mid is None:
        return z3.BoolVal(True)
    return _all([z3.Implies(cond, _ite(block, ae.mid.gpu.ref) == 1) for cond, block in ae.written])


def alloc_ok(ae: ActionEncoding) -> Any:
    """No allocation is attempted from an empty pool (the reference would raise)."""
    return _all(list(ae.enc.alloc_ok))


def _ite(index: Any, values: list[Any]) -> Any:
    out = values[-1]
    for j in range(len(values) - 2, -1, -1):
        out = z3.If(index == j, values[j], out)
    return out


STATE_INVARIANTS: dict[str, StatePredicate] = {
    "BLK-001": blk001, "BLK-002": blk002, "BLK-003": blk003, "BLK-004": blk004, "BLK-005": blk005,
    "BLK-006": blk006, "RES-001": res001, "RES-002": res002, "RES-003": res003, "RES-004": res004,
    "CAP-001": cap001, "CAP-003": cap003, "QUE-001": que001, "QUE-002": que002, "LEN-001": len001,
    "BUD-003": bud003, "STR-001": str001, "STR-002": str002, "WF": wf,
}
STRENGTHENING = ("STR-001", "STR-002")
TRANSITION_PROPERTIES: dict[str, Callable[[ActionEncoding], Any]] = {
    "ADM-002": adm002, "COW-001": cow001, "ALLOC": alloc_ok,
}

# Catalogue invariants that are not state predicates, and why (shown in the matrix, not omitted).
SCOPE: dict[str, str] = {
    "CAP-002": "mid-step table coverage: implied by the decode/admit transitions (see CAP-001 and ALLOC)",
    "COW-002": "step property over the copy map (not a state invariant)",
    "ADM-001": "step property on the mid-step snapshot (admission is all-or-nothing by construction of admit)",
    "BUD-001": "step property over one scheduler output (not a state invariant)",
    "BUD-002": "step property over one scheduler output (not a state invariant)",
    "BUD-004": "step property over one scheduler output (not a state invariant)",
    "LEN-002": "step property over one scheduler output (not a state invariant)",
    "LEN-003": "step property over finish reports (not a state invariant)",
    "SWP-001": "step property over the swap-out map (not a state invariant)",
    "SWP-002": "step property over the swap-in map (not a state invariant)",
    "SWP-003": "step property relating two snapshots (not a state invariant)",
    "REQ-001": "property of the finish reports of a run (not a state invariant)",
    "REQ-002": "property of the finish reports of a run (not a state invariant)",
    "REQ-003": "property of the outputs of a run (not a state invariant)",
    "REQ-004": "step property relating two snapshots (not a state invariant)",
    "OUT-001": "step property over one scheduler output (not a state invariant)",
    "OUT-002": "step property over one scheduler output (not a state invariant)",
    # The engine-neutral safety forms: on this flow each follows from the stronger, proved
    # policy form of the same rule (CAP-003 is proved in V0's exact form, which implies its
    # relaxed catalogue form too).
    "CAP-004": "implied on this flow by CAP-001 (proved: exactly ceil(computed / block_size) blocks)",
    "CAP-005": "mid-step table coverage: implied by the decode/admit transitions (see CAP-002 and ALLOC)",
    "CAP-006": "implied on this flow by CAP-001 and CAP-003 (proved: computed < tokens, no reservation)",
    "ADM-003": "step property on the mid-step snapshot (admission is all-or-nothing by construction of admit)",
    "RES-005": "implied on this flow by RES-004 (proved: a finished sequence holds no block)",
    "REQ-005": "property of the finish reports and outcomes of a run (not a state invariant)",
    "REQ-006": "relates earlier finish reports to the sequences in a snapshot (not a state invariant)",
}
SCOPE_BY_FAMILY = {
    "POL": "policy (queue order is not modelled; proofs hold for every order)",
    "LIV": "liveness (not a safety property; see check-config for feasibility)",
    "PFX": "prefix caching is not modelled by the encoding",
    "ORD": "order of the token-budget flows (queue order is not modelled; proofs hold for every order)",
}
UNCLASSIFIED = "not encoded: added to the catalogue after the Z3 model and not classified yet"
