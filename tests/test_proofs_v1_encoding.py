"""The v1 (chunked prefill) Z3 encoding is checked against reference_impl/v1_scheduler.py.

For Hypothesis-drawn V1 reference states (random small configs, chunked prefill on or off, a
threshold and a partial-prefill limit, prefix caching off, driven through random steps and then
a random walk of matrix actions), the symbolic pre-state is pinned to the concrete one; for every
action, request and chunk size the test checks that the encoding's guard holds exactly when the
reference would take the action, and that the reference's post-state (after its own
``_allocate`` / ``apply_outcome`` / ``_preempt`` / ``abort_request`` / ``_ignore_if_infeasible``)
is one the encoding allows, unique except for *which* free blocks were taken (the encoding lets
a chunk take any free block: it over-approximates V1's free-queue order).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.selftest.proof_bridge import (
    v1_apply_action,
    v1_concrete_state,
    v1_config_constants,
    v1_reference_guard,
    v1_requests,
)
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.proofs.chunked import V1_ACTIONS, V1_BOUND, V1_STATE_INVARIANTS, ChunkedEncoder, grp_ok_v1
from spec.proofs.encoding import pin_state, read_state
from spec.types import Request, StepOutcome
from tests.conftest import examples
from tests.encoded_actions import encoded_actions

BOUND = V1_BOUND


_encoded = encoded_actions(lambda: ChunkedEncoder(BOUND), grp_ok_v1, V1_STATE_INVARIANTS)


def _config(draw) -> SchedulerConfig:
    max_num_seqs = draw(st.sampled_from([1, 2, 3, 3]))
    chunked = draw(st.booleans())
    return SchedulerConfig(
        block_size=BOUND.block_size, num_gpu_blocks=BOUND.gpu_blocks, num_cpu_blocks=BOUND.cpu_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=draw(st.integers(max_num_seqs, 6)),
        max_model_len=draw(st.sampled_from([3, 5, 6, 7])), watermark=draw(st.sampled_from([0.0, 0.25, 0.5])),
        preemption_mode="recompute", policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 2])) if chunked else 0,
        max_num_partial_prefills=draw(st.sampled_from([0, 0, 1, 2])) if chunked else 0,
    )


@st.composite
def v1_states(draw):
    sched = V1Scheduler(_config(draw))
    made = 0

    def arrive():
        nonlocal made
        sched.add_request(Request(f"r{made}", prompt_len=draw(st.sampled_from([1, 2, 3, 4, 5, 7])),
                                  max_tokens=draw(st.integers(1, 6)), priority=draw(st.integers(0, 2))))
        made += 1

    for _ in range(draw(st.sampled_from([0, 1, 2, 3, 4, 6]))):
        if made < BOUND.seqs and draw(st.integers(0, 2)) > 0:
            arrive()
        live = [t for t in sched.requests.values() if not t.status.is_finished]
        if live and draw(st.integers(0, 9)) == 0:
            sched.abort_request(draw(st.sampled_from(sorted(t.request_id for t in live))))
        out = sched.schedule()
        stopped = frozenset(s.seq_id for s in out.scheduled if draw(st.integers(0, 9)) == 0)
        sched.update(StepOutcome(stopped))
    if made < BOUND.seqs and draw(st.integers(0, 2)) > 0:
        arrive()
    return sched


def _check(sched: V1Scheduler, action: str, g: int, tokens: int, stop: bool, prompt: int,
           check_invariants: bool = False) -> str:
    pre = v1_concrete_state(sched, BOUND)
    if pre is None:
        return "skip"
    tracked = v1_requests(sched)
    t = tracked[g] if g < len(tracked) else None
    new_request = None
    if action == "add":
        if g != len(tracked):
            return "skip"
        new_request = Request(f"r{g}", prompt_len=prompt, max_tokens=1 + prompt % 3)
    elif t is None:
        return "skip"
    wanted = v1_reference_guard(sched, action, t, tokens, BOUND)
    enc = _encoded(action)
    solver, ae = enc.solver, enc.ae
    solver.push()
    try:
        solver.add(*pin_state(enc.enc, ae.pre, pre), *enc.enc.pin_config(v1_config_constants(sched.config)))
        solver.add(ae.params["group"] == g)
        if "tokens" in ae.params:
            solver.add(ae.params["tokens"] == tokens, ae.params["stop"] == int(stop))
        if "prompt_len" in ae.params:
            solver.add(ae.params["prompt_len"] == prompt, ae.params["max_tokens"] == 1 + prompt % 3)
        if check_invariants:  # a state the reference reached satisfies every v1 state invariant
            solver.push()
            solver.add(z3.Not(enc.invariants_of_pre))
            assert solver.check() == z3.unsat, f"a reached V1 state violates the Z3 invariants: {json.dumps(pre)}"
            solver.pop()
        solver.add(ae.guard)
        got = solver.check()
        assert got in (z3.sat, z3.unsat), got
        assert (got == z3.sat) == wanted, (
            f"{action} on request {g} (k={tokens}): encoding guard {got}, reference guard {wanted}; pre {json.dumps(pre)}; "
            f"config {v1_config_constants(sched.config)}"
        )
        if not wanted:
            return "guard-false"
        after = copy.deepcopy(sched)
        v1_apply_action(after, action, v1_requests(after)[g] if t is not None else None, tokens, stop, new_request)
        post_ref = v1_concrete_state(after, BOUND)
        assert post_ref is not None
        solver.push()
        solver.add(*pin_state(enc.enc, ae.post, post_ref))
        assert solver.check() == z3.sat, (
            f"{action} on request {g} (k={tokens}): the reference's post-state is not one the encoding allows\n"
            f"pre {json.dumps(pre)}\nref {json.dumps(post_ref)}"
        )
        solver.pop()
        # unique except for which free blocks were taken
        assert solver.check() == z3.sat
        sym = read_state(solver.model(), enc.enc, ae.post)
        assert _shape(sym) == _shape(post_ref), f"{action}: shapes differ\nz3  {json.dumps(sym)}\nref {json.dumps(post_ref)}"
        post = ae.post
        same = [z3.And(post.sstat[s] == post.sstat[s], True) for s in range(enc.enc.S)]
        for s, q in enumerate(post_ref["seqs"]):
            if q["status"] == "NONE":
                continue
            same += [post.ntok[s] == q["tokens"], post.ncomp[s] == q["computed"], post.tlen[s] == len(q["table"])]
        same.append(enc.enc.free_count(post.gpu) == sum(post_ref["gpu_free"]))
        solver.add(z3.Not(z3.And(same)))
        assert solver.check() == z3.unsat, f"{action}: the encoding allows another post-state shape"
        return "compared"
    finally:
        solver.pop()


def _shape(state: dict) -> tuple:
    """A state without block ids: statuses, queues, token counts, table lengths, free count."""
    seqs = tuple((q["status"], q["device"], len(q["table"]), q["tokens"] if q["status"] != "NONE" else 0,
                  q["computed"] if q["status"] != "NONE" else 0) for q in state["seqs"])
    groups = tuple((g["status"], tuple(g["queues"])) for g in state["groups"])
    return seqs, groups, sum(state["gpu_free"])


def _walk(sched: V1Scheduler, data, length: int) -> None:
    """Take ``length`` matrix actions the reference allows, chosen by Hypothesis."""
    for _ in range(length):
        options = []
        for t in v1_requests(sched):
            for action in ("admit", "chunk", "preempt_recompute"):
                for k in range(1, 5):
                    if v1_reference_guard(sched, action, t, k, BOUND):
                        options.append((action, t.request_id, k))
        if len(sched.requests) < BOUND.seqs:
            options.append(("add", "", 0))
        if not options:
            return
        action, rid, k = data.draw(st.sampled_from(options))
        if action == "add":
            n = len(sched.requests)
            sched.add_request(Request(f"r{n}", prompt_len=data.draw(st.integers(1, 6)), max_tokens=data.draw(st.integers(1, 6))))
            sched._rejected = []
        else:
            v1_apply_action(sched, action, sched.requests[rid], k, data.draw(st.booleans()))


@settings(max_examples=examples(30), database=None, deadline=None)
@given(sched=v1_states(), data=st.data(), walk=st.integers(0, 5), prompt=st.integers(1, 8),
       stop=st.booleans())
def test_v1_encoding_matches_reference(sched, data, walk, prompt, stop):
    _walk(sched, data, walk)
    for action in V1_ACTIONS:
        for g in range(BOUND.seqs):
            for k in (1, 2, 3, 4) if action in ("admit", "chunk") else (1,):
                _check(sched, action, g, k, stop, prompt, check_invariants=action == "abort" and g == 0)


def _fixed(config: SchedulerConfig, *requests: Request, actions: tuple[tuple[str, str, int], ...] = ()) -> V1Scheduler:
    sched = V1Scheduler(config)
    for r in requests:
        sched.add_request(r)
    for action, rid, k in actions:
        v1_apply_action(sched, action, sched.requests[rid], k)
    return sched


CHUNKED = SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=1, max_num_seqs=2, max_num_batched_tokens=4,
                          max_model_len=7, watermark=0.0, preemption_mode="recompute", enable_chunked_prefill=True,
                          long_prefill_token_threshold=2, max_num_partial_prefills=1)
FIXED = [  # (state, action, request, tokens): every action compared at least once, whatever Hypothesis draws
    (lambda: _fixed(CHUNKED), "add", 0, 1),
    (lambda: _fixed(CHUNKED, Request("a", 5)), "admit", 0, 3),  # one request: no threshold
    (lambda: _fixed(CHUNKED, Request("a", 5), Request("b", 2), actions=(("admit", "a", 2),)), "chunk", 0, 2),
    (lambda: _fixed(CHUNKED, Request("a", 5), actions=(("admit", "a", 3),)), "chunk", 0, 2),  # completes: samples
    (lambda: _fixed(CHUNKED, Request("a", 5), actions=(("admit", "a", 3),)), "preempt_recompute", 0, 1),
    (lambda: _fixed(CHUNKED, Request("a", 5), actions=(("admit", "a", 3),)), "abort", 0, 1),
    (lambda: _fixed(replace(CHUNKED, watermark=0.25), Request("a", 7, max_tokens=2)), "ignore", 0, 1),  # never fits
]


@pytest.mark.parametrize("make, action, g, tokens", FIXED, ids=[f"{f[1]}-{i}" for i, f in enumerate(FIXED)])
def test_each_v1_action_on_a_fixed_state(make, action, g, tokens):
    assert _check(make(), action, g, tokens, False, 3, check_invariants=True) == "compared"


@settings(max_examples=examples(60), database=None, deadline=None)
@given(sched=v1_states(), data=st.data(), steps=st.integers(1, 5))
def test_a_v1_step_is_a_sequence_of_matrix_actions(sched, data, steps):
    """One whole schedule() + update() of the V1 reference equals, up to block ids, a sequence of
    matrix actions each allowed by its guard: the step's preemptions, then its chunks in
    schedule order (``chunk`` for a request that was running, ``admit`` for one admitted now),
    then its ignores. With the test above (each guarded action is the reference's), every state
    the reference reaches between steps is one the v1 matrix covers. Checked over several
    consecutive steps."""
    for _ in range(steps):
        if not _step_is_composed(sched, data):
            return


def _step_is_composed(sched: V1Scheduler, data) -> bool:
    if len(sched.requests) < BOUND.seqs and data.draw(st.booleans()):
        # a later, more urgent arrival is what makes a priority victim give back a chunk it was given
        sched.add_request(Request(f"r{len(sched.requests)}", prompt_len=data.draw(st.integers(1, 7)),
                                  max_tokens=data.draw(st.integers(1, 6)), priority=data.draw(st.integers(0, 2))))
    if v1_concrete_state(sched, BOUND) is None:
        return False
    composed = copy.deepcopy(sched)
    composed._rejected = []  # already finished in the state; schedule() only reports them
    out = sched.schedule()
    stopped = frozenset(s.seq_id for s in out.scheduled if data.draw(st.integers(0, 4)) == 0)
    sched.update(StepOutcome(stopped))
    after = v1_concrete_state(sched, BOUND)
    if after is None:
        return False
    for item in out.scheduled:  # a chunk whose table outgrows the bound is outside the matrix
        t = composed.requests[item.request_id]
        if sched.config.blocks_for(t.num_computed + item.num_tokens) > BOUND.table_len:
            return False

    def take(action: str, rid: str, tokens: int = 1, stop: bool = False) -> None:
        t = composed.requests[rid]
        assert v1_reference_guard(composed, action, t, tokens, BOUND), (
            f"step {out.step}: {action} of {rid} (k={tokens}) is not allowed in the composed sequence"
        )
        v1_apply_action(composed, action, t, tokens, stop)

    for p in out.preempted:
        take("preempt_recompute", p.request_id)
    for item in out.scheduled:
        action = "chunk" if composed.requests[item.request_id].status.name == "RUNNING" else "admit"
        take(action, item.request_id, item.num_tokens, item.seq_id in stopped)
    for rid in out.ignored:
        if not composed.requests[rid].status.is_finished:
            take("ignore", rid)
    composed_state = v1_concrete_state(composed, BOUND)
    assert composed_state is not None
    assert _shape(composed_state) == _shape(after), (
        f"the composed actions end elsewhere\nstep {json.dumps(_shape(after))}\nseq  {json.dumps(_shape(composed_state))}"
    )
    return True
