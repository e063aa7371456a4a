"""Strict lockstep of the reference's SGLang flow against SGLang 0.5.23's scheduler code
(conformance/selftest/campaigns/lockstep_sglang.py), on a few traces of each policy.

Skipped when the ``sglang`` target is not installed, unless KVSCHED_REQUIRE_TARGETS=1 (CI).
"""

from __future__ import annotations

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.selftest.campaigns import lockstep_sglang as L
from tests.test_targets import need


@pytest.fixture(scope="module")
def adapter():
    return need("sglang").adapter()


@pytest.mark.parametrize("path", L.PATHS)
def test_lockstep_agrees(adapter, path):
    invariants = get_profile(L.PROFILE).invariants()
    for trace in sample_traces(L.path_strategy(path), 15, 20261201):
        outcome = L.run_one(adapter, trace, invariants)
        assert L.classify(outcome) in (None, "first-prefill-above-input-budget"), outcome.describe()
