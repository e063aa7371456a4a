"""The mutation benchmark on vLLM 0.33.0 (conformance/selftest/mutation, benchmarks/bench_mutation_vllm.py):
descriptors are deterministic, scope rules read as documented, and one mutant is applied through
an overlay and killed by kvsched end to end (needs the vllm-v1 target and Cosmic Ray's venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.selftest.mutation import descriptors as desc
from conformance.selftest.mutation import workspace
from conformance.selftest.mutation.summary import summarize
from conformance.targets import get_target

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "docs" / "results" / "mutation-vllm" / "descriptors.json"


def _points() -> tuple[list[dict], dict[str, list[str]]]:
    points, lines = [], {}
    for f in ("a.py", "b.py"):
        lines[f] = [f"x = {i} < {i + 1}" for i in range(40)]
        for i in range(40):
            for op in ("core/ReplaceComparisonOperator_Lt_Gt", "core/ReplaceComparisonOperator_Lt_LtE"):
                points.append({"file": f, "operator": op, "occurrence": i, "start": [i + 1, 6], "end": [i + 1, 7],
                               "definition": None})
    return points, lines


def test_sample_is_deterministic_and_site_first():
    points, lines = _points()
    one = desc.sample(points, lines, 20, seed=5)
    assert one == desc.sample(points, lines, 20, seed=5)
    assert one != desc.sample(points, lines, 20, seed=6)
    sites = {(m["file"], m["line"], m["col"]) for m in one}
    assert len(sites) == len(one) == 20  # one mutant per site
    assert {m["file"] for m in one} == {"a.py", "b.py"}  # every file keeps its minimum
    assert [m["id"] for m in one] == [f"m{i:03d}" for i in range(20)]


def test_scope_rules():
    assert desc.scope_of("if kv_transfer_config is not None:", "__init__") == ("out", "kv-connector")
    assert desc.scope_of("x = 1", "_update_waiting_for_remote_kv") == ("out", "kv-connector")
    assert desc.scope_of("assert block.ref_cnt == 0", "get_new_blocks") == ("out", "assertion/logging")
    assert desc.scope_of("block.ref_cnt += 1", "touch") == ("in", "")
    # a condition that guards only feature code belongs to the feature; one that guards more does not
    src = ["def f():", "    if total > 0:", "        self.num_executed_steps += 1", "    x = 1"]
    assert desc.guarded_body(src, 2) == ["self.num_executed_steps += 1"]
    assert desc.scope_of(src[1], "f", (), desc.guarded_body(src, 2)) == ("out", "parallelism")
    assert desc.scope_of("if total > 0:", "f", (), ["self.num_executed_steps += 1", "y = 2"]) == ("in", "")
    # the admission loop runs under `!= PAUSED_ALL`: only code that runs in a paused state is out
    assert desc.scope_of("x = 1", "schedule", ["if not preempted and self._pause_state != PauseState.PAUSED_ALL:"]) \
        == ("in", "")
    assert desc.scope_of("return 0", "get_num_unfinished_requests",
                         ["if self._pause_state == PauseState.PAUSED_ALL:"]) == ("out", "engine pause")


def test_equivalent_mutants_are_named_by_source_and_left_out_of_both_denominators():
    m = {"id": "e", "file": "vllm/v1/core/sched/scheduler.py", "line": 2751, "operator": "core/ReplaceFalseWithTrue",
         "source_line": "stopped = False", "scope": "in"}
    assert desc.equivalence_of(m)
    assert not desc.equivalence_of({**m, "source_line": "stopped = True"})  # another build: no inherited verdict
    mutants = [{**m, "equivalent": desc.equivalence_of(m)}, {"id": "k", "scope": "in"}]
    results = {i: {"kvsched:vllm-v1": {"verdict": "survived"}, "kvsched:vllm-v1-async": {"verdict": "survived"},
                   "pytest": {"verdict": "killed"}} for i in ("e", "k")}
    s = summarize(mutants, results)["in"]
    assert (s["judged"], s["pytest_kills"], list(s["equivalent"])) == (1, 1, ["e"])


def test_committed_descriptors_are_versioned_and_hold_no_source_files():
    doc = desc.load(COMMITTED)
    assert doc["version"] == desc.VERSION and doc["package"] == desc.PACKAGE
    assert len(doc["mutants"]) >= 150
    assert set(doc["files"]) == set(desc.FILES)
    assert all({"file", "operator", "occurrence", "line", "col", "scope"} <= set(m) for m in doc["mutants"])


def test_summary_counts_each_side_and_leaves_crashes_out():
    mutants = [{"id": i, "scope": "in"} for i in ("a", "b", "c", "d")]
    results = {"a": {"kvsched:vllm-v1": {"verdict": "killed"}, "pytest": {"verdict": "survived"}},
               "b": {"kvsched:vllm-v1": {"verdict": "survived"}, "kvsched:vllm-v1-async": {"verdict": "timeout"},
                     "pytest": {"verdict": "killed"}},
               "c": {"kvsched:vllm-v1": {"verdict": "crash-at-import"}, "pytest": {"verdict": "crash-at-import"}},
               "d": {"kvsched:vllm-v1": {"verdict": "survived"}, "kvsched:vllm-v1-async": {"verdict": "survived"},
                     "pytest": {"verdict": "survived", "not_reached": True}}}
    s = summarize(mutants, results)["in"]
    assert (s["judged"], s["crash_at_import"], s["kvsched_kills"], s["pytest_kills"], s["either"]) == (3, 1, 2, 1, 2)
    assert s["kvsched_only"] == ["a"] and s["pytest_only"] == [] and s["neither"] == ["d"]
    assert s["pytest_not_reached"] == ["d"]


needs_target = pytest.mark.skipif(
    not (get_target("vllm-v1").installed() and workspace.tool_python().exists()),
    reason="needs `kvsched targets install vllm-v1` and the mutation venv (benchmarks/bench_mutation_vllm.py makes it)")


@needs_target
def test_descriptor_generation_is_deterministic_on_the_installed_package():
    venv = get_target("vllm-v1").root / "venv"
    files = ("vllm/v1/core/block_pool.py",)
    one = desc.generate(workspace.tool_python(), venv, 12, 3, files=files)
    assert one == desc.generate(workspace.tool_python(), venv, 12, 3, files=files)
    assert one["population"]["mutation_points"] > 100


@needs_target
def test_one_mutant_applied_through_an_overlay_and_killed_by_kvsched(tmp_path):
    from conformance.selftest.mutation.forks import ForkServer
    from conformance.selftest.mutation.kvsched_judge import KvschedJudge, suite

    target = get_target("vllm-v1")
    site = desc.site_packages(target.root / "venv")
    doc = desc.load(COMMITTED)
    desc.check_installed(doc, site)
    # block_pool.py, BlockPool.touch: `block.ref_cnt += 1` becomes `+= 2` (a leaked reference)
    mutant = next(m for m in doc["mutants"] if m["source_line"] == "block.ref_cnt += 1")
    before = desc.sha256(site / mutant["file"])
    overlays = desc.materialize(workspace.tool_python(), site, [mutant], tmp_path / "scratch")
    overlay = {desc.module_name(mutant["file"]): str(overlays[mutant["id"]])}
    assert overlays[mutant["id"]].read_text() != (site / mutant["file"]).read_text()
    server = ForkServer(target.python, tmp_path / "fork.sock").start()
    try:
        judge = KvschedJudge(server, "vllm-v1", suite("vllm-v1", 24, 20261201))
        baseline = judge.baseline()
        assert judge.judge({}, baseline, 120)["verdict"] == "survived"  # the unmutated engine matches itself
        verdict = judge.judge(overlay, baseline, 120)
    finally:
        server.stop()
    assert verdict["verdict"] == "killed", json.dumps(verdict)
    assert desc.sha256(site / mutant["file"]) == before  # the installed package is untouched


def test_scope_reads_enclosing_headers_whole_and_skips_continuations():
    src = ["def f(self):",
           "    if (",
           "        self.num_spec_tokens > 0",
           "    ):",
           "        if x > budget:",
           "            y = 1",
           "    z = a or (",
           "        b > 0",
           "    )"]
    headers = desc.enclosing_headers(src, 6)
    assert headers[1].startswith("if ( self.num_spec_tokens > 0")
    assert desc.scope_of(src[5], "f", headers[:-1]) == ("out", "spec-decode")
    assert desc.enclosing_headers(src, 8)[:-1] == ["z = a or ("]
    assert desc.scope_of(src[7], "f", desc.enclosing_headers(src, 8)[:-1]) == ("in", "")


def test_the_specdec_judge_drives_the_async_target_and_runs_only_on_survivors():
    import importlib.util

    from conformance.selftest.mutation.kvsched_judge import TARGET_OF, flavour

    assert TARGET_OF["vllm-v1-async+specdec"] == "vllm-v1-async"
    assert flavour("vllm-v1-async+specdec").paths == ("async",)
    spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "bench_mutation_vllm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    survived = {"kvsched:vllm-v1": {"verdict": "survived"}, "kvsched:vllm-v1-async": {"verdict": "survived"}}
    assert bench._needs_specdec(survived, {"kvsched"}, 40)
    assert not bench._needs_specdec(survived, {"kvsched"}, 0)  # off by default
    assert not bench._needs_specdec({"kvsched:vllm-v1": {"verdict": "killed"}}, {"kvsched"}, 40)
    assert not bench._needs_specdec({**survived, bench.SPECDEC: {"verdict": "survived"}}, {"kvsched"}, 40)
