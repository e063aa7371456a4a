"""The parametric block proof is tied to the code that runs (issue 19, item 3).

The unbounded proof (spec/proofs/parametric.py) shows that five micro-operations keep every block
fact; that covers the scheduler only if each of its actions *is* a sequence of those
micro-operations. Here the reference scheduler runs on Hypothesis-drawn states of any size (pools
up to 24 blocks, block sizes 1-4, up to 6 requests with n up to 3, tables as long as the
prompts make them), with its BlockManager's mutators recorded; each recorded call becomes its
micro-operations, which are executed through their Z3 encoding (``parametric.step``: the guard
must hold, the post-state is read back from the encoding), and the result must equal the
reference's block layer after the action. Every reached state must also satisfy every quantified
block fact.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.generation.connector import connector_traces
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
from spec.proofs.encoding import CPU, GPU
from spec.proofs.parametric import ACTION_OPS, Snapshot, holds, step
from spec.status import Status
from spec.types import Request, StepOutcome
from tests.conftest import examples

# reference_guard reads only the table length of a bound (to stay inside a bounded matrix); here none
UNBOUNDED_TABLES: Any = SimpleNamespace(table_len=10**9)


class Numbering:
    """Sequence ids as the integers the parametric state is indexed by (stable across a test)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def __call__(self, seq_id: str) -> int:
        return self.ids.setdefault(seq_id, len(self.ids))


def snapshot(sched: Scheduler, num: Numbering) -> Snapshot:
    bm = sched.block_manager
    ref = {(GPU, b): r for b, r in enumerate(bm.gpu.ref_counts)} | {(CPU, b): r for b, r in enumerate(bm.cpu.ref_counts)}
    free = {(GPU, b) for b in bm.gpu.free_ids()} | {(CPU, b) for b in bm.cpu.free_ids()}
    tables: dict[int, list[tuple[int, int]]] = {}
    for dev, tabs in ((GPU, bm.gpu_tables), (CPU, bm.cpu_tables)):
        for sid, table in tabs.items():
            tables[num(sid)] = [(dev, b) for b in table]
    return Snapshot(bm.gpu.num_blocks, bm.cpu.num_blocks, ref, free, tables)


def record(sched: Scheduler, num: Numbering, ops: list[tuple[str, dict[str, int]]]) -> None:
    """Wrap the block manager's mutators so that each call appends its micro-operations."""
    bm = sched.block_manager
    real = {name: getattr(bm, name) for name in ("allocate", "append_slot", "fork", "swap_out", "swap_in", "free")}

    def allocate(group: Any) -> None:
        real["allocate"](group)
        for seq in group.live_seqs():
            for b in bm.gpu_tables[seq.seq_id]:
                ops.append(("append", {"s": num(seq.seq_id), "d": GPU, "b": b}))

    def append_slot(seq: Any) -> Any:
        before = list(bm.gpu_tables[seq.seq_id])
        out = real["append_slot"](seq)
        after = bm.gpu_tables[seq.seq_id]
        if len(after) > len(before):
            ops.append(("append", {"s": num(seq.seq_id), "d": GPU, "b": after[-1]}))
        elif after != before:
            ops.append(("replace", {"s": num(seq.seq_id), "i": len(after) - 1, "b": after[-1]}))
        return out

    def fork(parent: Any, child: Any) -> None:
        real["fork"](parent, child)
        for _ in bm.gpu_tables[child.seq_id]:
            ops.append(("share", {"t": num(child.seq_id), "s": num(parent.seq_id)}))

    def mover(name: str, src: dict[str, list[int]]) -> Any:
        def move(group: Any) -> Any:
            tables = {s.seq_id: list(src[s.seq_id]) for s in group.live_seqs()}
            mapping = real[name](group)
            dst = dict(mapping)
            first = True
            for sid, table in tables.items():
                for i, b in enumerate(table):
                    ops.append(("move", {"s": num(sid), "i": i, "c": dst[b], "start": int(first)}))
                    first = False
            return mapping
        return move

    def free(seq: Any) -> None:
        held = len(bm.gpu_tables.get(seq.seq_id, ())) + len(bm.cpu_tables.get(seq.seq_id, ()))
        real["free"](seq)
        ops.extend(("drop", {"s": num(seq.seq_id)}) for _ in range(held))

    bm.allocate, bm.append_slot, bm.fork, bm.free = allocate, append_slot, fork, free
    bm.swap_out, bm.swap_in = mover("swap_out", bm.gpu_tables), mover("swap_in", bm.cpu_tables)


@st.composite
def reference_states(draw: Any) -> Scheduler:
    """Reference schedulers of any size the draw picks, after a random run."""
    block_size = draw(st.integers(1, 4))
    gpu = draw(st.integers(4, 24))
    config = SchedulerConfig(
        block_size=block_size, num_gpu_blocks=gpu, num_cpu_blocks=draw(st.integers(1, 16)),
        max_num_seqs=draw(st.integers(1, 8)), max_num_batched_tokens=64, max_model_len=draw(st.integers(4, 40)),
        watermark=draw(st.sampled_from([0.0, 0.1])),
        preemption_mode=draw(st.sampled_from(["auto", "swap", "recompute"])),
    )
    sched = Scheduler(config)
    for k in range(draw(st.integers(0, 12))):
        if draw(st.integers(0, 2)) == 0 and len(sched.groups) < 6:
            sched.add_request(Request(f"r{k}", prompt_len=draw(st.integers(1, 20)), max_tokens=draw(st.integers(1, 16)),
                                      n=draw(st.integers(1, 3))))
        out = sched.schedule()
        sched.update(StepOutcome(frozenset(s.seq_id for s in out.scheduled if draw(st.integers(0, 9)) == 0)))
    return sched


def check_action(sched: Scheduler, action: str, group: Any, seq_id: str | None = None) -> None:
    num = Numbering()
    pre = snapshot(sched, num)
    after = copy.deepcopy(sched)
    ops: list[tuple[str, dict[str, int]]] = []
    record(after, num, ops)
    apply_action(after, action, after.groups[group.request_id], seq_id)
    assert {name for name, _ in ops} <= set(ACTION_OPS["v0"][action]), (action, ops)
    state = pre
    for name, params in ops:
        state = step(state, name, params)
    want = snapshot(after, num)
    assert state.layer() == want.layer(), f"{action}: micro-ops give {state}, reference {want}"
    assert holds(want), f"{action}: a reached state breaks a block fact: {want}"


_RELEASES = ("preempt_recompute", "abort", "ignore", "finish")


@settings(max_examples=examples(15), deadline=None, database=None)
@given(sched=reference_states(), data=st.data())
def test_each_action_is_its_micro_ops(sched, data):
    for _ in range(data.draw(st.integers(1, 10))):
        options = []
        for group in all_groups_of(sched):
            for action in ("admit", "fork", "decode", "preempt_recompute", "swap_out", "swap_in", "abort", "ignore", "finish"):
                seq_id = next((s.seq_id for s in group.live_seqs()), None) if action == "finish" else None
                if reference_guard(sched, action, group, seq_id, UNBOUNDED_TABLES):
                    # the actions that allocate, share and move drawn more often than the releases
                    options += [(action, group.request_id, seq_id)] * (1 if action in _RELEASES else 4)
        if not options:
            return
        action, rid, seq_id = data.draw(st.sampled_from(options))
        check_action(sched, action, sched.groups[rid], seq_id)
        apply_action(sched, action, sched.groups[rid], seq_id)


def _sched(*requests: Request, actions: tuple[str, ...] = ()) -> Scheduler:
    sched = Scheduler(SchedulerConfig(block_size=2, num_gpu_blocks=12, num_cpu_blocks=8, max_num_seqs=4,
                                      max_num_batched_tokens=64, max_model_len=30, preemption_mode="swap"))
    for r in requests:
        sched.add_request(r)
    for a in actions:
        apply_action(sched, a, sched.groups["a"])
    return sched


FIXED = [  # every micro-op met whatever Hypothesis draws: share, replace (cow) and move included
    ("admit", lambda: _sched(Request("a", 7))),
    ("fork", lambda: _sched(Request("a", 5, max_tokens=9, n=3))),
    ("decode", lambda: _sched(Request("a", 5, max_tokens=9, n=3), actions=("fork",))),
    ("swap_out", lambda: _sched(Request("a", 5, max_tokens=9, n=3), actions=("fork",))),
    ("swap_in", lambda: _sched(Request("a", 5, max_tokens=9, n=3), actions=("fork", "swap_out"))),
    ("preempt_recompute", lambda: _sched(Request("a", 5, max_tokens=9, n=2), actions=("fork", "decode"))),
    ("abort", lambda: _sched(Request("a", 5, max_tokens=9, n=2), actions=("fork", "swap_out"))),
]


@pytest.mark.parametrize("action, make", FIXED, ids=[f[0] for f in FIXED])
def test_fixed_actions(action, make):
    sched = make()
    group = sched.groups["a"]
    assert reference_guard(sched, action, group, None, UNBOUNDED_TABLES)
    check_action(sched, action, group)


# ---------------------------------------------------------------------- the v1 flow
def v1_snapshot(sched: Any, num: Numbering) -> Snapshot:
    pool = sched.pool
    ref = {(GPU, b): r for b, r in enumerate(pool.ref_counts)}
    tables = {num(t.request_id): [(GPU, b) for b in t.blocks] for t in v1_requests(sched)}
    return Snapshot(pool.num_blocks, 0, ref, {(GPU, b) for b in pool.free_ids()}, tables)


def v1_micro_ops(pre: Snapshot, post: Snapshot) -> list[tuple[str, dict[str, int]]]:
    """A v1 action's block effect as micro-ops: a table that grew took fresh blocks at its end
    (``_allocate``); a table that emptied was released tail first (``_free_blocks``). Any other
    change is not a v1 block effect and fails the test."""
    ops: list[tuple[str, dict[str, int]]] = []
    for s, after in post.tables.items():
        before = pre.tables.get(s, [])
        if after[: len(before)] == before:
            ops += [("append", {"s": s, "d": GPU, "b": b}) for _, b in after[len(before):]]
        elif not after:
            ops += [("drop", {"s": s})] * len(before)
        else:
            raise AssertionError(f"request {s}: table {before} -> {after} is neither growth nor release")
    return ops


def small_v1_fields(data: Any) -> dict[str, Any]:
    """A small V1 config's fields, drawn in one fixed order (chunked prefill or not, the pool and the
    limits); a test adds its own fields after these (``SchedulerConfig(**small_v1_fields(data), ...)``
    draws them in that order)."""
    chunked = data.draw(st.booleans())
    return dict(
        block_size=data.draw(st.integers(1, 4)), num_gpu_blocks=data.draw(st.integers(4, 24)), num_cpu_blocks=0,
        max_num_seqs=data.draw(st.integers(1, 6)), max_num_batched_tokens=data.draw(st.integers(6, 32)),
        max_model_len=data.draw(st.integers(4, 40)), enable_chunked_prefill=chunked,
        long_prefill_token_threshold=data.draw(st.sampled_from([0, 0, 3])) if chunked else 0,
    )


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_each_v1_action_is_its_micro_ops(data):
    config = SchedulerConfig(**small_v1_fields(data))
    sched = V1Scheduler(config)
    for k in range(data.draw(st.integers(0, 10))):
        if k < 3 or data.draw(st.integers(0, 2)) == 0:  # a few requests arrive first
            sched.add_request(Request(f"r{k}", prompt_len=data.draw(st.integers(1, 20)), max_tokens=data.draw(st.integers(1, 12))))
        out = sched.schedule()
        sched.update(StepOutcome(frozenset(s.seq_id for s in out.scheduled if data.draw(st.integers(0, 9)) == 0)))
    for _ in range(data.draw(st.integers(1, 8))):
        options = []
        for t in v1_requests(sched):
            for action in ("admit", "chunk", "preempt_recompute", "abort", "ignore"):
                for k in (1, 2, 5) if action in ("admit", "chunk") else (1,):
                    if v1_reference_guard(sched, action, t, k, UNBOUNDED_TABLES):
                        options += [(action, t.request_id, k)] * (4 if action in ("admit", "chunk") else 1)
        if not options:
            return
        action, rid, k = data.draw(st.sampled_from(options))
        stop = data.draw(st.integers(0, 4)) == 0
        num = Numbering()
        pre = v1_snapshot(sched, num)
        v1_apply_action(sched, action, sched.requests[rid], k, stop)
        post = v1_snapshot(sched, num)
        ops = v1_micro_ops(pre, post)
        assert {name for name, _ in ops} <= set(ACTION_OPS["v1"][action]), (action, ops)
        state = pre
        for name, params in ops:
            state = step(state, name, params)
        assert state.layer() == post.layer(), f"{action}: micro-ops give {state}, reference {post}"
        assert holds(post)


# ---------------------------------------------------------------------- the async flow
def _release_first(ops: list[tuple[str, dict[str, int]]]) -> list[tuple[str, dict[str, int]]]:
    """A whole step's block effect: its releases (preemptions, finishes) before its growth, since a
    block one request releases may be taken by another in the same step."""
    return [o for o in ops if o[0] == "drop"] + [o for o in ops if o[0] != "drop"]


@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_each_async_step_is_v1_micro_ops(data):
    """The async flow's block layer (ACTION_OPS["async"]: schedule() appends like a V1 chunk, an
    abort, preemption or finishing outcome releases the whole table) on the pipelined reference of
    any size, depth 0..2: every schedule(), update() and abort, as micro-ops, gives the
    reference's block layer, and every reached state has every block fact."""
    from reference_impl.async_scheduler import AsyncV1Scheduler

    config = SchedulerConfig(
        **small_v1_fields(data),
        pipeline_depth=data.draw(st.integers(0, 2)),
    )
    sched = AsyncV1Scheduler(config)
    num = Numbering()
    allowed = set(ACTION_OPS["async"]["chunk"]) | set(ACTION_OPS["async"]["process"])

    def check(change) -> None:
        pre = v1_snapshot(sched, num)
        change()
        post = v1_snapshot(sched, num)
        ops = _release_first(v1_micro_ops(pre, post))
        assert {name for name, _ in ops} <= allowed, ops
        state = pre
        for name, params in ops:
            state = step(state, name, params)
        assert state.layer() == post.layer(), f"micro-ops give {state}, reference {post}"
        assert holds(post)

    for k in range(data.draw(st.integers(1, 14))):
        if k < 3 or data.draw(st.integers(0, 2)) == 0:
            sched.add_request(Request(f"r{k}", prompt_len=data.draw(st.integers(1, 20)), max_tokens=data.draw(st.integers(1, 12))))
        live = [t.request_id for t in v1_requests(sched) if not t.status.is_finished]
        if live and data.draw(st.integers(0, 6)) == 0:
            rid = data.draw(st.sampled_from(live))
            check(lambda rid=rid: sched.abort_request(rid))
        check(sched.schedule)
        stopped = frozenset(s for s in sched.samples_of_last_step() if data.draw(st.integers(0, 9)) == 0)
        check(lambda stopped=stopped: sched.update(StepOutcome(stopped)))


# ---------------------------------------------------------------------- the specdec flow
@settings(max_examples=examples(15), deadline=None, database=None)
@given(data=st.data())
def test_each_specdec_step_is_v1_micro_ops(data):
    """The speculative flow's block layer (ACTION_OPS["specdec"]: a verifying step appends its
    drafts' slots like a chunk, a rejection frees nothing, an abort, preemption or finish releases
    the whole table) on the speculative reference of any size, k 1..4, with random acceptances,
    empty outcomes and stops: every step and abort, as micro-ops, gives the reference's block
    layer, and every reached state has every block fact."""
    from reference_impl.specdec_scheduler import SpecDecScheduler
    from spec.speculative import DraftDecision

    config = SchedulerConfig(
        **small_v1_fields(data),
        num_speculative_tokens=data.draw(st.integers(1, 4)),
    )
    sched = SpecDecScheduler(config)
    num = Numbering()
    allowed = set(ACTION_OPS["specdec"]["verify"]) | set(ACTION_OPS["specdec"]["chunk"])

    def check(change) -> None:
        pre = v1_snapshot(sched, num)
        change()
        post = v1_snapshot(sched, num)
        ops = _release_first(v1_micro_ops(pre, post))
        assert {name for name, _ in ops} <= allowed, ops
        state = pre
        for name, params in ops:
            state = step(state, name, params)
        assert state.layer() == post.layer(), f"micro-ops give {state}, reference {post}"
        assert holds(post)

    def run_step() -> None:
        out = sched.schedule()
        decisions = {s.seq_id: DraftDecision(accepted=data.draw(st.integers(0, 4)),
                                             empty=data.draw(st.integers(0, 5)) == 5) for s in out.scheduled}
        stopped = frozenset(s.seq_id for s in out.scheduled if data.draw(st.integers(0, 9)) == 9)
        sched.update(StepOutcome(stopped, decisions))

    for k in range(data.draw(st.integers(1, 14))):
        if k < 3 or data.draw(st.integers(0, 2)) == 0:
            sched.add_request(Request(f"r{k}", prompt_len=data.draw(st.integers(1, 20)), max_tokens=data.draw(st.integers(1, 12))))
        live = [t.request_id for t in v1_requests(sched) if not t.status.is_finished]
        if live and data.draw(st.integers(0, 6)) == 6:
            rid = data.draw(st.sampled_from(live))
            check(lambda rid=rid: sched.abort_request(rid))
        check(run_step)


# ---------------------------------------------------------------------- the connector flow
def _connector_block_layer(trace: Any) -> Counter:
    """Run ``trace`` on the connector reference (prefix caching off, as in the encoding) with every
    schedule(), update() and abort checked against ACTION_OPS["connector"]'s micro-ops; counts what
    was held: by a waiting request (a load) and by a finished one (a load it was aborted during, a
    delayed free)."""
    from reference_impl.engine import run_trace
    from reference_impl.kv_connector_scheduler import ConnectorScheduler

    trace = replace(trace, config=replace(trace.config, enable_prefix_caching=False))
    num = Numbering()
    allowed = {o for ops in ACTION_OPS["connector"].values() for o in ops}
    seen: Counter = Counter()

    class Checked(ConnectorScheduler):
        def _checked(self, change):  # type: ignore[no-untyped-def]
            pre = v1_snapshot(self, num)
            out = change()
            post = v1_snapshot(self, num)
            ops = _release_first(v1_micro_ops(pre, post))
            assert {name for name, _ in ops} <= allowed, ops
            state = pre
            for name, params in ops:
                state = step(state, name, params)
            assert state.layer() == post.layer(), f"micro-ops give {state}, reference {post}"
            assert holds(post)
            for t in v1_requests(self):
                if t.blocks and (t.status.is_finished or t.status == Status.WAITING_FOR_REMOTE_KV):
                    seen["finished-holds" if t.status.is_finished else "load-holds"] += 1
            return out

        def schedule(self):  # type: ignore[no-untyped-def]
            return self._checked(lambda: ConnectorScheduler.schedule(self))

        def update(self, outcome):  # type: ignore[no-untyped-def]
            return self._checked(lambda: ConnectorScheduler.update(self, outcome))

        def abort_request(self, request_id):  # type: ignore[no-untyped-def]
            return self._checked(lambda: ConnectorScheduler.abort_request(self, request_id))

    run_trace(trace, Checked)
    return seen


@settings(max_examples=examples(3), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=connector_traces())
def test_each_connector_step_is_v1_micro_ops(trace):
    """The connector flow's block layer (ACTION_OPS["connector"]: a load appends its fresh blocks, a
    landed load that frees, a reported send, an abort, a preemption or a finish releases the whole
    table, a table kept for a transfer is no op) on the connector reference of any size, its
    connector scripted by the generator (asynchronous and synchronous loads, failures under both
    policies, delayed frees, aborts): every schedule(), update() and abort, as micro-ops, gives the
    reference's block layer, and every reached state has every block fact."""
    _connector_block_layer(trace)


def _connector_trace(script: dict[str, Any], policy: str = "recompute", aborts: tuple = ()) -> Any:
    from spec.trace import Trace

    return Trace.from_dict({
        "version": 1,
        "config": {"kv_connector": True, "block_size": 2, "num_gpu_blocks": 12, "max_num_seqs": 3,
                   "max_num_batched_tokens": 16, "max_model_len": 24, "watermark": 0.0,
                   "enable_chunked_prefill": True, "kv_load_failure_policy": policy},
        "requests": [{"id": "A", "prompt_len": 9, "max_tokens": 3}, {"id": "B", "prompt_len": 5, "max_tokens": 2}],
        "connector": {"version": 1, "requests": [{"request": "A", **script},
                                                 {"request": "B", "external_tokens": 2}]},
        **({"aborts": [{"step": s, "request": "A"} for s in aborts]} if aborts else {})})


@pytest.mark.parametrize(("script", "policy", "aborts", "held"), [
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, "recompute", (), "both"),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "recompute", (), "load"),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [0]}, "fail", (), "load"),
    ({"external_tokens": 6, "load_async": True, "load_steps": 3}, "recompute", (1,), "both"),
])
def test_connector_paths_are_micro_ops(script, policy, aborts, held):
    """Worked connector paths (a load with a delayed free, failures under both policies, an abort
    during a load), through the same check; each holds what the path is about."""
    seen = _connector_block_layer(_connector_trace(script, policy, aborts))
    assert seen["load-holds"] >= 1
    if held == "both":
        assert seen["finished-holds"] >= 1
