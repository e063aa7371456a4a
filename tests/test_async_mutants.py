"""Each mutant of the pipelined reference (conformance/selftest/mutants_async.py) is caught by the PIP
invariants it names (drafted in conformance/selftest/async_checks.py), and the reference itself is
caught by none, on the same seeded traces."""

from __future__ import annotations

import functools

import pytest

from conformance.generation.async_paths import path_strategy
from conformance.generation.v0 import sample_traces
from conformance.selftest.async_checks import problems
from conformance.selftest.mutants_async import MUTANTS, AsyncMutant
from reference_impl.async_scheduler import AsyncV1Scheduler

SEED = 20261201


@functools.cache
def traces():
    return sample_traces(path_strategy("preemption"), 120, SEED)


def test_the_reference_breaks_no_pipelined_invariant() -> None:
    for depth in (1, 2):
        for trace in traces():
            assert problems(lambda config, d=depth: AsyncV1Scheduler(config, depth=d), trace) == []


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutant_is_caught_by_the_invariants_it_names(mutant: AsyncMutant) -> None:
    caught: set[str] = set()
    for trace in traces():
        found = problems(lambda config: mutant.cls(config, depth=1), trace)
        caught |= {p.split(" ", 1)[0].rstrip(":") for p in found}
        if caught & mutant.caught_by:
            break
    assert caught & mutant.caught_by, f"{mutant.name} ({mutant.upstream}) not caught; saw {sorted(caught)}"
