"""The mutation benchmark on vLLM 0.33.0 (conformance/selftest/mutation, benchmarks/bench_mutation_vllm.py):
descriptors are deterministic and cover the whole stack in proportion to its statements, areas
label without excluding, one population with kill kinds, baselines as expectations with their
where, and one mutant is applied through an overlay and killed by kvsched end to end (needs the
vllm-v1 target and Cosmic Ray's venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.selftest.mutation import descriptors as desc
from conformance.selftest.mutation import workspace
from conformance.selftest.mutation.summary import render, summarize
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


def test_sample_is_deterministic_site_first_and_in_proportion_to_statements():
    points, lines = _points()
    lines["b.py"] = lines["b.py"] * 3  # three times the statements (the points stay on its first 40 lines)
    one = desc.sample(points, lines, 20, seed=5)
    assert one == desc.sample(points, lines, 20, seed=5)
    assert one != desc.sample(points, lines, 20, seed=6)
    sites = {(m["file"], m["line"], m["col"]) for m in one}
    assert len(sites) == len(one) == 20  # one mutant per site
    assert [sum(m["file"] == f for m in one) for f in ("a.py", "b.py")] == [5, 15]
    assert [m["id"] for m in one] == [f"m{i:03d}" for i in range(20)]


def test_shares_are_proportional_with_at_least_one_each():
    assert desc.shares({"big": 1514, "tiny": 28, "mid": 361}, 320) == {"big": 254, "tiny": 5, "mid": 61}
    assert desc.shares({"a": 1000, "b": 1}, 10) == {"a": 9, "b": 1}
    assert sum(desc.shares({"a": 3, "b": 3, "c": 3}, 10).values()) == 10


def test_areas_label_a_mutant_and_never_leave_it_out():
    sched = "vllm/v1/core/sched/scheduler.py"
    assert desc.area_of(sched, "if kv_transfer_config is not None:", "__init__") == "kv-connector"
    assert desc.area_of(sched, "x = 1", "_update_waiting_for_remote_kv") == "kv-connector"
    assert desc.area_of("vllm/v1/core/block_pool.py", "assert block.ref_cnt == 0", "get_new_blocks") \
        == "assertions/logging"
    assert desc.area_of("vllm/v1/core/block_pool.py", "block.ref_cnt += 1", "touch") == "block pool"
    assert desc.area_of("vllm/v1/core/sched/request_queue.py", "return self._heap[0]", "peek_request") \
        == "request queues (FCFS / priority)"
    assert desc.area_of("vllm/v1/core/encoder_cache_manager.py", "return True", "can_allocate") == "encoder/multimodal"
    # a condition that guards only feature code belongs to the feature; one that guards more does not
    src = ["def f():", "    if total > 0:", "        self.num_executed_steps += 1", "    x = 1"]
    assert desc.guarded_body(src, 2) == ["self.num_executed_steps += 1"]
    assert desc.area_of(sched, src[1], "f", (), desc.guarded_body(src, 2)) == "parallelism"
    assert desc.area_of(sched, "if total > 0:", "f", (), ["self.num_executed_steps += 1", "y = 2"]) == "scheduling core"
    assert desc.area_of(sched, "x = 1", "schedule", ["if not preempted and self._pause_state != PauseState.PAUSED_ALL:"]) \
        == "scheduling core"
    assert desc.area_of(sched, "return 0", "get_num_unfinished_requests",
                        ["if self._pause_state == PauseState.PAUSED_ALL:"]) == "engine pause"


def _mutant(i: str, area: str = "scheduling core", **kw) -> dict:
    return {"id": i, "file": "f.py", "area": area, **kw}


def test_one_population_equivalence_refuted_by_a_kill_and_crashes_counted():
    m = {"id": "e", "file": "vllm/v1/core/sched/request_queue.py", "line": 181, "col": 41, "operator": "core/AddNot",
         "source_line": "requests_to_remove = requests if isinstance(requests, set) else set(requests)"}
    assert desc.equivalence_of(m)
    assert not desc.equivalence_of({**m, "source_line": "requests_to_remove = set(requests)"})  # another build
    mutants = [_mutant("e", equivalent="read so"), _mutant("r", equivalent="read so"), _mutant("k", "kv-connector"),
               _mutant("c"), _mutant("s", "kv-connector")]
    survived = {"verdict": "survived"}
    results = {"e": {"kvsched:vllm-v1": survived, "pytest": survived},
               "r": {"kvsched:vllm-v1": survived, "pytest": {"verdict": "killed", "kind": "oracle"}},
               "k": {"kvsched:vllm-v1": {"verdict": "killed", "kind": "crash"},
                     "kvsched:vllm-v1-async": {"verdict": "killed", "kind": "oracle"}, "pytest": survived},
               "c": {"kvsched:vllm-v1": {"verdict": "crash-at-import"}, "pytest": {"verdict": "crash-at-import"}},
               "s": {"kvsched:vllm-v1": survived, "pytest": survived}}
    s = summarize(mutants, results)
    assert list(s["equivalent"]) == ["e"] and list(s["equivalence_refuted"]) == ["r"]
    pop = s["population"]
    assert (pop["mutants"], pop["kvsched_kills"], pop["kvsched_oracle"], pop["kvsched_crash"]) == (4, 2, 1, 1)
    assert (pop["pytest_kills"], pop["union"], pop["neither"]) == (2, 3, ["s"])
    assert s["by_area"]["kv-connector"]["mutants"] == 2 and s["by_area"]["kv-connector"]["kvsched_oracle"] == 1
    assert "| 4 | 2 (50%) | 1 (25%) | 2 (50%) | 3 (75%) |" in render(s)


def test_committed_descriptors_cover_the_whole_stack_in_proportion():
    doc = desc.load(COMMITTED)
    assert doc["version"] == desc.VERSION and doc["package"] == desc.PACKAGE
    assert len(doc["mutants"]) == desc.POPULATION >= 300 and doc["seed"] == desc.SEED
    assert set(doc["files"]) == set(desc.FILES) and len(desc.FILES) == 8
    shares = desc.shares({f: meta["statements"] for f, meta in doc["files"].items()}, desc.POPULATION)
    assert {f: meta["mutants"] for f, meta in doc["files"].items()} == shares
    assert {f: sum(m["file"] == f for m in doc["mutants"]) for f in desc.FILES} == shares
    assert all({"file", "operator", "occurrence", "line", "col", "area"} <= set(m) for m in doc["mutants"])
    assert not any("scope" in m for m in doc["mutants"])  # areas label; nothing is out of scope
    assert all(m["equivalent"] == desc.equivalence_of(m) for m in doc["mutants"] if "equivalent" in m)


def test_the_equivalence_review_covers_every_mutant_and_is_current():
    from conformance.selftest.mutation.equivalence import EQUIVALENT, NOT_EQUIVALENT, review

    doc = desc.load(COMMITTED)
    keys = {(m["file"], m["line"], m["col"], m["operator"]) for m in doc["mutants"]}
    assert set(EQUIVALENT) <= keys and set(NOT_EQUIVALENT) <= keys and not set(EQUIVALENT) & set(NOT_EQUIVALENT)
    text = review(doc)
    assert text.count("\n| m") == len(doc["mutants"]) and text.count("**equivalent**") == len(EQUIVALENT)
    assert (COMMITTED.parent / "equivalence-review.md").read_text() == text


def test_a_sample_is_seeded_and_reaches_every_file():
    doc = desc.load(COMMITTED)
    one = desc.subsample(doc["mutants"], 36, desc.SEED)
    assert one == desc.subsample(doc["mutants"], 36, desc.SEED) and len(one) == 36
    assert {m["file"] for m in one} == set(desc.FILES)


def test_findings_the_baseline_has_are_expected_with_their_where():
    """The async judge's unmutated baseline fails CAP-006 on most traces: a mutant that fails it at
    another step, or more often, is killed; one that fails it less is not; kinds follow the new
    findings."""
    from conformance.selftest.mutation.kvsched_judge import kind_of, new_findings

    base = {"findings": [["CAP-006", 3, ""], ["CAP-006", 3, ""]], "steps": 9}
    assert not new_findings({"findings": [["CAP-006", 3, ""], ["CAP-006", 3, ""]], "steps": 9}, base)
    assert not new_findings({"findings": [["CAP-006", 3, ""]], "steps": 4}, base)  # less: no kill
    assert new_findings({"findings": [["CAP-006", 5, ""]], "steps": 9}, base) == [["CAP-006", 5, ""]]
    assert new_findings({"findings": [["CAP-006", 3, ""]] * 3, "steps": 9}, base) == [["CAP-006", 3, ""]]
    assert kind_of([["FAULT-raised", 2, "block_pool.py:305 in cache_full_blocks"]]) == "crash"
    assert kind_of([["FAULT-raised", 2, "x"], ["LOCKSTEP", 1, "scheduled"]]) == "oracle"
    assert kind_of([["FAULT-hang", 2, ""]]) == "timeout"
    assert kind_of([["STATE", 4, "num_computed_tokens"]]) == "oracle"


def test_a_test_failure_is_an_oracle_kill_when_the_test_s_own_check_fails():
    from conformance.selftest.mutation.pytest_judge import failure_kind

    own = "E   assert 3 == 4\n\ntests/v1/core/test_scheduler.py:120: AssertionError\n=== short test summary info ==="
    inside = ("E   AttributeError: 'NoneType' object has no attribute 'append'\n\n"
              "/x/site-packages/vllm/v1/core/block_pool.py:305: AttributeError\n=== short test summary info ===")
    assert failure_kind(own) == "oracle" and failure_kind(inside) == "crash"


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench", ROOT / "benchmarks" / "bench_mutation_vllm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_judges_at_full_strength_by_default():
    """Synchronous, pipelined and speculative traces all on; a crash kill goes on to the next
    judge, an oracle kill or a timeout ends kvsched's turn."""
    from conformance.selftest.mutation.kvsched_judge import TARGET_OF, flavour

    bench = _bench()
    args = bench.parse([])
    assert args.traces > 0 and args.async_traces > 0 and args.specdec_traces > 0
    assert args.out.name == "results.json" and bench.parse(["--sample", "36"]).out.name == "sample-results.json"
    assert TARGET_OF["vllm-v1-async+specdec"] == "vllm-v1-async" and flavour("vllm-v1-async+specdec").paths == ("async",)
    names = list(bench.KVSCHED_JUDGES)
    crash = {"kvsched:vllm-v1": {"verdict": "killed", "kind": "crash"}}
    assert not bench.done_with_kvsched(crash, names)
    assert bench.done_with_kvsched({**crash, "kvsched:vllm-v1-async": {"verdict": "killed", "kind": "oracle"}}, names)
    assert bench.done_with_kvsched({"kvsched:vllm-v1": {"verdict": "timeout"}}, names)
    survived = {"verdict": "survived"}
    assert bench.done_with_kvsched({f"kvsched:{n}": survived for n in names}, names)


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
    file = "vllm/v1/core/block_pool.py"
    lines = (site / file).read_text().splitlines()
    # block_pool.py, BlockPool.touch: `block.ref_cnt += 1` becomes `+= 2` (a leaked reference)
    point = next(p for p in desc.enumerate_points(workspace.tool_python(), site, (file,))
                 if p["operator"] == "core/NumberReplacer" and lines[p["start"][0] - 1].strip() == "block.ref_cnt += 1")
    mutant = {"id": "touch", "file": file, "operator": point["operator"], "occurrence": point["occurrence"]}
    before = desc.sha256(site / file)
    overlays = desc.materialize(workspace.tool_python(), site, [mutant], tmp_path / "scratch")
    overlay = {desc.module_name(file): str(overlays["touch"])}
    assert overlays["touch"].read_text() != (site / file).read_text()
    server = ForkServer(target.python, tmp_path / "fork.sock").start()
    try:
        judge = KvschedJudge(server, "vllm-v1", suite("vllm-v1", 24, 20261201))
        baseline = judge.baseline()
        assert judge.judge({}, baseline, 120)["verdict"] == "survived"  # the unmutated engine matches itself
        verdict = judge.judge(overlay, baseline, 120)
    finally:
        server.stop()
    assert verdict["verdict"] == "killed" and verdict["kind"] == "oracle", json.dumps(verdict)
    assert desc.sha256(site / file) == before  # the installed package is untouched


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
    sched = "vllm/v1/core/sched/scheduler.py"
    assert desc.area_of(sched, src[5], "f", headers[:-1]) == "spec-decode"
    assert desc.enclosing_headers(src, 8)[:-1] == ["z = a or ("]
    assert desc.area_of(sched, src[7], "f", desc.enclosing_headers(src, 8)[:-1]) == "scheduling core"


def test_a_default_argument_selects_the_tests_that_call_its_function_fastest_first():
    """An import-time line selects every test, except a default argument: the tests that run its
    function's body; tests go fastest first by their baseline time."""
    from conformance.selftest.mutation.pytest_judge import default_argument_body, fastest_first

    source = "X = 3\n\n\ndef f(\n    a: int = 0,\n    b=1,\n):\n    y = a + b\n    return y\n\n\ndef g():\n    return X\n"
    assert default_argument_body(source, 5, 5) == range(8, 10)
    assert default_argument_body(source, 1, 1) is None  # a module constant: every test
    assert default_argument_body(source, 8, 8) is None
    base = {"durations": {"t1": 3.0, "t2": 0.1, "t3": 1.0}}
    assert fastest_first(["t1", "t2", "t3", "t4"], base) == ["t2", "t3", "t1", "t4"]


def test_every_kvsched_judge_is_one_registry_entry_ordered_cheapest_first():
    from conformance.selftest.mutation.kvsched_judge import JUDGE_NAMES, flavour

    bench = _bench()
    assert {"vllm-v1-hybrid", "vllm-v1-async+hybrid"} <= set(JUDGE_NAMES)
    assert flavour("vllm-v1-async+hybrid").target == "vllm-v1-async"
    assert all(p.startswith("async-") for p in flavour("vllm-v1-async+hybrid").paths)
    # The connector and the other budgets have their own judges (issues 30 and 32 count on them).
    assert flavour("vllm-v1-connector").campaign == "lockstep_connector"
    from conformance.selftest.campaigns import lockstep_budgets, lockstep_connector

    assert set(flavour("vllm-v1-budgets").paths) <= set(lockstep_budgets.SYNC_PATHS)
    assert set(flavour("vllm-v1-async+budgets").paths) <= set(lockstep_budgets.ASYNC_PATHS)
    assert flavour("vllm-v1-async+budgets").target == "vllm-v1-async"
    assert set(flavour("vllm-v1-connector").paths) <= set(lockstep_connector.PATHS)
    assert not any(p.startswith("async") for p in flavour("vllm-v1-connector").paths)  # the synchronous host
    args = bench.parse(["--judge-traces", "vllm-v1-hybrid=7,vllm-v1-async+hybrid=0"])
    assert args.counts["vllm-v1-hybrid"] == 7 and args.counts["vllm-v1-async+hybrid"] == 0
    seconds = {"baseline_seconds": {"kvsched:vllm-v1": 9.0, "kvsched:vllm-v1-hybrid": 2.0}}
    assert bench.order_judges(["vllm-v1", "vllm-v1-async", "vllm-v1-hybrid"], seconds) == \
        ["vllm-v1-hybrid", "vllm-v1", "vllm-v1-async"]


def test_the_two_judges_runs_merge_their_verdicts_in_one_results_file(tmp_path):
    """A pytest run and a kvsched run at once each keep the other's verdicts; an old file's trace
    counts move out of its key."""
    bench = _bench()
    out = tmp_path / "results.json"
    key = {"descriptors_seed": 1, "population": 2, "sample": 0, "findings": bench.FINDINGS}
    old = {"version": bench.RESULTS_VERSION, "key": {**key, "traces": {"vllm-v1": 100}}, "baselines": {},
           "runs": [], "mutants": {"m1": {"pytest": {"verdict": "killed"}}}}
    out.write_text(json.dumps(old))
    kv = bench.load_results(out, key)
    assert kv["judge_traces"] == {"kvsched:vllm-v1": 100} and kv["mutants"]["m1"]["pytest"]["verdict"] == "killed"
    py = bench.load_results(out, key)
    kv["mutants"].setdefault("m2", {})["kvsched:vllm-v1"] = {"verdict": "survived"}
    bench.save_results(kv, out, {"kvsched"})
    py["mutants"]["m2"] = {"pytest": {"verdict": "survived"}}
    bench.save_results(py, out, {"pytest"})
    both = json.loads(out.read_text())["mutants"]
    assert both["m2"] == {"kvsched:vllm-v1": {"verdict": "survived"}, "pytest": {"verdict": "survived"}}
    assert both["m1"] == {"pytest": {"verdict": "killed"}}


def test_a_run_that_stops_early_has_judged_every_file_in_proportion():
    doc = desc.load(COMMITTED)
    order = desc.judging_order(doc["mutants"], desc.SEED)
    assert sorted(m["id"] for m in order) == sorted(m["id"] for m in doc["mutants"])
    assert order == desc.judging_order(doc["mutants"], desc.SEED)
    first = order[:64]  # a fifth of the 320
    per_file = {f: sum(m["file"] == f for m in doc["mutants"]) for f in desc.FILES}
    for f, n in per_file.items():
        assert abs(sum(m["file"] == f for m in first) - n / 5) <= 1, f


def test_a_cached_baseline_that_its_suite_no_longer_gives_is_stale():
    """A suite whose traces changed since its baseline was cached (the hybrid campaign gained paths)
    would judge each mutant against another trace's expectations: the bench judges it again."""
    bench = _bench()
    base = [{"findings": [["CAP-006", 3, ""]], "steps": 9}, {"findings": [], "steps": 4}]
    assert not bench.stale_baseline(base, [dict(b) for b in base])
    assert bench.stale_baseline(base, [base[0], {"findings": [], "steps": 5}])
    assert bench.stale_baseline(base, [{"findings": [["CAP-006", 4, ""]], "steps": 9}, base[1]])
    assert bench.stale_baseline(base, base[:1])
