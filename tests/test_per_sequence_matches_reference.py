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

from conformance.proof_bridge import all_groups_of, apply_action, reference_guard
from reference_impl.scheduler import Scheduler
from spec.proofs.encoding import CPU, FIN, GPU, NODEV, NONE, RUN, SWAP, WAIT
from spec.proofs.matrix import prove
from spec.proofs.per_sequence import ACTIONS, MUTANTS, ROWS, Generic, Seq, hypotheses_satisfiable, prove_sequences
from spec.status import Status
from spec.types import Request
from tests.conftest import examples
from tests.test_parametric_matches_reference import FIXED as BLOCK_FIXED
from tests.test_parametric_matches_reference import UNBOUNDED_TABLES, _sched, reference_states

_CODE = {Status.WAITING: WAIT, Status.RUNNING: RUN, Status.SWAPPED: SWAP}


def _status(status: Status) -> int:
    return FIN if status.is_finished else _CODE[status]


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
    return (_status(seq.status), dv, tl, seq.num_tokens, seq.num_computed)


def predicted(sched: Scheduler, group: Any, action: str, q: tuple, parent: tuple, first: bool) -> tuple:
    G = Generic()
    sq, sp = G.seq("q"), G.seq("p")
    guard, post = G.effect(action, sq, sp)
    pins = [(a, z3.IntVal(v)) for a, v in zip((sq.st, sq.dv, sq.tl, sq.nt, sq.nc), q, strict=True)]
    pins += [(a, z3.IntVal(v)) for a, v in zip((sp.st, sp.dv, sp.tl, sp.nt, sp.nc), parent, strict=True)]
    cfg = sched.config
    pins += [(G.bs, z3.IntVal(cfg.block_size)), (G.ML, z3.IntVal(cfg.max_model_len)),
             (G.plen, z3.IntVal(group.request.prompt_len)), (G.mtok, z3.IntVal(group.request.max_tokens)),
             (G.gs, z3.IntVal(_status(group.status))), (G.forked, z3.BoolVal(group.forked)),
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
    for g in all_groups_of(after_sched):
        if g.request_id != group.request_id:
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
    assert {(r.row, r.action) for r in results} == {(row, a) for row in ROWS for a in ("init", *ACTIONS)}


@pytest.mark.parametrize("action", ACTIONS)
def test_hypotheses_are_satisfiable(action):
    assert hypotheses_satisfiable(action)


@pytest.mark.parametrize("mutant, row", [("recompute-keeps-computed", "CAP-003"), ("abort-no-free", "RES-004")])
def test_per_sequence_mutants_are_caught_by_an_unbounded_cell(mutant, row):
    action = MUTANTS[mutant]
    m = prove(mutant=mutant, actions=[action], invariants=[row])
    assert [row, action] in m.parametric["cells"]
    assert m.cell(row, action).result == "counterexample"


def test_per_sequence_rows_are_unbounded_in_the_v0_matrix():
    m = prove(invariants=["RES-001", "CAP-001", "LEN-001", "QUE-002"], actions=["decode", "swap_in"])
    for c in m.cells:
        assert c.result == "proved"
        assert c.scope == ("bounded" if c.invariant == "QUE-002" else "unbounded"), c


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
