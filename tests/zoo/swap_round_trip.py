"""Swap back in within the schedule() that swapped out: a victim whose blocks fit again at once
(other requests finished or were preempted after it) comes back in the same step. smol-vllm and
kvstream both do this (their swap-in loop runs after the preemption loop, issue 34); the KV
makes a round trip through the CPU and nothing is lost.

The V0 reference, with its rule "no swap-in in a step that preempted" (vLLM's) dropped.
Correct: OUT-002, SWP-002 and SWP-003 follow the blocks through both maps.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from zoo._adapter import zoo_adapter


class SwapRoundTrip(Scheduler):
    def _schedule_running(self, budget, step) -> None:
        super()._schedule_running(budget, step)
        if step.preempted and self.swapped:  # the reference waits for the next step; this one does not
            preempted, step.preempted = step.preempted, []
            try:
                self._schedule_swapped(budget, step)
            finally:
                step.preempted = preempted + step.preempted


class LosesTheRoundTrip(SwapRoundTrip):
    def _schedule_swapped(self, budget, step) -> None:
        before = len(step.swap_in)
        super()._schedule_swapped(budget, step)
        del step.swap_in[before:]  # bug: the swap-in map is dropped, so no KV comes back


def make():
    return zoo_adapter("zoo-swap-round-trip", SwapRoundTrip)


def make_broken():
    return zoo_adapter("zoo-swap-round-trip-broken", LosesTheRoundTrip)
