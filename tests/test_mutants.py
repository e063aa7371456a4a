"""Every invariant has teeth: a mutant of the reference that its check catches.

For each (mutant, invariant) pair the mutant declares, Hypothesis searches (derandomised, so
the search is the same on every run) for a trace on which the mutant violates that invariant,
and the same trace is run on the reference, which must violate nothing. Remove an invariant's
predicate and its test here fails.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import traces
from conformance.selftest.mutants import MUTANTS, violated
from reference_impl import Scheduler
from spec.catalogue import catalogue, get

PAIRS = [(m.name, inv) for m in MUTANTS.values() for inv in m.catches]
SEARCH = settings(
    max_examples=4000, database=None, derandomize=True, phases=[Phase.generate],
    suppress_health_check=list(HealthCheck), deadline=None,
)


def test_every_invariant_has_a_mutant():
    caught = {inv for _, inv in PAIRS}
    missing = [inv.id for inv in catalogue() if inv.id not in caught]
    assert not missing, f"invariants without a mutant: {missing}"


def test_mutants_name_real_invariants():
    ids = {inv.id for inv in catalogue()}
    assert {inv for _, inv in PAIRS} <= ids


@pytest.mark.parametrize(("name", "invariant_id"), PAIRS, ids=[f"{n}-{i}" for n, i in PAIRS])
def test_mutant_is_caught(name, invariant_id):
    mutant = MUTANTS[name]
    strategy = mutant.trace_strategy() if mutant.trace_strategy else traces()
    checked = get_profile(mutant.profile).invariants() if mutant.profile else None
    # the search reads one invariant's verdict, so it checks that one alone: a predicate reads the
    # step record and the checker's context, never another invariant's verdict
    target = [get(invariant_id)]
    assert checked is None or target[0] in checked, f"{invariant_id} is not in {mutant.profile}"
    trace = find(strategy, lambda t: invariant_id in violated(mutant.factory, t, invariants=target), settings=SEARCH)
    reference = mutant.reference or Scheduler
    assert violated(reference, trace, invariants=checked) == set(), "the reference must pass the trace that exposes the mutant"
