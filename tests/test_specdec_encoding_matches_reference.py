"""The speculative-decoding Z3 encoding is checked against reference_impl/specdec_scheduler.py.

Hypothesis drives the speculative reference (random small configs with k = 0..3, chunked prefill
and prefix caching on or off, thresholds, partial-prefill limits; arrivals, aborts, and per step
and sequence the drafter's proposal, the accepted drafts, empty outcomes and stops inside the
accepted run) and cuts every step into what the matrix calls actions:

- an arrival is ``add``, an abort ``abort``;
- a step (``schedule()`` then ``update()``) is its preemptions, then its scheduled requests in
  schedule order (``admit`` for one admitted now, ``verify`` for one scheduled with drafts,
  ``chunk`` otherwise), each with the chunk the reference gave it and the outcome the trace
  decided, then its ignores.

For each such sequence the symbolic pre-state is pinned to the reference's state before it (its
proposals and keyed blocks included), every action's guard and effect is asserted with the
reference's parameters, and the symbolic post-state is pinned to the reference's state after: Z3
must find them consistent (the encoding allows what the reference does, up to *which* free blocks
were taken). Every state the reference reaches satisfies every specdec state invariant. So the
specdec matrix covers every state the speculative reference reaches: the proof is about the code
that runs. A step with a prefix-cache *hit* leaves the encoding (which models keys, not hits):
prompts are distinct, and a run stops at a request's hit on its own blocks after a preemption.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.selftest.proof_bridge import specdec_concrete_state, specdec_config_constants, v1_requests
from reference_impl.specdec_scheduler import SpecDecScheduler
from spec.config import SchedulerConfig
from spec.proofs.encoding_specdec import (
    SPECDEC_BOUND,
    SPECDEC_STATE_INVARIANTS,
    SpecDecEncoder,
    grp_ok_specdec,
    pin_specdec_state,
)
from spec.speculative import DraftDecision
from spec.status import Status
from spec.types import Request, ScheduledSeq, StepOutcome
from tests import encoded_chain
from tests.conftest import examples

BOUND = SPECDEC_BOUND
NO_STOP_AT = 16  # a stop with no index falls on the last committed token: the encoding clamps it there


def _chain() -> encoded_chain.Chain:
    return encoded_chain.Chain(SpecDecEncoder(BOUND), grp_ok_specdec, pin_specdec_state)


_INVARIANTS = encoded_chain.StateInvariants(SpecDecEncoder(BOUND), SPECDEC_STATE_INVARIANTS, grp_ok_specdec, pin_specdec_state)
_broken_invariants = _INVARIANTS.broken


def _config(draw) -> SchedulerConfig:
    max_num_seqs = draw(st.sampled_from([1, 2, 2]))
    chunked = draw(st.booleans())
    return SchedulerConfig(
        block_size=BOUND.block_size, num_gpu_blocks=BOUND.gpu_blocks, num_cpu_blocks=BOUND.cpu_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=draw(st.integers(max_num_seqs, 6)),
        # tables stay within the bound's 3 blocks: at most max_model_len tokens computed
        max_model_len=draw(st.sampled_from([4, 5, 6, 6])), watermark=draw(st.sampled_from([0.0, 0.0, 0.25])),
        preemption_mode="recompute", policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 1, 2])) if chunked else 0,
        max_num_partial_prefills=draw(st.sampled_from([0, 0, 1])) if chunked else 0,
        enable_prefix_caching=draw(st.booleans()),
        num_speculative_tokens=draw(st.sampled_from([0, 1, 2, 2, 3, 3])),
    )


def _decision(draw, k: int) -> tuple[DraftDecision, bool]:
    """The trace's decision for one scheduled sequence, and whether it stops in this step."""
    decision = DraftDecision(proposed=draw(st.sampled_from([None, None, 0, 1, 2])), accepted=draw(st.integers(0, 3)),
                             stop_at=draw(st.sampled_from([None, 0, 1])), empty=draw(st.integers(0, 5)) == 5)
    return decision, draw(st.integers(0, 4)) == 4  # (Hypothesis leans to 0: the rare case is the high value)


Decide = Callable[[ScheduledSeq, int], tuple[DraftDecision, bool]]


class Run:
    """The reference, the ``void`` ghost it does not keep, and the counts of what was covered."""

    def __init__(self, sched: SpecDecScheduler) -> None:
        self.sched = sched
        self.config = specdec_config_constants(sched.config)
        self.void: set[str] = set()  # requests whose last outcome committed no token
        self.seen: dict[str, int] = {}

    def state(self) -> dict[str, Any] | None:
        return specdec_concrete_state(self.sched, BOUND, frozenset(self.void))

    def slot(self, rid: str) -> int:
        return next(j for j, t in enumerate(v1_requests(self.sched)) if t.request_id == rid)

    def count(self, what: str) -> None:
        self.seen[what] = self.seen.get(what, 0) + 1

    def check(self, before: dict[str, Any], chain: encoded_chain.Chain) -> bool:
        after = self.state()
        if after is None:
            return False
        broken = _broken_invariants(after, self.config)
        assert not broken, f"a reached state violates {broken}: {json.dumps(after)}"
        assert chain.consistent(before, after, self.config), (
            f"the encoding does not allow the reference's {' '.join(chain.actions)}\nconfig {self.config}\n"
            f"before {json.dumps(before)}\nafter  {json.dumps(after)}")
        for a in chain.actions:
            self.count(a.split("(")[0])
        return True

    def arrive(self, prompt: int, max_tokens: int, priority: int) -> bool:
        before = self.state()
        if before is None:
            return False
        g = len(self.sched.requests)
        # distinct prompts (the first token names the request): no request hits another's blocks
        tokens = tuple((10 * (g + 1) + i) % 50 for i in range(prompt))
        self.sched.add_request(Request(f"r{g}", prompt_len=prompt, max_tokens=max_tokens, priority=priority,
                                       prompt_tokens=tokens))
        chain = _chain()
        chain.take("add", g, prompt_len=prompt, max_tokens=max_tokens)
        return self.check(before, chain)

    def abort(self, rid: str) -> bool:
        before = self.state()
        if before is None:
            return False
        chain = _chain()
        chain.take("abort", self.slot(rid))
        if before["seqs"][self.slot(rid)]["proposed"]:
            self.count("abort-with-proposal")
        self.sched.abort_request(rid)
        return self.check(before, chain)

    def step(self, decide: Decide) -> bool:
        """One step; ``decide(scheduled seq, k)`` is the trace's outcome for each scheduled sequence."""
        sched = self.sched
        before = self.state()
        if before is None:
            return False
        k = sched.config.num_speculative_tokens
        was = {t.request_id: (t.status, t.num_tokens, t.num_computed) for t in v1_requests(sched)}
        out = sched.schedule()
        if any(was[s.request_id][0] is Status.WAITING and sched.requests[s.request_id].num_computed
               for s in out.scheduled):
            return False  # a prefix-cache hit: outside the encoding
        chain = _chain()
        for p in out.preempted:
            if before["seqs"][self.slot(p.request_id)]["proposed"]:
                self.count("preempt-with-proposal")
            chain.take("preempt_recompute", self.slot(p.request_id))
        decided = {s.seq_id: decide(s, k) for s in out.scheduled}
        decisions = {sid: d for sid, (d, _) in decided.items()}
        stopped = frozenset(sid for sid, (_, stop) in decided.items() if stop)
        for s in out.scheduled:
            status, ntok, ncomp = was[s.request_id]
            d = decisions[s.seq_id]
            action = "admit" if status is Status.WAITING else "verify" if s.num_drafts else "chunk"
            samples = ncomp + s.num_tokens >= ntok
            if action == "verify":
                accepted = min(d.accepted, s.num_drafts)
                self.count("verify-empty" if d.empty else "verify-rejects" if accepted < s.num_drafts else "verify-all")
                if s.seq_id in stopped and not d.empty and accepted and d.stop_at == 0:
                    self.count("stop-inside-run")
            chain.take(action, self.slot(s.request_id), tokens=s.num_tokens, accepted=min(d.accepted, s.num_drafts),
                       empty=int(d.empty), stop=int(s.seq_id in stopped),
                       stop_at=NO_STOP_AT if d.stop_at is None else d.stop_at, proposed=d.num_proposed(k))
            if samples and d.empty:
                self.void.add(s.request_id)
            else:
                self.void.discard(s.request_id)
        for rid in out.ignored:
            if was[rid][0] is Status.WAITING:
                chain.take("ignore", self.slot(rid))
        sched.update(StepOutcome(stopped, decisions))
        return self.check(before, chain)


def _drive(run: Run, data, steps: int) -> None:
    for _ in range(steps):
        sched = run.sched
        if len(sched.requests) < BOUND.seqs and data.draw(st.integers(0, 2)) > 0:
            if not run.arrive(data.draw(st.integers(1, 4)), data.draw(st.integers(1, 6)), data.draw(st.integers(0, 2))):
                return
        live = [t.request_id for t in v1_requests(sched) if not t.status.is_finished]
        if live and data.draw(st.integers(0, 7)) == 7 and not run.abort(data.draw(st.sampled_from(live))):
            return
        if not run.step(lambda s, k: _decision(data.draw, k)):
            return


@settings(max_examples=examples(40), database=None, deadline=None)
@given(data=st.data(), steps=st.integers(1, 16))
def test_every_specdec_step_is_a_sequence_of_allowed_matrix_actions(data, steps):
    run = Run(SpecDecScheduler(_config(data.draw)))
    _drive(run, data, steps)


def test_the_speculative_paths_are_covered():
    """Deterministic runs through the same check, so the paths that matter are compared whatever
    Hypothesis draws: drafts verified with rejections and all accepted, an empty outcome with
    drafts, a stop inside an accepted run, prefix caching on; under KV pressure, a preemption of a
    request holding a proposal."""
    config = SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=1, max_num_seqs=2, max_num_batched_tokens=6,
                             max_model_len=6, watermark=0.0, preemption_mode="recompute", enable_prefix_caching=True,
                             num_speculative_tokens=2)
    plans = [
        [DraftDecision(accepted=1), DraftDecision(accepted=0), DraftDecision(empty=True), DraftDecision(accepted=2)],
        [DraftDecision(), DraftDecision(accepted=2, stop_at=0)],
    ]
    seen: dict[str, int] = {}
    for plan in plans:
        run = Run(SpecDecScheduler(config))
        assert run.arrive(2, 5, 0)
        steps = iter(plan)
        for _ in plan:
            decision = next(steps)
            assert run.step(lambda s, k, d=decision: (d, d.stop_at == 0))  # the plan's stop_at marks its stop
        for key, count in run.seen.items():
            seen[key] = seen.get(key, 0) + count
    assert seen.get("verify-rejects", 0) >= 1 and seen.get("verify-empty", 0) >= 1, seen
    assert seen.get("verify-all", 0) >= 1 and seen.get("stop-inside-run", 0) == 1, seen
    pressure = SchedulerConfig(block_size=2, num_gpu_blocks=4, num_cpu_blocks=1, max_num_seqs=2,
                               max_num_batched_tokens=6, max_model_len=6, watermark=0.0, preemption_mode="recompute",
                               num_speculative_tokens=2)
    run = Run(SpecDecScheduler(pressure))
    assert run.arrive(3, 5, 0) and run.arrive(3, 5, 0)
    for _ in range(4):
        assert run.step(lambda s, k: (DraftDecision(accepted=2), False))
    assert run.seen.get("preempt-with-proposal", 0) >= 1, run.seen
