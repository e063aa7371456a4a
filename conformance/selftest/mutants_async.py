"""Mutants of the pipelined reference, each the shape of an upstream async-scheduling bug, each
with the PIP invariants (docs/ASYNC.md, drafted in `conformance.selftest.async_checks`) that must
catch it. A mutant overrides one hook of `AsyncV1Scheduler`; tests/test_async_mutants.py
shows each caught on seeded traces.
"""

from __future__ import annotations

from dataclasses import dataclass

from conformance.flows import get_flow
from conformance.selftest.mutant_record import mutant
from reference_impl.async_scheduler import AsyncV1Scheduler, DeferredFreeAsyncV1Scheduler, InFlightStep
from reference_impl.v1_scheduler import TrackedRequest
from spec.types import Finished, SchedulerOutput


class ForgetsInFlightOnPreempt(AsyncV1Scheduler):
    """vllm-project/vllm#48245 (and #47900): preemption resets computed tokens and placeholders
    but does not mark the victim's in-flight outcome stale, so when it returns it drains against
    the reset counters: placeholders underflow."""

    def _preempt(self, victim: TrackedRequest) -> None:
        super()._preempt(victim)
        self.counters[victim.request_id].num_stale = 0  # bug: the in-flight share is not marked stale


class FinalChunkWithoutPlaceholder(AsyncV1Scheduler):
    """vllm-project/vllm#35755 / #50692: the final chunk of a prompt that needed several chunks
    reserves no placeholder, though the model returns its token."""

    def schedule(self) -> SchedulerOutput:
        mid_prompt = {t.request_id for t in self.running  # a chunk computed, prompt tokens left
                      if 0 < t.num_computed < t.num_tokens and not self.counters[t.request_id].num_placeholders}
        output = super().schedule()
        for tracked, _tokens, position, _drafts in self.in_flight[-1].entries:
            if position is not None and tracked.request_id in mid_prompt:
                self.counters[tracked.request_id].num_placeholders -= 1  # bug: the reservation it skipped
        return output


class AppliesOutcomesOfFinished(AsyncV1Scheduler):
    """An in-flight outcome of a request that finished meanwhile is applied anyway (vLLM drops
    it: vllm/v1/core/sched/scheduler.py:2327-2334)."""

    def _process(self, step: InFlightStep) -> list[Finished]:
        for tracked, _tokens, position, _drafts in step.entries:
            if tracked.status.is_finished and position is not None and position == tracked.num_tokens:
                tracked.tokens.append(0)  # bug: applied although the request finished
        return super()._process(step)


class ResamplesAfterPreemption(AsyncV1Scheduler):
    """vllm-project/vllm#38624 / #47900: the in-flight token of a preempted request is kept and
    the position is sampled again after the resume, so the client gets one token twice."""

    def _process(self, step: InFlightStep) -> list[Finished]:
        stale = {t.request_id for t, _tokens, position, _drafts in step.entries
                 if position is not None and not t.status.is_finished and self.counters[t.request_id].num_stale}
        finished = super()._process(step)
        for rid in stale:
            tracked = self.requests[rid]
            if not tracked.status.is_finished:
                tracked.tokens.append(tracked.tokens[-1])  # bug: the kept token, delivered again
        return finished


class OneStepLater(AsyncV1Scheduler):
    """Outcomes are processed one step later than the declared depth (a queue one batch too deep,
    or stale frames that delay a stop: vllm-project/vllm#49860)."""

    def update(self, outcome):  # type: ignore[no-untyped-def]
        depth, self.depth = self.depth, self.depth + 1  # bug: one step deeper than declared
        try:
            return super().update(outcome)
        finally:
            self.depth = depth


class FreesWithoutFence(DeferredFreeAsyncV1Scheduler):
    """An engine that cannot promise in-order steps (a KV connector may write out of order) but
    frees a preempted or finished request's blocks at once, while a step that writes them is still
    in flight: what ``defer_block_free`` exists to prevent (vllm/v1/core/sched/scheduler.py:189-195)."""

    def _free_blocks(self, tracked: TrackedRequest) -> None:
        AsyncV1Scheduler._free_blocks(self, tracked)  # bug: no fence


@dataclass(frozen=True)
class AsyncMutant:
    name: str
    cls: type[AsyncV1Scheduler]
    caught_by: frozenset[str]
    upstream: str


MUTANTS = (
    AsyncMutant("forgets_in_flight_on_preempt", ForgetsInFlightOnPreempt, frozenset({"PIP-003", "PIP-005"}),
                    "vllm-project/vllm#48245"),
    AsyncMutant("final_chunk_without_placeholder", FinalChunkWithoutPlaceholder,
                    frozenset({"PIP-003", "PIP-005"}), "vllm-project/vllm#35755"),
    AsyncMutant("applies_outcomes_of_finished", AppliesOutcomesOfFinished, frozenset({"PIP-001", "PIP-002"}),
                    "vllm/v1/core/sched/scheduler.py:2327-2334"),
    AsyncMutant("one_step_later", OneStepLater, frozenset({"PIP-006", "PIP-002"}), "vllm-project/vllm#49860"),
    AsyncMutant("resamples_after_preemption", ResamplesAfterPreemption, frozenset({"PIP-001"}),
                "vllm-project/vllm#38624"),
)

# The catalogue's teeth (tests/test_mutants.py): each mutant with the catalogue invariants that
# catch it on what the runner observes. The in-flight counters (PIP-003) show the first two bugs
# steps before the engine's own assert fails in update(), which PIP-005 names when the outcome is a
# preempted request's.
_ASYNC = get_flow("async").mutant_fields()
mutant("async-forgets-in-flight-on-preempt",
       "preemption resets the counters without marking the victim's in-flight tokens stale (vllm-project/vllm#48245)",
       ("PIP-003", "PIP-005"), **_ASYNC)(ForgetsInFlightOnPreempt)
mutant("async-final-chunk-without-placeholder",
       "the final chunk of a chunked prompt reserves no placeholder (vllm-project/vllm#35755)",
       ("PIP-003",), **_ASYNC)(FinalChunkWithoutPlaceholder)
mutant("async-applies-outcomes-of-finished", "an in-flight outcome of a request that finished meanwhile is applied",
       ("PIP-002",), **_ASYNC)(AppliesOutcomesOfFinished)
mutant("async-one-step-later", "outcomes are processed one step later than the declared pipeline depth",
       ("PIP-006", "PIP-007"), **_ASYNC)(OneStepLater)
mutant("async-resamples-after-preemption", "a preempted request's in-flight token is kept and sampled again",
       ("PIP-001",), **_ASYNC)(ResamplesAfterPreemption)
mutant("async-frees-without-fence",
       "blocks a step in flight still writes are freed at preemption or finish, without the fence",
       ("PIP-004",), **{**_ASYNC, "reference": DeferredFreeAsyncV1Scheduler})(FreesWithoutFence)
