"""The coverage gate: a campaign on a real target must reach every path its engine has.

A pass is only evidence for what the traces reached (`conformance.runner.coverage`). Each target
declares, as data beside its strategy, which lifecycle edges its engine can take and which
invariants its engine can never give anything to check (with the reason: no swap space, one
sequence per request, no ignore path); `gaps` lists what a campaign left out of the rest: an
applicable invariant with zero exercised steps, or a declared edge never taken. The target
tests run a small campaign per target and fail on any gap (tests/test_targets.py), so a
strategy that stops drawing n > 1, swaps or aborts is caught the day it does (issue 21: the
vllm-v0 strategy had drawn n = 1 only, and fork, copy-on-write and swap-in went unchecked). A
target may also ask for a rate (`Reach.least_steps`): vllm-v0 must fork, copy on write and swap
in on at least 50 steps per 100 examples (issue 29: its campaign had copied on write on 2).
"""

from __future__ import annotations

from typing import Any

from conformance.targets.reach import Reach, edge_name


def gaps(result: Any, reach: Reach) -> list[str]:
    """What the campaign ``result`` (a `conformance.runner.fuzz.FuzzResult`) left unreached that the
    engine has: one line each, empty when the campaign reached everything."""
    coverage = result.coverage
    out = [f"{i}: applicable, never exercised" for i in result.active
           if not coverage.steps[i] and i not in reach.unexercised]
    taken = {edge_name(e) for e, n in coverage.edges.items() if n}
    out += [f"{e}: the engine takes this edge, the campaign never did" for e in reach.edges if e not in taken]
    examples = max(result.examples, 1)
    out += [f"{event}: on {coverage.events[event]} steps of {examples} examples, expected at least "
            f"{least} per 100" for event, least in reach.least_steps.items()
            if coverage.events[event] * 100 < least * examples]
    return out
