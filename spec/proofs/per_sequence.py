"""Per-sequence rows for every size: one generic sequence of the touched request.

RES-001..004, CAP-001, CAP-003 and LEN-001 are each a fact about one sequence alone (its status,
device, table length, token and computed counts, and the config's ``max_model_len``). An action
of the v0 flow changes only the sequences of the request it touches (``finish``: one of them),
and changes each of them by the same rule, applied to that sequence's own pre-state (``fork``: a
child's post-state is the parent's, since the child copies the parent's table and counts). So a
row holds after an action for every number of sequences, requests, blocks and table entries iff
it holds for one generic member: the queries here have one sequence (plus the parent, for a
forked child), a symbolic block size and a symbolic config, and no bound at all.

The member's status before the action is its request's (QUE-002's per-sequence half, and WF: a
live sequence of an unfinished request has the request's status; an unborn child of a request
that has not forked holds nothing). ``tests/test_per_sequence_matches_reference.py`` checks the
per-sequence rules against the reference scheduler on drawn states of any size: each member's
post-state is the rule applied to its pre-state, every other sequence is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import z3

from spec.proofs.encoding import CPU, FIN, GPU, NODEV, NONE, RUN, SWAP, WAIT

ROWS = ("RES-001", "RES-002", "RES-003", "RES-004", "CAP-001", "CAP-003", "LEN-001")
# QUE-002's per-sequence half (a live sequence of an unfinished request has the request's
# status); its per-request half (a queue names the status) is in spec/proofs/unbounded.py
QUE_SEQS = "QUE-002/seqs"
# WF's per-sequence part, with the request's status and fork flag after the action
WF_SEQS = "WF/seqs"
# The touched request's status after the action whenever one of its sequences is still live
# (an action ends the request only when none is: finish_group_if_done, V1's finish)
TARGET = {"add": WAIT, "admit": RUN, "fork": RUN, "decode": RUN, "preempt_recompute": WAIT, "swap_out": SWAP,
          "swap_in": RUN, "finish": RUN, "abort": FIN, "ignore": FIN, "chunk": RUN, "verify": RUN}
ACTIONS = ("add", "admit", "fork", "decode", "preempt_recompute", "swap_out", "swap_in", "finish", "abort", "ignore")


@dataclass
class Seq:
    st: Any
    dv: Any
    tl: Any
    nt: Any
    nc: Any


# The proof mutants whose mutated transition is a per-sequence rule (spec.proofs.encoding.MUTANTS).
MUTANTS = {
    "recompute-keeps-computed": ("preempt_recompute",),
    "abort-no-free": ("abort",),
}
# and of the v1 flow (spec.proofs.chunked.V1_MUTANTS)
MUTANTS_V1 = {
    "admit-ignores-partial-limit": ("admit",),
    "chunk-ignores-threshold": ("admit", "chunk"),
    "preempt-keeps-computed": ("preempt_recompute",),
    "chunk-past-end": ("admit", "chunk"),
    "chunk-no-alloc": ("chunk",),
    "chunk-counts-as-whole": ("admit", "chunk"),
}


class Generic:
    """A generic sequence and its request's fields; the config and block size are symbolic."""

    def __init__(self, mutant: str | None = None) -> None:
        self.mutant = mutant
        self.bs, self.ML = z3.Ints("g_block_size g_max_model_len")
        self.plen, self.mtok = z3.Ints("g_prompt_len g_max_tokens")
        self.gs = z3.Int("g_request_status")
        self.forked = z3.Bool("g_forked")
        self.first = z3.Bool("g_first")  # the request's first slot (the parent)
        self.L = z3.Int("g_table_len")  # the bound's table length, symbolic (WF: tables fit it)
        self.n = z3.Int("g_n")
        self.anylive = z3.Bool("g_any_member_live_after")

    def seq(self, p: str) -> Seq:
        return Seq(*z3.Ints(f"{p}_st {p}_dv {p}_tl {p}_nt {p}_nc"))

    def unborn(self) -> Seq:
        """A slot of the empty scheduler (the init column)."""
        return Seq(z3.IntVal(NONE), z3.IntVal(NODEV), z3.IntVal(0), z3.Int("i_nt"), z3.Int("i_nc"))

    def ceil(self, t: Any) -> Any:
        return (t + self.bs - 1) / self.bs

    def base(self) -> Any:
        return z3.And(self.bs >= 1, self.ML >= 1, self.plen >= 1, self.mtok >= 1)

    # ---------------------------------------------------------------- facts
    def rows(self, q: Seq) -> dict[str, Any]:
        admitted = z3.Or(q.st == RUN, q.st == SWAP)
        return {
            "RES-001": z3.Implies(q.st == RUN, z3.And(q.dv == GPU, q.tl >= 1)),
            "RES-002": z3.Implies(q.st == SWAP, z3.And(q.dv == CPU, q.tl >= 1)),
            "RES-003": z3.Implies(q.st == WAIT, q.tl == 0),
            "RES-004": z3.Implies(q.st == FIN, q.tl == 0),
            "CAP-001": z3.Implies(admitted, q.tl == self.ceil(q.nc)),
            "CAP-003": z3.And(z3.Implies(admitted, q.nc == q.nt - 1), z3.Implies(q.st == WAIT, q.nc == 0)),
            "LEN-001": z3.Implies(admitted, q.nt <= self.ML),
        }

    def wf(self, q: Seq, gs: Any = None, forked: Any = None) -> Any:
        """WF's per-sequence part, and its tie to the request (QUE-002's per-sequence half)."""
        gs = self.gs if gs is None else gs
        forked = self.forked if forked is None else forked
        born = q.st != NONE
        live = z3.Or(q.st == WAIT, q.st == RUN, q.st == SWAP)
        unfinished = z3.Or(gs == WAIT, gs == RUN, gs == SWAP)
        return z3.And(
            q.st >= NONE, q.st <= FIN, q.dv >= NODEV, q.dv <= CPU, q.tl >= 0, (q.dv == NODEV) == (q.tl == 0),
            z3.Implies(born, z3.And(q.nt >= 1, q.nc >= 0)), z3.Implies(z3.Not(born), q.tl == 0),
            z3.Implies(gs == NONE, z3.Not(born)), z3.Implies(gs == FIN, z3.Not(live)),
            z3.Implies(z3.And(unfinished, live), q.st == gs),
            z3.Implies(self.first, born == (gs != NONE)),
            z3.Implies(z3.Not(self.first), born == z3.And(gs != NONE, forked)),
        )

    def target(self, action: str) -> Any:
        """The touched request's status after the action whenever one of its sequences is live."""
        return z3.IntVal(TARGET[action])

    def request_after(self, action: str, post: Seq) -> tuple[Any, Any, Any]:
        """(constraint, status, fork flag) of the touched request after the action: an action
        that may end it ends it exactly when no member is live (``anylive``, true when this one
        is)."""
        link = z3.Implies(self.live(post), self.anylive)
        if action == "add":
            return z3.Implies(z3.Not(self.first), self.n >= 2), z3.IntVal(WAIT), self.n == 1
        if action in ("admit", "fork", "decode", "swap_in", "finish"):
            forked = z3.BoolVal(True) if action == "fork" else self.forked
            return link, z3.If(self.anylive, RUN, FIN), forked
        status = {"preempt_recompute": WAIT, "swap_out": SWAP, "abort": FIN, "ignore": FIN}[action]
        return z3.BoolVal(True), z3.IntVal(status), self.forked

    def in_bound(self, action: str, q: Seq, parent: Seq) -> Any:
        """The table-length guards of the bounded encoding (what keeps WF's tl <= L)."""
        m = self.live(q)
        grow = z3.And(m, q.nc / self.bs == q.tl, q.tl < self.L)
        if action == "admit":
            return z3.Implies(m, self.ceil(q.nt) <= self.L)
        if action == "fork":
            return self.ceil(parent.nt) <= self.L
        if action in ("decode", "swap_in"):
            return z3.Or(z3.Not(z3.And(m, q.nc / self.bs == q.tl)), grow)
        return z3.BoolVal(True)

    def inv(self, q: Seq) -> Any:
        return z3.And(self.wf(q), *self.rows(q).values())

    # ---------------------------------------------------------------- per-sequence rules
    @staticmethod
    def live(q: Seq) -> Any:
        return z3.Or(q.st == WAIT, q.st == RUN, q.st == SWAP)

    def _freed(self, q: Seq, cond: Any, st: Any) -> Seq:
        return Seq(z3.If(cond, st, q.st), z3.If(cond, NODEV, q.dv), z3.If(cond, 0, q.tl), q.nt, q.nc)

    def _update(self, q: Seq, cond: Any, computed: Any) -> Seq:
        """Scheduler.update for one sequence: computed, one token, the length / max_tokens cap."""
        nc = z3.If(cond, computed, q.nc)
        nt = z3.If(cond, q.nt + 1, q.nt)
        capped = z3.And(cond, z3.Or(nt - self.plen >= self.mtok, nt >= self.ML))
        return self._freed(Seq(q.st, q.dv, q.tl, nt, nc), capped, FIN)

    def _prefill(self, q: Seq, cond: Any) -> Seq:
        q = Seq(z3.If(cond, RUN, q.st), z3.If(cond, GPU, q.dv), z3.If(cond, self.ceil(q.nt), q.tl), q.nt, q.nc)
        return self._update(q, cond, q.nt)

    def _decode(self, q: Seq, cond: Any) -> Seq:
        grow = z3.And(cond, q.nc / self.bs == q.tl)
        return self._update(Seq(q.st, q.dv, z3.If(grow, q.tl + 1, q.tl), q.nt, q.nc), cond, q.nc + 1)

    def effect(self, action: str, q: Seq, parent: Seq) -> tuple[Any, Seq]:
        """(guard, post) for a member ``q`` of the touched request; ``parent`` is the request's
        first sequence (used by ``fork``, where ``q`` may be an unborn child)."""
        gs, m = self.gs, self.live(q)
        if action == "add":  # the request arrives: its first slot waits with the prompt
            post = Seq(z3.If(self.first, WAIT, q.st), q.dv, q.tl, z3.If(self.first, self.plen, q.nt),
                       z3.If(self.first, 0, q.nc))
            return gs == NONE, post
        if action == "admit":
            return z3.And(gs == WAIT, self.forked), self._prefill(q, m)
        if action == "fork":  # parent: prefill; child: the parent's post-state
            guard = z3.And(gs == WAIT, z3.Not(self.forked), parent.st == WAIT, parent.tl == 0, parent.nc == 0)
            pre = z3.If(self.first, q.nt, parent.nt)
            src = Seq(WAIT, NODEV, 0, pre, 0)
            return guard, self._prefill(src, True)
        if action == "decode":
            return gs == RUN, self._decode(q, m)
        if action == "preempt_recompute":
            freed = self._freed(q, m, WAIT)
            keep = self.mutant == "recompute-keeps-computed"
            return gs == RUN, Seq(freed.st, freed.dv, freed.tl, freed.nt, q.nc if keep else z3.If(m, 0, q.nc))
        if action == "swap_out":
            return gs == RUN, Seq(z3.If(m, SWAP, q.st), z3.If(z3.And(m, q.dv == GPU), CPU, q.dv), q.tl, q.nt, q.nc)
        if action == "swap_in":
            moved = Seq(z3.If(m, RUN, q.st), z3.If(z3.And(m, q.dv == CPU), GPU, q.dv), q.tl, q.nt, q.nc)
            return gs == SWAP, self._decode(moved, m)
        if action == "finish":  # the stopped sequence (any other member is unchanged)
            return z3.And(gs == RUN, q.st == RUN), self._freed(q, True, FIN)
        if action in ("abort", "ignore"):
            ok = z3.Or(gs == WAIT, gs == RUN, gs == SWAP) if action == "abort" else z3.Or(gs == WAIT, gs == SWAP)
            if action == "abort" and self.mutant == "abort-no-free":
                return ok, Seq(z3.If(m, FIN, q.st), q.dv, q.tl, q.nt, q.nc)
            return ok, self._freed(q, m, FIN)
        raise ValueError(action)


ROWS_V1 = ("RES-001", "RES-002", "RES-003", "RES-004", "CAP-001", "CAP-003", "CHK-002", "LEN-001", "CHK-006")
# v1 transition properties about the touched request alone (no init column)
STEPS_V1 = ("CHK-001", "CHK-003", "CHK-004", "CHK-005", "ALLOC", "ADM-002")
ACTIONS_V1 = ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore")


class GenericV1(Generic):
    """The v1 flow (spec/proofs/chunked.py): one sequence per request, chunks of ``k`` tokens,
    no swap. The chunk size, the stop decision and chunked prefill are symbolic."""

    def __init__(self, mutant: str | None = None) -> None:
        super().__init__(mutant)
        self.k, self.stop = z3.Ints("g_tokens g_stop")
        self.CH = z3.Bool("g_chunked_prefill")
        # CHK-006 counts running requests mid-prefill: this request's term plus the others'
        # (``rest``, an arbitrary count: only this request changes), against the limit P
        self.P, self.rest_partial = z3.Ints("g_max_num_partial_prefills g_rest_partial")
        # CHK-005's threshold applies when more than one request runs or waits: this one + the rest
        self.TH, self.rest_active = z3.Ints("g_long_prefill_token_threshold g_rest_active")
        # ALLOC / ADM-002: the pool's free count before the action and the watermark (symbolic)
        self.F, self.W = z3.Ints("g_free_blocks g_watermark_blocks")
        self.first = z3.BoolVal(True)
        self.forked = z3.BoolVal(True)

    def rows(self, q: Seq) -> dict[str, Any]:
        out = super().rows(q)
        out["CAP-003"] = z3.And(z3.Implies(q.st == RUN, q.nc <= q.nt - 1), z3.Implies(q.st == WAIT, q.nc == 0))
        out["CHK-002"] = z3.Implies(q.st != NONE, z3.And(q.nc >= 0, q.nc <= q.nt))
        out["CHK-006"] = z3.Implies(self.P > 0, self.rest_partial + self.partial(q) <= self.P)
        return out

    @staticmethod
    def partial(q: Seq) -> Any:
        return z3.If(z3.And(q.st == RUN, q.nc < q.nt - 1), 1, 0)

    def base(self) -> Any:
        return z3.And(super().base(), self.P >= 0, self.rest_partial >= 0, self.TH >= 0, self.rest_active >= 0,
                      self.F >= 0, self.W >= 0)

    def taken(self, q: Seq) -> Any:
        """Fresh blocks a chunk of k takes: those covering computed + k beyond the table."""
        fresh = self.ceil(q.nc + self.k) - q.tl
        return z3.If(fresh > 0, fresh, 0)

    def threshold_applies(self, q: Seq) -> Any:
        active = self.rest_active + z3.If(z3.Or(q.st == WAIT, q.st == RUN), 1, 0)
        return z3.And(self.TH > 0, active > 1)

    def transition_goals(self, action: str, q: Seq, post: Seq) -> dict[str, Any]:
        """The v1 transition properties on (pre, post) of the touched request (others unchanged)."""
        chunked = action in ("admit", "chunk")
        true = z3.BoolVal(True)
        return {
            "CHK-001": self.k >= 1 if chunked else true,
            "CHK-002/step": q.nc + self.k <= q.nt if chunked else true,
            "CHK-003": z3.And(post.tl == 0, post.nc == 0, post.nt == q.nt) if action == "preempt_recompute" else true,
            "CHK-004": post.nc == q.nc + self.k if chunked else true,
            "CHK-005": z3.Implies(self.threshold_applies(q), self.k <= self.TH) if chunked else true,
            # the blocks taken are free ones (the free-count link: |free set| = F, BLK-001)
            "ALLOC": self.taken(q) <= self.F if chunked else true,
            # an admitted request leaves the watermark free after its allocation
            "ADM-002": self.F - self.taken(q) >= self.W if action == "admit" else true,
        }

    def wf(self, q: Seq, gs: Any = None, forked: Any = None) -> Any:
        gs = self.gs if gs is None else gs
        live = self.live(q)
        unfinished = z3.Or(gs == WAIT, gs == RUN)  # the request's one sequence is live (WF)
        return z3.And(super().wf(q, gs, forked), q.st != SWAP, gs != SWAP, z3.Implies(live, q.nt <= self.ML),
                      z3.Implies(unfinished, live),
                      z3.Implies(q.st != NONE, q.nt >= self.plen))

    def request_after(self, action: str, post: Seq) -> tuple[Any, Any, Any]:
        """The request's status after the action is its one sequence's (FIN once it ends)."""
        if action == "add":
            return z3.BoolVal(True), z3.If(self.plen > self.ML, FIN, WAIT), z3.BoolVal(True)
        if action in ("admit", "chunk"):
            return z3.BoolVal(True), z3.If(self.live(post), RUN, FIN), z3.BoolVal(True)
        status = {"preempt_recompute": WAIT, "abort": FIN, "ignore": FIN}[action]
        return z3.BoolVal(True), z3.IntVal(status), z3.BoolVal(True)

    def in_bound(self, action: str, q: Seq, parent: Seq) -> Any:
        if action in ("admit", "chunk"):
            return self.ceil(q.nc + self.k) <= self.L
        return z3.BoolVal(True)

    def _chunk(self, q: Seq, allocate: bool = True) -> tuple[Any, Seq]:
        k = self.k
        upper = q.nt - q.nc + (1 if self.mutant == "chunk-past-end" else 0)
        ok = z3.And(k >= 1, k <= upper, self.stop >= 0, self.stop <= 1)
        if self.mutant != "chunk-ignores-threshold":
            ok = z3.And(ok, z3.Implies(self.threshold_applies(q), k <= self.TH))
        target = self.ceil(q.nc + k)
        tl = z3.If(target > q.tl, target, q.tl) if allocate else q.tl
        nc = q.nc + k
        if self.mutant == "chunk-counts-as-whole":
            nc = z3.If(nc < q.nt - 1, q.nt - 1, nc)
        sampled = nc >= q.nt
        nt = z3.If(sampled, q.nt + 1, q.nt)
        ends = z3.And(sampled, z3.Or(self.stop == 1, nt - self.plen >= self.mtok, nt >= self.ML))
        run = Seq(z3.IntVal(RUN), z3.If(tl >= 1, GPU, q.dv), tl, nt, nc)
        return ok, self._freed(run, ends, FIN)

    def effect(self, action: str, q: Seq, parent: Seq) -> tuple[Any, Seq]:
        gs = self.gs
        if action == "add":
            rejected = self.plen > self.ML
            return gs == NONE, Seq(z3.If(rejected, FIN, WAIT), q.dv, q.tl, self.plen, z3.IntVal(0))
        if action in ("admit", "chunk"):
            ok, post = self._chunk(q, allocate=not (action == "chunk" and self.mutant == "chunk-no-alloc"))
            want = WAIT if action == "admit" else RUN
            # the block guards: admit keeps the whole sequence and the chunk above the watermark,
            # a running chunk needs its fresh blocks free
            if action == "admit":
                ok = z3.And(ok, self.ceil(q.nt) - q.tl + self.W <= self.F, self.taken(q) + self.W <= self.F)
            else:
                ok = z3.And(ok, self.taken(q) <= self.F)
            if action == "admit" and self.mutant != "admit-ignores-partial-limit":
                # a new partial prefill only while fewer than the limit are mid-prefill
                ok = z3.And(ok, z3.Or(self.P == 0, q.nc + self.k >= q.nt - 1, self.rest_partial + self.partial(q) < self.P))
            return z3.And(gs == want, ok, z3.Or(self.CH, action == "chunk", self.k == q.nt - q.nc)), post
        if action == "preempt_recompute":
            freed = self._freed(q, True, WAIT)
            nc = q.nc if self.mutant == "preempt-keeps-computed" else z3.IntVal(0)
            return gs == RUN, Seq(freed.st, freed.dv, freed.tl, freed.nt, nc)
        if action in ("abort", "ignore"):
            ok = z3.Or(gs == WAIT, gs == RUN) if action == "abort" else gs == WAIT
            return ok, self._freed(q, True, FIN)
        raise ValueError(action)


@dataclass
class SeqResult:
    row: str
    action: str
    result: str
    seconds: float
