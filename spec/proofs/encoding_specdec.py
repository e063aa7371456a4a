"""The Z3 encoding of the speculative-decoding flow (``reference_impl/specdec_scheduler.py``): flow ``specdec``.

vLLM V1's flow with ``num_speculative_tokens`` = k > 0 (spec/speculative.py): a running request
is scheduled for its next token plus d <= k *drafts*; the outcome accepts j <= d of them plus one
bonus token, or returns nothing (the empty outcome of vllm-project/vllm#42722); the rejected
drafts roll back. The state is the v1 encoding's (`spec.proofs.chunked`: one slot per request,
GPU only), plus, per request, what the reference keeps for drafts and keys
(`reference_impl.v1_scheduler.TrackedRequest`):

- ``npr``: drafts the drafter proposed for its next decode (``num_proposed``);
- ``nkey``: blocks of its table keyed for prefix caching (``num_keyed``), which SPD-007 reads
  (the cache's *hits* are not modelled, as in the v1 flow: admission computes from 0);
- ``void``: a proof-only ghost, absent from the reference: its last outcome committed no token
  (SPD-007 allows one more keyed position then: `SPD007_STRENGTHENING`; the checker's
  counterpart is `spec.invariants._views.void_outcomes`).

The config adds ``num_speculative_tokens`` (symbolic, 0..`MAX_SPECULATIVE_TOKENS`: one proof
covers k = 0, today's V1, and every k) and ``enable_prefix_caching``.

Actions, each one request's transition between two steps (``schedule()`` and ``update()``
together, as in the v1 flow; `tests/test_specdec_encoding_matches_reference.py` checks every
reference step is a sequence of them):

- ``add``, ``abort``, ``ignore``: V1's (an abort with drafts outstanding frees like any other).
- ``admit``: V1's admission (a waiting request holds no proposal, so no drafts), with the
  speculative outcome below.
- ``chunk``: a running request's chunk *without* drafts (a prefill chunk, or a decode with no
  proposal or no room for one), with the speculative outcome.
- ``verify``: a running decode scheduled with d >= 1 drafts: ``tokens`` = its next token plus
  the drafts, at most its proposal, k, and the room the bonus token leaves within
  ``max_model_len`` and ``max_tokens`` (`V1Scheduler._draft_room`), within the budget (the
  drafts count), the threshold and the free blocks (their KV slots are allocated like any token).
- ``preempt_recompute``: V1's, and the proposal is dropped (vLLM ``_preempt_request``).

The speculative outcome (``update()``, `reference_impl.v1_scheduler.commit_tokens`), for a chunk
that reaches the request's last token: the environment picks ``accepted`` (j <= d), ``empty``,
``stop`` with ``stop_at`` and the drafter's next ``proposed`` (<= k). The step commits
``j + 1`` tokens (0 when empty); computed tokens roll back to every committed token but the last
(to the last known token but one when empty); a stop at committed token i, or a length limit
there, ends the stream after it, computed rolled back to it; a request that committed and goes
on holds the new proposal. A chunk short of the prompt's end samples nothing. With prefix
caching on, blocks are keyed up to the step's non-draft tokens when allocated, and (k > 0) up to
the computed tokens once the outcome committed (vLLM scheduler.py:2402-2415).

Over-approximations, as in the v1 flow (any queue order, the budget per action, any free block),
so what is proved holds for more than the reference does.

For every size (every pool, request count, table length and k): `GenericSpecDec` at the end is
spec/proofs/per_sequence.py's one-generic-request argument for this flow, sharing `outcome` with
the bounded encoding; the block layer and the counts are v1's arguments (a verifying step appends
like a chunk). docs/PROOFS.md, "Speculative decoding", says which argument covers which cell.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import z3

from spec.config import MAX_SPECULATIVE_TOKENS
from spec.proofs import properties as P0
from spec.proofs.bound import Bound
from spec.proofs.chunked import (
    V1_STATE_INVARIANTS,
    V1_TRANSITION_PROPERTIES,
    ChunkedEncoder,
    chk002,
    grp_ok_v1,
    wf_v1,
)
from spec.proofs.encoding import FIN, GPU, RUN, ActionEncoding, Encoder, Pool, State
from spec.proofs.per_sequence import GenericV1, Seq

FLOW = "specdec"
SPECDEC_BOUND = Bound(gpu_blocks=4, cpu_blocks=1, seqs=3, groups=3, table_len=3, block_size=2)  # the v1 flow's
SPECDEC_ACTIONS = ("add", "admit", "chunk", "verify", "preempt_recompute", "abort", "ignore")

# Mutated transitions, each the shape of an upstream bug and of a conformance mutant of the
# speculative reference (conformance/selftest/mutants_specdec.py, named in the value).
SPECDEC_MUTANTS = {
    "empty-outcome-skips-rollback": "an outcome with no token rolls nothing back: the drafts and the step's token stay "
                                    "computed (vllm#42722; mutant specdec-empty-outcome-keeps-drafts)",
    "drafts-outside-budget": "the budget caps the tokens before the drafts, the drafts come on top "
                             "(TensorRT-LLM#16101; mutant specdec-drafts-outside-budget)",
    "drafts-on-prefill-chunk": "the drafter's proposal after a prefill chunk that samples nothing is kept, so the "
                               "prompt's next chunk carries drafts (vllm#30618; mutant specdec-drafts-on-prefill-chunk)",
    "drafts-after-cut-chunk": "the proposal kept after a prefill chunk rides the next chunk even when the budget or "
                              "the threshold cuts it short of the prompt's end (vllm#30618 where it corrupts; mutant "
                              "specdec-drafts-after-cut-chunk)",
    "keys-rejected-kv": "after an outcome, blocks are keyed up to every committed token, the bonus token's slot "
                        "(rejected-draft KV) included (vllm#18668's family; mutant specdec-caches-rejected-kv)",
}


@dataclass
class SpecState(State):
    """`State` plus each request's proposal and keyed blocks (slot s is request s)."""

    npr: list[Any] = field(default_factory=list)
    nkey: list[Any] = field(default_factory=list)
    void: list[Any] = field(default_factory=list)  # proof-only ghost: the last outcome committed nothing

    def copy(self) -> SpecState:
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.copy() if isinstance(v, Pool) else [list(x) if isinstance(x, list) else x for x in v]
        return SpecState(**out)


def _max(a: Any, b: Any) -> Any:
    return z3.If(a >= b, a, b)


def _min(a: Any, b: Any) -> Any:
    return z3.If(a <= b, a, b)


class SpecDecEncoder(ChunkedEncoder):
    """The speculative V1 flow over the v1 encoding's state, with each request's proposal and keys."""

    actions = SPECDEC_ACTIONS  # action a is encoded by `_sd_{a}`
    action_prefix = "_sd_"
    chunk_actions = ("admit", "chunk", "verify")

    def __init__(self, bound: Bound, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in SPECDEC_MUTANTS:
            raise ValueError(f"unknown specdec mutant {mutant!r}")
        super().__init__(bound, None)
        self.mutant = mutant
        self.K = z3.Int("cfg_num_speculative_tokens")
        self.PC = z3.Bool("cfg_enable_prefix_caching")

    # ------------------------------------------------------------------ config
    def config_ok(self) -> Any:
        return z3.And(super().config_ok(), self.K >= 0, self.K <= MAX_SPECULATIVE_TOKENS)

    def read_config(self, model: Any) -> dict[str, Any]:
        return {**super().read_config(model),
                "num_speculative_tokens": model.eval(self.K, model_completion=True).as_long(),
                "enable_prefix_caching": z3.is_true(model.eval(self.PC, model_completion=True))}

    def pin_config(self, config: dict[str, Any]) -> list[Any]:
        return [*super().pin_config(config), self.K == config["num_speculative_tokens"],
                self.PC == z3.BoolVal(config["enable_prefix_caching"])]

    # ------------------------------------------------------------------ state
    def state(self, prefix: str) -> SpecState:
        base = super().state(prefix)
        ints = lambda name: [z3.Int(f"{prefix}_{name}_{s}") for s in range(self.S)]  # noqa: E731
        return SpecState(**{f.name: getattr(base, f.name) for f in dataclasses.fields(State)},
                         npr=ints("npr"), nkey=ints("nkey"), void=[z3.Bool(f"{prefix}_void_{s}") for s in range(self.S)])

    def initial(self) -> SpecState:
        st = super().initial()
        assert isinstance(st, SpecState)
        st.npr, st.nkey = [z3.IntVal(0)] * self.S, [z3.IntVal(0)] * self.S
        st.void = [z3.BoolVal(False)] * self.S
        return st

    def encode(self, action: str, pre: State | None = None) -> ActionEncoding:
        ae = super().encode(action, pre)
        post = ae.post
        assert isinstance(post, SpecState)
        for s in range(self.S):  # freeing a table forgets its keys (`V1Scheduler._free_blocks`)
            post.nkey[s] = self.let(z3.If(post.tlen[s] == 0, 0, post.nkey[s]), "nk")
            post.void[s] = self.let(z3.And(post.tlen[s] > 0, post.void[s]), "vd")
        return ae

    def read_state(self, model: Any, st: State) -> dict[str, Any]:
        return read_specdec_state(model, self, st)

    # ------------------------------------------------------------------ views
    def draft_room(self, st: State, g: Any) -> Any:
        """`V1Scheduler._draft_room`: the proposal, at most k, leaving room for the bonus token
        within max_model_len and max_tokens (0 without a proposal)."""
        assert isinstance(st, SpecState)
        ntok = self._at(st.ntok, g)
        generated = ntok - self.gsel(st.plen, g)
        room = _min(_min(self._at(st.npr, g), self.K), _min(self.ML - ntok - 1, self.gsel(st.mtok, g) - generated - 1))
        return _max(room, 0)

    # ------------------------------------------------------------------ schedule()
    def _tokens(self, ae: ActionEncoding, pre: State, g: Any) -> tuple[Any, Any]:
        """The chunk ``k``: at most the uncomputed tokens plus the draft room, the budget (drafts
        included) and the threshold; ``drafts`` = how far it reaches past the last known token."""
        k = z3.Int("act_tokens")
        ae.params["tokens"] = k
        ntok, ncomp = self._at(pre.ntok, g), self._at(pre.ncomp, g)
        assert isinstance(pre, SpecState)
        cut = z3.Int("act_cut_drafts")
        if self.mutant == "drafts-after-cut-chunk":
            ae.params["cut_drafts"] = cut
        drafts, ok = chunk_drafts(self, ncomp, ntok, self._at(pre.npr, g), self.draft_room(pre, g), k, cut)
        ae.params["drafts"] = self.let(drafts, "dr")
        return k, z3.And(ok, z3.Implies(self.threshold_applies(pre), k <= self.TH))

    def _sd_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_chunk(ae, pre, st, g)
        ae.guard = z3.And(ae.guard, ae.params["drafts"] == 0)

    def _sd_verify(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_chunk(ae, pre, st, g)
        ae.guard = z3.And(ae.guard, ae.params["drafts"] >= 1)

    # ------------------------------------------------------------------ update()
    def _update_chunk(self, ae: ActionEncoding, pre: State, st: State, g: Any, k: Any) -> None:
        """The speculative outcome for request g (`commit_tokens`, read by `outcome`), after the
        keys its allocation made (`V1Scheduler._allocate` keys up to the step's non-draft tokens)."""
        assert isinstance(pre, SpecState) and isinstance(st, SpecState)
        ae.guard = z3.And(ae.guard, outcome_params(ae.params, self.K, ae.params["drafts"]))
        for s in range(self.S):
            c = g == s
            o = outcome(self, pre.ntok[s], pre.ncomp[s], pre.nkey[s], k, ae.params["drafts"], pre.plen[s],
                        pre.mtok[s], ae.params, self.let)
            self.set_s(st.ncomp, s, o["computed"], c)
            self.set_s(st.ntok, s, o["ntok"], c)
            self.set_s(st.npr, s, o["proposal"], c)
            self.set_s(st.nkey, s, o["keyed"], c)
            self.set_s(st.void, s, o["void"], c)
            ends = z3.And(c, o["ends"])
            self.set_s(st.sstat, s, FIN, ends)
            self.free_seq(st, s, ends)
            self.set_g(st.gstat, g, FIN, ends)
            self.set_g(st.in_r, g, False, ends)

    # ------------------------------------------------------------------ the rest: V1's
    def _sd_add(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_add(ae, pre, st, g)

    def _sd_admit(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_admit(ae, pre, st, g)

    def _sd_preempt_recompute(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        assert isinstance(st, SpecState)
        self._v1_preempt_recompute(ae, pre, st, g)
        for s in range(self.S):
            self.set_s(st.npr, s, 0, g == s)

    def _sd_abort(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_abort(ae, pre, st, g)

    def _sd_ignore(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        self._v1_ignore(ae, pre, st, g)


# ---------------------------------------------------------------------- the chunk and the outcome, shared
def chunk_drafts(enc: Any, ncomp: Any, ntok: Any, npr: Any, room: Any, k: Any, cut: Any) -> tuple[Any, Any]:
    """(drafts, bounds) of a chunk of ``k`` tokens (`V1Scheduler._running_chunk`): at most the
    uncomputed tokens plus the draft room and the budget (drafts included); the drafts are how far
    it reaches past the last known token. Mutant ``drafts-after-cut-chunk``: a chunk of ``k -
    cut`` tokens short of the prompt's end carries ``cut`` drafts of the proposal after it."""
    drafts = _max(ncomp + k - ntok, 0)
    budgeted = k - drafts if enc.mutant == "drafts-outside-budget" else k
    ok = z3.And(k >= 1, k <= ntok + room - ncomp, budgeted <= enc.T)
    if enc.mutant == "drafts-after-cut-chunk":
        cut_short = z3.And(cut >= 1, cut <= npr, cut <= enc.K, k - cut >= 1, ncomp + k - cut < ntok, k <= enc.T)
        return z3.If(cut >= 1, cut, drafts), z3.Or(z3.And(cut == 0, ok), cut_short)
    return drafts, ok



OUTCOME_PARAMS = ("stop", "stop_at", "accepted", "empty", "proposed")


def outcome_params(params: dict[str, Any], K: Any, drafts: Any) -> Any:
    """The environment's outcome parameters, added to ``params``; returns their ranges."""
    stop, stop_at, accepted, empty, proposed = (z3.Int(f"act_{n}") for n in OUTCOME_PARAMS)
    params.update(zip(OUTCOME_PARAMS, (stop, stop_at, accepted, empty, proposed), strict=True))
    return z3.And(stop >= 0, stop <= 1, stop_at >= 0, empty >= 0, empty <= 1, accepted >= 0, accepted <= drafts,
                  proposed >= 0, proposed <= K)


def outcome(enc: Any, n: Any, computed: Any, keyed: Any, k: Any, d: Any, plen: Any, mtok: Any,
            p: dict[str, Any], let: Any = lambda e, hint="t": e) -> dict[str, Any]:
    """One request's speculative outcome (`reference_impl.v1_scheduler.commit_tokens`) after a
    chunk of ``k`` tokens (``d`` drafts) from ``computed`` of its ``n`` tokens: its computed and
    token counts, proposal, keyed blocks and ``void`` ghost after it, and whether it ends. Shared
    by the bounded encoding (``enc`` a `SpecDecEncoder`) and the generic request of
    `GenericSpecDec` (``enc`` one), which read the same config fields (bs, K, PC, ML, mutant)."""
    bs = enc.bs
    after = computed + k
    samples = after >= n
    pre_keyed = z3.If(enc.PC, _max(keyed, _min(after, n) / bs), keyed)
    committed = let(z3.If(p["empty"] == 1, 0, p["accepted"] + 1), "cm")
    skip_rollback = enc.mutant == "empty-outcome-skips-rollback"
    rolled = z3.If(committed >= 1, after - d + committed - 1, after if skip_rollback else after - d - 1)
    # the first committed token that ends the stream: the stop, or max_tokens / max_model_len
    capped = _max(0, _min(mtok + plen - n - 1, enc.ML - n - 1))
    end = let(z3.If(p["stop"] == 1, _min(_min(p["stop_at"], committed - 1), capped), capped), "end")
    ends = let(z3.And(samples, committed >= 1, end <= committed - 1), "ends")
    computed_after = z3.If(samples, z3.If(ends, rolled - (committed - 1 - end), rolled), after)
    ntok = z3.If(samples, n + z3.If(ends, end + 1, committed), n)
    goes_on = z3.And(samples, committed >= 1, z3.Not(ends))
    if enc.mutant in ("drafts-on-prefill-chunk", "drafts-after-cut-chunk"):
        goes_on = z3.Or(goes_on, z3.Not(samples))
    upto = ntok if enc.mutant == "keys-rejected-kv" else computed_after
    on_commit = z3.And(samples, committed >= 1, enc.PC, enc.K > 0)
    return {"computed": computed_after, "ntok": ntok, "ends": ends,
            "proposal": z3.If(goes_on, p["proposed"], 0),  # scheduled: the proposal is spent
            "keyed": z3.If(on_commit, _max(pre_keyed, upto / bs), pre_keyed),
            "void": z3.And(samples, committed == 0)}


# ---------------------------------------------------------------------- invariants of the specdec flow
def _unfinished(st: State, s: int) -> Any:
    return st.sstat[s] != FIN


def wf_specdec(enc: Encoder, st: State) -> Any:
    """The model's well-formedness for the specdec flow: the v1 flow's, and the ghost keys stay
    within the table (none without prefix caching); a proposal is at most k and never negative."""
    assert isinstance(enc, SpecDecEncoder) and isinstance(st, SpecState)
    out = [wf_v1(enc, st)]
    for s in range(enc.S):
        out += [st.npr[s] >= 0, st.npr[s] <= enc.K, st.nkey[s] >= 0, st.nkey[s] <= st.tlen[s],
                z3.Implies(z3.Not(enc.PC), st.nkey[s] == 0)]
    return P0._all(out)


def cap001_specdec(enc: Encoder, st: State) -> Any:
    """CAP-001 with speculative decoding: a running request's table has at least the blocks of
    its computed tokens and at most those of its tokens plus k (rejected drafts keep their slots)."""
    assert isinstance(enc, SpecDecEncoder)
    return P0._all([z3.Implies(st.sstat[s] == RUN, z3.And(
        st.tlen[s] >= enc.ceil_blocks(st.ncomp[s]), st.tlen[s] <= enc.ceil_blocks(st.ntok[s] + enc.K)))
        for s in range(enc.S)])


def spd002(enc: Encoder, st: State) -> Any:
    """SPD-002's state part: only a decode holds a proposal (an unfinished request with drafts
    proposed is running with every token but its last computed), so drafts can only extend a
    decode; its step part (`spd002_step`) is the scheduled shape."""
    assert isinstance(st, SpecState)
    return P0._all([z3.Implies(z3.And(st.npr[s] > 0, _unfinished(st, s)),
                               z3.And(st.sstat[s] == RUN, st.ncomp[s] == st.ntok[s] - 1)) for s in range(enc.S)])


def spd007_strict(enc: Encoder, st: State) -> Any:
    """SPD-007 without its allowance for an empty outcome: with k > 0, every keyed block of a
    running request lies within its computed tokens. Not a row: it fails right after an outcome
    with no token when prefix caching is on (`SPD007_STRENGTHENING`); `spd007` is the row."""
    assert isinstance(enc, SpecDecEncoder) and isinstance(st, SpecState)
    return z3.Implies(enc.K > 0, P0._all([z3.Implies(st.sstat[s] == RUN, st.nkey[s] * enc.bs <= st.ncomp[s])
                                          for s in range(enc.S)]))


def spd007(enc: Encoder, st: State) -> Any:
    """SPD-007 as catalogued: with k > 0, every keyed block of a running request lies within its
    computed tokens, plus the one it must recompute when its last outcome committed nothing
    (``void``; the catalogue's `void_outcomes`): that position's KV was written from a committed
    token by the step's forward pass, not a draft."""
    assert isinstance(enc, SpecDecEncoder) and isinstance(st, SpecState)
    return z3.Implies(enc.K > 0, P0._all([z3.Implies(st.sstat[s] == RUN, st.nkey[s] * enc.bs <= st.ncomp[s]
                                                      + z3.If(st.void[s], 1, 0)) for s in range(enc.S)]))


SPD007_STRENGTHENING = (
    "the strict form (keys within the computed tokens) is not inductive: it fails after an outcome with no "
    "token (vllm#42722's empty outcome) when prefix caching is on and the step's last known token ends a "
    "block: the block was keyed when allocated (vLLM allocate_slots keys up to the known tokens), and the "
    "rollback to the last token but one leaves its last slot past the computed tokens. That slot's KV was "
    "written from a committed token by the step's forward pass (vLLM's runner empties the sampled tokens "
    "after it), so SPD-007 as catalogued allows it; docs/PROOFS.md"
)


# ---------------------------------------------------------------------- transition properties
def _acted(ae: ActionEncoding) -> list[Any]:
    return [ae.params["group"] == s for s in range(ae.enc.S)]


def _schedules(ae: ActionEncoding) -> bool:
    return ae.action in ("admit", "chunk", "verify")


def _samples(ae: ActionEncoding, s: int) -> Any:
    return ae.pre.ncomp[s] + ae.params["tokens"] >= ae.pre.ntok[s]


def spd001(ae: ActionEncoding) -> Any:
    """SPD-001: the step's tokens, drafts included, fit the budget (per action here, as in the v1
    flow), and after schedule() the table holds the slots of every token scheduled now."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    enc, k = ae.enc, ae.params["tokens"]
    assert ae.mid is not None
    return z3.And(k <= enc.T, P0._all([z3.Implies(a, ae.mid.tlen[s] >= enc.ceil_blocks(ae.pre.ncomp[s] + k))
                                      for s, a in enumerate(_acted(ae))]))


def spd002_step(ae: ActionEncoding) -> Any:
    """SPD-002 (step part; policy, the reference's): a request scheduled with drafts has exactly
    one other token scheduled, its last known one."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    k, d = ae.params["tokens"], ae.params["drafts"]
    return z3.Implies(d >= 1, k - d == 1)


def spd009(ae: ActionEncoding) -> Any:
    """SPD-009: a request scheduled with drafts gets at most k of them and at least one other
    token, and the chunk before the drafts ends at its last known token."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    enc = ae.enc
    assert isinstance(enc, SpecDecEncoder)
    k, d = ae.params["tokens"], ae.params["drafts"]
    return z3.Implies(d >= 1, z3.And(d <= enc.K, k > d, P0._all([
        z3.Implies(a, ae.pre.ncomp[s] + k - d == ae.pre.ntok[s]) for s, a in enumerate(_acted(ae))])))


def spd003(ae: ActionEncoding) -> Any:
    """SPD-003: a request scheduled with drafts has room for the token after the last draft."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    k, d = ae.params["tokens"], ae.params["drafts"]
    return z3.Implies(d >= 1, P0._all([z3.Implies(a, ae.pre.ncomp[s] + k + 1 <= ae.enc.ML)
                                       for s, a in enumerate(_acted(ae))]))


def spd004(ae: ActionEncoding) -> Any:
    """SPD-004 (policy, the reference's): d drafts only after at most max_tokens - d - 1 generated."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    d, pre = ae.params["drafts"], ae.pre
    return z3.Implies(d >= 1, P0._all([
        z3.Implies(a, pre.ntok[s] - pre.plen[s] + d + 1 <= pre.mtok[s])
        for s, a in enumerate(_acted(ae))]))


def spd005(ae: ActionEncoding) -> Any:
    """SPD-005: after the outcome, a request still running that the step scheduled with drafts, or
    whose outcome committed nothing, has every token but its last computed and no more."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    d, empty = ae.params["drafts"], ae.params["empty"]
    post = ae.post
    return P0._all([
        z3.Implies(z3.And(a, post.sstat[s] == RUN, z3.Or(d >= 1, z3.And(empty == 1, _samples(ae, s)))),
                   post.ncomp[s] == post.ntok[s] - 1)
        for s, a in enumerate(_acted(ae))])


def spd006(ae: ActionEncoding) -> Any:
    """SPD-006: a stop at committed token i leaves at most i + 1 tokens more, and the request finished."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    p = ae.params
    committed = z3.If(p["empty"] == 1, 0, p["accepted"] + 1)
    at = _min(p["stop_at"], committed - 1)
    pre, post = ae.pre, ae.post
    return P0._all([
        z3.Implies(z3.And(a, p["stop"] == 1, _samples(ae, s), committed >= 1),
                   z3.And(post.ntok[s] <= pre.ntok[s] + at + 1, post.sstat[s] == FIN))
        for s, a in enumerate(_acted(ae))])


def spd008(ae: ActionEncoding) -> Any:
    """SPD-008 (policy, the reference's): no more drafts than the drafter proposed."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    pre = ae.pre
    assert isinstance(pre, SpecState)
    d = ae.params["drafts"]
    return P0._all([z3.Implies(a, d <= pre.npr[s]) for s, a in enumerate(_acted(ae))])


def chk002_step_specdec(ae: ActionEncoding) -> Any:
    """CHK-002 (step part): computed plus the tokens scheduled now, drafts aside, never exceed the tokens."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    k, d = ae.params["tokens"], ae.params["drafts"]
    return P0._all([z3.Implies(a, ae.pre.ncomp[s] + k - d <= ae.pre.ntok[s]) for s, a in enumerate(_acted(ae))])


def chk004_specdec(ae: ActionEncoding) -> Any:
    """CHK-004 with drafts: the scheduled request's computed tokens advance by at most the tokens it
    was given and at least those less its d drafts (one less again on an outcome with no token);
    every other running request's stay."""
    if not _schedules(ae):
        return z3.BoolVal(True)
    k, d, empty = ae.params["tokens"], ae.params["drafts"], ae.params["empty"]
    pre, post = ae.pre, ae.post
    out = []
    for s, a in enumerate(_acted(ae)):
        least = pre.ncomp[s] + k - d - z3.If(z3.And(empty == 1, _samples(ae, s)), 1, 0)
        out.append(z3.If(a, z3.And(post.ncomp[s] >= least, post.ncomp[s] <= pre.ncomp[s] + k),
                         z3.Implies(pre.sstat[s] == RUN, post.ncomp[s] == pre.ncomp[s])))
    return P0._all(out)


SPECDEC_STATE_INVARIANTS = {
    **{k: v for k, v in V1_STATE_INVARIANTS.items() if k not in ("CAP-001", "WF")},
    "CAP-001": cap001_specdec, "CHK-002": chk002, "SPD-002": spd002, "SPD-007": spd007,
    "WF": wf_specdec,
}
SPECDEC_TRANSITION_PROPERTIES = {
    **{k: v for k, v in V1_TRANSITION_PROPERTIES.items() if k != "CHK-004"},
    "CHK-004": chk004_specdec,
    "SPD-001": spd001, "SPD-003": spd003, "SPD-004": spd004, "SPD-005": spd005, "SPD-006": spd006, "SPD-008": spd008,
    "SPD-009": spd009,
}
SPECDEC_STEP_PARTS = {"CHK-002": chk002_step_specdec, "SPD-002": spd002_step}
SPECDEC_SCOPE = {
    "CAP-004": "implied on this flow by CAP-001 (proved: at least ceil(computed / block_size) blocks)",
    "CAP-006": "implied on this flow by CAP-001 (proved: at most the blocks of its tokens plus k, the lookahead "
               "reservation the reference declares)",
    "BUD-001": "step property over one scheduler output: the budget is per action here (each chunk, drafts "
               "included, <= the budget: SPD-001's cell)",
    "CAP-002": "mid-step table coverage: SPD-001's cell says the table covers every token scheduled now, drafts "
               "included",
}
grp_ok_specdec = grp_ok_v1


# ---------------------------------------------------------------------- concrete states
def read_specdec_state(model: Any, enc: Encoder, st: State) -> dict[str, Any]:
    """`spec.proofs.encoding.read_state` plus each request's proposal and keyed blocks."""
    from spec.proofs.encoding import read_state

    assert isinstance(st, SpecState)
    out = read_state(model, enc, st)
    for s, seq in enumerate(out["seqs"]):
        seq["proposed"] = model.eval(st.npr[s], model_completion=True).as_long()
        seq["keyed"] = model.eval(st.nkey[s], model_completion=True).as_long()
        seq["void"] = z3.is_true(model.eval(st.void[s], model_completion=True))
    return out


def pin_specdec_state(enc: Encoder, st: State, concrete: dict[str, Any]) -> list[Any]:
    """Constraints that fix ``st`` to a concrete state (as `read_specdec_state` writes it)."""
    from spec.proofs.encoding import pin_state

    assert isinstance(st, SpecState)
    out = pin_state(enc, st, concrete)
    for s, seq in enumerate(concrete["seqs"]):
        out += [st.npr[s] == seq["proposed"], st.nkey[s] == seq["keyed"], st.void[s] == z3.BoolVal(seq["void"])]
    return out


# ---------------------------------------------------------------------- for every size: one generic request
# spec/proofs/per_sequence.py's argument for the v1 flow (`GenericV1`: each per-request row and
# step property after an action is a fact about the one request it touches), with the request's
# proposal, keys and ``void`` ghost, and the speculative chunk (`outcome`, shared with the bounded
# encoding above). `tests/test_per_sequence_matches_reference.py` checks it on the reference.
ROWS_SPECDEC_SEQ = ("RES-001", "RES-002", "RES-003", "RES-004", "CAP-001", "CAP-003", "CHK-002", "LEN-001", "CHK-006",
                    "SPD-002", "SPD-007")
STEPS_SPECDEC_SEQ = ("CHK-001", "CHK-003", "CHK-004", "CHK-005", "ALLOC", "ADM-002",
                     "SPD-001", "SPD-003", "SPD-004", "SPD-005", "SPD-006", "SPD-008", "SPD-009")
ACTIONS_SPECDEC_SEQ = SPECDEC_ACTIONS


@dataclass
class SpecSeq(Seq):
    """`per_sequence.Seq` plus the request's proposal, keyed blocks and ``void`` ghost."""

    pr: Any = 0
    ky: Any = 0
    vd: Any = False


class GenericSpecDec(GenericV1):
    """The specdec flow's generic request: `GenericV1` with drafts (k, prefix caching and the
    token budget symbolic, like the rest of the config)."""

    def __init__(self, mutant: str | None = None) -> None:
        super().__init__(None)
        self.mutant = mutant
        self.K, self.T = z3.Ints("g_num_speculative_tokens g_token_budget")
        self.PC = z3.Bool("g_enable_prefix_caching")
        self.cut = z3.Int("g_cut_drafts")  # mutant drafts-after-cut-chunk only
        self.p: dict[str, Any] = {}

    def seq(self, p: str) -> SpecSeq:
        return SpecSeq(*z3.Ints(f"{p}_st {p}_dv {p}_tl {p}_nt {p}_nc"), z3.Int(f"{p}_pr"), z3.Int(f"{p}_ky"),
                       z3.Bool(f"{p}_vd"))

    def unborn(self) -> SpecSeq:
        q = super().unborn()
        return SpecSeq(q.st, q.dv, q.tl, q.nt, q.nc, z3.IntVal(0), z3.IntVal(0), z3.BoolVal(False))

    def base(self) -> Any:
        return z3.And(super().base(), self.K >= 0, self.K <= MAX_SPECULATIVE_TOKENS, self.T >= 1)

    # ---------------------------------------------------------------- facts
    def rows(self, q: Seq) -> dict[str, Any]:
        assert isinstance(q, SpecSeq)
        out = super().rows(q)
        out["CAP-001"] = z3.Implies(q.st == RUN, z3.And(q.tl >= self.ceil(q.nc), q.tl <= self.ceil(q.nt + self.K)))
        out["SPD-002"] = z3.Implies(z3.And(q.pr > 0, q.st != FIN), z3.And(q.st == RUN, q.nc == q.nt - 1))
        out["SPD-007"] = z3.Implies(self.K > 0, z3.Implies(q.st == RUN, q.ky * self.bs <= q.nc + z3.If(q.vd, 1, 0)))
        return out

    def wf(self, q: Seq, gs: Any = None, forked: Any = None) -> Any:
        assert isinstance(q, SpecSeq)
        return z3.And(super().wf(q, gs, forked), q.pr >= 0, q.pr <= self.K, q.ky >= 0, q.ky <= q.tl,
                      z3.Implies(z3.Not(self.PC), q.ky == 0))

    # ---------------------------------------------------------------- the request's rules
    def drafts(self, q: Seq) -> Any:
        assert isinstance(q, SpecSeq)
        return chunk_drafts(self, q.nc, q.nt, q.pr, self.room(q), self.k, self.cut)[0]

    def room(self, q: SpecSeq) -> Any:
        """`SpecDecEncoder.draft_room` for the generic request."""
        generated = q.nt - self.plen
        return _max(_min(_min(q.pr, self.K), _min(self.ML - q.nt - 1, self.mtok - generated - 1)), 0)

    def _freed(self, q: Seq, cond: Any, st: Any) -> SpecSeq:
        f = super()._freed(q, cond, st)
        pr = q.pr if isinstance(q, SpecSeq) else 0
        ky = q.ky if isinstance(q, SpecSeq) else 0
        vd = q.vd if isinstance(q, SpecSeq) else False
        return SpecSeq(f.st, f.dv, f.tl, f.nt, f.nc, pr, ky, vd)

    def _chunk(self, q: Seq, allocate: bool = True) -> tuple[Any, Seq]:
        assert isinstance(q, SpecSeq)
        k = self.k
        d, bounds = chunk_drafts(self, q.nc, q.nt, q.pr, self.room(q), k, self.cut)
        ok = z3.And(bounds, z3.Implies(self.threshold_applies(q), k <= self.TH), outcome_params(self.p, self.K, d))
        target = self.ceil(q.nc + k)
        tl = z3.If(target > q.tl, target, q.tl)
        o = outcome(self, q.nt, q.nc, q.ky, k, d, self.plen, self.mtok, self.p)
        run = SpecSeq(z3.IntVal(RUN), z3.If(tl >= 1, GPU, q.dv), tl, o["ntok"], o["computed"], o["proposal"],
                      o["keyed"], o["void"])
        return ok, self._freed(run, o["ends"], FIN)

    def effect(self, action: str, q: Seq, parent: Seq) -> tuple[Any, Seq]:
        assert isinstance(q, SpecSeq)
        ok, post = super().effect("chunk" if action == "verify" else action, q, parent)
        if action in ("chunk", "verify"):
            ok = z3.And(ok, self.drafts(q) >= 1 if action == "verify" else self.drafts(q) == 0)
        pr = post.pr if isinstance(post, SpecSeq) else q.pr
        if action == "preempt_recompute":
            pr = z3.IntVal(0)
        ky = post.ky if isinstance(post, SpecSeq) else q.ky
        vd = post.vd if isinstance(post, SpecSeq) else q.vd
        # freeing a table forgets its keys and the ghost (`SpecDecEncoder.encode`)
        return ok, SpecSeq(post.st, post.dv, post.tl, post.nt, post.nc, pr, z3.If(post.tl == 0, 0, ky),
                           z3.And(post.tl > 0, vd))

    def request_after(self, action: str, post: Seq) -> tuple[Any, Any, Any]:
        return super().request_after("chunk" if action == "verify" else action, post)

    def in_bound(self, action: str, q: Seq, parent: Seq) -> Any:
        return super().in_bound("chunk" if action == "verify" else action, q, parent)

    def transition_goals(self, action: str, q: Seq, post: Seq) -> dict[str, Any]:
        assert isinstance(q, SpecSeq)
        goals = super().transition_goals("chunk" if action == "verify" else action, q, post)
        goals.update({name: z3.BoolVal(True) for name in ("SPD-001", "SPD-003", "SPD-004", "SPD-005", "SPD-006",
                                                          "SPD-008", "SPD-009", "SPD-002/step")})
        if action not in ("admit", "chunk", "verify"):
            return goals
        k, d, p = self.k, self.drafts(q), self.p
        samples = q.nc + k >= q.nt
        committed = z3.If(p["empty"] == 1, 0, p["accepted"] + 1)
        least = q.nc + k - d - z3.If(z3.And(p["empty"] == 1, samples), 1, 0)
        goals.update({
            "CHK-002/step": q.nc + k - d <= q.nt,
            "CHK-004": z3.And(post.nc >= least, post.nc <= q.nc + k),
            "SPD-001": z3.And(k <= self.T, z3.If(self.ceil(q.nc + k) > q.tl, self.ceil(q.nc + k), q.tl)
                              >= self.ceil(q.nc + k)),
            "SPD-002/step": z3.Implies(d >= 1, k - d == 1),
            "SPD-009": z3.Implies(d >= 1, z3.And(d <= self.K, k > d, q.nc + k - d == q.nt)),
            "SPD-003": z3.Implies(d >= 1, q.nc + k + 1 <= self.ML),
            "SPD-004": z3.Implies(d >= 1, q.nt - self.plen + d + 1 <= self.mtok),
            "SPD-005": z3.Implies(z3.And(post.st == RUN, z3.Or(d >= 1, z3.And(p["empty"] == 1, samples))),
                                  post.nc == post.nt - 1),
            "SPD-006": z3.Implies(z3.And(p["stop"] == 1, samples, committed >= 1),
                                  z3.And(post.nt <= q.nt + _min(p["stop_at"], committed - 1) + 1, post.st == FIN)),
            "SPD-008": d <= q.pr,
        })
        return goals
