"""vLLM 0.33.0's V1 scheduler with hybrid KV cache groups built in the host
(conformance/targets/hosts/vllm_hybrid_groups.py) in strict lockstep with the hybrid reference
(conformance/selftest/campaigns/lockstep_hybrid.py): decisions and every group's tables after every
step, on each path; and the hunt's checks on the target (HYB-001, BLK-003 over every group, the
policy HYB-004/005) find nothing.

Skipped when the ``vllm-v1`` target is not installed, unless KVSCHED_REQUIRE_TARGETS=1 (CI).
"""

from __future__ import annotations

import pytest

from conformance.flows.profiles import get_profile, invariants_of
from conformance.generation.v0 import sample_traces
from conformance.runner.driver import run_checked
from conformance.selftest.campaigns import hybrid_hunt
from conformance.selftest.campaigns import lockstep_hybrid as L
from spec.catalogue import get
from spec.kv_groups import NULL_BLOCK
from tests.test_targets import need


@pytest.fixture(scope="module")
def adapters():
    return {}


@pytest.mark.parametrize("path", L.CAMPAIGN_PATHS)
def test_path_agrees_step_for_step(adapters, path: str) -> None:
    pipelined = path.startswith("async-")
    name = "vllm-v1-async" if pipelined else "vllm-v1"
    if name not in adapters:
        adapters[name] = need(name).adapter()
    adapter = adapters[name]
    invariants = get_profile("async" if pipelined else "safety").invariants()
    nulls = 0
    for trace in sample_traces(L.path_strategy(path), 8 if pipelined else 12, 20261202):
        outcome = L.run_one(adapter, trace, invariants)
        # a +spec path may meet a classified vLLM defect (lockstep_hybrid.CLASSES); nothing open
        known = "+spec" in path and outcome.divergence_step is not None and \
            L.classify(trace, outcome) != "unclassified"
        assert outcome.divergence_step is None or known, outcome.describe()
        nulls += sum(NULL_BLOCK in table for r in outcome.result.records
                     for tables in (r.after.group_tables or {}).values() for table in tables)
    if "mamba-none" not in path:  # a window or a state group nulled positions on the engine's side too
        assert nulls > 0


def test_hunt_checks_apply_on_the_target_and_pass() -> None:
    adapter = hybrid_hunt._with_groups(need("vllm-v1").adapter())
    invariants = invariants_of(["safety"]) + [get("HYB-004"), get("HYB-005")]
    active: set[str] = set()
    try:
        for trace in sample_traces(hybrid_hunt.sync_strategy(), 8, 5):
            result = run_checked(adapter, trace, invariants, timeout=120, stop_at_first=False)
            assert result.problem_ids == set(), result.violations[:2]
            active |= {inv.id for inv in result.active}
    finally:
        adapter.close()
    assert {"HYB-001", "HYB-003", "HYB-004", "HYB-005", "BLK-003"} <= active  # checked on the target, not vacuous


def test_async_admission_cap_counts_two_batches(adapters) -> None:
    """The trace of the first run's async-sliding-window-hit-missing class: the AsyncScheduler host's
    VllmConfig keeps async scheduling on (the CPU platform turns it off), so a sliding window's
    admission cap counts the two batches in flight as the reference does; with one batch vLLM
    admitted r4 at step 16 where the reference waited."""
    import json
    from pathlib import Path

    from spec.trace import Trace

    if "vllm-v1-async" not in adapters:
        adapters["vllm-v1-async"] = need("vllm-v1-async").adapter()
    data = json.loads(Path("docs/traces/lockstep-hybrid/async-swa-prefix-admission-cap.json").read_text())
    trace = Trace.from_dict(data.get("trace", data))
    outcome = L.run_one(adapters["vllm-v1-async"], trace, get_profile("async").invariants())
    assert outcome.divergence_step is None, outcome.describe()
    assert len(outcome.result.records) > 16


def test_stale_step_drafts_are_delivered_whole(adapters) -> None:
    """The first of the three ``async-local+spec`` traces of the 1000-trace run that were
    ``unclassified`` (class ``stale-step-drafts-voided``, a reference bug): r1 is preempted at step 3
    with a step in flight whose real draft the trace accepts; vLLM delivers the stale step's tokens
    whole (v1/core/sched/scheduler.py:1825-1835), and the fixed reference agrees to the end."""
    import json
    from pathlib import Path

    from spec.trace import Trace

    if "vllm-v1-async" not in adapters:
        adapters["vllm-v1-async"] = need("vllm-v1-async").adapter()
    data = json.loads(Path("docs/traces/lockstep-hybrid/async-local-spec-stale-step-drafts.json").read_text())
    outcome = L.run_one(adapters["vllm-v1-async"], Trace.from_dict(data), get_profile("async").invariants())
    assert outcome.divergence_step is None, outcome.describe()
    assert len(outcome.result.records) > 3


def test_eagle_paths_drop_the_block_on_the_engine(adapters) -> None:
    """The ``+eagle`` paths have teeth: the host builds vLLM's scheduler with
    ``use_eagle_block_drop`` (vllm_hybrid_groups.with_eagle_block_drop), so the reference without the
    drop (``drop_eagle_block`` off) diverges on some of the first traces where the reference with it
    agrees (test_path_agrees_step_for_step)."""
    import dataclasses

    class NoDrop(L.RecordingHybrid):
        def __init__(self, config) -> None:
            super().__init__(dataclasses.replace(config, drop_eagle_block=False))

    if "vllm-v1" not in adapters:
        adapters["vllm-v1"] = need("vllm-v1").adapter()
    invariants = get_profile("safety").invariants()
    divergent = 0
    for trace in sample_traces(L.path_strategy("mamba-align+eagle"), 8, 20261202):
        holder: list = []

        def factory(config, holder=holder):
            holder.append(NoDrop(config))
            return holder[-1]

        result = run_checked(adapters["vllm-v1"], trace, invariants, lockstep=True, reference_factory=factory)
        divergent += result.divergence is not None or L.compare_state(result, holder[0]) is not None
    assert divergent > 0


def test_eagle_drop_self_preemption_is_the_engines(adapters) -> None:
    """``eagle-drop-mamba-self-preemption`` on vLLM 0.33.0's AsyncScheduler: the saved trace agrees step
    for step with the reference, and the engine never finishes it (LIV-002 on the engine's side)."""
    import json
    from pathlib import Path

    from spec.trace import Trace

    if "vllm-v1-async" not in adapters:
        adapters["vllm-v1-async"] = need("vllm-v1-async").adapter()
    data = json.loads(Path("docs/traces/lockstep-hybrid/async-mamba-align-eagle-self-preemption.json").read_text())
    trace = Trace.from_dict(data)
    outcome = L.run_one(adapters["vllm-v1-async"], trace, get_profile("async").invariants())
    assert outcome.divergence_step is None, outcome.describe()
    assert "LIV-002" in outcome.result.problem_ids
    assert L.classify(trace, outcome) == "eagle-drop-mamba-self-preemption"
