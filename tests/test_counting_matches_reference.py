"""The per-request effects behind the unbounded STR-002 / BUD-003 cells (spec/proofs/counting.py)
are the reference's: on drawn reference states of any size (both flows), the touched request's
(status, fork flag, live sequences) before and after each action satisfy the encoded relation,
its guard on the seat sums included (with the other requests' seats as the ``rest``); and the
proofs hold, are not vacuous, and need the seat check (a mutant without it fails)."""

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
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.proofs.counting import ACTIONS, Counting, Request, prove_counts, satisfiable
from spec.proofs.encoding import NONE, RUN, WAIT, status_code
from spec.proofs.matrix import prove
from spec.status import Status
from spec.types import Request as Req
from spec.types import StepOutcome
from tests.conftest import examples
from tests.test_parametric_matches_reference import FIXED as BLOCK_FIXED
from tests.test_parametric_matches_reference import UNBOUNDED_TABLES, reference_states


def _holds(flow_name: str, action: str, n: int, m: int, rest: tuple[int, int], pre: tuple, post: tuple) -> bool:
    C = Counting(flow_name)
    a, b = Request("a"), Request("b")
    pins = [C.n == n, C.M == m, C.rest_seats == rest[0], C.rest_seqs == rest[1]]
    for r, (code, forked, live) in ((a, pre), (b, post)):
        pins += [r.st == code, r.forked == z3.BoolVal(forked), r.live == live]
    pins += [a.plen == b.plen, a.mtok == b.mtok, b.plen >= 1, b.mtok >= 1]  # fixed at arrival
    s = z3.Solver()
    s.add(*pins, C.effect(action, a, b), C.local(a), C.local(b))
    return s.check() == z3.sat


def _group(g: Any) -> tuple[int, bool, int]:
    return (status_code(g.status), bool(g.forked), len(g.live_seqs()))


@settings(max_examples=examples(15), deadline=None, database=None)
@given(sched=reference_states(), data=st.data())
def test_v0_request_effects(sched, data):
    for _ in range(data.draw(st.integers(1, 10))):
        options = []
        for group in all_groups_of(sched):
            for action in ACTIONS["v0"][1:]:
                seq_id = next((s.seq_id for s in group.live_seqs()), None) if action == "finish" else None
                if reference_guard(sched, action, group, seq_id, UNBOUNDED_TABLES):
                    weight = 1 if action in ("preempt_recompute", "abort", "ignore", "finish") else 4
                    options += [(action, group.request_id, seq_id)] * weight
        if not options:
            return
        action, rid, seq_id = data.draw(st.sampled_from(options))
        group = sched.groups[rid]
        others = [g for g in all_groups_of(sched) if g is not group and g.status is Status.RUNNING]
        rest = (sum(g.max_running_seqs() for g in others), sum(len(g.live_seqs()) for g in others))
        pre = _group(group)
        after = copy.deepcopy(sched)
        apply_action(after, action, after.groups[rid], seq_id)
        post = _group(after.groups[rid])
        assert _holds("v0", action, group.request.n, sched.config.max_num_seqs, rest, pre, post), \
            f"{action}: {pre} -> {post}, rest {rest}"
        sched = after


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_v1_request_effects(data):
    chunked = data.draw(st.booleans())
    sched = V1Scheduler(SchedulerConfig(
        block_size=data.draw(st.integers(1, 4)), num_gpu_blocks=data.draw(st.integers(4, 24)), num_cpu_blocks=0,
        max_num_seqs=data.draw(st.integers(1, 6)), max_num_batched_tokens=data.draw(st.integers(6, 32)),
        max_model_len=data.draw(st.integers(4, 40)), enable_chunked_prefill=chunked))
    for j in range(data.draw(st.integers(0, 10))):
        if j < 3 or data.draw(st.integers(0, 2)) == 0:  # a few requests arrive first
            sched.add_request(Req(f"r{j}", prompt_len=data.draw(st.integers(1, 20)), max_tokens=data.draw(st.integers(1, 12))))
        out = sched.schedule()
        sched.update(StepOutcome(frozenset(s.seq_id for s in out.scheduled if data.draw(st.integers(0, 9)) == 0)))
    for _ in range(data.draw(st.integers(1, 8))):
        options = [(a, t.request_id, k) for t in v1_requests(sched) for a in ACTIONS["v1"][1:]
                   for k in ((1, 3) if a in ("admit", "chunk") else (1,))
                   if v1_reference_guard(sched, a, t, k, UNBOUNDED_TABLES)]
        if not options:
            return
        action, rid, k = data.draw(st.sampled_from(options))
        t = sched.requests[rid]
        running = [r for r in v1_requests(sched) if r is not t and r.status is Status.RUNNING]
        rest = (len(running), len(running))

        def state(r: Any) -> tuple[int, bool, int]:
            return (status_code(r.status), True, 0 if r.status.is_finished else 1)

        pre = state(t)
        v1_apply_action(sched, action, t, k, data.draw(st.integers(0, 4)) == 0)
        assert _holds("v1", action, 1, sched.config.max_num_seqs, rest, pre, state(t)), f"{action}: {pre} -> {state(t)}"


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_async_request_effects(data):
    """The pipelined reference of any size, depth 0..2: each request's (status, live) across each
    cut action of a step (preemptions, then chunks in schedule order with the requests running
    then as the rest, then ignores; an ``update()``'s outcomes, composed: a run of process steps
    leaves a request where it was or ends it, as one does) satisfies the encoded relation."""
    from reference_impl.async_scheduler import AsyncV1Scheduler

    sched = AsyncV1Scheduler(SchedulerConfig(
        block_size=data.draw(st.integers(1, 4)), num_gpu_blocks=data.draw(st.integers(4, 24)), num_cpu_blocks=0,
        max_num_seqs=data.draw(st.integers(1, 6)), max_num_batched_tokens=data.draw(st.integers(6, 32)),
        max_model_len=data.draw(st.integers(4, 40)), enable_chunked_prefill=data.draw(st.booleans()),
        pipeline_depth=data.draw(st.integers(0, 2))))
    m = sched.config.max_num_seqs

    def state(r: Any) -> tuple[int, bool, int]:
        return (status_code(r.status), True, 0 if r.status.is_finished else 1)

    def check(action: str, now: dict[str, tuple], rid: str, post: tuple) -> None:
        running = sum(1 for r, q in now.items() if r != rid and q[0] == RUN)
        assert _holds("async", action, 1, m, (running, running), now[rid], post), f"{action}: {now[rid]} -> {post}"
        now[rid] = post

    for j in range(data.draw(st.integers(1, 14))):
        if j < 3 or data.draw(st.integers(0, 2)) == 0:
            sched.add_request(Req(f"r{j}", prompt_len=data.draw(st.integers(1, 20)), max_tokens=data.draw(st.integers(1, 12))))
            t = sched.requests[f"r{j}"]
            assert _holds("async", "add", 1, m, (0, 0), (NONE, False, 0), state(t))
        now = {t.request_id: state(t) for t in v1_requests(sched)}
        live = [r for r, q in now.items() if q[0] in (WAIT, RUN)]
        if live and data.draw(st.integers(0, 6)) == 0:
            rid = data.draw(st.sampled_from(live))
            sched.abort_request(rid)
            check("abort", now, rid, state(sched.requests[rid]))
        out = sched.schedule()
        for p in out.preempted:
            check("preempt_recompute", now, p.request_id, state(sched.requests[p.request_id]))
        for t, *_ in sched.in_flight[-1].entries:
            check("admit" if now[t.request_id][0] == WAIT else "chunk", now, t.request_id, state(t))
        for rid in out.ignored:
            if rid in now and now[rid][0] == WAIT:
                check("ignore", now, rid, state(sched.requests[rid]))
        steps = list(sched.in_flight)
        processed = {t.request_id for step in steps[:max(0, len(steps) - sched.depth)] for t, *_ in step.entries}
        sched.update(StepOutcome(frozenset(s for s in sched.samples_of_last_step() if data.draw(st.integers(0, 5)) == 0)))
        for rid in processed:
            check("process", now, rid, state(sched.requests[rid]))


@pytest.mark.parametrize("flow_name", ["v0", "v1", "async"])
def test_counts_are_proved_for_every_number_of_requests(flow_name):
    results = prove_counts(flow_name)
    assert all(r == "proved" for r in results.values()), results
    assert all(satisfiable(flow_name, a) for a in ACTIONS[flow_name])


def test_without_the_seat_check_admission_breaks_str002():
    """Teeth: the relation without the reference's seat check does not prove STR-002."""
    C = Counting("v0")
    a, b = Request("a"), Request("b")
    s = z3.Solver()
    s.add(C.n >= 1, C.M >= 1, C.rest_seqs >= 0, C.rest_seqs <= C.rest_seats, C.local(a), *C.rows(a).values(),
          a.st == WAIT, a.forked, b.st == RUN, b.forked, b.live == a.live, C.local(b), z3.Not(C.rows(b)["STR-002"]))
    assert s.check() == z3.sat


def test_count_rows_are_unbounded_in_the_matrix():
    m = prove(invariants=["STR-002", "BUD-003", "WF", "ADM-002"], actions=["fork", "swap_in"])
    for c in m.cells:
        assert c.result == "proved"
        assert c.scope == "unbounded", c  # ADM-002 too, by spec/proofs/writes.py's allocation counting


def test_unborn_statusstatus_code():
    assert NONE == 0


@pytest.mark.parametrize("action, make", BLOCK_FIXED, ids=[f[0] for f in BLOCK_FIXED])
def test_fixed_v0_request_effects(action, make):
    sched = make()
    group = sched.groups["a"]
    assert reference_guard(sched, action, group, None, UNBOUNDED_TABLES)
    pre = _group(group)
    apply_action(sched, action, group)
    assert _holds("v0", action, group.request.n, sched.config.max_num_seqs, (0, 0), pre, _group(group))
