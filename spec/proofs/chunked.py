"""The Z3 encoding of vLLM V1's flow (``reference_impl/v1_scheduler.py``): chunked prefill.

Flow ``v1`` of ``kvsched prove``. The symbolic state is the V0 encoding's (`spec.proofs.encoding.State`)
with one sequence slot per request (V1 schedules requests of ``n = 1``: slot ``s`` is request
``s``) and no swap space: computed tokens advance by a scheduled *chunk*, so a request may be
RUNNING mid-prefill with fewer computed tokens than prompt tokens. The config adds
``enable_chunked_prefill``, ``long_prefill_token_threshold`` and ``max_num_partial_prefills``
(all symbolic, like the watermark, ``max_num_seqs``, ``max_model_len`` and the token budget).

Actions, each one request's transition between two steps (``schedule()`` and ``update()``
together; a step of the reference is a sequence of them):

- ``add``: arrival; a prompt longer than ``max_model_len`` is rejected at once (finished).
- ``admit``: a waiting request's first chunk (V1's ``_admit`` for one head): not ignorable, fewer
  than ``max_num_seqs`` running, the blocks of the *whole* sequence fit above the watermark, the
  partial-prefill limit, and ``1 <= k <= min(uncomputed, budget, threshold if it applies)``
  tokens (without chunked prefill exactly the uncomputed tokens, within the budget).
- ``chunk``: a running request's next ``k`` tokens (a decode is a chunk of one), allocating the
  blocks that cover ``computed + k`` tokens (no watermark: V1's running loop).
- ``preempt_recompute``: free every block, computed := 0, keep every token, back to waiting.
- ``abort``, ``ignore`` (prompt over the prompt limit, or blocks that can never fit).

After ``admit`` / ``chunk`` the update: computed += k; a request whose tokens are then all
computed samples one token and finishes on a stop (``stop`` parameter: the environment's
decision), at ``max_tokens`` or at ``max_model_len`` tokens.

Over-approximations (so the proofs hold for more than the reference does): queue order is not
modelled (any waiting request may be admitted, any running one chunked or preempted); the step's
token budget is per action (each chunk <= the budget, not their sum); the threshold applies when
more than one request is waiting or running *in the action's pre-state*; and a fresh block is
*any* free block, not the head of V1's free queue (the proofs hold for every allocation order,
V1's and nano-vllm's included; the encoding-vs-reference test checks the reference's post-state
is one the encoding allows).
"""

from __future__ import annotations

from typing import Any

import z3

from spec.errors import InputError
from spec.proofs import properties as P0
from spec.proofs.bound import Bound
from spec.proofs.encoding import (
    FIN,
    GPU,
    NONE,
    RUN,
    SWAP,
    WAIT,
    ActionEncoding,
    Encoder,
    Pool,
    State,
    _count,
    _ite_chain,
)

FLOW = "v1"
V1_BOUND = Bound(gpu_blocks=4, cpu_blocks=1, seqs=3, groups=3, table_len=3, block_size=2)
V1_ACTIONS = ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore")

# Mutated transitions of the chunked flow; each names the conformance mutant of the V1
# reference with the same bug (tests/proof_mutants.py maps them).
V1_MUTANTS = {
    "chunk-past-end": "a chunk may be given one token more than the uncomputed tokens",
    "chunk-no-alloc": "a running request's chunk takes no new block (its table stops growing)",
    "preempt-keeps-computed": "preemption by recompute frees the blocks but keeps the computed count",
    "chunk-counts-as-whole": "a partial chunk advances the computed count to the prompt's last token",
    "chunk-ignores-threshold": "chunks are not capped at long_prefill_token_threshold",
    "admit-ignores-partial-limit": "admission starts a partial prefill beyond max_num_partial_prefills",
}


class ChunkedEncoder(Encoder):
    """The V1 flow over the V0 encoding's state: one slot per request, GPU only."""

    actions = V1_ACTIONS  # action a is encoded by `_v1_{a}`
    action_prefix = "_v1_"
    chunk_actions: tuple[str, ...] = ("admit", "chunk")  # the actions that schedule tokens (CHK-001, ...)

    def __init__(self, bound: Bound, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in V1_MUTANTS:
            raise ValueError(f"unknown v1 mutant {mutant!r}")
        if bound.groups != bound.seqs:
            raise InputError("bound.groups", f"must equal seqs for the v1 flow (n = 1), got {bound.groups} and {bound.seqs}")
        super().__init__(bound, None)
        self.mutant = mutant
        self.TH, self.P = z3.Ints("cfg_long_prefill_token_threshold cfg_max_num_partial_prefills")
        self.CH = z3.Bool("cfg_enable_chunked_prefill")

    # ------------------------------------------------------------------ config
    def config_ok(self) -> Any:
        return z3.And(super().config_ok(), self.TH >= 0, self.P >= 0, z3.Implies(z3.Or(self.TH > 0, self.P > 0), self.CH))

    def prompt_limit(self) -> Any:
        return z3.If(self.CH, self.ML, z3.If(self.ML < self.T, self.ML, self.T))

    def read_config(self, model: Any) -> dict[str, Any]:
        out = super().read_config(model)
        out["long_prefill_token_threshold"] = model.eval(self.TH, model_completion=True).as_long()
        out["max_num_partial_prefills"] = model.eval(self.P, model_completion=True).as_long()
        out["enable_chunked_prefill"] = z3.is_true(model.eval(self.CH, model_completion=True))
        return out

    def pin_config(self, config: dict[str, Any]) -> list[Any]:
        return [*super().pin_config(config), self.TH == config["long_prefill_token_threshold"],
                self.P == config["max_num_partial_prefills"], self.CH == z3.BoolVal(config["enable_chunked_prefill"])]

    # ------------------------------------------------------------------ views
    def active(self, st: State) -> Any:
        """len(running) + len(waiting)."""
        return _count([z3.Or(st.gstat[j] == WAIT, st.gstat[j] == RUN) for j in range(self.G)])

    def running(self, st: State) -> Any:
        return _count([st.gstat[j] == RUN for j in range(self.G)])

    def partial(self, st: State) -> Any:
        """Running requests mid-prefill: more than their last token uncomputed (CHK-006's count)."""
        return _count([z3.And(st.sstat[s] == RUN, st.ncomp[s] < st.ntok[s] - 1) for s in range(self.S)])

    def threshold_applies(self, st: State) -> Any:
        return z3.And(self.TH > 0, self.active(st) > 1)

    # ------------------------------------------------------------------ allocation (any free block)
    def alloc_any(self, pool: Pool, cond: Any) -> tuple[Pool, Any]:
        """Take *some* free block when ``cond`` holds (an over-approximation of V1's free queue)."""
        n = len(pool.free)
        blk = self.fresh(z3.IntSort(), "blk")
        any_free = z3.Or(list(pool.free))
        self.defs.append(z3.Implies(cond, z3.And(blk >= 0, blk < n)))
        self.defs.append(z3.Implies(z3.And(cond, any_free), _ite_chain(blk, list(pool.free))))
        self.alloc_ok.append(z3.Implies(cond, any_free))
        hit = [z3.And(cond, blk == b) for b in range(n)]
        return Pool(
            [self.let(z3.If(hit[b], 1, pool.ref[b]), "r") for b in range(n)],
            [self.let(z3.If(hit[b], False, pool.free[b]), "f") for b in range(n)],
        ), blk

    # ------------------------------------------------------------------ actions
    def _at(self, values: list[Any], g: Any) -> Any:
        return _ite_chain(g, values)

    def _v1_add(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        p, m = z3.Int("act_prompt_len"), z3.Int("act_max_tokens")
        ae.params["prompt_len"] = p
        ae.params["max_tokens"] = m
        ae.guard = z3.And(self.gsel(pre.gstat, g) == NONE, p >= 1, m >= 1)
        rejected = p > self.ML  # V1's input processor: never waits, finished as ignored
        self.set_g(st.plen, g, p)
        self.set_g(st.mtok, g, m)
        for s in range(self.S):
            c = g == s
            self.set_s(st.sstat, s, z3.If(rejected, FIN, WAIT), c)
            self.set_s(st.ntok, s, p, c)
            self.set_s(st.ncomp, s, 0, c)
        self.set_g(st.gstat, g, z3.If(rejected, FIN, WAIT))
        self.set_g(st.in_w, g, z3.Not(rejected))
        self.set_g(st.forked, g, True)

    def _tokens(self, ae: ActionEncoding, pre: State, g: Any) -> tuple[Any, Any]:
        """The chunk size ``k`` and its bounds (the reference's min(uncomputed, threshold, budget))."""
        k = z3.Int("act_tokens")
        ae.params["tokens"] = k
        ntok, ncomp = self._at(pre.ntok, g), self._at(pre.ncomp, g)
        rem = ntok - ncomp
        upper = rem + 1 if self.mutant == "chunk-past-end" else rem
        ok = z3.And(k >= 1, k <= upper, k <= self.T)
        if self.mutant != "chunk-ignores-threshold":
            ok = z3.And(ok, z3.Implies(self.threshold_applies(pre), k <= self.TH))
        return k, ok

    def _schedule_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any, k: Any, allocate: Any) -> None:
        """Allocate the blocks covering computed + k tokens, then update(): computed += k, a
        sampled token once every token is computed, and the stops."""
        self._allocate_chunk(ae, pre, st, g, k, allocate)
        self._update_chunk(ae, pre, st, g, k)

    def _allocate_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any, k: Any, allocate: Any) -> None:
        """``schedule()`` for request g: the blocks covering computed + k tokens (the table only
        grows), the blocks those tokens are written into, and ``ae.mid``."""
        for s in range(self.S):
            c = g == s
            target = self.let(self.ceil_blocks(pre.ncomp[s] + k), "nd")
            pool = st.gpu
            for i in range(self.L):
                ci = z3.And(c, allocate, i >= pre.tlen[s], i < target)
                pool, blk = self.alloc_any(pool, ci)
                st.tab[s][i] = self.let(z3.If(ci, blk, st.tab[s][i]), "tb")
            st.gpu = pool
            grow = z3.And(c, allocate, target > pre.tlen[s])
            self.set_s(st.tlen, s, target, grow)
            self.set_s(st.dev, s, GPU, z3.And(c, st.tlen[s] >= 1))
            self.set_s(st.sstat, s, RUN, c)
            # the blocks this chunk's tokens are written into (COW-001)
            for i in range(self.L):
                ae.written.append((z3.And(c, i * self.bs < pre.ncomp[s] + k, (i + 1) * self.bs > pre.ncomp[s], i < st.tlen[s]),
                                   st.tab[s][i]))
        ae.mid = st.copy()

    def _update_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any, k: Any) -> None:
        """``update()`` for request g (a hook: the speculative flow commits a run of tokens)."""
        stop = z3.Int("act_stop")
        ae.params["stop"] = stop
        ae.guard = z3.And(ae.guard, stop >= 0, stop <= 1)
        for s in range(self.S):
            c = g == s
            computed = pre.ncomp[s] + k
            if self.mutant == "chunk-counts-as-whole":
                computed = z3.If(computed < pre.ntok[s] - 1, pre.ntok[s] - 1, computed)
            self.set_s(st.ncomp, s, computed, c)
            sampled = z3.And(c, st.ncomp[s] >= pre.ntok[s])
            self.set_s(st.ntok, s, pre.ntok[s] + 1, sampled)
            generated = st.ntok[s] - self.gsel(st.plen, g)
            ends = z3.And(sampled, z3.Or(stop == 1, generated >= self.gsel(st.mtok, g), st.ntok[s] >= self.ML))
            self.set_s(st.sstat, s, FIN, ends)
            self.free_seq(st, s, ends)
            self.set_g(st.gstat, g, FIN, ends)
            self.set_g(st.in_r, g, False, ends)

    def _v1_admit(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        k, k_ok = self._tokens(ae, pre, g)
        ntok, ncomp, tlen = self._at(pre.ntok, g), self._at(pre.ncomp, g), self._at(pre.tlen, g)
        rem = ntok - ncomp
        B = self.nblocks[GPU]
        free = self.free_count(pre.gpu)
        whole = self.ceil_blocks(ntok) - tlen
        fresh = self.ceil_blocks(ncomp + k) - tlen
        partial_ok = z3.Or(self.P == 0, ncomp + k >= ntok - 1, self.partial(pre) < self.P)
        if self.mutant == "admit-ignores-partial-limit":
            partial_ok = z3.BoolVal(True)
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == WAIT,
            self.gsel(pre.plen, g) <= self.prompt_limit(), self.ceil_blocks(ntok) <= B - self.W,  # not ignored
            self.running(pre) < self.M,
            k_ok, z3.Or(self.CH, k == rem),
            partial_ok,
            whole + self.W <= free,  # V1's scheduler_reserve_full_isl, above the watermark
            z3.If(fresh > 0, fresh, 0) + self.W <= free,
            self.ceil_blocks(ncomp + k) <= self.L,
        )
        self._schedule_chunk(ae, pre, st, g, k, z3.BoolVal(True))
        for j in range(self.G):
            entered = z3.And(g == j, st.gstat[j] != FIN)
            st.gstat[j] = self.let(z3.If(entered, RUN, st.gstat[j]), "g")
            st.in_w[j] = self.let(z3.If(g == j, False, st.in_w[j]), "g")
            st.in_r[j] = self.let(z3.If(entered, True, st.in_r[j]), "g")

    def _v1_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        k, k_ok = self._tokens(ae, pre, g)
        ncomp, tlen = self._at(pre.ncomp, g), self._at(pre.tlen, g)
        fresh = self.ceil_blocks(ncomp + k) - tlen
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == RUN, k_ok,
            z3.If(fresh > 0, fresh, 0) <= self.free_count(pre.gpu),
            self.ceil_blocks(ncomp + k) <= self.L,
        )
        self._schedule_chunk(ae, pre, st, g, k, z3.BoolVal(self.mutant != "chunk-no-alloc"))

    def _v1_preempt_recompute(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        ae.guard = self.gsel(pre.gstat, g) == RUN
        for s in range(self.S):
            c = g == s
            self.free_seq(st, s, c)
            if self.mutant != "preempt-keeps-computed":
                self.set_s(st.ncomp, s, 0, c)
            self.set_s(st.sstat, s, WAIT, c)
        self.set_g(st.gstat, g, WAIT)
        self.set_g(st.in_r, g, False)
        self.set_g(st.in_w, g, True)

    def _v1_end(self, st: State, g: Any) -> None:
        for s in range(self.S):
            c = g == s
            self.free_seq(st, s, c)
            self.set_s(st.sstat, s, FIN, c)
        self.set_g(st.gstat, g, FIN)
        self.set_g(st.in_w, g, False)
        self.set_g(st.in_r, g, False)

    def _v1_abort(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        gs = self.gsel(pre.gstat, g)
        ae.guard = z3.Or(gs == WAIT, gs == RUN)
        self._v1_end(st, g)

    def _v1_ignore(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        B = self.nblocks[GPU]
        ntok = self._at(pre.ntok, g)
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == WAIT,
            z3.Or(self.gsel(pre.plen, g) > self.prompt_limit(), self.ceil_blocks(ntok) > B - self.W),
        )
        self._v1_end(st, g)


# ---------------------------------------------------------------------- invariants of the v1 flow
def _admitted(st: State, s: int) -> Any:
    return st.sstat[s] == RUN


def cap003_chunked(enc: Encoder, st: State) -> Any:
    """CAP-003 with chunked prefill: a running sequence lags by at least one token (mid-prefill
    or just sampled), a waiting one has computed none."""
    return P0._all([
        z3.And(z3.Implies(_admitted(st, s), st.ncomp[s] <= st.ntok[s] - 1), z3.Implies(st.sstat[s] == WAIT, st.ncomp[s] == 0))
        for s in range(enc.S)
    ])


def chk002(enc: Encoder, st: State) -> Any:
    """CHK-002 (state part): computed tokens never exceed tokens."""
    return P0._all([z3.Implies(st.sstat[s] != NONE, z3.And(st.ncomp[s] >= 0, st.ncomp[s] <= st.ntok[s])) for s in range(enc.S)])


def chk006(enc: Encoder, st: State) -> Any:
    """CHK-006: with max_num_partial_prefills set, at most that many running requests are mid-prefill."""
    assert isinstance(enc, ChunkedEncoder)
    return z3.Implies(enc.P > 0, enc.partial(st) <= enc.P)


def wf_v1(enc: Encoder, st: State) -> Any:
    """The model's well-formedness (WF) for the v1 flow, plus: no swap state, and a live request
    has at most max_model_len tokens (a longer prompt is rejected on arrival, a sampled token
    that reaches the limit finishes the request) and at least its prompt's, and no block is shared (n = 1, prefix caching
    off: a reference count is 0 or 1)."""
    out = [P0.wf(enc, st), *[r <= 1 for r in st.gpu.ref]]
    for s in range(enc.S):
        out += [st.sstat[s] != SWAP, z3.Implies(enc.live(st, s), st.ntok[s] <= enc.ML),
                z3.Implies(st.sstat[s] != NONE, st.ntok[s] >= enc.gsel(st.plen, enc.grp[s]))]
    for j in range(enc.G):
        out += [st.gstat[j] != SWAP, z3.Not(st.in_s[j]), z3.Implies(st.gstat[j] != NONE, st.forked[j])]
    return P0._all(out)


def grp_ok_v1(enc: Encoder) -> Any:
    """One slot per request: slot s is request s."""
    return P0._all([enc.grp[s] == s for s in range(enc.S)])


V1_STATE_INVARIANTS = {
    **{k: v for k, v in P0.STATE_INVARIANTS.items() if k not in ("CAP-003", "WF")},
    "CAP-003": cap003_chunked, "CHK-002": chk002, "CHK-006": chk006, "WF": wf_v1,
}


def _acted(ae: ActionEncoding) -> list[Any]:
    return [ae.params["group"] == s for s in range(ae.enc.S)]


def _chunked(ae: ActionEncoding) -> bool:
    return ae.action in getattr(ae.enc, "chunk_actions", ("admit", "chunk"))


def chk001(ae: ActionEncoding) -> Any:
    """CHK-001: a scheduled request is given at least one token."""
    return ae.params["tokens"] >= 1 if _chunked(ae) else z3.BoolVal(True)


def chk002_step(ae: ActionEncoding) -> Any:
    """CHK-002 (step part): computed plus the tokens scheduled now never exceed the tokens."""
    if not _chunked(ae):
        return z3.BoolVal(True)
    return P0._all([z3.Implies(a, ae.pre.ncomp[s] + ae.params["tokens"] <= ae.pre.ntok[s]) for s, a in enumerate(_acted(ae))])


def chk003(ae: ActionEncoding) -> Any:
    """CHK-003: a recompute victim has no blocks and no computed tokens, and keeps every token."""
    if ae.action != "preempt_recompute":
        return z3.BoolVal(True)
    post, pre = ae.post, ae.pre
    return P0._all([
        z3.Implies(a, z3.And(post.tlen[s] == 0, post.ncomp[s] == 0, post.ntok[s] == pre.ntok[s]))
        for s, a in enumerate(_acted(ae))
    ])


def chk004(ae: ActionEncoding) -> Any:
    """CHK-004: computed tokens advance by exactly the scheduled tokens; nobody else's change."""
    if not _chunked(ae):
        return z3.BoolVal(True)
    k = ae.params["tokens"]
    return P0._all([
        z3.If(a, ae.post.ncomp[s] == ae.pre.ncomp[s] + k,
              z3.Implies(ae.pre.sstat[s] == RUN, ae.post.ncomp[s] == ae.pre.ncomp[s]))
        for s, a in enumerate(_acted(ae))
    ])


def chk005(ae: ActionEncoding) -> Any:
    """CHK-005: with the threshold set and more than one request running or waiting, no chunk exceeds it."""
    if not _chunked(ae):
        return z3.BoolVal(True)
    enc = ae.enc
    assert isinstance(enc, ChunkedEncoder)
    return z3.Implies(enc.threshold_applies(ae.pre), ae.params["tokens"] <= enc.TH)


def adm002_v1(ae: ActionEncoding) -> Any:
    """ADM-002: a request that enters running leaves the watermark free."""
    if ae.action != "admit":
        return z3.BoolVal(True)
    assert ae.mid is not None
    return ae.enc.free_count(ae.mid.gpu) >= ae.enc.W


V1_TRANSITION_PROPERTIES = {
    "CHK-001": chk001, "CHK-003": chk003, "CHK-004": chk004, "CHK-005": chk005,
    "ADM-002": adm002_v1, "COW-001": P0.cow001, "ALLOC": P0.alloc_ok,
}
# A row that is a state invariant and also has a step part: the goal is both.
V1_STEP_PARTS = {"CHK-002": chk002_step}

V1_SCOPE = {
    "CAP-002": "mid-step table coverage: the chunk transition allocates ceil((computed + k) / block_size) blocks (CAP-001 after it)",
    "BUD-001": "step property over one scheduler output: the budget is per action here (each chunk <= the budget)",
}
