"""Mutation benchmark (issue 21, item 5): seeded bugs in vLLM 0.33.0's V1 scheduler, judged by
kvsched and by vLLM's own tests on the same mutants.

    nice -n 10 python benchmarks/bench_mutation_vllm.py [--sample 160] [--seed 20261201] [--jobs 1]
        [--traces 100] [--async-traces 40] [--limit N] [--only m001,m002] [--judges kvsched,pytest]

1. Descriptors: Cosmic Ray's operators over the four files of the installed package
   (`conformance.selftest.mutation.descriptors`), a seeded site-first sample of ``--sample`` mutants, kept
   in ``docs/results/mutation-vllm/descriptors.json`` (regenerated only for another sample/seed).
2. Each mutant's file is written to a scratch overlay (never the installed package).
3. A fork server imports vLLM once; each judge of each mutant is a forked child with the overlay.
4. Baselines on the unmutated package: the fixed trace suites' outcomes (kvsched), and which
   tests pass and what lines each runs (vLLM's tests). Cached in the results file.
5. Judges per mutant: kvsched's lockstep campaign on ``vllm-v1`` (``--traces``) and, unless that
   kills it, on ``vllm-v1-async`` (``--async-traces``); vLLM's ``tests/v1/core`` (the tests that
   run the mutated line). Results are written after every mutant: an interrupted run resumes.

Needs ``kvsched targets install vllm-v1``; fetches Cosmic Ray, pytest and the sdist's tests into
``~/.cache/kvsched/mutation`` on first use. Prints one line per mutant and the summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Lock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.selftest.mutation import descriptors as desc  # noqa: E402
from conformance.selftest.mutation import workspace  # noqa: E402
from conformance.selftest.mutation.forks import ForkServer  # noqa: E402
from conformance.selftest.mutation.kvsched_judge import KvschedJudge, suite  # noqa: E402
from conformance.selftest.mutation.pytest_judge import PytestJudge  # noqa: E402
from conformance.selftest.mutation.summary import render, summarize  # noqa: E402
from conformance.targets import get_target  # noqa: E402

RESULTS_VERSION = 1
SPECDEC = "kvsched:vllm-v1-async+specdec"
OUT_DIR = Path("docs/results/mutation-vllm")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sample", type=int, default=160, help="mutants in the seeded sample")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--jobs", type=int, default=1, help="mutants judged at once")
    ap.add_argument("--traces", type=int, default=100, help="kvsched traces on vllm-v1 per mutant")
    ap.add_argument("--async-traces", type=int, default=40, help="kvsched traces on vllm-v1-async per mutant")
    ap.add_argument("--specdec-traces", type=int, default=0,
                    help="kvsched traces on vllm-v1-async with speculative decoding per mutant (0: none)")
    ap.add_argument("--kvsched-seconds", type=float, default=180.0, help="time cap of one kvsched judge")
    ap.add_argument("--pytest-seconds", type=float, default=300.0, help="time cap of one pytest judge")
    ap.add_argument("--limit", type=int, default=0, help="judge at most this many new mutants (a pilot)")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--judges", default="kvsched,pytest")
    ap.add_argument("--rebaseline", nargs="+", default=None, metavar="TEST_FILE",
                    help="rerun the pytest baseline of these test files (relative to the sdist), merge it, and "
                         "re-judge with their tests every judged mutant vLLM's tests let survive; then stop")
    ap.add_argument("--redo", default="", metavar="VERDICTS",
                    help="judge again the mutants kvsched gave one of these verdicts (comma-separated)")
    ap.add_argument("--rejudge-kvsched", action="store_true",
                    help="drop kvsched's baselines and verdicts (its traces or checks changed) and judge again; "
                         "vLLM's tests' verdicts are kept")
    ap.add_argument("--summary-only", action="store_true", help="recompute and print the summary, judge nothing")
    ap.add_argument("--descriptors", type=Path, default=OUT_DIR / "descriptors.json")
    ap.add_argument("--out", type=Path, default=OUT_DIR / "results.json")
    return ap.parse_args(argv)


def lines_file() -> Path:
    """The pytest baseline's per-test line coverage (megabytes): kept in the workspace, not in
    the committed results file."""
    return workspace.root() / "pytest-baseline-lines.json"


def load_results(path: Path, key: dict) -> dict:
    if path.exists():
        doc = json.loads(path.read_text())
        if doc.get("version") == RESULTS_VERSION and doc.get("key") == key:
            pytest_baseline = doc["baselines"].get("pytest")
            if pytest_baseline is not None and "lines" not in pytest_baseline:
                if not lines_file().exists():  # the coverage is gone: run that baseline again
                    doc["baselines"].pop("pytest")
                else:
                    pytest_baseline["lines"] = json.loads(lines_file().read_text())
            return doc
        print(f"{path}: made with other settings; starting afresh", flush=True)
    return {"version": RESULTS_VERSION, "key": key, "baselines": {}, "mutants": {}}


def save_results(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    slim = json.loads(json.dumps(doc))
    lines = slim["baselines"].get("pytest", {}).pop("lines", None)
    if lines is not None:
        lines_file().parent.mkdir(parents=True, exist_ok=True)
        lines_file().write_text(json.dumps(lines))
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(slim, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def machine() -> dict:
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "cpus": os.cpu_count(), "platform": platform.platform(), "load_1m": round(os.getloadavg()[0], 2)}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    judges = set(args.judges.split(","))
    target = get_target("vllm-v1")
    if not target.installed():
        print("vllm-v1 target not installed: run `kvsched targets install vllm-v1`", file=sys.stderr)
        return 2
    lock = _single_run()
    if lock is None:
        print(f"another run of this benchmark holds {workspace.root() / 'bench.lock'} (its fork server's socket is "
              "shared): wait for it to end", file=sys.stderr)
        return 2
    tool = workspace.ensure_tool()
    site = desc.site_packages(target.root / "venv")
    doc = desc.load(args.descriptors) if args.descriptors.exists() else None
    if doc is None or doc["seed"] != args.seed or len(doc["mutants"]) != args.sample:
        print(f"generating {args.sample} descriptors (seed {args.seed})", flush=True)
        doc = desc.generate(tool, target.root / "venv", args.sample, args.seed)
        desc.save(doc, args.descriptors)
    desc.check_installed(doc, site)
    rescoped = desc.rescope(doc, site)  # today's scope rules and equivalence verdicts, same sample
    if rescoped:
        print(f"scope or equivalence changed for {len(rescoped)} mutants: {' '.join(rescoped)}", flush=True)
        desc.save(doc, args.descriptors)
    mutants = doc["mutants"]
    if args.only:
        wanted = set(args.only.split(","))
        mutants = [m for m in mutants if m["id"] in wanted]

    key = {"descriptors_seed": args.seed, "sample": args.sample, "traces": args.traces,
           "async_traces": args.async_traces}
    results = load_results(args.out, key)
    if args.summary_only:
        results["summary"] = summarize(doc["mutants"], results["mutants"])
        save_results(results, args.out)
        print(render(results["summary"]))
        return 0
    if args.rejudge_kvsched:
        for name in [k for k in results["baselines"] if k.startswith("kvsched:")]:
            results["baselines"].pop(name)
        for entry in results["mutants"].values():
            for name in [k for k in entry if k.startswith("kvsched:")]:
                entry.pop(name)
        results["kvsched_rejudged"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    redo = set(filter(None, args.redo.split(",")))
    if redo:  # e.g. hangs judged before they were confirmed on a fresh host (kvsched_judge)
        for entry in results["mutants"].values():
            for name in [k for k, v in entry.items() if k.startswith("kvsched:") and v.get("verdict") in redo]:
                entry.pop(name)
    todo = [m for m in mutants if not all(j in results["mutants"].get(m["id"], {}) for j in _judge_keys(judges))
            or _needs_specdec(results["mutants"].get(m["id"], {}), judges, args.specdec_traces)]
    todo.sort(key=lambda m: (m["scope"] != "in", m["id"]))  # in scope first: a capped run still compares them
    if args.limit:
        todo = todo[:args.limit]
    overlays = desc.materialize(tool, site, todo, workspace.scratch())

    server = ForkServer(target.python, workspace.root() / "fork.sock", hf_home=workspace.ensure_hf(),
                        pytest_path=workspace.ensure_pytest(target.python) if "pytest" in judges else None)
    workspace.ensure_tests()
    print("starting the fork server (imports vLLM once)", flush=True)
    server.start()
    lock = Lock()
    try:
        kv = {}
        if "kvsched" in judges:
            if results.get("specdec_traces") != args.specdec_traces:  # not in the key: the other verdicts stay
                results["baselines"].pop(SPECDEC, None)
                for entry in results["mutants"].values():
                    entry.pop(SPECDEC, None)
                results["specdec_traces"] = args.specdec_traces
            for name, count in (("vllm-v1", args.traces), ("vllm-v1-async", args.async_traces),
                                ("vllm-v1-async+specdec", args.specdec_traces)):
                if not count:
                    continue
                kv[name] = KvschedJudge(server, name, suite(name, count, args.seed))
                if f"kvsched:{name}" not in results["baselines"]:
                    started = time.monotonic()
                    results["baselines"][f"kvsched:{name}"] = kv[name].baseline()
                    print(f"baseline {name}: {count} traces in {time.monotonic() - started:.0f} s", flush=True)
                    save_results(results, args.out)
        pj = PytestJudge(server, workspace.sdist_root(), workspace.root() / "pytest-runs")
        if "pytest" in judges and "pytest" not in results["baselines"]:
            print("baseline vLLM tests/v1/core (every file, with per-test line coverage)", flush=True)
            results["baselines"]["pytest"] = pj.baseline()
            b = results["baselines"]["pytest"]
            print(f"baseline pytest: {len(b['passing'])} passing, {len(b['failing_unmutated'])} failing unmutated, "
                  f"{len(b['unusable'])} unusable files, {b['seconds']} s", flush=True)
            save_results(results, args.out)

        if args.rebaseline:
            rebaseline(args, doc, results, pj, tool, site)
            return 0

        def judge(m: dict) -> None:
            overlay = {desc.module_name(m["file"]): str(overlays[m["id"]])} if m["id"] in overlays else None
            entry: dict = {}
            if overlay is None:
                entry = {"kvsched:vllm-v1": {"verdict": "not-applied"}, "pytest": {"verdict": "not-applied"}}
            else:
                known = dict(results["mutants"].get(m["id"], {}))  # verdicts kept from an earlier run
                if "kvsched" in judges:
                    seen = {k: v for k, v in known.items() if k.startswith("kvsched:")}
                    for name in ("vllm-v1", "vllm-v1-async", "vllm-v1-async+specdec"):  # until one kills it
                        if any(v["verdict"] in ("killed", "timeout", "crash-at-import") for v in seen.values()):
                            break
                        key = f"kvsched:{name}"
                        if key in seen or name not in kv:
                            continue
                        seen[key] = entry[key] = kv[name].judge(overlay, results["baselines"][key],
                                                                args.kvsched_seconds)
                if "pytest" in judges and "pytest" not in known:
                    tests = pj.select(results["baselines"]["pytest"], m)
                    entry["pytest"] = pj.judge(m["id"], overlay, tests, args.pytest_seconds)
            with lock:
                results["mutants"].setdefault(m["id"], {}).update(entry)
                results["machine"] = machine()
                save_results(results, args.out)
                done = len(results["mutants"])
                verdicts = " ".join(f"{k}={v['verdict']}" for k, v in sorted(entry.items()))
                print(f"[{done}/{len(doc['mutants'])}] {m['id']} {m['scope']:3} {m['file'].split('/')[-1]}:{m['line']} "
                      f"{m['operator'].split('/')[-1]}: {verdicts}", flush=True)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            list(pool.map(judge, todo))
    finally:
        server.stop()
    results["summary"] = summarize(doc["mutants"], results["mutants"])
    save_results(results, args.out)
    print(render(results["summary"]))
    return 0


def rebaseline(args: argparse.Namespace, doc: dict, results: dict, pj: PytestJudge, tool: Path, site: Path) -> None:
    """Add test files to the pytest baseline (`--rebaseline`) and give vLLM's tests their chance
    on the mutants they had let survive."""
    from conformance.selftest.mutation.pytest_judge import merge_baselines
    from conformance.selftest.mutation.summary import KILLS

    files = list(args.rebaseline)
    new = pj.baseline(files=files, tag="rebaseline")
    print(f"rebaseline {files}: {len(new['passing'])} passing, {len(new['failing_unmutated'])} failing, "
          f"{new['seconds']} s", flush=True)
    merged = merge_baselines(results["baselines"]["pytest"], new, files)
    results["baselines"]["pytest"] = merged
    save_results(results, args.out)
    again = [m for m in doc["mutants"] if results["mutants"].get(m["id"], {}).get("pytest", {}).get("verdict")
             in ("survived", "survived-budget")]
    chosen = {m["id"]: [t for t in pj.select(merged, m) if t.split("::")[0] in files] for m in again}
    again = [m for m in again if chosen[m["id"]]]
    overlays = desc.materialize(tool, site, again, workspace.scratch())
    for m in again:
        overlay = {desc.module_name(m["file"]): str(overlays[m["id"]])}
        verdict = pj.judge(m["id"], overlay, chosen[m["id"]], args.pytest_seconds)
        entry = results["mutants"][m["id"]]["pytest"]
        if verdict["verdict"] in KILLS:
            entry.update({**verdict, "rejudged_with": files, "not_reached": False})
        else:
            entry["also_ran"] = {"files": files, "tests": len(chosen[m["id"]]), "verdict": verdict["verdict"]}
        save_results(results, args.out)
        print(f"rejudged {m['id']}: pytest={verdict['verdict']} ({len(chosen[m['id']])} tests)", flush=True)
    results["summary"] = summarize(doc["mutants"], results["mutants"])
    save_results(results, args.out)
    print(render(results["summary"]))


def _single_run():
    """An exclusive lock on the workspace, held until exit: two runs would share the fork server's
    socket, and the second's server would answer the first's requests (every mutant then looks like
    a crash at import). None when another run holds it."""
    import fcntl

    workspace.root().mkdir(parents=True, exist_ok=True)
    handle = open(workspace.root() / "bench.lock", "w")  # noqa: SIM115 - held for the whole run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


def _needs_specdec(entry: dict, judges: set[str], count: int) -> bool:
    """A mutant every other kvsched judge let survive, not yet judged with speculative decoding."""
    verdicts = [v.get("verdict") for k, v in entry.items() if k.startswith("kvsched:")]
    return ("kvsched" in judges and bool(count) and SPECDEC not in entry and bool(verdicts)
            and not any(v in ("killed", "timeout", "crash-at-import", "not-applied") for v in verdicts))


def _judge_keys(judges: set[str]) -> list[str]:
    return [*(["kvsched:vllm-v1"] if "kvsched" in judges else []), *(["pytest"] if "pytest" in judges else [])]


if __name__ == "__main__":
    raise SystemExit(main())
