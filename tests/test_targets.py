"""Real third-party schedulers through the wire protocol (conformance/targets).

Each test states a finding (or a pass) about a pinned target and fails if it stops being true.
A target that is not installed is skipped, unless KVSCHED_REQUIRE_TARGETS=1 (CI), where a
missing target is a failure: CI never passes silently without them.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.runner.driver import run_checked
from conformance.runner.fuzz import fuzz
from conformance.runner.plan import RunPlan
from conformance.targets import TARGET_SPECS, engine_configs, engine_traces, get_target
from spec.trace import Trace

DOCS = Path(__file__).resolve().parent.parent / "docs" / "traces"


def need(name: str):
    target = get_target(name)
    if not target.installed():
        message = f"target {name} is not installed (kvsched targets install {name})"
        # CI installs `all`, which leaves the nightly install profile out: those skip there.
        if os.environ.get("KVSCHED_REQUIRE_TARGETS") == "1" and target.install_profile == "default":
            pytest.fail(message)
        pytest.skip(message)
    return target


def replay(name: str, path: Path, profile: str = "safety", lockstep: bool = False):
    adapter = need(name).adapter()
    return run_checked(adapter, Trace.load(path), get_profile(profile).invariants(), timeout=60,
                       lockstep=lockstep, stop_at_first=False)


def test_registry_lists_the_targets_with_pins():
    assert {n: t.version for n, t in TARGET_SPECS.items()} == {
        "nano-vllm": "nano-vllm-npu==0.0.2", "nano-vllm-fork": "nano-vllm-fork==20260210",
        "vllm-v0": "vllm==0.10.2", "vllm-v1": "vllm==0.33.0", "vllm-v1-async": "vllm==0.33.0",
        "vllm-v1-async-0.29": "vllm==0.29.0",
        "sglang": "sglang==0.5.23", "lmdeploy": "lmdeploy==0.18.0", "aphrodite": "aphrodite-engine==0.24.1",
        "vidur-vllm": "vidur==0.0.26", "vidur-sarathi": "vidur==0.0.26", "vidur-orca": "vidur==0.0.26"}
    assert get_target("vllm-v1-async").root == get_target("vllm-v1").root  # one venv for both schedulers
    assert get_target("vllm-v1-async-0.29").root != get_target("vllm-v1").root  # 0.29.0 has its own
    assert get_target("vllm-v1-async-0.29").host == get_target("vllm-v1-async").host  # the same host
    assert get_target("vidur-orca").root == get_target("vidur-sarathi").root == get_target("vidur-vllm").root


def test_install_all_leaves_the_nightly_targets_out():
    from conformance.targets import install_names

    assert "sglang" not in install_names(["all"]) and "vllm-v1" in install_names(["all"])
    assert install_names(["nightly"]) == ["sglang", "lmdeploy", "aphrodite"]
    assert "vidur-vllm" in install_names(["all"])
    assert install_names(["sglang", "nightly"]) == ["sglang", "lmdeploy", "aphrodite"]


def test_sglang_scheduler_modules_import_without_a_gpu_stack():
    # hosts/sglang_stubs.py: stub parent package and a torchvision stub, nothing of SGLang changed
    import subprocess

    from conformance.targets import HOSTS_DIR

    target = need("sglang")
    proc = subprocess.run([str(target.python), str(HOSTS_DIR / "sglang_stubs.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.split() == ["PrefillAdder", "Scheduler"], proc.stderr[-2000:]


@pytest.mark.parametrize("name", ["nano-vllm", "nano-vllm-fork"])
def test_nano_vllm_overfills_the_running_seats_and_ignores_max_model_len(name, tmp_path):
    # nano-vllm's Scheduler.schedule counts only this step's admissions against max_num_seqs,
    # and nothing in scheduler.py / postprocess checks max_model_len.
    known = {"BUD-003", "STR-002", "LEN-001", "LEN-002", "LEN-003", "BUD-004", "FAULT-raised", "QUE-001", "QUE-002"}
    result = fuzz(lambda: need(name).adapter(), RunPlan(get_profile("safety"), max_examples=60, seed=20261130, out_dir=tmp_path),
                  shrink_only=lambda p: p not in known)  # what is found is checked here; shrinking has its own tests
    assert {"LEN-002", "LEN-003"} <= set(result.findings) <= known
    seats = replay(name, DOCS / "nano-vllm" / "handmade" / "seats-overfilled.json", profile="nano-vllm")
    assert {"BUD-003", "STR-002"} <= seats.problem_ids


def test_nano_vllm_fork_leaves_the_preempted_victim_in_running():
    result = replay("nano-vllm-fork", DOCS / "nano-vllm-fork" / "handmade" / "preempted-victim-stays-running.json")
    assert {"QUE-001", "QUE-002"} <= result.problem_ids
    assert min(v.step for v in result.violations if v.invariant_id == "QUE-001") == 5


def test_nano_vllm_upstream_handles_the_same_preemption():
    result = replay("nano-vllm", DOCS / "nano-vllm-fork" / "handmade" / "preempted-victim-stays-running.json")
    assert not {"QUE-001", "QUE-002"} & result.problem_ids and result.fault is None


def test_vllm_v0_agrees_with_the_reference_on_fcfs_traces(tmp_path):
    from hypothesis import given, seed, settings

    adapter = need("vllm-v0").adapter()
    seen = []

    @settings(max_examples=25, deadline=None, database=None)
    @seed(7)
    @given(engine_traces(engine_configs(watermark=0.01, modes=("recompute",), policies=("fcfs",)), max_n=1))
    def check(trace):
        result = run_checked(adapter, trace, get_profile("safety").invariants(), timeout=60, lockstep=True)
        seen.append(len(result.records))
        assert not result.failed, (result.problem_ids, result.divergence and result.divergence.describe())

    check()
    assert sum(seen) > 25


def test_vllm_v0_priority_swap_preemption_loses_its_swap_out():
    result = replay("vllm-v0", DOCS / "lockstep" / "priority-swap-out-lost.json")
    assert result.problem_ids & {"SWP-001", "QUE-002", "BLK-004"}


def test_vllm_v0_raises_when_swap_space_runs_out():
    result = replay("vllm-v0", DOCS / "lockstep" / "swap-space-exhausted.json")
    assert result.fault is not None and "lack of CPU swap space" in result.fault.message


def test_vllm_v1_conforms_to_safety_on_its_default_path(tmp_path):
    result = fuzz(lambda: need("vllm-v1").adapter(), RunPlan(get_profile("safety"), max_examples=25, seed=20261130, out_dir=tmp_path, timeout=60))  # reset builds a ModelConfig per max_model_len: slow on a busy machine
    assert result.examples == 25 and not result.findings, sorted(result.findings)


@pytest.mark.parametrize("profile", ["safety", "liveness"])
def test_sglang_conforms_on_its_page_size_one_path(profile, tmp_path):
    # docs/results/sglang.json and sglang-liveness.json: 300 traces each, no failure
    result = fuzz(lambda: need("sglang").adapter(), RunPlan(get_profile(profile), max_examples=25, seed=20261130, out_dir=tmp_path))
    assert result.examples == 25 and not result.findings, sorted(result.findings)


def test_sglang_retract_decode_sends_a_request_back_and_stays_safe():
    # 4 requests on 20 slots: PrefillAdder's 0.7 new-token ratio admits three, they outgrow the
    # pool and ScheduleBatch.retract_decode retracts C (the fuzzed traces never get that far)
    for profile in ("safety", "liveness"):
        result = replay("sglang", DOCS / "sglang" / "handmade" / "retract-decode.json", profile=profile)
        assert not result.failed and result.fault is None, result.problem_ids
    assert any(p.request_id == "C" for rec in result.records for p in rec.output.preempted)


# ------------------------------------------------------------------------------ LMDeploy, Aphrodite, Vidur (issue 20)
LMDEPLOY_KNOWN = {"REQ-004", "RES-003", "CAP-003", "CHK-003"}  # conformance/targets/expectations/lmdeploy.json


def test_lmdeploy_conforms_but_for_its_known_deviations(tmp_path):
    # docs/results/lmdeploy.json: the empty finish (engine.py:477-481: a prompt that fills max_session_len gets
    # max_new_tokens 0 and finishes after its prefill without a token) and the lazy recompute eviction
    result = fuzz(lambda: need("lmdeploy").adapter(), RunPlan(get_profile("liveness"), max_examples=25, seed=20261201, out_dir=tmp_path),
                  shrink_only=lambda p: p not in LMDEPLOY_KNOWN)  # what is found is checked here, not its shrunk trace
    assert result.examples == 25 and set(result.findings) <= LMDEPLOY_KNOWN, sorted(result.findings)
    empty = replay("lmdeploy", DOCS / "lmdeploy" / "counterexamples" / "REQ-004.json")
    assert empty.problem_ids == {"REQ-004"}


def test_lmdeploy_prefix_cache_hits_are_shared_blocks_and_free_once_unheld():
    # hosts/lmdeploy_host.py: the trie's own reference is not a table entry, and a block only it holds is free
    result = replay("lmdeploy", DOCS / "lmdeploy" / "handmade" / "prefix-cache-hit.json")
    assert not result.failed and result.fault is None, result.problem_ids
    prefills = {s.seq_id: s.num_tokens for rec in result.records for s in rec.output.scheduled if s.is_prefill}
    assert prefills == {"a#0": 40, "b#0": 8, "c#0": 8}  # b and c find a's two full blocks in the trie


def test_lmdeploy_preempts_keeps_the_blocks_then_reclaims_them_safely():
    # schedule_running preempts B (RUNNING -> READY -> WAITING with its blocks), and A's growth
    # reclaims them through RecomputeEvictionHelper; the fuzzed traces never outgrow the 16-token prealloc
    for profile in ("safety", "liveness"):
        result = replay("lmdeploy", DOCS / "lmdeploy" / "handmade" / "preempt-then-evict.json", profile=profile)
        assert not result.failed and result.fault is None, result.problem_ids
    assert any(p.request_id == "B" for rec in result.records for p in rec.output.preempted)


def test_aphrodite_conforms_on_its_default_path(tmp_path):
    # docs/results/aphrodite.json and aphrodite-liveness.json: 300 traces each, no failure
    result = fuzz(lambda: need("aphrodite").adapter(), RunPlan(get_profile("liveness"), max_examples=25, seed=20261201, out_dir=tmp_path))
    assert result.examples == 25 and not result.findings, sorted(result.findings)


def test_aphrodite_caps_a_lone_request_at_the_long_prefill_threshold():
    from conformance.selftest.campaigns import lockstep_v1

    trace = Trace.load(DOCS / "lockstep-aphrodite" / "chunked-threshold-caps-a-lone-request.json")
    adapter = need("aphrodite").adapter()
    outcome = lockstep_v1.run_one(adapter, trace, get_profile("safety").invariants())
    assert lockstep_v1.classify(adapter, trace, outcome) == "threshold-caps-a-lone-request"


def test_aphrodite_stops_its_running_scan_after_a_self_preemption():
    # aphrodite/v1/core/sched/scheduler.py:682-684 breaks where vLLM 0.33.0 goes on (983-995)
    from conformance.selftest.campaigns import lockstep_v1

    trace = Trace.load(DOCS / "lockstep-aphrodite" / "chunked-partial-self-preemption-ends-the-running-scan.json")
    adapter = need("aphrodite").adapter()
    outcome = lockstep_v1.run_one(adapter, trace, get_profile("safety").invariants())
    assert lockstep_v1.classify(adapter, trace, outcome) == "self-preemption-ends-the-running-scan"


VIDUR_KNOWN = {"LEN-001", "LEN-002", "LEN-003", "FAULT-raised", "LIV-001", "LIV-002", "LIV-003", "REQ-004", "BUD-001"}


@pytest.mark.parametrize("name", ["vidur-vllm", "vidur-sarathi", "vidur-orca"])
def test_vidur_schedulers_fail_only_as_documented(name, tmp_path):
    # docs/CONFORMANCE.md: no length limits, never-fitting prompts wait for ever, the restart assertion
    result = fuzz(lambda: need(name).adapter(), RunPlan(get_profile("liveness"), max_examples=25, seed=20261201, out_dir=tmp_path),
                  shrink_only=lambda p: p not in VIDUR_KNOWN)  # what is found is checked here, not its shrunk trace
    assert result.examples == 25 and set(result.findings) <= VIDUR_KNOWN, sorted(result.findings)


def test_vidur_restarted_request_trips_vidurs_own_assertion():
    # vidur/entities/request.py: restart() leaves _num_stage_processed_tokens, on_batch_stage_end asserts
    result = replay("vidur-vllm", DOCS / "lockstep-vidur" / "spec-restart-assertion.json")
    assert result.fault is not None and "request.py:300" in result.fault.message


@pytest.mark.parametrize("name", sorted(p.stem for p in (DOCS / "lockstep-vidur").glob("*.json")))
def test_vidur_lockstep_classes_hold_on_their_saved_traces(name):
    # docs/results/lockstep-vidur-vllm.json: each class's saved trace still shows that class
    from conformance.selftest.campaigns import lockstep_vidur

    trace = Trace.load(DOCS / "lockstep-vidur" / f"{name}.json")
    adapter = need("vidur-vllm").adapter()
    result = run_checked(adapter, trace, get_profile("vllm-v0").invariants(), timeout=60, lockstep=True)
    assert lockstep_vidur.classify(result) == trace.meta["class"]


# ------------------------------------------------------------------ the coverage gate (issue 21, item 1)
GATED = [name for name, t in TARGET_SPECS.items() if t.reach is not None]


def test_the_gate_names_the_spec_s_lifecycle_edges():
    from conformance.targets.reach import ALL_EDGES, edge_name
    from spec.lifecycle import EDGES

    assert ALL_EDGES == tuple(edge_name((a.value, b.value, c)) for a, b, c in EDGES)
    assert {"vllm-v0", "vllm-v1", "nano-vllm"} <= set(GATED)


def test_the_gate_holds_a_campaign_to_its_event_rates():
    """A rate (`Reach.least_steps`) is per 100 examples: 49 copy-on-write steps in 100 examples is
    a gap, 50 is not, and 30 in 50 examples is 60 per 100."""
    from types import SimpleNamespace

    from conformance.runner.coverage import Coverage
    from conformance.selftest.campaigns.coverage_gate import gaps
    from conformance.targets.reach import Reach

    reach = Reach((), least_steps={"copy_on_write": 50})
    for examples, steps, gap in ((100, 49, True), (100, 50, False), (50, 30, False), (50, 24, True)):
        coverage = Coverage([])
        coverage.add_counts(Counter({"copy_on_write": steps}), Counter())
        found = gaps(SimpleNamespace(coverage=coverage, active=[], examples=examples), reach)
        assert bool(found) == gap, (examples, steps, found)
    assert TARGET_SPECS["vllm-v0"].reach.least_steps == {"fork": 50, "copy_on_write": 50, "swap_in": 50}
    with pytest.raises(AssertionError, match="unknown events"):
        Reach((), least_steps={"forks": 1})


def test_the_v0_strategy_draws_forks_that_copy_on_write_and_pools_that_swap():
    """Of 60 drawn vllm-v0 traces, most have an n > 1 group whose prompt ends in a partly filled
    block with two or more tokens to generate (so a copy on write follows its fork), and some have
    a GPU pool at most 3 blocks over one max_model_len sequence with a CPU pool twice its size."""
    from conformance.generation.v0 import sample_traces

    traces = sample_traces(get_target("vllm-v0").strategy(), 60, 7)
    forks = [t for t in traces if any(a.request.n > 1 and a.request.prompt_len % t.config.block_size
                                      and a.request.max_tokens >= 2 for a in t.arrivals)]
    assert all(a.request.prompt_len % t.config.block_size
               for t in traces if t.config.block_size > 1 for a in t.arrivals if a.request.n > 1)
    pressed = [t for t in traces if t.config.num_cpu_blocks >= 2 * t.config.num_gpu_blocks
               and t.config.num_gpu_blocks <= -(-t.config.max_model_len // t.config.block_size) + 3]
    assert len(forks) >= 30 and len(pressed) >= 20, (len(forks), len(pressed))


@pytest.mark.parametrize("name", GATED)
def test_a_small_campaign_reaches_every_path_the_engine_has(name, tmp_path):
    """100 traces of the target's own strategy, run as `kvsched conform --adapter NAME` runs them
    (its own process, seeded batches), with its expectations file: every applicable invariant is
    exercised, every lifecycle edge its engine takes is taken, and nothing but its known
    deviations is found, at the rates the target asks for (vllm-v0: fork, copy-on-write and swap-in
    on at least 50 steps per 100 examples; it met 74-219 at seeds 20261130, 1 and 3)."""
    from conformance.runner.expectations import target_expectations
    from conformance.runner.isolated import ChildRunner, Limits
    from conformance.selftest.campaigns.coverage_gate import gaps

    target = need(name)
    expectations = target_expectations(name)
    # Its known deviations are found, not shrunk: shrinking them is nine tenths of the run (vllm-v0:
    # 108 s against 10 s) and has its own tests; an unexpected finding is shrunk for its message.
    result = fuzz(ChildRunner(name, Limits(timeout=60)), RunPlan(get_profile(target.profiles[0]), max_examples=100, seed=20261130, out_dir=tmp_path, timeout=60, expectations=expectations),
                  shrink_only=lambda p: p not in expectations.expected)
    assert result.examples == 100
    assert not gaps(result, target.reach), gaps(result, target.reach)
    assert not result.unexpected, {p: f.message for p, f in result.unexpected.items()}
