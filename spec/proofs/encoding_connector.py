"""The Z3 encoding of vLLM V1's flow with a KV connector (``reference_impl/kv_connector.py``): flow ``connector``.

The state is the v1 encoding's (`spec.proofs.chunked`: one slot per request, GPU only, prefix
caching off) plus, per request, what the connector's record says about it (spec/connector.py,
``Snapshot.kv_transfers``):

- ``xfer``: its transfer: none, an asynchronous load in flight (``LOADING``), a load reported
  done and not yet admitted (``LANDED``: the request holds its loaded KV in the KV-holding front
  of waiting), or a send in flight for a finished request (``SENDING``: a delayed free);
- ``ltok``: the tokens the load covers (its blocks are ``ceil(ltok / block_size)``);
- ``lval``: a proof-only ghost, the tokens the landed load left valid (all of them, or up to its
  first failed block), what KVC-005 reads.

A waiting request with a load (``LOADING`` or ``LANDED``) is the reference's
WAITING_FOR_REMOTE_KV; the queue is the one waiting list, as in the reference. The config adds the
failure policy (``kv_load_failure_policy`` fail, symbolic: one proof covers both).

Actions (each one request's transition between two steps, as in the v1 flow):

- ``add``, ``chunk``, ``preempt_recompute``, ``ignore``: V1's (a request with a load is never
  ignored: its load started only once its whole sequence fit, which the config keeps true).
- ``admit``: V1's admission, also of a landed request, whose table already holds its loaded
  blocks (the whole sequence must fit beyond them, `ConnectorFlow._kv_whole_sequence_fits`); not
  of a request whose load is in flight (KVC-001).
- ``load_start``: an asynchronous load of ``external`` tokens (1 .. tokens - 1) into fresh blocks
  for a waiting request that holds nothing: seats left, the whole sequence fits above the
  watermark, the blocks of the load allocated, nothing computed (the reference's `_kv_admit` with
  ``load_async``; the reservation for other prefills is left out, which allows more).
- ``load_land``: the connector reports the load done; ``valid`` tokens of it landed (all, or up to
  its first failed block). A request aborted meanwhile frees its blocks now; under ``fail`` a
  failure finishes the request with an error and frees them; a load that left nothing valid frees
  them and the request waits as before; else it holds its blocks with ``valid`` tokens computed
  (`_kv_truncate_async`, `_kv_promote`).
- ``abort``: V1's, except that a request whose load is in flight keeps its blocks until the load
  reports, and any other may start a send (``send``: the connector asks for a delayed free).
- ``send_done``: the connector reports a finished request's send done: its blocks are freed.

A chunk's update may also end the request with a send (``send``), keeping its blocks.

Not modelled: synchronous loads (an admission whose first tokens are counted as computed without
being scheduled), loads past a local prefix hit (prefix caching is off here, as in the v1 flow),
the reservation for in-flight prefills, and failures of a load that another request reads.

Over-approximations, as in the v1 flow (any queue order, the budget per action, any free block).

For every size (issue 30 item 7): every action changes one request and the pool, so the arguments
of the v1 flow reach the connector's cells too. The block rows and COW-001 by the block layer
(spec/proofs/parametric.py, writes.py: a load appends fresh blocks, a landed load that frees, a
reported send and an abort drop the table, a kept table is no micro-op at all); the per-request
rows and transition properties by `GenericConnector` below (the v1 generic request with the
request's transfer, its load's tokens and the valid ghost); KVC-002 by its per-request half here
with the block facts ``named-not-free`` and "no count above 1" (`parametric.prove_unshared`);
QUE-001/QUE-002 by unbounded.py and STR-002/BUD-003 by counting.py with the connector's status
changes. `CONNECTOR_BOUND` is the bounded encoding's, an independent check at the default bound.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

import z3

from spec.proofs import properties as P0
from spec.proofs.bound import Bound
from spec.proofs.chunked import (
    V1_BOUND,
    V1_STATE_INVARIANTS,
    V1_STEP_PARTS,
    V1_TRANSITION_PROPERTIES,
    ChunkedEncoder,
    grp_ok_v1,
    wf_v1,
)
from spec.proofs.encoding import FIN, GPU, NODEV, NONE, RUN, WAIT, ActionEncoding, Encoder, Pool, State
from spec.proofs.per_sequence import GenericV1, Seq

FLOW = "connector"
CONNECTOR_BOUND = V1_BOUND
CONNECTOR_ACTIONS = ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore", "load_start", "load_land",
                     "send_done")
NO_XFER, LOADING, LANDED, SENDING = 0, 1, 2, 3
XFER_NAMES = ("none", "loading", "landed", "sending")

# Mutated transitions, each the shape of a conformance mutant of the connector reference
# (conformance/selftest/mutants_connector.py, named in the value).
CONNECTOR_MUTANTS = {
    "admit-while-loading": "a request whose load is in flight may be admitted (mutant connector-schedules-loading-request)",
    "load-allocates-past-load": "a load takes one block more than its tokens need, the first token's slot "
                                "(mutant connector-allocates-past-the-load)",
    "land-counts-failed": "a load that failed counts every loaded token as computed (mutant connector-keeps-failed-tokens)",
    "send-done-keeps-blocks": "a send reported done frees nothing (mutant connector-leaks-after-transfer)",
    "frees-while-transferring": "an abort frees the blocks of its load in flight or of the send it starts "
                                "(mutant connector-frees-while-sending)",
    "fail-policy-ignored": "kv_load_failure_policy fail is read as recompute (mutant connector-ignores-fail-policy)",
    "load-into-held-block": "a load's block may be one another table already names (the block-layer shape of mutant "
                            "connector-caches-loading-blocks: another request holds a block the load writes)",
}


@dataclass
class ConnState(State):
    """`State` plus each request's connector transfer (slot s is request s)."""

    xfer: list[Any] = field(default_factory=list)
    ltok: list[Any] = field(default_factory=list)
    lval: list[Any] = field(default_factory=list)  # proof-only ghost: the landed load's valid tokens

    def copy(self) -> ConnState:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.copy() if isinstance(v, Pool) else [list(x) if isinstance(x, list) else x for x in v]
        return ConnState(**out)


class ConnectorEncoder(ChunkedEncoder):
    """The V1 flow with a KV connector's transfers over the v1 encoding's state."""

    actions = CONNECTOR_ACTIONS  # action a is encoded by `_kc_{a}`
    action_prefix = "_kc_"

    def __init__(self, bound: Bound, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in CONNECTOR_MUTANTS:
            raise ValueError(f"unknown connector mutant {mutant!r}")
        super().__init__(bound, None)
        self.mutant = mutant
        self.FAIL = z3.Bool("cfg_kv_load_failure_policy_fail")

    # ------------------------------------------------------------------ config
    def read_config(self, model: Any) -> dict[str, Any]:
        fails = z3.is_true(model.eval(self.FAIL, model_completion=True))
        return {**super().read_config(model), "kv_connector": True,
                "kv_load_failure_policy": "fail" if fails else "recompute"}

    def pin_config(self, config: dict[str, Any]) -> list[Any]:
        return [*super().pin_config(config), self.FAIL == z3.BoolVal(config["kv_load_failure_policy"] == "fail")]

    # ------------------------------------------------------------------ state
    def state(self, prefix: str) -> ConnState:
        base = super().state(prefix)
        ints = lambda name: [z3.Int(f"{prefix}_{name}_{s}") for s in range(self.S)]  # noqa: E731
        return ConnState(**{f.name: getattr(base, f.name) for f in dataclasses.fields(State)},
                         xfer=ints("xfer"), ltok=ints("ltok"), lval=ints("lval"))

    def initial(self) -> ConnState:
        st = super().initial()
        assert isinstance(st, ConnState)
        st.xfer, st.ltok, st.lval = [z3.IntVal(NO_XFER)] * self.S, [z3.IntVal(0)] * self.S, [z3.IntVal(0)] * self.S
        return st

    def read_state(self, model: Any, st: State) -> dict[str, Any]:
        from spec.proofs.encoding import read_state

        assert isinstance(st, ConnState)
        out = read_state(model, self, st)
        for s, seq in enumerate(out["seqs"]):
            code = model.eval(st.xfer[s], model_completion=True).as_long()
            seq["transfer"] = XFER_NAMES[code] if 0 <= code < len(XFER_NAMES) else code
            seq["load_tokens"] = model.eval(st.ltok[s], model_completion=True).as_long()
            seq["load_valid"] = model.eval(st.lval[s], model_completion=True).as_long()
        return out

    # ------------------------------------------------------------------ update(): an end may start a send
    def _update_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any, k: Any) -> None:
        """V1's update for request g; a request that ends may keep its blocks for a send."""
        assert isinstance(st, ConnState)
        stop, send = z3.Int("act_stop"), z3.Int("act_send")
        ae.params["stop"], ae.params["send"] = stop, send
        ae.guard = z3.And(ae.guard, stop >= 0, stop <= 1, send >= 0, send <= 1)
        for s in range(self.S):
            c = g == s
            self.set_s(st.ncomp, s, pre.ncomp[s] + k, c)
            sampled = z3.And(c, st.ncomp[s] >= pre.ntok[s])
            self.set_s(st.ntok, s, pre.ntok[s] + 1, sampled)
            generated = st.ntok[s] - self.gsel(st.plen, g)
            ends = z3.And(sampled, z3.Or(stop == 1, generated >= self.gsel(st.mtok, g), st.ntok[s] >= self.ML))
            held = z3.And(ends, send == 1)
            self.set_s(st.sstat, s, FIN, ends)
            self.free_seq(st, s, z3.And(ends, z3.Not(held)))
            self.set_s(st.xfer, s, SENDING, held)
            self.set_g(st.gstat, g, FIN, ends)
            self.set_g(st.in_r, g, False, ends)

    # ------------------------------------------------------------------ actions
    def _kc_add(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(st, ConnState)
        self._v1_add(ae, pre, st, g)
        for s in range(self.S):
            for values in (st.xfer, st.ltok, st.lval):
                self.set_s(values, s, 0, g == s)

    def _kc_admit(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, ConnState) and isinstance(st, ConnState)
        self._v1_admit(ae, pre, st, g)
        if self.mutant != "admit-while-loading":
            ae.guard = z3.And(ae.guard, self._at(pre.xfer, g) != LOADING)
        # A landed load is promoted: its record is gone (a send the end started stays). A load in
        # flight stays in the connector's record, which the scheduler does not write.
        for s in range(self.S):
            kept = z3.Or(st.xfer[s] == SENDING, pre.xfer[s] == LOADING)
            self.set_s(st.xfer, s, z3.If(kept, st.xfer[s], NO_XFER), g == s)

    def _kc_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_chunk(ae, pre, st, g)

    def _kc_preempt_recompute(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_preempt_recompute(ae, pre, st, g)

    def _kc_ignore(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, ConnState)
        self._v1_ignore(ae, pre, st, g)
        ae.guard = z3.And(ae.guard, self._at(pre.xfer, g) == NO_XFER)

    def _kc_abort(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, ConnState) and isinstance(st, ConnState)
        gs = self.gsel(pre.gstat, g)
        send = z3.Int("act_send")
        ae.params["send"] = send
        ae.guard = z3.And(z3.Or(gs == WAIT, gs == RUN), send >= 0, send <= 1)
        for s in range(self.S):
            c = g == s
            loading = pre.xfer[s] == LOADING
            sends = z3.And(z3.Not(loading), send == 1, pre.tlen[s] >= 1)
            keep = z3.Or(loading, sends)
            if self.mutant == "frees-while-transferring":
                keep = z3.BoolVal(False)
            self.free_seq(st, s, z3.And(c, z3.Not(keep)))
            self.set_s(st.sstat, s, FIN, c)
            self.set_s(st.xfer, s, z3.If(loading, pre.xfer[s], z3.If(sends, SENDING, NO_XFER)), c)
        self.set_g(st.gstat, g, FIN)
        self.set_g(st.in_w, g, False)
        self.set_g(st.in_r, g, False)

    def _kc_load_start(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, ConnState) and isinstance(st, ConnState)
        e = z3.Int("act_external")
        ae.params["external"] = e
        B = self.nblocks[GPU]
        ntok = self._at(pre.ntok, g)
        blocks = self.ceil_blocks(e) + (1 if self.mutant == "load-allocates-past-load" else 0)
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == WAIT, self._at(pre.xfer, g) == NO_XFER,
            self._at(pre.tlen, g) == 0, self._at(pre.ncomp, g) == 0,
            self.gsel(pre.plen, g) <= self.prompt_limit(), self.ceil_blocks(ntok) <= B - self.W,  # not ignored
            self.running(pre) < self.M,  # the seats check comes first (`_kv_admit`)
            e >= 1, e <= ntok - 1, blocks <= self.L,
            self.ceil_blocks(ntok) + self.W <= self.free_count(pre.gpu),  # the whole sequence fits
        )
        for s in range(self.S):
            c = g == s
            pool = st.gpu
            for i in range(self.L):
                ci = z3.And(c, i < blocks)
                pool, blk = self._alloc_held(pool, ci) if self.mutant == "load-into-held-block" else self.alloc_any(pool, ci)
                st.tab[s][i] = self.let(z3.If(ci, blk, st.tab[s][i]), "tb")
            st.gpu = pool
            self.set_s(st.tlen, s, blocks, c)
            self.set_s(st.dev, s, GPU, c)
            self.set_s(st.xfer, s, LOADING, c)
            self.set_s(st.ltok, s, e, c)
            self.set_s(st.lval, s, 0, c)

    def _alloc_held(self, pool: Pool, cond: Any) -> tuple[Pool, Any]:
        """The mutant ``load-into-held-block``: any block of the pool, free or not, count 1."""
        n = len(pool.free)
        blk = self.fresh(z3.IntSort(), "blk")
        self.defs.append(z3.Implies(cond, z3.And(blk >= 0, blk < n)))
        hit = [z3.And(cond, blk == b) for b in range(n)]
        return Pool([self.let(z3.If(hit[b], 1, pool.ref[b]), "r") for b in range(n)],
                    [self.let(z3.If(hit[b], False, pool.free[b]), "f") for b in range(n)]), blk

    def _kc_load_land(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, ConnState) and isinstance(st, ConnState)
        v = z3.Int("act_valid")
        ae.params["valid"] = v
        ltok = self._at(pre.ltok, g)
        ae.guard = z3.And(self._at(pre.xfer, g) == LOADING, v >= 0, v <= ltok,
                          z3.Or(v == ltok, v % self.bs == 0))  # all of it, or up to its first failed block
        failed = v < ltok
        errs_any = False
        for s in range(self.S):
            c = g == s
            aborted = pre.sstat[s] == FIN
            fails = z3.BoolVal(False) if self.mutant == "fail-policy-ignored" else self.FAIL
            errs = z3.And(c, failed, fails, z3.Not(aborted))
            empty = z3.And(z3.Not(aborted), z3.Not(errs), v == 0)
            frees = z3.Or(aborted, errs, empty)
            self.free_seq(st, s, z3.And(c, frees))
            self.set_s(st.xfer, s, z3.If(frees, NO_XFER, LANDED), c)
            counted = pre.ltok[s] if self.mutant == "land-counts-failed" else v
            self.set_s(st.ncomp, s, z3.If(frees, pre.ncomp[s], counted), c)
            self.set_s(st.lval, s, z3.If(frees, 0, v), c)
            self.set_s(st.sstat, s, FIN, errs)
            errs_any = z3.Or(errs_any, errs)
        self.set_g(st.gstat, g, FIN, errs_any)  # FINISHED_ERROR (kv_load_failure_policy fail)
        self.set_g(st.in_w, g, False, errs_any)

    def _kc_send_done(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, ConnState) and isinstance(st, ConnState)
        ae.guard = self._at(pre.xfer, g) == SENDING
        for s in range(self.S):
            c = g == s
            if self.mutant != "send-done-keeps-blocks":
                self.free_seq(st, s, c)
            self.set_s(st.xfer, s, NO_XFER, c)


# ---------------------------------------------------------------------- invariants of the connector flow
def _x(st: State) -> ConnState:
    assert isinstance(st, ConnState)
    return st


def wf_connector(enc: Encoder, st: State) -> Any:
    """The model's well-formedness for the connector flow: the v1 flow's, and each transfer where
    its request can have one (a load for a waiting or aborted request, of 1 .. tokens - 1 tokens; a
    landed load for a waiting one, with some of it valid; a send for a finished one)."""
    c = _x(st)
    out = [wf_v1(enc, st)]
    for s in range(enc.S):
        x, status = c.xfer[s], st.sstat[s]
        load = z3.Or(x == LOADING, x == LANDED)
        out += [x >= NO_XFER, x <= SENDING, z3.Implies(status == NONE, x == NO_XFER),
                z3.Implies(x == SENDING, status == FIN),
                z3.Implies(x == LANDED, z3.And(status == WAIT, c.lval[s] >= 1, c.lval[s] <= c.ltok[s])),
                z3.Implies(x == LOADING, z3.Or(status == WAIT, status == FIN)),
                z3.Implies(load, z3.And(c.ltok[s] >= 1, c.ltok[s] <= st.ntok[s] - 1))]
    return P0._all(out)


def kvc001(enc: Encoder, st: State) -> Any:
    """KVC-001's state part: a request whose load is in flight is not running."""
    c = _x(st)
    return P0._all([z3.Implies(c.xfer[s] == LOADING, st.sstat[s] != RUN) for s in range(enc.S)])


def kvc002(enc: Encoder, st: State) -> Any:
    """KVC-002: every block a transfer in flight uses (a load's, a send's) is held, by its request
    only: in its table, not free, one reference."""
    c = _x(st)
    out = []
    for s in range(enc.S):
        busy = z3.Or(c.xfer[s] == LOADING, c.xfer[s] == SENDING)
        out.append(z3.Implies(busy, z3.And(st.tlen[s] >= 1, st.dev[s] == GPU)))
        for i in range(enc.L):
            entry = z3.And(busy, i < st.tlen[s])
            for b in range(enc.nblocks[GPU]):
                out.append(z3.Implies(z3.And(entry, st.tab[s][i] == b), z3.And(z3.Not(st.gpu.free[b]), st.gpu.ref[b] == 1)))
    return P0._all(out)


def kvc004(enc: Encoder, st: State) -> Any:
    """KVC-004: a waiting request whose load is in flight holds exactly its load's blocks and has
    computed nothing; a landed one still holds them."""
    c = _x(st)
    return P0._all([z3.Implies(z3.And(st.sstat[s] == WAIT, z3.Or(c.xfer[s] == LOADING, c.xfer[s] == LANDED)),
                               z3.And(st.tlen[s] == enc.ceil_blocks(c.ltok[s]),
                                      z3.Implies(c.xfer[s] == LOADING, st.ncomp[s] == 0)))
                    for s in range(enc.S)])


def kvc005(enc: Encoder, st: State) -> Any:
    """KVC-005's state part: a landed load counts no more tokens as computed than it left valid."""
    c = _x(st)
    return P0._all([z3.Implies(c.xfer[s] == LANDED, st.ncomp[s] <= c.lval[s]) for s in range(enc.S)])


def kvc007(enc: Encoder, st: State) -> Any:
    """KVC-007's state part (RES-004 with a connector): a finished request holds blocks only while a
    transfer of its is in flight (a load it was aborted during, or a send), and on the GPU."""
    c = _x(st)
    return P0._all([z3.Implies(z3.And(st.sstat[s] == FIN, st.tlen[s] >= 1),
                               z3.And(z3.Or(c.xfer[s] == LOADING, c.xfer[s] == SENDING), st.dev[s] == GPU))
                    for s in range(enc.S)])


def res003_connector(enc: Encoder, st: State) -> Any:
    """RES-003 with a connector: a waiting request holds blocks only with a load (in flight or
    landed; the reference's WAITING_FOR_REMOTE_KV, which RES-003's trigger leaves out), on the GPU."""
    c = _x(st)
    return P0._all([z3.Implies(z3.And(st.sstat[s] == WAIT, st.tlen[s] >= 1),
                               z3.And(z3.Or(c.xfer[s] == LOADING, c.xfer[s] == LANDED), st.dev[s] == GPU))
                    for s in range(enc.S)])


def cap003_connector(enc: Encoder, st: State) -> Any:
    """CAP-003 with a connector: a running request lags by at least one token; a waiting one
    without a landed load has computed none (a landed one: KVC-005)."""
    c = _x(st)
    return P0._all([z3.And(z3.Implies(st.sstat[s] == RUN, st.ncomp[s] <= st.ntok[s] - 1),
                           z3.Implies(z3.And(st.sstat[s] == WAIT, c.xfer[s] != LANDED), st.ncomp[s] == 0))
                    for s in range(enc.S)])


# CAP-001 (a table is exactly its computed tokens' blocks) is left out, as the connector profile
# leaves it out: a landed load that failed keeps the blocks past its first failed block.
CONNECTOR_STATE_INVARIANTS = {
    **{k: v for k, v in V1_STATE_INVARIANTS.items() if k not in ("RES-003", "RES-004", "CAP-001", "CAP-003", "WF")},
    "RES-003": res003_connector, "CAP-003": cap003_connector,
    "KVC-001": kvc001, "KVC-002": kvc002, "KVC-004": kvc004, "KVC-005": kvc005, "KVC-007": kvc007,
    "WF": wf_connector,
}
def kvc006(ae: ActionEncoding) -> Any:
    """KVC-006: a reported failure follows the policy: under ``fail`` the request (not aborted
    before) finishes, under ``recompute`` it does not; a load that did not fail finishes nobody."""
    if ae.action != "load_land":
        return z3.BoolVal(True)
    enc = ae.enc
    assert isinstance(enc, ConnectorEncoder) and isinstance(ae.pre, ConnState)
    g, v = ae.params["group"], ae.params["valid"]
    failed = v < enc._at(ae.pre.ltok, g)
    was_live = enc.gsel(ae.pre.gstat, g) != FIN
    done = enc.gsel(ae.post.gstat, g) == FIN
    return z3.Implies(was_live, done == z3.And(failed, enc.FAIL))


CONNECTOR_TRANSITION_PROPERTIES = {**V1_TRANSITION_PROPERTIES, "KVC-006": kvc006}
CONNECTOR_STEP_PARTS = dict(V1_STEP_PARTS)
grp_ok_connector = grp_ok_v1

CONNECTOR_SCOPE = {
    "CAP-001": "a landed load that failed keeps the blocks past its first failed block (the connector profile "
               "leaves CAP-001 out; KVC-004 and KVC-005 bound the table and the computed tokens)",
    "RES-004": "a delayed free keeps a finished request's blocks while its send is in flight (KVC-007's state part)",
    "KVC-003": "prefix caching is off in the v1 and connector encodings: no key to check",
    "KVC-008": "liveness over one step's admissions (not a state invariant)",
    "KVC-010": "about one step's schedule over the tables (not a state invariant); with prefix caching off in "
               "these encodings no other table holds a loading block at all (KVC-002, proved)",
    "KVC-009": "liveness over steps (not a state invariant)",
    "KVC-011": "about one step's chunks over the blocks failed loads left invalid, carried across steps "
               "(not a state invariant); synchronous loads are not encoded",
}


# ---------------------------------------------------------------------- the generic request, for every size
# The per-request rows proved on one generic request (`GenericConnector`); KVC-002's per-request
# half is KVC_SEQS (its block half: parametric.py's named-not-free and prove_unshared).
KVC_SEQS = "KVC-002/seqs"
ROWS_CONNECTOR_SEQ = ("RES-001", "RES-002", "RES-003", "CAP-003", "CHK-002", "LEN-001", "CHK-006", "KVC-001",
                      KVC_SEQS, "KVC-004", "KVC-005", "KVC-007")
STEPS_CONNECTOR_SEQ = ("CHK-001", "CHK-003", "CHK-004", "CHK-005", "ALLOC", "ADM-002", "KVC-006")
ACTIONS_CONNECTOR_SEQ = CONNECTOR_ACTIONS
# the connector proof mutants that mutate one request's rule, with the actions whose generic cells they
# break; the other, load-into-held-block, is a mutated block-layer micro-op (parametric.MUTANTS)
CONNECTOR_MUTANT_ACTIONS = {
    "admit-while-loading": ("admit",),
    "load-allocates-past-load": ("load_start",),
    "land-counts-failed": ("load_land",),
    "send-done-keeps-blocks": ("send_done",),
    "frees-while-transferring": ("abort",),
    "fail-policy-ignored": ("load_land",),
}


@dataclass
class ConnSeq(Seq):
    """The generic request's sequence with its connector record: transfer, load tokens, valid ghost."""

    x: Any = None
    lt: Any = None
    lv: Any = None


class GenericConnector(GenericV1):
    """The connector flow's generic request: `GenericV1` (chunk size, stop, chunked prefill, the
    threshold, the partial limit, the free count and the watermark symbolic) with the request's
    transfer (`xfer`), its load's tokens (`ltok`) and the valid ghost (`lval`), the failure policy
    symbolic. Its rules are `ConnectorEncoder`'s for the touched request; the guards that read
    other requests (the seat check, the partial count, the threshold's active count, the free
    count) read them as the v1 generic request does (an arbitrary rest, a symbolic free count),
    and a guard left out only allows more."""

    def __init__(self, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in CONNECTOR_MUTANT_ACTIONS:
            raise ValueError(f"unknown per-request connector mutant {mutant!r}")
        super().__init__(None)
        self.mutant = mutant
        self.FAIL = z3.Bool("g_kv_load_failure_policy_fail")
        self.send, self.e, self.v = z3.Ints("g_send g_external g_valid")

    def seq(self, p: str) -> ConnSeq:
        return ConnSeq(*z3.Ints(f"{p}_st {p}_dv {p}_tl {p}_nt {p}_nc {p}_x {p}_lt {p}_lv"))

    def unborn(self) -> ConnSeq:
        q = super().unborn()
        zero = z3.IntVal(0)
        return ConnSeq(q.st, q.dv, q.tl, q.nt, q.nc, z3.IntVal(NO_XFER), zero, zero)

    # ---------------------------------------------------------------- facts
    @staticmethod
    def _load(q: ConnSeq) -> Any:
        return z3.Or(q.x == LOADING, q.x == LANDED)

    @staticmethod
    def _busy(q: ConnSeq) -> Any:
        return z3.Or(q.x == LOADING, q.x == SENDING)

    def rows(self, q: Seq) -> dict[str, Any]:
        assert isinstance(q, ConnSeq)
        v1 = super().rows(q)
        return {
            **{row: v1[row] for row in ("RES-001", "RES-002", "CHK-002", "LEN-001", "CHK-006")},
            "RES-003": z3.Implies(z3.And(q.st == WAIT, q.tl >= 1), z3.And(self._load(q), q.dv == GPU)),
            "CAP-003": z3.And(z3.Implies(q.st == RUN, q.nc <= q.nt - 1),
                              z3.Implies(z3.And(q.st == WAIT, q.x != LANDED), q.nc == 0)),
            "KVC-001": z3.Implies(q.x == LOADING, q.st != RUN),
            KVC_SEQS: z3.Implies(self._busy(q), z3.And(q.tl >= 1, q.dv == GPU)),
            "KVC-004": z3.Implies(z3.And(q.st == WAIT, self._load(q)),
                                  z3.And(q.tl == self.ceil(q.lt), z3.Implies(q.x == LOADING, q.nc == 0))),
            "KVC-005": z3.Implies(q.x == LANDED, q.nc <= q.lv),
            "KVC-007": z3.Implies(z3.And(q.st == FIN, q.tl >= 1), z3.And(self._busy(q), q.dv == GPU)),
        }

    def wf(self, q: Seq, gs: Any = None, forked: Any = None) -> Any:
        """v1's per-request WF and `wf_connector`'s transfer facts."""
        assert isinstance(q, ConnSeq)
        x, status = q.x, self.gs if gs is None else gs
        return z3.And(super().wf(q, gs, forked), status >= NONE, status <= FIN, x >= NO_XFER, x <= SENDING, z3.Implies(q.st == NONE, x == NO_XFER),
                      z3.Implies(x == SENDING, q.st == FIN),
                      z3.Implies(x == LANDED, z3.And(q.st == WAIT, q.lv >= 1, q.lv <= q.lt)),
                      z3.Implies(x == LOADING, z3.Or(q.st == WAIT, q.st == FIN)),
                      z3.Implies(self._load(q), z3.And(q.lt >= 1, q.lt <= q.nt - 1)))

    # ---------------------------------------------------------------- the request's rules
    def _freed(self, q: Seq, cond: Any, st: Any) -> Seq:
        return replace(q, st=z3.If(cond, st, q.st), dv=z3.If(cond, NODEV, q.dv), tl=z3.If(cond, 0, q.tl))

    def _cchunk(self, q: ConnSeq) -> tuple[Any, ConnSeq]:
        """V1's chunk of k (`GenericV1._chunk`); an end may keep the table for a send
        (`ConnectorEncoder._update_chunk`)."""
        k = self.k
        ok = z3.And(k >= 1, k <= q.nt - q.nc, self.stop >= 0, self.stop <= 1, self.send >= 0, self.send <= 1,
                    z3.Implies(self.threshold_applies(q), k <= self.TH))
        target = self.ceil(q.nc + k)
        tl = z3.If(target > q.tl, target, q.tl)
        nc = q.nc + k
        sampled = nc >= q.nt
        nt = z3.If(sampled, q.nt + 1, q.nt)
        ends = z3.And(sampled, z3.Or(self.stop == 1, nt - self.plen >= self.mtok, nt >= self.ML))
        held = z3.And(ends, self.send == 1)
        run = replace(q, st=z3.IntVal(RUN), dv=z3.If(tl >= 1, GPU, q.dv), tl=tl, nt=nt, nc=nc)
        out = self._freed(run, z3.And(ends, z3.Not(held)), FIN)
        return ok, replace(out, st=z3.If(ends, FIN, out.st), x=z3.If(held, SENDING, q.x))

    def load_blocks(self) -> Any:
        return self.ceil(self.e) + (1 if self.mutant == "load-allocates-past-load" else 0)

    def effect(self, action: str, q: Seq, parent: Seq) -> tuple[Any, Seq]:
        assert isinstance(q, ConnSeq)
        gs, F, W = self.gs, self.F, self.W
        zero = z3.IntVal(0)
        if action == "add":
            rejected = self.plen > self.ML
            return gs == NONE, replace(q, st=z3.If(rejected, FIN, WAIT), nt=self.plen, nc=zero,
                                       x=z3.IntVal(NO_XFER), lt=zero, lv=zero)
        if action == "admit":
            ok, post = self._cchunk(q)
            partial_ok = z3.Or(self.P == 0, q.nc + self.k >= q.nt - 1, self.rest_partial + self.partial(q) < self.P)
            guard = z3.And(gs == WAIT, ok, z3.Or(self.CH, self.k == q.nt - q.nc), partial_ok,
                           self.ceil(q.nt) - q.tl + W <= F, self.taken(q) + W <= F)
            if self.mutant != "admit-while-loading":
                guard = z3.And(guard, q.x != LOADING)
            kept = z3.Or(post.x == SENDING, q.x == LOADING)  # a landed load is promoted: its record goes
            return guard, replace(post, x=z3.If(kept, post.x, NO_XFER))
        if action == "chunk":
            ok, post = self._cchunk(q)
            return z3.And(gs == RUN, ok, self.taken(q) <= F), post
        if action == "preempt_recompute":
            return gs == RUN, replace(self._freed(q, True, WAIT), nc=zero)
        if action == "ignore":
            return z3.And(gs == WAIT, q.x == NO_XFER), self._freed(q, True, FIN)
        if action == "abort":
            loading = q.x == LOADING
            sends = z3.And(z3.Not(loading), self.send == 1, q.tl >= 1)
            keep = z3.BoolVal(False) if self.mutant == "frees-while-transferring" else z3.Or(loading, sends)
            post = replace(self._freed(q, z3.Not(keep), FIN), st=z3.IntVal(FIN),
                           x=z3.If(loading, q.x, z3.If(sends, SENDING, NO_XFER)))
            return z3.And(z3.Or(gs == WAIT, gs == RUN), self.send >= 0, self.send <= 1), post
        if action == "load_start":
            blocks = self.load_blocks()
            guard = z3.And(gs == WAIT, q.x == NO_XFER, q.tl == 0, q.nc == 0, self.e >= 1, self.e <= q.nt - 1,
                           self.ceil(q.nt) + W <= F)
            return guard, replace(q, tl=blocks, dv=z3.IntVal(GPU), x=z3.IntVal(LOADING), lt=self.e, lv=zero)
        if action == "load_land":
            v = self.v
            guard = z3.And(q.x == LOADING, v >= 0, v <= q.lt, z3.Or(v == q.lt, v % self.bs == 0))
            aborted = q.st == FIN
            fails = z3.BoolVal(False) if self.mutant == "fail-policy-ignored" else self.FAIL
            errs = z3.And(v < q.lt, fails, z3.Not(aborted))
            frees = z3.Or(aborted, errs, v == 0)
            counted = q.lt if self.mutant == "land-counts-failed" else v
            post = replace(self._freed(q, frees, q.st), st=z3.If(errs, FIN, q.st), x=z3.If(frees, NO_XFER, LANDED),
                           nc=z3.If(frees, q.nc, counted), lv=z3.If(frees, 0, v))
            return guard, post
        if action == "send_done":
            post = q if self.mutant == "send-done-keeps-blocks" else self._freed(q, True, q.st)
            return q.x == SENDING, replace(post, x=z3.IntVal(NO_XFER))
        raise ValueError(action)

    def target(self, action: str) -> Any:
        """The request's status after the action while its sequence is live."""
        if action in ("load_start", "load_land"):
            return z3.IntVal(WAIT)  # a live request stays waiting (a failure under fail ends it)
        if action == "send_done":
            return z3.IntVal(FIN)  # never live: a send is a finished request's
        return super().target(action)

    def request_after(self, action: str, post: Seq) -> tuple[Any, Any, Any]:
        true = z3.BoolVal(True)
        if action == "load_start":
            return true, z3.IntVal(WAIT), true
        if action == "load_land":
            return true, z3.If(post.st == FIN, FIN, self.gs), true
        if action == "send_done":
            return true, z3.IntVal(FIN), true
        return super().request_after(action, post)

    def in_bound(self, action: str, q: Seq, parent: Seq) -> Any:
        if action == "load_start":
            return self.load_blocks() <= self.L
        return super().in_bound(action, q, parent)

    def transition_goals(self, action: str, q: Seq, post: Seq) -> dict[str, Any]:
        assert isinstance(q, ConnSeq)
        out = super().transition_goals(action, q, post)
        true = z3.BoolVal(True)
        if action == "load_start":  # the load's blocks are free ones (ALLOC); no admission (ADM-002)
            out["ALLOC"] = self.load_blocks() <= self.F
        failed = self.v < q.lt
        out["KVC-006"] = z3.Implies(self.gs != FIN, (post.st == FIN) == z3.And(failed, self.FAIL)) \
            if action == "load_land" else true
        return out
