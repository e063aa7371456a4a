"""The allocation-counting argument of spec/proofs/writes.py, held to the reference (issue 19).

v0's ALLOC and ADM-002 are proved for every size by counting: each action takes at most ``N``
blocks from a pool (``N`` the sum its guard bounds), all of them before it frees any block of that
pool, and copy-on-write drops a reference only to a block that stays held. Here the reference
scheduler runs on Hypothesis-drawn states of any size (the parametric tie test's states: pools up
to 24 blocks, block sizes 1-4, up to 6 requests with n up to 3), its block pools' calls counted,
and for every action the guard allows: the blocks it takes from each pool
are at most the argument's ``N`` for that action, and none is taken after a block of that pool
was freed in the same action (a copy-on-write between two allocations frees nothing); and, for
COW-001's argument, once a decode's (or swap-in's) appends are done every block a sequence's
token is written to has count 1. For the swap-in, ``N`` is the distinct full CPU blocks
plus one per live sequence, the reference's own ``blocks_to_swap_in``.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.selftest.proof_bridge import all_groups_of, apply_action, reference_guard
from reference_impl.scheduler import Scheduler
from spec.proofs.encoding import CPU, GPU
from tests.conftest import examples
from tests.test_parametric_matches_reference import UNBOUNDED_TABLES, reference_states


def _bound(sched: Scheduler, action: str, group: Any) -> tuple[int, int]:
    """The argument's N for (GPU, CPU): what the action's guard bounds."""
    bm = sched.block_manager
    bs = sched.config.block_size
    live = group.live_seqs()
    if action in ("admit", "fork"):
        return sum(-(-s.num_tokens // bs) for s in live), 0
    if action == "decode":
        return len(live), 0
    if action == "swap_out":
        return 0, len({b for s in live for b in bm.gpu_tables[s.seq_id]})
    if action == "swap_in":
        return bm.blocks_to_swap_in(group), 0
    return 0, 0


def _check(sched: Scheduler, action: str, group: Any, seq_id: str | None) -> dict[str, int]:
    n_gpu, n_cpu = _bound(sched, action, group)
    after = copy.deepcopy(sched)
    bm = after.block_manager
    counts = {GPU: bm.gpu.ref_counts, CPU: bm.cpu.ref_counts}
    taken = {GPU: 0, CPU: 0}
    freed_before = {GPU: False, CPU: False}
    real = {d: pool.allocate for d, pool in ((GPU, bm.gpu), (CPU, bm.cpu))}
    real_decref = {d: pool.decref for d, pool in ((GPU, bm.gpu), (CPU, bm.cpu))}

    def allocating(d: int) -> Any:
        def allocate(*args: Any, **kw: Any) -> Any:
            assert not freed_before[d], f"{action}: a block of pool {d} was freed before an allocation"
            taken[d] += 1
            return real[d](*args, **kw)
        return allocate

    def decrefing(d: int) -> Any:
        def decref(block: int, *args: Any, **kw: Any) -> Any:
            out = real_decref[d](block, *args, **kw)
            if counts[d][block] == 0:
                freed_before[d] = True
            return out
        return decref

    for d, pool in ((GPU, bm.gpu), (CPU, bm.cpu)):
        pool.allocate, pool.decref = allocating(d), decrefing(d)
    written: list[int] = []
    if action in ("decode", "swap_in"):  # COW-001's argument: once the appends are done, each
        real_update = after.update       # block a sequence's token is written to has count 1

        def update(*args: Any, **kw: Any) -> Any:
            bs = after.config.block_size
            for s in after.groups[group.request_id].live_seqs():
                block = bm.gpu_tables[s.seq_id][s.num_computed // bs]
                written.append(block)
                assert bm.gpu.ref_counts[block] == 1, f"{action}: {s.seq_id} writes block {block} held {bm.gpu.ref_counts[block]} times"
            return real_update(*args, **kw)

        after.update = update  # type: ignore[method-assign]
    apply_action(after, action, after.groups[group.request_id], seq_id)
    assert action not in ("decode", "swap_in") or written, action
    assert taken[GPU] <= n_gpu and taken[CPU] <= n_cpu, (action, taken, (n_gpu, n_cpu))
    return taken


_WEIGHT = {"swap_in": 8, "swap_out": 4, "fork": 4, "admit": 2, "decode": 2}


@settings(max_examples=examples(15), deadline=None, database=None)
@given(sched=reference_states(), data=st.data())
def test_each_v0_action_takes_at_most_what_its_guard_bounds(sched, data):
    for _ in range(data.draw(st.integers(1, 16))):
        options = []
        for group in all_groups_of(sched):
            for action in ("admit", "fork", "decode", "swap_out", "swap_in", "preempt_recompute", "abort", "finish"):
                seq_id = next((s.seq_id for s in group.live_seqs()), None) if action == "finish" else None
                if reference_guard(sched, action, group, seq_id, UNBOUNDED_TABLES):
                    # the actions that take blocks drawn more often, swap-in (forked groups) most
                    options += [(action, group.request_id, seq_id)] * _WEIGHT.get(action, 1)
        if not options:
            return
        action, rid, seq_id = data.draw(st.sampled_from(options))
        _check(sched, action, sched.groups[rid], seq_id)
        apply_action(sched, action, sched.groups[rid], seq_id)


def test_a_forked_swap_in_takes_exactly_its_bound():
    """The swap-in class argument's tight case: three forked sequences sharing a non-full last
    block take one block for its move and one copy for each but the last writer, plus the full
    blocks: exactly ``blocks_to_swap_in``."""
    from reference_impl.scheduler import Scheduler as S
    from spec.config import SchedulerConfig
    from spec.types import Request

    sched = S(SchedulerConfig(block_size=2, num_gpu_blocks=12, num_cpu_blocks=8, max_num_seqs=4,
                              max_num_batched_tokens=64, max_model_len=30, preemption_mode="swap"))
    sched.add_request(Request("a", 5, max_tokens=9, n=3))
    for a in ("fork", "swap_out"):
        apply_action(sched, a, sched.groups["a"])
    group = sched.groups["a"]
    taken = _check(sched, "swap_in", group, None)
    assert taken[GPU] == sched.block_manager.blocks_to_swap_in(group)


def test_the_write_check_catches_a_decode_without_copy_on_write():
    """The COW-001 half has teeth: the decode-no-cow reference (tests/proof_mutants.py) writes a
    forked group's shared last block in place, and the check says so."""
    import pytest

    from spec.config import SchedulerConfig
    from spec.types import Request
    from tests.proof_mutants import MUTATED_REFERENCES

    mutated, _ = MUTATED_REFERENCES["decode-no-cow"]
    sched = mutated(SchedulerConfig(block_size=2, num_gpu_blocks=12, num_cpu_blocks=8, max_num_seqs=4,
                                    max_num_batched_tokens=64, max_model_len=30, preemption_mode="swap"))
    sched.add_request(Request("a", 5, max_tokens=9, n=3))
    apply_action(sched, "fork", sched.groups["a"])
    with pytest.raises(AssertionError, match="held 3 times"):
        _check(sched, "decode", sched.groups["a"], None)
