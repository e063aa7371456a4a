"""The async (pipelined) Z3 encoding is checked against reference_impl/async_scheduler.py.

Hypothesis drives the pipelined reference (random small configs at pipeline depth 0, 1 and 2,
chunked prefill on or off, thresholds, partial-prefill limits; arrivals, aborts with steps in
flight, stops) and cuts every step into what the matrix calls actions:

- an arrival is ``add``, an abort ``abort``;
- ``schedule()`` is its preemptions, then its chunks in schedule order (``chunk`` for a request
  that was running, ``admit`` for one admitted now, each with the chunk the reference gave it),
  then its ignores;
- ``update()`` is one ``process`` per entry of each step it processes, oldest step first, with
  the stop the environment decided.

For each such sequence the symbolic pre-state is pinned to the reference's state before it (its
counters and its entries in flight included), every action's guard and effect is asserted with
the reference's parameters, and the symbolic post-state is pinned to the reference's state after:
Z3 must find them consistent (the encoding allows what the reference does, up to *which* free
blocks were taken), and processing asserts none of the engine checks (PIP-005) fails. Every
state the reference reaches satisfies every async state invariant. So every state the pipelined
reference reaches between two actions is one the async matrix covers: the proof is about the code
that runs. (The other direction, that the encoding allows nothing the reference would refuse,
is not needed for soundness and is not checked here.)
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.selftest.proof_bridge import async_concrete_state, async_config_constants, v1_requests
from reference_impl.async_scheduler import AsyncV1Scheduler
from spec.config import SchedulerConfig
from spec.proofs.encoding_async import (
    ASYNC_BOUND,
    ASYNC_STATE_INVARIANTS,
    AsyncEncoder,
    grp_ok_async,
    pin_async_state,
)
from spec.status import Status
from spec.types import Request, StepOutcome
from tests import encoded_chain
from tests.conftest import examples

BOUND = ASYNC_BOUND


def _chain() -> encoded_chain.Chain:
    return encoded_chain.Chain(AsyncEncoder(BOUND), grp_ok_async, pin_async_state, engine_ok=True)


_INVARIANTS = encoded_chain.StateInvariants(AsyncEncoder(BOUND), ASYNC_STATE_INVARIANTS, grp_ok_async, pin_async_state)
_broken_invariants = _INVARIANTS.broken


def _config(draw) -> SchedulerConfig:
    max_num_seqs = draw(st.sampled_from([1, 2, 2]))
    chunked = draw(st.booleans())
    return SchedulerConfig(
        block_size=BOUND.block_size, num_gpu_blocks=BOUND.gpu_blocks, num_cpu_blocks=BOUND.cpu_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=draw(st.integers(max_num_seqs, 5)),
        # tables stay within the bound's 3 blocks: at most max_model_len + 1 tokens computed
        max_model_len=draw(st.sampled_from([3, 4, 5, 5])), watermark=draw(st.sampled_from([0.0, 0.0, 0.25])),
        preemption_mode="recompute", policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 2])) if chunked else 0,
        max_num_partial_prefills=draw(st.sampled_from([0, 0, 1])) if chunked else 0,
        pipeline_depth=draw(st.sampled_from([0, 1, 1, 2])),
    )


class Run:
    """The reference and the counts of what the checked sequences covered."""

    def __init__(self, sched: AsyncV1Scheduler) -> None:
        self.sched = sched
        self.config = async_config_constants(sched.config)
        self.seen: dict[str, int] = {}

    def slot(self, rid: str) -> int:
        return next(j for j, t in enumerate(v1_requests(self.sched)) if t.request_id == rid)

    def check(self, before: dict[str, Any], chain: encoded_chain.Chain) -> bool:
        after = async_concrete_state(self.sched, BOUND)
        if after is None:
            return False
        broken = _broken_invariants(after, self.config)
        assert not broken, f"a reached state violates {broken}: {json.dumps(after)}"
        assert chain.consistent(before, after, self.config), (
            f"the encoding does not allow the reference's {' '.join(chain.actions)}\nconfig {self.config}\n"
            f"before {json.dumps(before)}\nafter  {json.dumps(after)}")
        for a in chain.actions:
            self.seen[a.split("(")[0]] = self.seen.get(a.split("(")[0], 0) + 1
        return True

    def arrive(self, prompt: int, max_tokens: int, priority: int) -> bool:
        before = async_concrete_state(self.sched, BOUND)
        if before is None:
            return False
        g = len(self.sched.requests)
        self.sched.add_request(Request(f"r{g}", prompt_len=prompt, max_tokens=max_tokens, priority=priority))
        chain = _chain()
        chain.take("add", g, prompt_len=prompt, max_tokens=max_tokens)
        return self.check(before, chain)

    def abort(self, rid: str) -> bool:
        before = async_concrete_state(self.sched, BOUND)
        if before is None:
            return False
        chain = _chain()
        chain.take("abort", self.slot(rid))
        if any(e for e in before["seqs"][self.slot(rid)]["in_flight"]["entries"]):
            self.seen["abort-in-flight"] = self.seen.get("abort-in-flight", 0) + 1
        self.sched.abort_request(rid)
        return self.check(before, chain)

    def step(self, stops) -> bool:
        sched = self.sched
        before = async_concrete_state(sched, BOUND)
        if before is None:
            return False
        status = {t.request_id: t.status for t in v1_requests(sched)}
        out = sched.schedule()
        chain = _chain()
        for p in out.preempted:
            if sched.counters[p.request_id].num_stale:
                self.seen["preempt-in-flight"] = self.seen.get("preempt-in-flight", 0) + 1
            chain.take("preempt_recompute", self.slot(p.request_id))
        for t, tokens, *_ in sched.in_flight[-1].entries:
            action = "admit" if status[t.request_id] is Status.WAITING else "chunk"
            chain.take(action, self.slot(t.request_id), tokens=tokens)
        for rid in out.ignored:
            if status[rid] is Status.WAITING:
                chain.take("ignore", self.slot(rid))
        if not self.check(before, chain):
            return False
        # update(): the oldest steps until at most `depth` are in flight
        before = async_concrete_state(sched, BOUND)
        assert before is not None
        stopped = frozenset(s for s in sched.samples_of_last_step() if stops.draw(st.integers(0, 3)) == 0)
        steps = list(sched.in_flight)
        chain = _chain()
        for k, step in enumerate(steps[:max(0, len(steps) - sched.depth)]):
            stopped_here = stopped if k == len(steps) - 1 else (step.stopped or frozenset())
            for t, *_ in step.entries:
                if sched.counters[t.request_id].num_stale and not t.status.is_finished:
                    self.seen["process-stale"] = self.seen.get("process-stale", 0) + 1
                chain.take("process", self.slot(t.request_id), stop=int(t.seq_id in stopped_here))
        sched.update(StepOutcome(stopped))
        return self.check(before, chain)


def _drive(run: Run, data, steps: int) -> None:
    for _ in range(steps):
        sched = run.sched
        if len(sched.requests) < BOUND.seqs and data.draw(st.integers(0, 2)) > 0:
            if not run.arrive(data.draw(st.integers(1, 5)), data.draw(st.integers(1, 4)), data.draw(st.integers(0, 2))):
                return
        live = [t.request_id for t in v1_requests(sched) if not t.status.is_finished]
        if live and data.draw(st.integers(0, 7)) == 0 and not run.abort(data.draw(st.sampled_from(live))):
            return
        if not run.step(data):
            return


@settings(max_examples=examples(20), database=None, deadline=None)
@given(data=st.data(), steps=st.integers(1, 12))
def test_every_async_step_is_a_sequence_of_allowed_matrix_actions(data, steps):
    run = Run(AsyncV1Scheduler(_config(data.draw)))
    _drive(run, data, steps)


PRESSURE = SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=1, max_num_seqs=2, max_num_batched_tokens=4,
                           max_model_len=6, watermark=0.0, preemption_mode="recompute", pipeline_depth=1)


class _Fixed:
    """A data source for `Run.step`'s stop draws that never stops (the fixed scenarios decide)."""

    @staticmethod
    def draw(strategy) -> int:
        return 1


def test_preemption_abort_and_stale_outcomes_are_covered():
    """Deterministic scenarios through the same check, so the paths that matter are compared
    whatever Hypothesis draws: KV pressure at depth 1 preempts a request with a step in flight,
    whose stale outcome is then processed; an abort with a step in flight; depth 2."""
    run = Run(AsyncV1Scheduler(PRESSURE))
    assert run.arrive(3, 5, 0) and run.arrive(3, 5, 0)
    for _ in range(6):
        assert run.step(_Fixed)
    assert run.seen.get("preempt-in-flight", 0) >= 1, run.seen
    assert run.seen.get("process-stale", 0) >= 1, run.seen
    run = Run(AsyncV1Scheduler(replace(PRESSURE, pipeline_depth=2)))
    assert run.arrive(2, 4, 0)
    for _ in range(2):
        assert run.step(_Fixed)
    assert run.abort("r0")
    for _ in range(3):
        assert run.step(_Fixed)
    assert run.seen.get("abort-in-flight", 0) == 1, run.seen
    assert run.seen["process"] >= 2 and run.seen["admit"] >= 1 and run.seen["chunk"] >= 1, run.seen
