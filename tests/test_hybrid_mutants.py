"""Every hybrid mutant (conformance/selftest/mutants_hybrid.py) is caught by the invariant it names,
on a trace the hybrid reference passes; tests/test_mutants.py runs the same search for every
mutant of every flow, this file runs the hybrid ones alone (quick to run while working on them)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from conformance.flows.profiles import get_profile
from conformance.selftest.mutants import MUTANTS, violated

HYBRID = [(m.name, inv) for m in MUTANTS.values() if m.name.startswith("hybrid-") for inv in m.catches]
SEARCH = settings(max_examples=4000, database=None, derandomize=True, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck), deadline=None)


def test_every_hyb_invariant_has_a_hybrid_mutant() -> None:
    from spec.catalogue import catalogue

    caught = {inv for _, inv in HYBRID}
    assert {inv.id for inv in catalogue() if inv.id.startswith("HYB-")} <= caught


@pytest.mark.parametrize(("name", "invariant_id"), HYBRID, ids=[f"{n}-{i}" for n, i in HYBRID])
def test_hybrid_mutant_is_caught(name: str, invariant_id: str) -> None:
    mutant = MUTANTS[name]
    checked = get_profile(mutant.profile).invariants()
    trace = find(mutant.trace_strategy(), lambda t: invariant_id in violated(mutant.factory, t, invariants=checked),
                 settings=SEARCH)
    assert violated(mutant.reference, trace, invariants=checked) == set()
