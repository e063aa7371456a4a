"""The per-sequence rules behind the unbounded RES/CAP/LEN cells (spec/proofs/per_sequence.py)
are the reference scheduler's: on drawn reference states of any size, after each action every
member of the touched request has the post-state the generic rule gives for its own pre-state
(a forked child: the rule applied to the parent), and every other sequence is unchanged. Also:
the proofs themselves, their non-vacuity, and the two per-sequence proof mutants."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.selftest.proof_bridge import (
    all_groups_of,
    apply_action,
    reference_guard,
    v1_apply_action,
    v1_reference_guard,
    v1_requests,
)
from reference_impl.scheduler import Scheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.proofs.encoding import CPU, GPU, NODEV, NONE, status_code
from spec.proofs.matrix import prove
from spec.proofs.per_sequence import (
    ACTIONS,
    ACTIONS_V1,
    MUTANTS,
    MUTANTS_V1,
    QUE_SEQS,
    ROWS,
    TARGET,
    WF_SEQS,
    Generic,
    GenericV1,
    Seq,
)
from spec.proofs.sequence_cells import hypotheses_satisfiable, prove_sequences
from spec.status import Status
from spec.types import Request, StepOutcome
from tests.conftest import examples
from tests.test_parametric_matches_reference import FIXED as BLOCK_FIXED
from tests.test_parametric_matches_reference import UNBOUNDED_TABLES, _sched, reference_states, small_v1_fields


def seq_state(sched: Scheduler, seq: Any | None) -> tuple[int, int, int, int, int]:
    if seq is None:
        return (NONE, NODEV, 0, 0, 0)
    bm = sched.block_manager
    if seq.seq_id in bm.gpu_tables:
        dv, tl = GPU, len(bm.gpu_tables[seq.seq_id])
    elif seq.seq_id in bm.cpu_tables:
        dv, tl = CPU, len(bm.cpu_tables[seq.seq_id])
    else:
        dv, tl = NODEV, 0
    return (status_code(seq.status), dv, tl, seq.num_tokens, seq.num_computed)


def predicted(sched: Scheduler, group: Any, action: str, q: tuple, parent: tuple, first: bool) -> tuple:
    G = Generic()
    sq, sp = G.seq("q"), G.seq("p")
    guard, post = G.effect(action, sq, sp)
    pins = [(a, z3.IntVal(v)) for a, v in zip((sq.st, sq.dv, sq.tl, sq.nt, sq.nc), q, strict=True)]
    pins += [(a, z3.IntVal(v)) for a, v in zip((sp.st, sp.dv, sp.tl, sp.nt, sp.nc), parent, strict=True)]
    cfg = sched.config
    pins += [(G.bs, z3.IntVal(cfg.block_size)), (G.ML, z3.IntVal(cfg.max_model_len)),
             (G.plen, z3.IntVal(group.request.prompt_len)), (G.mtok, z3.IntVal(group.request.max_tokens)),
             (G.gs, z3.IntVal(status_code(group.status))), (G.forked, z3.BoolVal(group.forked)),
             (G.first, z3.BoolVal(first))]

    def ev(e: Any) -> Any:
        v = z3.simplify(z3.substitute(e, *pins))
        return v.as_long() if z3.is_int_value(v) else z3.is_true(v)

    assert ev(guard), f"{action}: the generic guard does not hold for {q} (parent {parent})"
    return tuple(ev(x) for x in (post.st, post.dv, post.tl, post.nt, post.nc))


def check_action(sched: Scheduler, action: str, group: Any, seq_id: str | None = None) -> None:
    n = group.request.n
    slots = [next((s for s in group.seqs if s.seq_id == f"{group.request_id}#{k}"), None) for k in range(n)]
    assert slots[0] is not None, f"sequence ids are not request#index: {[s.seq_id for s in group.seqs]}"
    before = {k: seq_state(sched, s) for k, s in enumerate(slots)}
    others = {s.seq_id: seq_state(sched, s) for g in all_groups_of(sched) if g is not group for s in g.seqs}
    other_status = {g.request_id: g.status for g in all_groups_of(sched) if g is not group}
    after_sched = copy.deepcopy(sched)
    apply_action(after_sched, action, after_sched.groups[group.request_id], seq_id)
    g2 = after_sched.groups[group.request_id]
    for k in range(n):
        seq2 = next((s for s in g2.seqs if s.seq_id == f"{group.request_id}#{k}"), None)
        got = seq_state(after_sched, seq2)
        if action == "finish" and f"{group.request_id}#{k}" != seq_id:
            assert got == before[k], f"finish changed another member #{k}"
            continue
        want = predicted(sched, group, action, before[k], before[0], k == 0)
        if want[0] == NONE:
            want = (NONE, NODEV, 0, 0, 0)
        assert got == want, f"{action} member #{k}: reference {got}, rule {want} (pre {before[k]}, parent {before[0]})"
    if any(not s.status.is_finished for s in g2.seqs):  # a member is still live: QUE-002's target status
        assert status_code(g2.status) == TARGET[action], f"{action}: request status {g2.status} with a live member"
    elif action in ("admit", "fork", "decode", "swap_in", "finish", "abort", "ignore"):  # WF: ends it
        assert g2.status.is_finished, f"{action}: no live member but the request is {g2.status}"
    for g in all_groups_of(after_sched):
        if g.request_id != group.request_id:
            assert g.status == other_status[g.request_id], f"{action} changed the status of {g.request_id}"
            for s in g.seqs:
                assert seq_state(after_sched, s) == others[s.seq_id], f"{action} changed {s.seq_id} of another request"


@settings(max_examples=examples(15), deadline=None, database=None)
@given(sched=reference_states(), data=st.data())
def test_each_member_follows_the_generic_rule(sched, data):
    for _ in range(data.draw(st.integers(1, 10))):
        options = []
        for group in all_groups_of(sched):
            for action in ("admit", "fork", "decode", "preempt_recompute", "swap_out", "swap_in", "abort", "ignore", "finish"):
                seq_id = next((s.seq_id for s in group.live_seqs()), None) if action == "finish" else None
                if reference_guard(sched, action, group, seq_id, UNBOUNDED_TABLES):
                    options += [(action, group.request_id, seq_id)] * (1 if action in ("abort", "ignore", "finish") else 3)
        if not options:
            return
        action, rid, seq_id = data.draw(st.sampled_from(options))
        check_action(sched, action, sched.groups[rid], seq_id)
        apply_action(sched, action, sched.groups[rid], seq_id)


def test_every_row_and_action_is_proved_for_a_generic_sequence():
    results = prove_sequences()
    assert all(r.result == "proved" for r in results), [r for r in results if r.result != "proved"]
    assert {(r.row, r.action) for r in results} == {(row, a) for row in (*ROWS, QUE_SEQS, WF_SEQS) for a in ("init", *ACTIONS)}


@pytest.mark.parametrize("action", ACTIONS)
def test_hypotheses_are_satisfiable(action):
    assert hypotheses_satisfiable(action)


@pytest.mark.parametrize("mutant, row", [("recompute-keeps-computed", "CAP-003"), ("abort-no-free", "RES-004")])
def test_per_sequence_mutants_are_caught_by_an_unbounded_cell(mutant, row):
    (action,) = MUTANTS[mutant]
    m = prove(mutant=mutant, actions=[action], invariants=[row])
    assert [row, action] in m.parametric["cells"]
    assert m.cell(row, action).result == "counterexample"


def test_per_sequence_rows_are_unbounded_in_the_v0_matrix():
    m = prove(invariants=["RES-001", "CAP-001", "LEN-001", "QUE-002", "COW-001"], actions=["decode", "swap_in"])
    for c in m.cells:
        assert c.result == "proved"
        assert c.scope == "unbounded", c  # COW-001 too, by spec/proofs/writes.py's lemmas


def test_generic_sequence_type():
    assert Seq(1, 2, 3, 4, 5).tl == 3


FIXED = [(a, make) for a, make in BLOCK_FIXED] + [
    ("finish", lambda: _sched(Request("a", 5, max_tokens=9, n=3), actions=("fork",))),
    ("ignore", lambda: _sched(Request("a", 40))),
]


@pytest.mark.parametrize("action, make", FIXED, ids=[f[0] for f in FIXED])
def test_fixed_actions(action, make):
    sched = make()
    group = sched.groups["a"]
    seq_id = "a#1" if action == "finish" else None
    if action == "finish":
        seq_id = next(s.seq_id for s in group.live_seqs() if s is not group.seqs[0])
    assert reference_guard(sched, action, group, seq_id, UNBOUNDED_TABLES)
    check_action(sched, action, group, seq_id)


# ---------------------------------------------------------------------- the v1 flow
def v1_seq_state(t: Any) -> tuple[int, int, int, int, int]:
    return (status_code(t.status), GPU if t.blocks else NODEV, len(t.blocks), t.num_tokens, t.num_computed)


def v1_predicted(sched: Any, t: Any, action: str, k: int, stop: bool, q: tuple, rest_partial: int = 0,
                 rest_active: int = 0) -> tuple:
    G = GenericV1()
    sq = G.seq("q")
    guard, post = G.effect(action, sq, sq)
    cfg = sched.config
    pins = [(a, z3.IntVal(v)) for a, v in zip((sq.st, sq.dv, sq.tl, sq.nt, sq.nc), q, strict=True)]
    pins += [(G.bs, z3.IntVal(cfg.block_size)), (G.ML, z3.IntVal(cfg.max_model_len)),
             (G.plen, z3.IntVal(t.request.prompt_len)), (G.mtok, z3.IntVal(t.request.max_tokens)),
             (G.gs, z3.IntVal(q[0])), (G.k, z3.IntVal(k)), (G.stop, z3.IntVal(int(stop))),
             (G.CH, z3.BoolVal(cfg.enable_chunked_prefill)), (G.P, z3.IntVal(cfg.max_num_partial_prefills)),
             (G.rest_partial, z3.IntVal(rest_partial)), (G.rest_active, z3.IntVal(rest_active)),
             (G.TH, z3.IntVal(cfg.long_prefill_token_threshold)), (G.F, z3.IntVal(sched.pool.num_free)),
             (G.W, z3.IntVal(cfg.watermark_blocks))]

    def ev(e: Any) -> Any:
        v = z3.simplify(z3.substitute(e, *pins))
        return v.as_long() if z3.is_int_value(v) else z3.is_true(v)

    assert ev(guard), f"{action} k={k}: the generic guard does not hold for {q}"
    return tuple(ev(x) for x in (post.st, post.dv, post.tl, post.nt, post.nc))


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_each_v1_request_follows_the_generic_rule(data):
    fields = small_v1_fields(data)
    config = SchedulerConfig(
        **fields,
        max_num_partial_prefills=data.draw(st.sampled_from([0, 1, 2])) if fields["enable_chunked_prefill"] else 0,
    )
    sched = V1Scheduler(config)
    for j in range(data.draw(st.integers(0, 10))):
        if j < 3 or data.draw(st.integers(0, 2)) == 0:  # a few requests arrive first
            sched.add_request(Request(f"r{j}", prompt_len=data.draw(st.integers(1, 20)),
                                      max_tokens=data.draw(st.integers(1, 12))))
        out = sched.schedule()
        sched.update(StepOutcome(frozenset(s.seq_id for s in out.scheduled if data.draw(st.integers(0, 9)) == 0)))
    for _ in range(data.draw(st.integers(1, 8))):
        options = []
        for t in v1_requests(sched):
            for action in ACTIONS_V1[1:]:
                for k in (1, 2, 5) if action in ("admit", "chunk") else (1,):
                    if v1_reference_guard(sched, action, t, k, UNBOUNDED_TABLES):
                        options += [(action, t.request_id, k)] * (3 if action in ("admit", "chunk") else 1)
        if not options:
            return
        action, rid, k = data.draw(st.sampled_from(options))
        stop = data.draw(st.integers(0, 4)) == 0
        t = sched.requests[rid]
        pre = v1_seq_state(t)
        others = {r.request_id: v1_seq_state(r) for r in v1_requests(sched) if r is not t}
        rest = sum(1 for r in v1_requests(sched) if r is not t and r.status is Status.RUNNING
                   and r.num_computed < r.num_tokens - 1)  # the other requests mid-prefill (CHK-006)
        active = sum(1 for r in v1_requests(sched) if r is not t and r.status in (Status.WAITING, Status.RUNNING))
        want = v1_predicted(sched, t, action, k, stop, pre, rest, active)
        free_before, blocks_before = sched.pool.num_free, len(t.blocks)
        v1_apply_action(sched, action, t, k, stop)
        assert v1_seq_state(t) == want, f"{action} k={k} stop={stop}: reference {v1_seq_state(t)}, rule {want} (pre {pre})"
        if action in ("admit", "chunk") and not t.status.is_finished:  # ALLOC / ADM-002's count: taken = growth
            assert free_before - sched.pool.num_free == len(t.blocks) - blocks_before
        assert others == {r.request_id: v1_seq_state(r) for r in v1_requests(sched) if r is not t}


def test_v1_rows_are_proved_for_a_generic_sequence():
    results = prove_sequences(flow_name="v1")
    assert all(r.result == "proved" for r in results), [r for r in results if r.result != "proved"]
    assert all(hypotheses_satisfiable(a, "v1") for a in ACTIONS_V1)


@pytest.mark.parametrize("mutant", sorted(MUTANTS_V1))
def test_v1_per_sequence_mutants_are_caught_by_an_unbounded_cell(mutant):
    actions = list(MUTANTS_V1[mutant])
    m = prove(flow_name="v1", mutant=mutant, actions=actions,
              invariants=["CAP-001", "CAP-003", "CHK-002", "CHK-003", "CHK-004", "CHK-005", "CHK-006"])
    broken = {tuple(c) for c in m.parametric["cells"]}
    refuted = {(c.invariant, c.action) for c in m.cells if c.result == "counterexample"}
    assert broken and broken <= refuted, (broken, refuted)


# ---------------------------------------------------------------------- the specdec flow
def specdec_seq_state(t: Any, void: set[str]) -> tuple:
    return (*v1_seq_state(t), t.num_proposed, t.num_keyed, t.request_id in void and bool(t.blocks))


def specdec_predicted(sched: Any, t: Any, action: str, q: tuple, k: int = 0, decision: Any = None,
                      stopped: bool = False) -> tuple:
    """The generic request's post-state (`GenericSpecDec.effect`) for ``t``'s pre-state ``q``."""
    from spec.proofs.encoding_specdec import GenericSpecDec

    G = GenericSpecDec()
    sq = G.seq("q")
    _, post = G.effect(action, sq, sq)
    cfg = sched.config
    d = decision
    pins = [(a, z3.IntVal(v)) for a, v in zip((sq.st, sq.dv, sq.tl, sq.nt, sq.nc, sq.pr, sq.ky), q[:7], strict=True)]
    pins += [(sq.vd, z3.BoolVal(q[7])), (G.bs, z3.IntVal(cfg.block_size)), (G.ML, z3.IntVal(cfg.max_model_len)),
             (G.plen, z3.IntVal(t.request.prompt_len)), (G.mtok, z3.IntVal(t.request.max_tokens)),
             (G.gs, z3.IntVal(q[0])), (G.k, z3.IntVal(k)), (G.K, z3.IntVal(cfg.num_speculative_tokens)),
             (G.PC, z3.BoolVal(cfg.enable_prefix_caching))]
    if action in ("admit", "chunk", "verify"):
        drafts = max(q[4] + k - q[3], 0)
        pins += [(G.p["stop"], z3.IntVal(int(stopped))), (G.p["empty"], z3.IntVal(int(d.empty))),
                 (G.p["stop_at"], z3.IntVal(16 if d.stop_at is None else d.stop_at)),
                 (G.p["accepted"], z3.IntVal(min(d.accepted, drafts))),
                 (G.p["proposed"], z3.IntVal(d.num_proposed(cfg.num_speculative_tokens)))]

    def ev(e: Any) -> Any:
        v = z3.simplify(z3.substitute(e, *pins))
        return v.as_long() if z3.is_int_value(v) else z3.is_true(v)

    return tuple(ev(x) for x in (post.st, post.dv, post.tl, post.nt, post.nc, post.pr, post.ky, post.vd))


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_each_specdec_request_follows_the_generic_rule(data):
    """The specdec flow's per-request rules (`GenericSpecDec`, what lifts its rows past the bound)
    on the speculative reference of any size, k 0..4, prefix caching on or off (distinct prompts,
    no cache hits), random acceptances, empty outcomes and stops: each step's preempted, scheduled
    and aborted requests end where the generic rule says, from their own state before the step
    (the guards are the bounded tie test's; the rest of a step is the other requests' business)."""
    from reference_impl.specdec_scheduler import SpecDecScheduler
    from spec.speculative import DraftDecision

    config = SchedulerConfig(
        **small_v1_fields(data),
        enable_prefix_caching=data.draw(st.booleans()), num_speculative_tokens=data.draw(st.integers(0, 4)),
    )
    sched = SpecDecScheduler(config)
    void: set[str] = set()
    for j in range(data.draw(st.integers(1, 14))):
        if j < 3 or data.draw(st.integers(0, 2)) == 0:
            prompt = data.draw(st.integers(1, 20))
            sched.add_request(Request(f"r{j}", prompt_len=prompt, max_tokens=data.draw(st.integers(1, 12)),
                                      prompt_tokens=tuple((7 * j + 1 + i) % 50 for i in range(prompt))))
        live = [t for t in v1_requests(sched) if not t.status.is_finished]
        if live and data.draw(st.integers(0, 6)) == 6:
            t = data.draw(st.sampled_from(live))
            want = specdec_predicted(sched, t, "abort", specdec_seq_state(t, void))
            sched.abort_request(t.request_id)
            assert specdec_seq_state(t, void) == want
        pre = {t.request_id: specdec_seq_state(t, void) for t in v1_requests(sched)}
        out = sched.schedule()
        if any(pre[s.request_id][0] == status_code(Status.WAITING) and sched.requests[s.request_id].num_computed
               for s in out.scheduled):
            return  # a prefix-cache hit (a request back on its own cached blocks): outside the rule
        decisions = {s.seq_id: DraftDecision(proposed=data.draw(st.sampled_from([None, 0, 1, 3])),
                                             accepted=data.draw(st.integers(0, 4)),
                                             stop_at=data.draw(st.sampled_from([None, 0, 1])),
                                             empty=data.draw(st.integers(0, 5)) == 5) for s in out.scheduled}
        stopped = frozenset(s.seq_id for s in out.scheduled if data.draw(st.integers(0, 9)) == 9)
        sched.update(StepOutcome(stopped, decisions))
        for p in out.preempted:
            t = sched.requests[p.request_id]
            assert specdec_seq_state(t, void) == specdec_predicted(sched, t, "preempt_recompute", pre[p.request_id])
        for s in out.scheduled:
            t, q, d = sched.requests[s.request_id], pre[s.request_id], decisions[s.seq_id]
            action = "admit" if q[0] == status_code(Status.WAITING) else "verify" if s.num_drafts else "chunk"
            want = specdec_predicted(sched, t, action, q, s.num_tokens, d, s.seq_id in stopped)
            if q[4] + s.num_tokens >= q[3] and d.empty:
                void.add(t.request_id)
            else:
                void.discard(t.request_id)
            got = specdec_seq_state(t, void)
            assert got == want, f"{action} k={s.num_tokens} {d}: reference {got}, rule {want} (pre {q})"


def test_specdec_rows_are_proved_for_a_generic_request():
    from spec.proofs.encoding_specdec import ACTIONS_SPECDEC_SEQ

    results = prove_sequences(flow_name="specdec")
    assert all(r.result == "proved" for r in results), [r for r in results if r.result != "proved"]
    assert all(hypotheses_satisfiable(a, "specdec") for a in ACTIONS_SPECDEC_SEQ)


# ---------------------------------------------------------------------- the async flow
_ASYNC_RULES: dict[str, Any] = {}


def _async_rule(action: str) -> tuple[Any, Any, Any]:
    """(generic request, guard, post) of ``action`` (`GenericAsync.effect`), built once per action."""
    from spec.proofs.encoding_async import GenericAsync

    if action not in _ASYNC_RULES:
        G = GenericAsync()
        q = G.seq("q")
        guard, post = G.effect(action, q, q)
        _ASYNC_RULES[action] = (G, q, guard, post)
    return _ASYNC_RULES[action]


def async_seq_state(sched: Any, t: Any) -> tuple:
    """Request ``t`` of a pipelined reference as the generic request's fields: (status, device,
    table length, tokens, the scheduler's computed count, placeholders, in-flight and stale tokens,
    the number of its entries in flight, their tokens, their sampled positions)."""
    from spec.proofs.encoding_async import Q

    c = sched.counters[t.request_id]
    entries = [(k, -1 if p is None else p) for step in sched.in_flight for (r, k, p, _d) in step.entries if r is t]
    assert len(entries) <= Q, entries
    entries += [(0, -1)] * (Q - len(entries))
    n = sum(1 for step in sched.in_flight for (r, *_) in step.entries if r is t)
    return (*v1_seq_state(t), c.num_placeholders, c.num_in_flight, c.num_stale, n,
            *(k for k, _ in entries), *(p for _, p in entries))


def async_predicted(sched: Any, t: Any, action: str, q: tuple, *, k: int = 0, stop: int = 0, free: int = 0,
                    rest_partial: int = 0, rest_active: int = 0) -> tuple:
    """The generic request's post-state for ``t``'s pre-state ``q``, asserting its guard holds
    with the reference's parameters (the chunk, the stop, the free blocks before the action and the
    other requests' mid-prefill and active counts then)."""
    from spec.proofs.encoding_async import Q

    G, sq, guard, post = _async_rule(action)
    cfg = sched.config
    fields = (sq.st, sq.dv, sq.tl, sq.nt, sq.nc, sq.ph, sq.inf, sq.stl, sq.qn, *sq.qk, *sq.qp)
    assert len(fields) == len(q) == 9 + 2 * Q
    pins = [(a, z3.IntVal(v)) for a, v in zip(fields, q, strict=True)]
    pins += [(G.bs, z3.IntVal(cfg.block_size)), (G.ML, z3.IntVal(cfg.max_model_len)),
             (G.plen, z3.IntVal(t.request.prompt_len)), (G.mtok, z3.IntVal(t.request.max_tokens)),
             (G.gs, z3.IntVal(q[0])), (G.k, z3.IntVal(k)), (G.stop, z3.IntVal(stop)),
             (G.CH, z3.BoolVal(cfg.enable_chunked_prefill)), (G.P, z3.IntVal(cfg.max_num_partial_prefills)),
             (G.rest_partial, z3.IntVal(rest_partial)), (G.rest_active, z3.IntVal(rest_active)),
             (G.TH, z3.IntVal(cfg.long_prefill_token_threshold)), (G.F, z3.IntVal(free)),
             (G.W, z3.IntVal(cfg.watermark_blocks)), (G.DP, z3.IntVal(sched.depth))]

    def ev(e: Any) -> Any:
        v = z3.simplify(z3.substitute(e, *pins))
        return v.as_long() if z3.is_int_value(v) else z3.is_true(v)

    assert ev(guard), f"{action} k={k} stop={stop} free={free}: the generic guard does not hold for {q}"
    assert action != "process" or ev(G.engine_checks(sq)), f"PIP-005's checks fail processing {q}"
    return tuple(ev(x) for x in (post.st, post.dv, post.tl, post.nt, post.nc, post.ph, post.inf, post.stl, post.qn,
                                  *post.qk, *post.qp))


class AsyncRun:
    """A pipelined reference whose every request is followed through the generic rule: each
    arrival, abort, ``schedule()`` and ``update()`` is cut into matrix actions as in
    tests/test_async_encoding_matches_reference.py, each request's post-state predicted from its
    own pre-state (the guard asserted), and every request compared with the reference after."""

    def __init__(self, sched: Any) -> None:
        self.sched = sched
        self.seen: dict[str, int] = {}

    def states(self) -> dict[str, tuple]:
        return {t.request_id: async_seq_state(self.sched, t) for t in v1_requests(self.sched)}

    def compare(self, want: dict[str, tuple], what: str) -> None:
        got = self.states()
        for rid, state in got.items():
            assert state == want[rid], f"{what}: {rid} reference {state}, rule {want[rid]}"

    def note(self, action: str) -> None:
        self.seen[action] = self.seen.get(action, 0) + 1

    def arrive(self, rid: str, prompt: int, max_tokens: int) -> None:
        from spec.proofs.encoding_async import Q

        want = self.states()
        self.sched.add_request(Request(rid, prompt_len=prompt, max_tokens=max_tokens))
        t = self.sched.requests[rid]
        unborn = (NONE, NODEV, 0, 0, 0, 0, 0, 0, 0, *[0] * Q, *[-1] * Q)
        want[rid] = async_predicted(self.sched, t, "add", unborn)
        self.note("add")
        self.compare(want, "add")

    def abort(self, rid: str) -> None:
        want = self.states()
        t = self.sched.requests[rid]
        want[rid] = async_predicted(self.sched, t, "abort", want[rid])
        self.note("abort-in-flight" if want[rid][8] else "abort")
        self.sched.abort_request(rid)
        self.compare(want, "abort")

    def _counts(self, now: dict[str, tuple], rid: str) -> tuple[int, int]:
        others = [q for r, q in now.items() if r != rid]
        mid_prefill = sum(1 for q in others if q[0] == status_code(Status.RUNNING) and q[4] < q[3] - 1)
        active = sum(1 for q in others if q[0] in (status_code(Status.WAITING), status_code(Status.RUNNING)))
        return mid_prefill, active

    def step(self, data: Any) -> None:
        sched = self.sched
        now = self.states()
        free_before = sched.pool.num_free
        out = sched.schedule()
        entries = sched.in_flight[-1].entries
        # the cut: preemptions, then the chunks in schedule order, then the ignores
        freed = 0
        fencing = hasattr(sched, "fenced")  # DeferredFreeAsyncV1Scheduler holds them while a step writes them
        for p in out.preempted:
            t = sched.requests[p.request_id]
            freed += 0 if fencing and now[t.request_id][8] else now[t.request_id][2]
            self.note("preempt-in-flight" if now[t.request_id][6] else "preempt_recompute")
            now[t.request_id] = async_predicted(sched, t, "preempt_recompute", now[t.request_id])
        after = self.states()
        taken = [after[t.request_id][2] - now[t.request_id][2] for t, *_ in entries]
        assert free_before + freed - sum(taken) == sched.pool.num_free  # ALLOC's count: taken = the table's growth
        for j, (t, tokens, *_) in enumerate(entries):
            q = now[t.request_id]
            action = "admit" if q[0] == status_code(Status.WAITING) else "chunk"
            rest_partial, active = self._counts(now, t.request_id)
            now[t.request_id] = async_predicted(sched, t, action, q, k=tokens, free=sched.pool.num_free + sum(taken[j:]),
                                                rest_partial=rest_partial, rest_active=active)
            self.note(action)
        for rid in out.ignored:
            if rid in now and now[rid][0] == status_code(Status.WAITING):
                now[rid] = async_predicted(sched, sched.requests[rid], "ignore", now[rid])
                self.note("ignore")
        self.compare(now, "schedule()")
        if getattr(sched, "fenced", None):
            self.note("fenced")
        # update(): one process per entry of each step it processes, oldest first
        stopped = frozenset(s for s in sched.samples_of_last_step() if data.draw(st.integers(0, 5)) == 0)
        steps = list(sched.in_flight)
        for n, step in enumerate(steps[:max(0, len(steps) - sched.depth)]):
            stopped_here = stopped if n == len(steps) - 1 else (step.stopped or frozenset())
            for t, *_ in step.entries:
                q = now[t.request_id]
                self.note("process-stale" if q[7] and q[0] != status_code(Status.FINISHED_STOPPED) else "process")
                now[t.request_id] = async_predicted(sched, t, "process", q, stop=int(t.seq_id in stopped_here))
        sched.update(StepOutcome(stopped))
        self.compare(now, "update()")


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_each_async_request_follows_the_generic_rule(data):
    """The async flow's per-request rules (`GenericAsync`, what lifts its rows past the bound) on
    the pipelined reference of any size (pools up to 24 blocks, block sizes 1-4, tables past the
    bound's 3 entries, up to 14 requests), depth 0..2, chunked prefill on or off, thresholds and
    partial-prefill limits; arrivals, aborts with steps in flight, stops: every request ends each
    arrival, abort, ``schedule()`` and ``update()`` where the generic rule says, each guard holding
    with the reference's parameters. Also the fencing reference (``DeferredFreeAsyncV1Scheduler``):
    a request's own state follows the same rules there (its table empties at once; where the blocks
    go, a fence or the pool, is the block layer's, which no encoding models for it)."""
    from reference_impl.async_scheduler import AsyncV1Scheduler, DeferredFreeAsyncV1Scheduler

    fencing = data.draw(st.booleans())
    fields = small_v1_fields(data)
    config = SchedulerConfig(
        **fields, pipeline_depth=data.draw(st.integers(0, 2)),
        max_num_partial_prefills=data.draw(st.sampled_from([0, 1, 2])) if fields["enable_chunked_prefill"] else 0,
    )
    run = AsyncRun((DeferredFreeAsyncV1Scheduler if fencing else AsyncV1Scheduler)(config))
    for j in range(data.draw(st.integers(1, 14))):
        if j < 3 or data.draw(st.integers(0, 2)) == 0:
            run.arrive(f"r{j}", data.draw(st.integers(1, 20)), data.draw(st.integers(1, 12)))
        live = [t.request_id for t in v1_requests(run.sched) if not t.status.is_finished]
        if live and data.draw(st.integers(0, 6)) == 0:
            run.abort(data.draw(st.sampled_from(live)))
        run.step(data)


def test_async_generic_rule_covers_the_in_flight_paths():
    """Fixed runs through the same check, so the paths that matter are compared whatever
    Hypothesis draws: KV pressure at depth 1 (a preemption with a step in flight, its stale
    outcome), an abort with steps in flight at depth 2, and tables past the bound's length."""
    from reference_impl.async_scheduler import AsyncV1Scheduler, DeferredFreeAsyncV1Scheduler

    class Never:
        @staticmethod
        def draw(strategy: Any) -> int:
            return 1

    pressure = SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=1, max_num_seqs=2,
                               max_num_batched_tokens=4, max_model_len=6, watermark=0.0, pipeline_depth=1)
    for make in (AsyncV1Scheduler, DeferredFreeAsyncV1Scheduler):
        run = AsyncRun(make(pressure))
        run.arrive("r0", 3, 5)
        run.arrive("r1", 3, 5)
        for _ in range(6):
            run.step(Never)
        assert run.seen.get("preempt-in-flight", 0) >= 1 and run.seen.get("process-stale", 0) >= 1, run.seen
    assert run.seen.get("fenced", 0) >= 1, run.seen  # the fencing run held the victim's blocks
    big = SchedulerConfig(block_size=1, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=4,
                          max_num_batched_tokens=16, max_model_len=20, pipeline_depth=2)
    run = AsyncRun(AsyncV1Scheduler(big))
    for j in range(4):
        run.arrive(f"r{j}", 5, 8)
    for _ in range(3):
        run.step(Never)
    assert max(len(t.blocks) for t in v1_requests(run.sched)) > 3
    run.abort("r0")
    for _ in range(4):
        run.step(Never)
    assert run.seen.get("abort-in-flight", 0) == 1 and run.seen["process"] >= 8, run.seen
