"""The coverage gate: a campaign on a real target must reach every path its engine has.

A pass is only evidence for what the traces reached (`conformance.coverage`). Each target
declares, as data beside its strategy, which lifecycle edges its engine can take and which
invariants its engine can never give anything to check (with the reason: no swap space, one
sequence per request, no ignore path); `gaps` lists what a campaign left out of the rest: an
applicable invariant with zero exercised steps, or a declared edge never taken. The target
tests run a small campaign per target and fail on any gap (tests/test_targets.py), so a
strategy that stops drawing n > 1, swaps or aborts is caught the day it does (issue 21: the
vllm-v0 strategy had drawn n = 1 only, and fork, copy-on-write and swap-in went unchecked).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ALL_EDGES = (
    "WAITING->RUNNING (admit)", "WAITING->FINISHED_IGNORED (ignore)", "WAITING->FINISHED_ABORTED (abort)",
    "RUNNING->RUNNING (decode)", "RUNNING->WAITING (preempt_recompute)", "RUNNING->SWAPPED (swap_out)",
    "RUNNING->FINISHED_STOPPED (finish_stop)", "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)",
    "RUNNING->FINISHED_ABORTED (abort)", "RUNNING->FINISHED_IGNORED (preempt_then_ignore)",
    "SWAPPED->RUNNING (swap_in)", "SWAPPED->FINISHED_IGNORED (ignore)", "SWAPPED->FINISHED_ABORTED (abort)",
)  # spec.lifecycle.EDGES as the report prints them (tests/test_targets.py holds the two equal)

# Invariants no engine without a swap space, or without n > 1, has anything for.
NO_SWAP = {i: "no swap space: nothing is swapped out or in"
           for i in ("BLK-002", "BLK-004", "RES-002", "SWP-001", "SWP-002", "SWP-003", "POL-002")}
ONE_SEQUENCE = {i: "one sequence per request: no fork, so no shared block to copy" for i in ("COW-001", "COW-002")}


@dataclass(frozen=True)
class Reach:
    """What a target's engine can do, so what its campaign must reach."""

    edges: tuple[str, ...]  # the lifecycle edges the engine takes, from ALL_EDGES
    unexercised: Mapping[str, str] = field(default_factory=dict)  # invariant id -> why the engine never exercises it

    def __post_init__(self) -> None:
        unknown = [e for e in self.edges if e not in ALL_EDGES]
        assert not unknown, f"unknown lifecycle edges {unknown} (known: {', '.join(ALL_EDGES)})"


def edge_name(edge: tuple[str, str, str]) -> str:
    src, dst, action = edge
    return f"{src}->{dst} ({action})"


def gaps(result: Any, reach: Reach) -> list[str]:
    """What the campaign ``result`` (a `conformance.fuzz.FuzzResult`) left unreached that the
    engine has: one line each, empty when the campaign reached everything."""
    coverage = result.coverage
    out = [f"{i}: applicable, never exercised" for i in result.active
           if not coverage.steps[i] and i not in reach.unexercised]
    taken = {edge_name(e) for e, n in coverage.edges.items() if n}
    out += [f"{e}: the engine takes this edge, the campaign never did" for e in reach.edges if e not in taken]
    return out
