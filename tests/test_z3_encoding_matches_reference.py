"""The Z3 encoding is checked against the code that runs.

For Hypothesis-drawn reference states (random small configs driven through random traces), the
symbolic pre-state is pinned to the concrete one; for every action and every request (and every
sequence, for ``finish``) the test checks that the encoding's guard holds exactly when the
reference would take the action, and that the symbolic post-state is unique and equal to the
reference's after the reference performs the action with its own methods. A divergence fails:
otherwise the proofs would be about a model nobody runs.
"""

from __future__ import annotations

import copy
import json

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.selftest.proof_bridge import (
    all_groups_of,
    apply_action,
    concrete_state,
    config_constants,
    layout_of,
    reference_guard,
)
from reference_impl.scheduler import Scheduler
from spec.config import SchedulerConfig
from spec.proofs.bound import DEFAULT, Bound
from spec.proofs.encoding import ACTIONS, Encoder, pin_config, pin_state, read_state
from spec.proofs.properties import STATE_INVARIANTS, grp_ok
from spec.types import Request, StepOutcome
from tests.conftest import examples
from tests.encoded_actions import encoded_actions

# The default proof bound with one more request slot, so single-sequence requests fit side by side.
BOUND = Bound(**{**DEFAULT.to_dict(), "groups": 3})


_encoded = encoded_actions(lambda: Encoder(BOUND), grp_ok, STATE_INVARIANTS)


@st.composite
def reference_states(draw):
    max_num_seqs = draw(st.sampled_from([1, 2, 3, 3]))
    config = SchedulerConfig(
        block_size=BOUND.block_size, num_gpu_blocks=BOUND.gpu_blocks, num_cpu_blocks=BOUND.cpu_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=draw(st.integers(max_num_seqs, 8)),
        max_model_len=draw(st.sampled_from([3, 5, 6, 6])),
        watermark=draw(st.sampled_from([0.0, 0.25, 0.5])),
        preemption_mode=draw(st.sampled_from(["auto", "swap", "recompute"])),
        policy=draw(st.sampled_from(["fcfs", "priority"])),
    )
    sched = Scheduler(config)
    steps = draw(st.sampled_from([0, 1, 1, 2, 2, 3, 4, 6]))
    slots_left, made = BOUND.seqs, 0

    def arrive():
        nonlocal made, slots_left
        n = slots_left if made == BOUND.groups - 1 else draw(st.sampled_from([1, 1, 2][: 3 if slots_left > 2 else 2]))
        sched.add_request(Request(f"r{made}", prompt_len=draw(st.sampled_from([1, 2, 3, 4, 2, 7])), max_tokens=draw(st.integers(1, 8)),
                                  n=n, priority=draw(st.integers(0, 2))))
        made += 1
        slots_left -= n

    for _ in range(steps):
        if made < BOUND.groups and slots_left > 0 and draw(st.integers(0, 3)) > 0:
            arrive()
        live = [g for g in sched.groups.values() if not g.status.is_finished]
        if live and draw(st.integers(0, 9)) == 0:
            sched.abort_request(draw(st.sampled_from(sorted(g.request_id for g in live))))
        out = sched.schedule()
        stopped = frozenset(s.seq_id for s in out.scheduled if draw(st.integers(0, 9)) == 0)
        sched.update(StepOutcome(stopped))
    if made < BOUND.groups and slots_left > 0 and draw(st.integers(0, 3)) > 0:
        arrive()  # one that has not been scheduled yet
    return sched


def _check(sched: Scheduler, action: str, group_index: int, seq_slot: int | None, prompt: int,
           check_invariants: bool = False) -> str:
    layout = layout_of(sched, BOUND)
    if layout is None:
        return "skip"
    pre = concrete_state(sched, BOUND, layout)
    if pre is None:
        return "skip"
    rid = layout.groups[group_index]
    group = sched.groups.get(rid) if rid else None
    seq_id = None
    new_request = None
    if action == "add":
        if rid or group_index != len(sched.groups):
            return "skip"
        n = sum(1 for j, _ in layout.slots if j == group_index)
        if n == 0:
            return "skip"
        new_request = Request(f"r{len(sched.groups)}", prompt_len=prompt, max_tokens=1 + prompt % 3, n=n)
    elif group is None:
        return "skip"
    if action == "finish":
        if seq_slot is None or layout.slots[seq_slot][0] != group_index or layout.slots[seq_slot][1] is None:
            return "skip"
        seq_id = layout.slots[seq_slot][1]
    wanted = reference_guard(sched, action, group, seq_id, BOUND)
    enc = _encoded(action)
    solver, ae = enc.solver, enc.ae
    solver.push()
    try:
        solver.add(*pin_state(enc.enc, ae.pre, pre), *pin_config(enc.enc, config_constants(sched.config)))
        solver.add(ae.params["group"] == group_index)
        if "seq" in ae.params:
            solver.add(ae.params["seq"] == (seq_slot if seq_slot is not None else 0))
        if "prompt_len" in ae.params:
            solver.add(ae.params["prompt_len"] == prompt, ae.params["max_tokens"] == 1 + prompt % 3)
        if check_invariants:  # the concrete pre-state satisfies every state invariant (the reference reached it)
            solver.push()
            solver.add(z3.Not(enc.invariants_of_pre))
            assert solver.check() == z3.unsat, f"a reached reference state violates the Z3 invariants: {json.dumps(pre)}"
            solver.pop()
        solver.add(ae.guard)
        got = solver.check()
        assert got in (z3.sat, z3.unsat), got
        assert (got == z3.sat) == wanted, (
            f"{action} on group {group_index}: encoding guard {got}, reference guard {wanted}; pre {json.dumps(pre)}"
        )
        if not wanted:
            return "guard-false"
        post_sym = read_state(solver.model(), enc.enc, ae.post)
        after = copy.deepcopy(sched)
        apply_action(after, action, after.groups.get(rid) if rid else None, seq_id, new_request)
        post_ref = concrete_state(after, BOUND, layout_of(after, BOUND) or layout)
        assert post_ref is not None
        assert _normal(post_sym) == _normal(post_ref), (
            f"{action} on group {group_index} diverges\npre {json.dumps(pre)}\nz3  {json.dumps(post_sym)}\n"
            f"ref {json.dumps(post_ref)}"
        )
        solver.add(z3.Not(z3.And(pin_state(enc.enc, ae.post, post_ref))))
        assert solver.check() == z3.unsat, f"{action}: the encoding allows a second post-state"
        return "compared"
    finally:
        solver.pop()


def _normal(state: dict) -> dict:
    """Compare what exists: an unborn slot has no token counts."""
    out = copy.deepcopy(state)
    for q in out["seqs"]:
        if q["status"] == "NONE":
            q["tokens"] = q["computed"] = 0
    for g in out["groups"]:
        if g["status"] == "NONE":
            g["forked"] = False
            g["prompt_len"] = g["max_tokens"] = 0
    return out


def _walk(sched: Scheduler, data, length: int) -> None:
    """Take ``length`` matrix actions the reference allows, chosen by Hypothesis (reaches the
    swapped and preempted states a short trace rarely leaves behind)."""
    for _ in range(length):
        options = []
        for group in all_groups_of(sched):
            for action in ("decode", "preempt_recompute", "swap_out", "swap_in", "admit", "fork"):
                if reference_guard(sched, action, group, None, BOUND):
                    options.append((action, group.request_id))
        layout = layout_of(sched, BOUND)
        spare = sum(1 for j, _ in layout.slots if j == len(sched.groups)) if layout else 0
        if spare and len(sched.groups) < BOUND.groups:
            options.append(("add", ""))
        if not options:
            return
        action, rid = data.draw(st.sampled_from(options))
        if action == "add":
            n = data.draw(st.integers(1, spare)) if len(sched.groups) < BOUND.groups - 1 else spare
            sched.add_request(Request(f"r{len(sched.groups)}", prompt_len=data.draw(st.integers(1, 4)), max_tokens=8, n=n))
        else:
            apply_action(sched, action, sched.groups[rid])



@settings(max_examples=examples(40), database=None)
@given(sched=reference_states(), data=st.data(), walk=st.integers(0, 6), prompt=st.integers(1, 7),
       seq_slot=st.integers(0, BOUND.seqs - 1))
def test_encoding_matches_reference(sched, data, walk, prompt, seq_slot):
    _walk(sched, data, walk)
    for action in ACTIONS:
        refused = 0
        for g in range(BOUND.groups):
            for slot in range(BOUND.seqs) if action == "finish" else (seq_slot,):
                if refused and not _takes(sched, action, g, slot):
                    continue  # one refused case per action and state is enough for the guard check
                result = _check(sched, action, g, slot, prompt, check_invariants=action == "abort" and g == 0)
                refused += result == "guard-false"


def _takes(sched: Scheduler, action: str, g: int, seq_slot: int) -> bool:
    layout = layout_of(sched, BOUND)
    if layout is None or not layout.groups[g]:
        return action == "add"
    group = sched.groups[layout.groups[g]]
    seq_id = layout.slots[seq_slot][1] if layout.slots[seq_slot][0] == g else None
    return reference_guard(sched, action, group, seq_id, BOUND)


def _fixed(*requests: Request, actions: tuple[tuple[str, str], ...] = ()) -> Scheduler:
    sched = Scheduler(SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=3, max_num_seqs=3,
                                      max_num_batched_tokens=8, max_model_len=6, preemption_mode="swap"))
    for r in requests:
        sched.add_request(r)
    for action, rid in actions:
        apply_action(sched, action, sched.groups[rid])
    return sched


FIXED = [  # (state, action, group index, seq slot): every action compared at least once, whatever Hypothesis draws
    (lambda: _fixed(), "add", 0, 0),
    (lambda: _fixed(Request("a", 3)), "admit", 0, 0),
    (lambda: _fixed(Request("a", 3, n=2)), "fork", 0, 0),
    (lambda: _fixed(Request("a", 3, n=2), actions=(("fork", "a"),)), "decode", 0, 0),
    (lambda: _fixed(Request("a", 3), actions=(("admit", "a"),)), "preempt_recompute", 0, 0),
    (lambda: _fixed(Request("a", 3, n=2), actions=(("fork", "a"),)), "swap_out", 0, 0),
    (lambda: _fixed(Request("a", 1), actions=(("admit", "a"), ("swap_out", "a"))), "swap_in", 0, 0),
    (lambda: _fixed(Request("a", 3, n=2), actions=(("fork", "a"),)), "finish", 0, 1),
    (lambda: _fixed(Request("a", 3), actions=(("admit", "a"),)), "abort", 0, 0),
    (lambda: _fixed(Request("a", 7)), "ignore", 0, 0),
]


@pytest.mark.parametrize("make, action, group, slot", FIXED, ids=[f[1] for f in FIXED])
def test_each_action_on_a_fixed_state(make, action, group, slot):
    assert _check(make(), action, group, slot, 3, check_invariants=True) == "compared"


def test_reached_states_are_covered():
    """all_groups_of is the arrival order the layout uses."""
    sched = Scheduler(SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=3, max_num_seqs=2,
                                      max_num_batched_tokens=8, max_model_len=6))
    sched.add_request(Request("a", 3, n=2))
    sched.add_request(Request("b", 1))
    assert [g.request_id for g in all_groups_of(sched)] == ["a", "b"]
    layout = layout_of(sched, BOUND)
    assert layout is not None and layout.slots == [(0, "a#0"), (0, None), (1, "b#0")]
