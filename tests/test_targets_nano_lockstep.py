"""Strict lockstep of the reference's nano-vllm flow against nano-vllm's real scheduler core
(conformance/selftest/campaigns/lockstep_nano.py), on a few traces of the spec space.

Skipped when the ``nano-vllm`` target is not installed, unless KVSCHED_REQUIRE_TARGETS=1 (CI).
"""

from __future__ import annotations

import importlib.util

import pytest

from conformance.generation.v0 import sample_traces
from conformance.selftest.campaigns import lockstep_nano as L
from conformance.targets import HOSTS_DIR
from spec.types import generated_token
from tests.test_targets import need

HOST = HOSTS_DIR / "nano_vllm_host.py"


@pytest.fixture(scope="module")
def adapter():
    return need("nano-vllm").adapter()


def test_host_samples_the_spec_tokens():
    # The host cannot import kvsched; its copy of generated_token must stay the spec's.
    spec = importlib.util.spec_from_file_location("nano_vllm_host_copy", HOST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert [module.generated_token(rid, pos) for rid in ("r0", "r17") for pos in range(40)] == \
        [generated_token(rid, 0, pos) for rid in ("r0", "r17") for pos in range(40)]
    assert not 0 <= module.EOS < module.VOCAB_SIZE


def test_spec_space_agrees_or_diverges_only_at_documented_deviations(adapter):
    traces = sample_traces(L.spec_traces(), 20, 20261130)
    classes, steps = [], 0
    for trace in traces:
        assert L.in_spec_space(trace)
        result = L.run(adapter, trace)
        steps += len(result.records)
        cls = L.classify(adapter, result)
        classes.append(cls)
        assert cls != "unclassified", L.describe(result)
        if cls is not None:  # with nano's deviations modelled, the whole trace agrees
            assert L.run(adapter, trace, L.MODELLED, checked=False).divergence is None, trace
    assert steps > 50 and classes.count(None) >= 5, classes
    assert {c for c in classes if c} <= {"seats-overfilled", "whole-prompt-hit", "seats-overfilled+whole-prompt-hit"}


def test_stale_index_hit_is_nanos_and_the_reference_misses(adapter):
    result = L.run(adapter, L.stale_hit_trace())
    assert L.classify(adapter, result) == "stale-index-hit"
    d = result.divergence
    assert d.field == "scheduled" and d.reference == {("c#0", 3, True)} and d.target == {("c#0", 1, True)}
