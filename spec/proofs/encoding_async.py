"""The Z3 encoding of the pipelined V1 flow (``reference_impl/async_scheduler.py``): flow ``async``.

A step's outcome is processed ``pipeline_depth`` steps after the step was scheduled (vLLM's
``AsyncScheduler``; docs/ASYNC.md). The state is the v1 encoding's (`spec.proofs.chunked`: one
slot per request, GPU only) where ``ncomp`` is the *scheduler's* computed count (advanced when a
step is scheduled, vLLM's ``num_computed_tokens``), plus, per request, what the reference keeps
for the steps still in flight (`reference_impl.async_scheduler.InFlightCounters` and its share of
``in_flight``):

- ``ph``: placeholders, tokens in-flight steps sample for it (vLLM ``num_output_placeholders``);
- ``inf``: tokens in-flight steps compute for it (``num_in_flight_tokens``);
- ``stl``: of those, tokens of steps scheduled before its last preemption (``num_stale_output_tokens``);
- its in-flight *entries*, oldest first, at most ``pipeline_depth + 1`` (``qn``): per entry the
  tokens it computes (``qk``) and the position it samples (``qp``; -1 for a prefill chunk that
  samples nothing).

The depth is symbolic (``cfg_pipeline_depth``, 0..`MAX_PIPELINE_DEPTH`): one proof covers the
synchronous flow (0), vLLM's (1) and deeper queues (2).

Actions, each one request's transition, as in the v1 flow; a reference step is a sequence of them
(`tests/test_async_encoding_matches_reference.py` checks every step the reference takes is):

- ``add``, ``abort``, ``ignore``: V1's. An abort leaves the request's entries in flight; their
  outcomes are dropped when they return.
- ``admit`` / ``chunk`` (``schedule()`` for one request): V1's guards with the uncomputed tokens
  ``ntok + ph - ncomp``; a running request whose placeholders already reach ``max_tokens`` or
  ``max_model_len`` is not scheduled (scheduler.py:800-815); a request with stale tokens in flight
  is not readmitted (the reference's spec decision); a request has at most ``pipeline_depth``
  entries in flight when it is scheduled. Effect: the blocks covering ``ncomp + k``, ``ncomp +=
  k``, ``inf += k``, and when the chunk reaches ``ntok + ph`` it samples position ``ncomp`` (one
  more placeholder). Nothing is appended, nothing stops: that is the outcome's.
- ``preempt_recompute``: V1's (free, ``ncomp := 0``), and the in-flight share turns stale
  (``stl := inf``, ``ph := 0``).
- ``process`` (``update()`` for one request's oldest entry, with the environment's ``stop``): the
  entry leaves; for a finished request nothing else happens (its outcome is dropped,
  scheduler.py:2327-2334); otherwise ``inf -= k`` (and ``stl -= k`` when stale), a sampled token is
  appended (a placeholder resolved unless stale) and the stop and length rules apply.

Over-approximations, as in the v1 flow, plus: the oldest entry of *any* request may be processed
at any time (the reference processes whole steps, oldest first, once more than ``depth`` are in
flight), so the proofs hold for every processing order that keeps each request's own order.

For every size: the bound above is only where the bounded matrix looks. Each action changes one
request (and the block pool as v1's actions do), and a request's in-flight share is a bounded
record whatever the pool, the number of requests or the table length, so `GenericAsync` (the end of
this module) restates the actions for one generic request with the block size, table length and
config symbolic; with the block layer (`spec.proofs.parametric`) and the seat counts
(`spec.proofs.counting`) it proves every cell of the flow for every size (docs/PROOFS.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from typing import Any

import z3

from spec.config import MAX_PIPELINE_DEPTH
from spec.proofs import properties as P0
from spec.proofs.bound import Bound
from spec.proofs.chunked import (
    V1_STATE_INVARIANTS,
    ChunkedEncoder,
    adm002_v1,
    chk001,
    chk005,
    grp_ok_v1,
    wf_v1,
)
from spec.proofs.encoding import FIN, GPU, NODEV, NONE, RUN, WAIT, ActionEncoding, Encoder, Pool, State, _count
from spec.proofs.per_sequence import GenericV1, Seq

FLOW = "async"
ASYNC_BOUND = Bound(gpu_blocks=4, cpu_blocks=1, seqs=3, groups=3, table_len=3, block_size=2)  # the v1 flow's
ASYNC_ACTIONS = ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore", "process")
Q = MAX_PIPELINE_DEPTH + 1  # entries a request may have in flight: depth, plus the step being scheduled

# Mutated transitions, each the shape of an upstream bug (docs/ASYNC.md section 6) and of a
# conformance mutant of the async reference (conformance/selftest/mutants_async.py, named in the value).
ASYNC_MUTANTS = {
    "preempt-forgets-in-flight": "preemption resets the counters without marking the in-flight share stale "
                                 "(vllm#48245 / #47900; mutant forgets_in_flight_on_preempt)",
    "final-chunk-no-placeholder": "the final chunk of a chunked prompt samples without reserving a placeholder "
                                  "(vllm#35755 / #50692; mutant final_chunk_without_placeholder)",
    "applies-outcomes-of-finished": "an outcome of a request that finished meanwhile is applied "
                                    "(scheduler.py:2327-2334 removed; mutant applies_outcomes_of_finished)",
    "schedules-past-depth": "a request is scheduled with pipeline_depth entries already in flight, a queue one "
                            "step deeper than declared (vllm#49860's delayed stop; mutant one_step_later)",
}


@dataclass
class AsyncState(State):
    """`State` plus each request's in-flight share (slot s is request s)."""

    ph: list[Any] = field(default_factory=list)
    inf: list[Any] = field(default_factory=list)
    stl: list[Any] = field(default_factory=list)
    qn: list[Any] = field(default_factory=list)
    qk: list[list[Any]] = field(default_factory=list)
    qp: list[list[Any]] = field(default_factory=list)

    def copy(self) -> AsyncState:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.copy() if isinstance(v, Pool) else [list(x) if isinstance(x, list) else x for x in v]
        return AsyncState(**out)


class AsyncEncoder(ChunkedEncoder):
    """The pipelined V1 flow over the v1 encoding's state, with the in-flight share per request."""

    actions = ASYNC_ACTIONS  # action a is encoded by `_as_{a}`
    action_prefix = "_as_"

    def __init__(self, bound: Bound, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in ASYNC_MUTANTS:
            raise ValueError(f"unknown async mutant {mutant!r}")
        super().__init__(bound, None)
        self.mutant = mutant
        self.DP = z3.Int("cfg_pipeline_depth")
        self.engine_ok: list[Any] = []  # the reference's asserts in `_process` (PIP-005)

    # ------------------------------------------------------------------ config
    def config_ok(self) -> Any:
        return z3.And(super().config_ok(), self.DP >= 0, self.DP <= MAX_PIPELINE_DEPTH)

    def read_config(self, model: Any) -> dict[str, Any]:
        return {**super().read_config(model), "pipeline_depth": model.eval(self.DP, model_completion=True).as_long()}

    def pin_config(self, config: dict[str, Any]) -> list[Any]:
        return [*super().pin_config(config), self.DP == config["pipeline_depth"]]

    # ------------------------------------------------------------------ state
    def state(self, prefix: str) -> AsyncState:
        base = super().state(prefix)
        S = self.S
        ints = lambda name: [z3.Int(f"{prefix}_{name}_{s}") for s in range(S)]  # noqa: E731
        return AsyncState(
            **{f.name: getattr(base, f.name) for f in dataclasses.fields(State)},
            ph=ints("ph"), inf=ints("inf"), stl=ints("stl"), qn=ints("qn"),
            qk=[[z3.Int(f"{prefix}_qk_{s}_{j}") for j in range(Q)] for s in range(S)],
            qp=[[z3.Int(f"{prefix}_qp_{s}_{j}") for j in range(Q)] for s in range(S)],
        )

    def initial(self) -> AsyncState:
        st = super().initial()
        assert isinstance(st, AsyncState)
        zero = z3.IntVal(0)
        st.ph, st.inf, st.stl, st.qn = [zero] * self.S, [zero] * self.S, [zero] * self.S, [zero] * self.S
        st.qk = [[zero] * Q for _ in range(self.S)]
        st.qp = [[z3.IntVal(-1)] * Q for _ in range(self.S)]
        return st

    def encode(self, action: str, pre: State | None = None) -> ActionEncoding:
        self.engine_ok = []
        return super().encode(action, pre)

    # ------------------------------------------------------------------ views
    def sampling(self, st: AsyncState, s: int) -> Any:
        """In-flight entries of request s that sample a token."""
        return _count([z3.And(j < st.qn[s], st.qp[s][j] >= 0) for j in range(Q)])

    # ------------------------------------------------------------------ actions
    def _as_add(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_add(ae, pre, st, g)

    def _as_abort(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_abort(ae, pre, st, g)

    def _as_ignore(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_ignore(ae, pre, st, g)

    def _k(self, ae: ActionEncoding, pre: State, g: Any, uncomputed: Any) -> tuple[Any, Any]:
        """The chunk size ``k`` and its bounds (min(uncomputed, budget, threshold if it applies))."""
        k = z3.Int("act_tokens")
        ae.params["tokens"] = k
        ok = z3.And(k >= 1, k <= uncomputed, k <= self.T, z3.Implies(self.threshold_applies(pre), k <= self.TH))
        return k, ok

    def _depth_ok(self, pre: AsyncState, g: Any) -> Any:
        room = self.DP + 1 if self.mutant == "schedules-past-depth" else self.DP
        return self._at(pre.qn, g) <= room

    def _schedule(self, ae: ActionEncoding, pre: AsyncState, st: AsyncState, g: Any, k: Any) -> None:
        """``schedule()`` for request g: the blocks covering ncomp + k, counted as computed at once,
        a placeholder when the chunk samples, and the step joins the in-flight entries."""
        for s in range(self.S):
            c = g == s
            target = self.let(self.ceil_blocks(pre.ncomp[s] + k), "nd")
            pool = st.gpu
            for i in range(self.L):
                ci = z3.And(c, i >= pre.tlen[s], i < target)
                pool, blk = self.alloc_any(pool, ci)
                st.tab[s][i] = self.let(z3.If(ci, blk, st.tab[s][i]), "tb")
            st.gpu = pool
            self.set_s(st.tlen, s, target, z3.And(c, target > pre.tlen[s]))
            self.set_s(st.dev, s, GPU, z3.And(c, st.tlen[s] >= 1))
            self.set_s(st.sstat, s, RUN, c)
            for i in range(self.L):  # the blocks this step's tokens are written into (COW-001)
                ae.written.append((z3.And(c, i * self.bs < pre.ncomp[s] + k, (i + 1) * self.bs > pre.ncomp[s],
                                          i < st.tlen[s]), st.tab[s][i]))
        ae.mid = st.copy()
        for s in range(self.S):
            c = g == s
            computed = pre.ncomp[s] + k
            samples = z3.And(c, computed >= pre.ntok[s] + pre.ph[s])
            reserves = samples
            if self.mutant == "final-chunk-no-placeholder":  # a chunk after the first one samples unreserved
                reserves = z3.And(samples, pre.ncomp[s] == 0)
            self.set_s(st.ncomp, s, computed, c)
            self.set_s(st.inf, s, pre.inf[s] + k, c)
            self.set_s(st.ph, s, pre.ph[s] + 1, reserves)
            n = pre.qn[s]
            for j in range(Q):
                at = z3.And(c, n == j)
                self.set_s(st.qk[s], j, k, at)
                self.set_s(st.qp[s], j, z3.If(samples, computed, -1), at)
            self.set_s(st.qn, s, n + 1, c)

    def _as_admit(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, AsyncState) and isinstance(st, AsyncState)
        ntok, ncomp, tlen = self._at(pre.ntok, g), self._at(pre.ncomp, g), self._at(pre.tlen, g)
        rem = ntok + self._at(pre.ph, g) - ncomp
        k, k_ok = self._k(ae, pre, g, rem)
        B = self.nblocks[GPU]
        free = self.free_count(pre.gpu)
        whole = self.ceil_blocks(ntok) - tlen
        fresh = self.ceil_blocks(ncomp + k) - tlen
        partial_ok = z3.Or(self.P == 0, ncomp + k >= ntok - 1, self.partial(pre) < self.P)
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == WAIT, self._at(pre.stl, g) == 0, self._depth_ok(pre, g),
            self.gsel(pre.plen, g) <= self.prompt_limit(), self.ceil_blocks(ntok) <= B - self.W,  # not ignored
            self.running(pre) < self.M,
            k_ok, z3.Or(self.CH, k == rem), partial_ok,
            whole + self.W <= free,
            z3.If(fresh > 0, fresh, 0) + self.W <= free,
            self.ceil_blocks(ncomp + k) <= self.L,
        )
        self._schedule(ae, pre, st, g, k)
        self.set_g(st.gstat, g, RUN)
        self.set_g(st.in_w, g, False)
        self.set_g(st.in_r, g, True)

    def _as_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, AsyncState) and isinstance(st, AsyncState)
        ntok, ncomp, tlen, ph = self._at(pre.ntok, g), self._at(pre.ncomp, g), self._at(pre.tlen, g), self._at(pre.ph, g)
        k, k_ok = self._k(ae, pre, g, ntok + ph - ncomp)
        generated = ntok - self.gsel(pre.plen, g)
        reaches_limit = z3.And(ph >= 1, z3.Or(generated + ph >= self.gsel(pre.mtok, g), ntok + ph >= self.ML))
        fresh = self.ceil_blocks(ncomp + k) - tlen
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == RUN, z3.Not(reaches_limit), self._depth_ok(pre, g), k_ok,
            z3.If(fresh > 0, fresh, 0) <= self.free_count(pre.gpu),
            self.ceil_blocks(ncomp + k) <= self.L,
        )
        self._schedule(ae, pre, st, g, k)

    def _as_preempt_recompute(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, AsyncState) and isinstance(st, AsyncState)
        self._v1_preempt_recompute(ae, pre, st, g)
        for s in range(self.S):
            c = g == s
            if self.mutant == "preempt-forgets-in-flight":  # the counters reset, the in-flight share forgotten
                self.set_s(st.inf, s, 0, c)
            else:
                self.set_s(st.stl, s, pre.inf[s], c)
            self.set_s(st.ph, s, 0, c)

    def _as_process(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(pre, AsyncState) and isinstance(st, AsyncState)
        stop = z3.Int("act_stop")
        ae.params["stop"] = stop
        ae.guard = z3.And(self._at(pre.qn, g) >= 1, stop >= 0, stop <= 1)
        for s in range(self.S):
            c = g == s
            k0, p0 = pre.qk[s][0], pre.qp[s][0]
            for j in range(Q):  # the oldest entry leaves
                self.set_s(st.qk[s], j, pre.qk[s][j + 1] if j + 1 < Q else 0, c)
                self.set_s(st.qp[s], j, pre.qp[s][j + 1] if j + 1 < Q else -1, c)
            self.set_s(st.qn, s, pre.qn[s] - 1, c)
            applies = z3.And(c, pre.sstat[s] != FIN) if self.mutant != "applies-outcomes-of-finished" else c
            stale = pre.stl[s] > 0
            sampled = z3.And(applies, p0 >= 0)
            # the reference's asserts (`AsyncV1Scheduler._process`): what kills vLLM's engine
            self.engine_ok += [z3.Implies(z3.And(applies, stale), pre.stl[s] - k0 >= 0),
                               z3.Implies(sampled, p0 == pre.ntok[s]),
                               z3.Implies(z3.And(sampled, z3.Not(stale)), pre.ph[s] - 1 >= 0)]
            self.set_s(st.inf, s, pre.inf[s] - k0, applies)
            self.set_s(st.stl, s, pre.stl[s] - k0, z3.And(applies, stale))
            self.set_s(st.ntok, s, pre.ntok[s] + 1, sampled)
            self.set_s(st.ph, s, pre.ph[s] - 1, z3.And(sampled, z3.Not(stale)))
            generated = st.ntok[s] - self.gsel(pre.plen, g)
            ends = z3.And(sampled, pre.sstat[s] != FIN,
                          z3.Or(stop == 1, generated >= self.gsel(pre.mtok, g), st.ntok[s] >= self.ML))
            self.set_s(st.sstat, s, FIN, ends)
            self.free_seq(st, s, ends)
            self.set_g(st.gstat, g, FIN, ends)
            self.set_g(st.in_r, g, False, ends)
            self.set_g(st.in_w, g, False, ends)

    def read_state(self, model: Any, st: State) -> dict[str, Any]:
        return read_async_state(model, self, st)


# ---------------------------------------------------------------------- invariants of the async flow
def _live(enc: Encoder, st: State, s: int) -> Any:
    return enc.live(st, s)


def wf_async(enc: Encoder, st: State) -> Any:
    """The model's well-formedness for the async flow: the v1 flow's, the entries' shape, and how
    the counters and the scheduled computed count follow from the entries (the strengthening the
    induction needs beside PIP-003: a request with stale tokens is waiting with nothing computed,
    sampled positions run on from the tokens)."""
    assert isinstance(enc, AsyncEncoder) and isinstance(st, AsyncState)
    out = [wf_v1(enc, st)]
    for s in range(enc.S):
        live = _live(enc, st, s)
        out += [st.qn[s] >= 0, st.qn[s] <= Q]
        for j in range(Q):
            inside = j < st.qn[s]
            out += [z3.Implies(inside, z3.And(st.qk[s][j] >= 1, st.qp[s][j] >= -1)),
                    z3.Implies(z3.Not(inside), z3.And(st.qk[s][j] == 0, st.qp[s][j] == -1))]
            before = _count([z3.And(i < st.qn[s], st.qp[s][i] >= 0) for i in range(j)])
            out.append(z3.Implies(z3.And(live, inside, st.qp[s][j] >= 0), st.qp[s][j] == st.ntok[s] + before))
        out += [
            z3.Implies(st.sstat[s] == NONE, z3.And(st.qn[s] == 0, st.ph[s] == 0, st.inf[s] == 0, st.stl[s] == 0)),
            z3.Implies(z3.And(live, st.stl[s] > 0), z3.And(st.sstat[s] == WAIT, st.ncomp[s] == 0)),
            # the scheduled frontier: a request with a token in flight has computed up to it
            z3.Implies(z3.And(st.sstat[s] == RUN, st.ph[s] >= 1), st.ncomp[s] == st.ntok[s] + st.ph[s] - 1),
            z3.Implies(z3.And(st.sstat[s] == RUN, st.ph[s] == 0), st.ncomp[s] <= st.ntok[s] - 1),
            z3.Implies(st.sstat[s] == WAIT, st.ncomp[s] == 0),
            # the table covers exactly the scheduled tokens (CAP-001 read at the scheduler's count)
            z3.Implies(st.sstat[s] == RUN, st.tlen[s] == enc.ceil_blocks(st.ncomp[s])),
        ]
    return P0._all(out)


def pip007(enc: Encoder, st: State) -> Any:
    """PIP-007's state (the strengthening behind its step part): a live request is counted
    computing at most its placeholders past its last token (``ncomp <= ntok - 1 + ph``), its
    placeholders are at most its entries in flight, and those at most ``pipeline_depth + 1`` (the
    +1 is the step being scheduled; ``update()`` processes down to ``pipeline_depth``)."""
    assert isinstance(enc, AsyncEncoder) and isinstance(st, AsyncState)
    out = []
    for s in range(enc.S):
        out += [z3.Implies(_live(enc, st, s), z3.And(st.ncomp[s] <= st.ntok[s] - 1 + st.ph[s], st.ph[s] <= st.qn[s])),
                z3.Implies(st.sstat[s] != NONE, st.qn[s] <= enc.DP + 1)]
    return P0._all(out)


def pip007_step(ae: ActionEncoding) -> Any:
    """PIP-007: the outcome that finishes a request (stopped or length-capped) leaves at most
    ``pipeline_depth`` positions computed past its last token."""
    if ae.action != "process":
        return z3.BoolVal(True)
    enc = ae.enc
    assert isinstance(enc, AsyncEncoder)
    pre, post = ae.pre, ae.post
    return P0._all([z3.Implies(z3.And(ae.params["group"] == s, pre.sstat[s] != FIN, post.sstat[s] == FIN),
                               post.ncomp[s] <= post.ntok[s] - 1 + enc.DP) for s in range(enc.S)])


def pip002(ae: ActionEncoding) -> Any:
    """PIP-002: no token is delivered to a request after its finish: no action (an outcome of a
    finished request included) changes a finished request's tokens."""
    pre, post = ae.pre, ae.post
    return P0._all([z3.Implies(pre.sstat[s] == FIN, post.ntok[s] == pre.ntok[s]) for s in range(ae.enc.S)])


def pip003(enc: Encoder, st: State) -> Any:
    """PIP-003: an unfinished request's in-flight counters (placeholders, in-flight tokens, stale
    tokens) are never negative and agree with what is in flight: all are zero when none of its
    steps is in flight, the in-flight tokens are its in-flight steps' tokens; one that is not running holds no placeholder and counts every in-flight
    token stale; a running one without stale tokens holds a placeholder for every position its
    in-flight steps sample. (A finished request's counters are the engine's to drop: vLLM
    deletes the request.)"""
    assert isinstance(enc, AsyncEncoder) and isinstance(st, AsyncState)
    out = []
    for s in range(enc.S):
        counters = (st.ph[s], st.inf[s], st.stl[s])
        out.append(z3.Implies(_live(enc, st, s), z3.And(
            *[c >= 0 for c in counters], z3.Implies(st.qn[s] == 0, z3.And(*[c == 0 for c in counters])),
            st.inf[s] == z3.Sum([st.qk[s][j] for j in range(Q)]),
            z3.Implies(st.sstat[s] == WAIT, z3.And(st.ph[s] == 0, st.stl[s] == st.inf[s])),
            z3.Implies(z3.And(st.sstat[s] == RUN, st.stl[s] == 0), st.ph[s] == enc.sampling(st, s)))))
    return P0._all(out)


def pip005(ae: ActionEncoding) -> Any:
    """PIP-005: processing an outcome never fails the engine's checks: a stale share never goes
    below zero, a placeholder is there to resolve, and the sampled position is the next token."""
    enc = ae.enc
    assert isinstance(enc, AsyncEncoder)
    return P0._all(list(enc.engine_ok))


ASYNC_STATE_INVARIANTS = {
    **{k: v for k, v in V1_STATE_INVARIANTS.items()
       if k not in ("CAP-001", "CAP-003", "LEN-001", "CHK-002", "WF")},
    "PIP-003": pip003, "PIP-007": pip007, "WF": wf_async,
}
ASYNC_TRANSITION_PROPERTIES = {
    "CHK-001": chk001, "CHK-005": chk005, "PIP-002": pip002, "PIP-005": pip005,
    "ADM-002": adm002_v1, "COW-001": P0.cow001, "ALLOC": P0.alloc_ok,
}
ASYNC_STEP_PARTS = {"PIP-007": pip007_step}
_SYNC = "assumes a step's outcome lands in the same step (Invariant.synchronous): not applicable at pipeline_depth > 0"
ASYNC_SCOPE = {
    "CAP-001": f"{_SYNC}; its reading at the scheduler's computed count is part of the async WF",
    "CAP-003": f"{_SYNC}; the async WF states the scheduled frontier (computed = tokens + placeholders - 1)",
    "LEN-001": _SYNC,
    "CHK-002": "computed tokens run ahead of the delivered tokens by the placeholders (PIP-007 bounds by how much)",
    "CHK-003": "a recompute victim: proved in the v1 flow; here its in-flight share turns stale (PIP-003, PIP-005)",
    "CHK-004": _SYNC,
    "PIP-001": "the delivered token values (the encoding counts tokens; its shadow here: sampled positions run on "
               "from the tokens, WF, and each processed sample is the next position, PIP-005)",
    "PIP-006": "latency in steps from the last scheduling step to the finish: the one-request actions carry no step "
               "numbers (PIP-007 bounds the tokens computed past the finish instead)",
    "PIP-004": "blocks an in-flight step writes: the reference frees at once and declares ordered steps (vLLM "
               "without defer_block_free; PIP-004 is then moot), and one-request actions carry no step order; "
               "the fencing variant (DeferredFreeAsyncV1Scheduler) is not encoded",
}
grp_ok_async = grp_ok_v1


# ---------------------------------------------------------------------- concrete states
def read_async_state(model: Any, enc: Encoder, st: State) -> dict[str, Any]:
    """`spec.proofs.encoding.read_state` plus each request's in-flight share."""
    from spec.proofs.encoding import read_state

    assert isinstance(st, AsyncState)
    out = read_state(model, enc, st)

    def iv(e: Any) -> int:
        return model.eval(e, model_completion=True).as_long()

    for s, seq in enumerate(out["seqs"]):
        n = max(0, min(iv(st.qn[s]), Q))
        seq["in_flight"] = {"placeholders": iv(st.ph[s]), "tokens": iv(st.inf[s]), "stale": iv(st.stl[s]),
                            "entries": [[iv(st.qk[s][j]), iv(st.qp[s][j])] for j in range(n)]}
    return out


def pin_async_state(enc: Encoder, st: State, concrete: dict[str, Any]) -> list[Any]:
    """Constraints that fix ``st`` to a concrete state (as `read_async_state` writes it)."""
    from spec.proofs.encoding import pin_state

    assert isinstance(st, AsyncState)
    out = pin_state(enc, st, concrete)
    for s, seq in enumerate(concrete["seqs"]):
        fl = seq["in_flight"]
        entries = fl["entries"]
        out += [st.ph[s] == fl["placeholders"], st.inf[s] == fl["tokens"], st.stl[s] == fl["stale"],
                st.qn[s] == len(entries)]
        for j in range(Q):
            k, p = entries[j] if j < len(entries) else (0, -1)
            out += [st.qk[s][j] == k, st.qp[s][j] == p]
    return out



# ---------------------------------------------------------------------- the generic request (every size)
# The async flow's cells beyond the block layer are facts about the one request an action touches:
# its status, table length, tokens, the scheduler's computed count and its in-flight share (the
# counters and its entries, at most Q of them: the depth is at most MAX_PIPELINE_DEPTH, so the share
# is a bounded record whatever the pool, the number of requests or the table length). So, as for
# the v1 and specdec flows (`spec.proofs.per_sequence`), each such cell is proved for one generic
# request with the block size, the table length and the config symbolic: every size at once. The
# sums over requests (CHK-006's mid-prefill count, the threshold's active count) are the request's
# term plus an arbitrary rest; the seat counts are `spec.proofs.counting`'s. The rules below are
# `AsyncEncoder`'s, request by request (`tests/test_per_sequence_matches_reference.py::
# test_each_async_request_follows_the_generic_rule` checks them on the pipelined reference of any
# size, depths 0..2).
ROWS_ASYNC_SEQ = ("RES-001", "RES-002", "RES-003", "RES-004", "CHK-006", "PIP-003", "PIP-007")
STEPS_ASYNC_SEQ = ("CHK-001", "CHK-005", "ALLOC", "ADM-002", "PIP-002", "PIP-005")
ACTIONS_ASYNC_SEQ = ASYNC_ACTIONS
# `GenericAsync.async_facts` that the induction needs, each with a cell that fails without it
STRENGTHENING_FACTS = {
    "entries": ("PIP-003", "chunk"),  # an entry slot past the last would be counted in flight
    "positions": ("PIP-005", "process"),  # the outcome's sampled position is the next token's
    "unborn-idle": ("PIP-003", "add"),  # an arrival starts with nothing in flight
    "stale-waits": ("PIP-003", "process"),  # a stale outcome touches no placeholder
    "frontier": ("CHK-006", "process"),  # the last placeholder resolved leaves no prefill behind
}
# The proof mutants, each a rule of the one request it touches, with the actions it mutates.
ASYNC_MUTANT_ACTIONS = {
    "preempt-forgets-in-flight": ("preempt_recompute",),
    "final-chunk-no-placeholder": ("admit", "chunk"),
    "applies-outcomes-of-finished": ("process",),
    "schedules-past-depth": ("admit", "chunk"),
}


@dataclass
class AsyncSeq(Seq):
    """`per_sequence.Seq` plus the request's in-flight share: placeholders, in-flight and stale
    tokens, and its entries (``qn`` of them; per entry the tokens ``qk`` and sampled position ``qp``)."""

    ph: Any = 0
    inf: Any = 0
    stl: Any = 0
    qn: Any = 0
    qk: tuple[Any, ...] = ()
    qp: tuple[Any, ...] = ()


class GenericAsync(GenericV1):
    """The async flow's generic request: `GenericV1` with the in-flight share and the symbolic
    depth; the chunk size, the stop, chunked prefill, the threshold and the partial limit are
    symbolic as in v1."""

    def __init__(self, mutant: str | None = None, without: tuple[str, ...] = ()) -> None:
        """``without``: `async_facts` left out of WF (to show which the induction needs)."""
        if mutant is not None and mutant not in ASYNC_MUTANTS:
            raise ValueError(f"unknown async mutant {mutant!r}")
        super().__init__(None)
        self.mutant = mutant
        self.without = without
        self.DP = z3.Int("g_pipeline_depth")

    def seq(self, p: str) -> AsyncSeq:
        return AsyncSeq(*z3.Ints(f"{p}_st {p}_dv {p}_tl {p}_nt {p}_nc {p}_ph {p}_inf {p}_stl {p}_qn"),
                        tuple(z3.Int(f"{p}_qk_{j}") for j in range(Q)), tuple(z3.Int(f"{p}_qp_{j}") for j in range(Q)))

    def unborn(self) -> AsyncSeq:
        q = super().unborn()
        zero = z3.IntVal(0)
        return AsyncSeq(q.st, q.dv, q.tl, q.nt, q.nc, zero, zero, zero, zero, (zero,) * Q, (z3.IntVal(-1),) * Q)

    def base(self) -> Any:
        return z3.And(super().base(), self.DP >= 0, self.DP <= MAX_PIPELINE_DEPTH)

    # ---------------------------------------------------------------- facts
    def sampling(self, q: AsyncSeq) -> Any:
        return _count([z3.And(j < q.qn, q.qp[j] >= 0) for j in range(Q)])

    def rows(self, q: Seq) -> dict[str, Any]:
        assert isinstance(q, AsyncSeq)
        v1 = super().rows(q)
        live = self.live(q)
        counters = (q.ph, q.inf, q.stl)
        return {
            **{row: v1[row] for row in ("RES-001", "RES-002", "RES-003", "RES-004", "CHK-006")},
            "PIP-003": z3.Implies(live, z3.And(
                *[c >= 0 for c in counters], z3.Implies(q.qn == 0, z3.And(*[c == 0 for c in counters])),
                q.inf == z3.Sum(list(q.qk)),
                z3.Implies(q.st == WAIT, z3.And(q.ph == 0, q.stl == q.inf)),
                z3.Implies(z3.And(q.st == RUN, q.stl == 0), q.ph == self.sampling(q)))),
            "PIP-007": z3.And(z3.Implies(live, z3.And(q.nc <= q.nt - 1 + q.ph, q.ph <= q.qn)),
                              z3.Implies(q.st != NONE, q.qn <= self.DP + 1)),
        }

    def wf(self, q: Seq, gs: Any = None, forked: Any = None) -> Any:
        """v1's per-request WF and `wf_async`'s facts about the request's entries and counters."""
        assert isinstance(q, AsyncSeq)
        status = self.gs if gs is None else gs
        facts = self.async_facts(q)
        return z3.And(super().wf(q, gs, forked), status >= NONE, status <= FIN,
                      *[f for name, f in facts.items() if name not in self.without])

    def async_facts(self, q: AsyncSeq) -> dict[str, Any]:
        """`wf_async`'s facts beside v1's, by name. The first five are the strengthening the
        induction needs beside PIP-003 and PIP-007's state part (without any one of them a cell
        other than WF fails: `STRENGTHENING_FACTS`, tests/test_async_proofs.py); the last three are
        CAP-003's and CAP-001's readings at the scheduler's computed count, proved, needed by none."""
        live = self.live(q)
        shape, positions = [q.qn >= 0, q.qn <= Q], []
        for j in range(Q):
            inside = j < q.qn
            before = _count([z3.And(i < q.qn, q.qp[i] >= 0) for i in range(j)])
            shape += [z3.Implies(inside, z3.And(q.qk[j] >= 1, q.qp[j] >= -1)),
                      z3.Implies(z3.Not(inside), z3.And(q.qk[j] == 0, q.qp[j] == -1))]
            positions.append(z3.Implies(z3.And(live, inside, q.qp[j] >= 0), q.qp[j] == q.nt + before))
        return {
            # entries in flight: each computes >= 1 token; the slots past the last are empty
            "entries": z3.And(shape),
            # the sampled positions run on from the tokens: the next outcome's is the next token
            "positions": z3.And(positions),
            # a request that has not arrived has nothing in flight
            "unborn-idle": z3.Implies(q.st == NONE, z3.And(q.qn == 0, q.ph == 0, q.inf == 0, q.stl == 0)),
            # stale tokens only in a waiting request (preempted), which has computed nothing since
            "stale-waits": z3.Implies(z3.And(live, q.stl > 0), z3.And(q.st == WAIT, q.nc == 0)),
            # the scheduled frontier: a running request with a token in flight has computed up to it
            "frontier": z3.Implies(z3.And(q.st == RUN, q.ph >= 1), q.nc == q.nt + q.ph - 1),
            "lag": z3.Implies(z3.And(q.st == RUN, q.ph == 0), q.nc <= q.nt - 1),
            "waiting-computes-nothing": z3.Implies(q.st == WAIT, q.nc == 0),
            # the table covers exactly the scheduled tokens (CAP-001 read at the scheduler's count)
            "table-covers-scheduled": z3.Implies(q.st == RUN, q.tl == self.ceil(q.nc)),
        }

    # ---------------------------------------------------------------- the request's rules
    def _depth_ok(self, q: AsyncSeq) -> Any:
        return q.qn <= (self.DP + 1 if self.mutant == "schedules-past-depth" else self.DP)

    def _k_ok(self, q: AsyncSeq) -> Any:
        return z3.And(self.k >= 1, self.k <= q.nt + q.ph - q.nc, z3.Implies(self.threshold_applies(q), self.k <= self.TH))

    def _schedule(self, q: AsyncSeq) -> AsyncSeq:
        """`AsyncEncoder._schedule`: the blocks covering nc + k, counted computed at once, a
        placeholder when the chunk samples, and the step joins the request's entries."""
        k = self.k
        target = self.ceil(q.nc + k)
        tl = z3.If(target > q.tl, target, q.tl)
        nc = q.nc + k
        samples = nc >= q.nt + q.ph
        reserves = z3.And(samples, q.nc == 0) if self.mutant == "final-chunk-no-placeholder" else samples
        qk = tuple(z3.If(q.qn == j, k, q.qk[j]) for j in range(Q))
        qp = tuple(z3.If(q.qn == j, z3.If(samples, nc, -1), q.qp[j]) for j in range(Q))
        return replace(q, st=z3.IntVal(RUN), dv=z3.If(tl >= 1, GPU, q.dv), tl=tl, nc=nc, inf=q.inf + k,
                       ph=z3.If(reserves, q.ph + 1, q.ph), qn=q.qn + 1, qk=qk, qp=qp)

    def _ended(self, q: AsyncSeq, cond: Any) -> AsyncSeq:
        """Finished and its table freed when ``cond`` (the in-flight share stays: its outcomes
        are dropped when they return)."""
        return replace(q, st=z3.If(cond, FIN, q.st), dv=z3.If(cond, NODEV, q.dv), tl=z3.If(cond, 0, q.tl))

    def engine_checks(self, q: AsyncSeq) -> Any:
        """PIP-005 for processing q's oldest entry: the reference's asserts in `_process`."""
        applies = self._applies(q)
        stale, sampled = q.stl > 0, z3.And(applies, q.qp[0] >= 0)
        return z3.And(z3.Implies(z3.And(applies, stale), q.stl - q.qk[0] >= 0),
                      z3.Implies(sampled, q.qp[0] == q.nt),
                      z3.Implies(z3.And(sampled, z3.Not(stale)), q.ph - 1 >= 0))

    def _applies(self, q: AsyncSeq) -> Any:
        return z3.BoolVal(True) if self.mutant == "applies-outcomes-of-finished" else q.st != FIN

    def _process(self, q: AsyncSeq) -> AsyncSeq:
        """`AsyncEncoder._as_process` for the request: its oldest entry leaves; unless it has
        finished, the share shrinks, a sampled token is appended and the stops apply."""
        k0, p0 = q.qk[0], q.qp[0]
        applies = self._applies(q)
        stale = q.stl > 0
        sampled = z3.And(applies, p0 >= 0)
        nt = z3.If(sampled, q.nt + 1, q.nt)
        ends = z3.And(sampled, q.st != FIN, z3.Or(self.stop == 1, nt - self.plen >= self.mtok, nt >= self.ML))
        out = replace(q, qn=q.qn - 1, qk=(*q.qk[1:], z3.IntVal(0)), qp=(*q.qp[1:], z3.IntVal(-1)),
                      inf=z3.If(applies, q.inf - k0, q.inf), stl=z3.If(z3.And(applies, stale), q.stl - k0, q.stl),
                      nt=nt, ph=z3.If(z3.And(sampled, z3.Not(stale)), q.ph - 1, q.ph))
        return self._ended(out, ends)

    def effect(self, action: str, q: Seq, parent: Seq) -> tuple[Any, Seq]:
        assert isinstance(q, AsyncSeq)
        gs, k, F, W = self.gs, self.k, self.F, self.W
        if action == "add":  # V1's input processor rejects a prompt over max_model_len at once
            return gs == NONE, replace(q, st=z3.If(self.plen > self.ML, FIN, WAIT), nt=self.plen, nc=z3.IntVal(0))
        if action == "admit":
            rem = q.nt + q.ph - q.nc
            partial_ok = z3.Or(self.P == 0, q.nc + k >= q.nt - 1, self.rest_partial + self.partial(q) < self.P)
            guard = z3.And(gs == WAIT, q.stl == 0, self._depth_ok(q), self._k_ok(q), z3.Or(self.CH, k == rem),
                           partial_ok, self.ceil(q.nt) - q.tl + W <= F, self.taken(q) + W <= F)
            return guard, self._schedule(q)
        if action == "chunk":
            generated = q.nt - self.plen
            reaches_limit = z3.And(q.ph >= 1, z3.Or(generated + q.ph >= self.mtok, q.nt + q.ph >= self.ML))
            guard = z3.And(gs == RUN, z3.Not(reaches_limit), self._depth_ok(q), self._k_ok(q), self.taken(q) <= F)
            return guard, self._schedule(q)
        if action == "preempt_recompute":  # freed, nothing computed, the in-flight share turns stale
            post = replace(q, st=z3.IntVal(WAIT), dv=z3.IntVal(NODEV), tl=z3.IntVal(0), nc=z3.IntVal(0),
                           ph=z3.IntVal(0))
            if self.mutant == "preempt-forgets-in-flight":
                return gs == RUN, replace(post, inf=z3.IntVal(0))
            return gs == RUN, replace(post, stl=q.inf)
        if action in ("abort", "ignore"):
            ok = z3.Or(gs == WAIT, gs == RUN) if action == "abort" else gs == WAIT
            return ok, self._ended(q, z3.BoolVal(True))
        if action == "process":
            return z3.And(q.qn >= 1, self.stop >= 0, self.stop <= 1), self._process(q)
        raise ValueError(action)

    def target(self, action: str) -> Any:
        """The request's status after the action while its sequence is live: an outcome leaves
        it where it was (or ends it)."""
        return self.gs if action == "process" else super().target(action)

    def request_after(self, action: str, post: Seq) -> tuple[Any, Any, Any]:
        if action == "process":
            return z3.BoolVal(True), z3.If(post.st == FIN, FIN, self.gs), z3.BoolVal(True)
        return super().request_after(action, post)

    def transition_goals(self, action: str, q: Seq, post: Seq) -> dict[str, Any]:
        """The async transition properties on (pre, post) of the touched request."""
        assert isinstance(q, AsyncSeq)
        scheduled = action in ("admit", "chunk")
        true = z3.BoolVal(True)
        return {
            "CHK-001": self.k >= 1 if scheduled else true,
            "CHK-005": z3.Implies(self.threshold_applies(q), self.k <= self.TH) if scheduled else true,
            "ALLOC": self.taken(q) <= self.F if scheduled else true,
            "ADM-002": self.F - self.taken(q) >= self.W if action == "admit" else true,
            "PIP-002": z3.Implies(q.st == FIN, post.nt == q.nt),
            "PIP-005": self.engine_checks(q) if action == "process" else true,
            "PIP-007/step": z3.Implies(z3.And(q.st != FIN, post.st == FIN), post.nc <= post.nt - 1 + self.DP)
            if action == "process" else true,
        }
