"""Mutation benchmark (issues 21 and 29): seeded bugs in vLLM 0.33.0's whole V1 scheduler stack,
judged by kvsched and by vLLM's own tests on the same mutants, over one population.

    nice -n 10 python benchmarks/bench_mutation_vllm.py --jobs 2              # all 320: the full run
    nice -n 10 python benchmarks/bench_mutation_vllm.py --jobs 2 --sample 36  # a seeded quick look

1. Descriptors: Cosmic Ray's operators over the eight files of the stack
   (`conformance.selftest.mutation.descriptors.FILES`), a seeded sample of ``--population``
   mutants, each file's share by its statements, site first inside a file; kept in
   ``docs/results/mutation-vllm/descriptors.json`` (regenerated only for another size or seed),
   with each mutant's feature area and, where read so, its equivalence (`equivalence.py`).
2. ``--sample N``: judge a seeded subsample of N of them (each file's share by its mutants), into
   ``sample-results.json``; without it every mutant is judged, into ``results.json``.
3. Each mutant's file is written to a scratch overlay (never the installed package); a fork server
   imports vLLM once, and each judge of each mutant is a forked child with the overlay.
4. Baselines on the unmutated package, cached in the results file: what kvsched's fixed trace
   suites find on each trace, with its where (the expectations a mutant is judged against), and
   which of vLLM's tests pass and what lines each runs.
5. Judges per mutant: kvsched's lockstep judges, one per lockstep campaign and host
   (`conformance.selftest.mutation.kvsched_judge.judges`: ``vllm-v1`` synchronous, ``vllm-v1-async``
   pipelined, ``vllm-v1-async+specdec`` speculative, ``vllm-v1-hybrid`` and ``vllm-v1-async+hybrid``
   hybrid KV cache groups, ``vllm-v1-connector`` the scripted KV connector (drafts on and off),
   ``vllm-v1-async+connector`` the same on the pipelined ``AsyncScheduler``, ``vllm-v1-budgets``
   encoder inputs, LoRA, pause, grammar waits and streaming sessions, ``vllm-v1-async+budgets`` the
   same on the pipelined ``AsyncScheduler``; ``--judge-traces NAME=N`` sets
   any judge's traces; a judge added later judges the mutants no judge has oracle-killed yet; a judge
   whose unmutated engine's findings changed since its cached baseline is judged again), cheapest first by
   their baseline's time, until one kills it with an oracle kill or a timeout (a crash kill goes on
   to the next); vLLM's ``tests/v1/core`` (the tests that run the mutated line, fastest first).
   Results are written after every mutant: an interrupted run resumes.
6. ``--judges pytest`` and ``--judges kvsched`` may run at once (each has its own lock, fork
   server and overlays; both write the same results file, merged under a file lock).

Needs ``kvsched targets install vllm-v1``; fetches Cosmic Ray, pytest and the sdist's tests into
``~/.cache/kvsched/mutation`` on first use. Prints one line per mutant and the summary (the
headline table and the per-area table, `summary.render`) at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Lock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.selftest.mutation import descriptors as desc  # noqa: E402
from conformance.selftest.mutation import workspace  # noqa: E402
from conformance.selftest.mutation.equivalence import review  # noqa: E402
from conformance.selftest.mutation.forks import ForkServer  # noqa: E402
from conformance.selftest.mutation.kvsched_judge import JUDGE_NAMES, KvschedJudge, judges, suite  # noqa: E402
from conformance.selftest.mutation.pytest_judge import PytestJudge  # noqa: E402
from conformance.selftest.mutation.summary import kill_kind, render, summarize  # noqa: E402
from conformance.targets import get_target  # noqa: E402

RESULTS_VERSION = 2
OUT_DIR = Path("docs/results/mutation-vllm")
KVSCHED_JUDGES = JUDGE_NAMES  # one per lockstep campaign and host (`kvsched_judge.judges`)
FINDINGS = "v2: expectations with their where; runs go on past a violation"


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=desc.POPULATION, help="mutants in the seeded population")
    ap.add_argument("--seed", type=int, default=desc.SEED)
    ap.add_argument("--sample", type=int, default=0,
                    help="judge only a seeded subsample of this many mutants (a quick look; 0: all)")
    ap.add_argument("--jobs", type=int, default=1, help="mutants judged at once")
    ap.add_argument("--traces", type=int, default=100, help="kvsched synchronous traces (vllm-v1) per mutant")
    ap.add_argument("--async-traces", type=int, default=40, help="kvsched pipelined traces (vllm-v1-async) per mutant")
    ap.add_argument("--specdec-traces", type=int, default=20,
                    help="kvsched speculative-decoding traces (vllm-v1-async) per mutant")
    ap.add_argument("--judge-traces", default="", metavar="NAME=N,...",
                    help="traces per mutant of any kvsched judge by name (0: off); defaults: "
                         + ", ".join(f"{j.name}={j.traces}" for j in judges()))
    ap.add_argument("--kvsched-seconds", type=float, default=180.0, help="time cap of one kvsched judge")
    ap.add_argument("--pytest-seconds", type=float, default=300.0, help="time cap of one pytest judge")
    ap.add_argument("--limit", type=int, default=0, help="judge at most this many new mutants (a pilot)")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--judges", default="kvsched,pytest")
    ap.add_argument("--redo", default="", metavar="VERDICTS",
                    help="judge again the mutants kvsched gave one of these verdicts (comma-separated)")
    ap.add_argument("--rejudge-kvsched", action="store_true",
                    help="drop kvsched's baselines and verdicts (its traces or checks changed) and judge again; "
                         "vLLM's tests' verdicts are kept")
    ap.add_argument("--summary-only", action="store_true", help="recompute and print the summary, judge nothing")
    ap.add_argument("--descriptors", type=Path, default=OUT_DIR / "descriptors.json")
    ap.add_argument("--out", type=Path, default=None,
                    help="results file (default: results.json, or sample-results.json with --sample)")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = OUT_DIR / ("sample-results.json" if args.sample else "results.json")
    for name in ("population", "jobs", "traces"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1")
    args.counts = {j.name: j.traces for j in judges()}
    args.counts.update({"vllm-v1": args.traces, "vllm-v1-async": args.async_traces,
                        "vllm-v1-async+specdec": args.specdec_traces})
    for item in filter(None, args.judge_traces.split(",")):
        name, _, count = item.partition("=")
        if name not in args.counts or not count.isdigit():
            ap.error(f"--judge-traces: {item!r} is not NAME=N with NAME one of {', '.join(args.counts)}")
        args.counts[name] = int(count)
    return args


def lines_file() -> Path:
    """The pytest baseline's per-test line coverage (megabytes): kept in the workspace, not in
    the committed results file."""
    return workspace.root() / "pytest-baseline-lines.json"


def load_results(path: Path, key: dict) -> dict:
    if path.exists():
        doc = json.loads(path.read_text())
        migrate(doc)
        if doc.get("version") == RESULTS_VERSION and doc.get("key") == key:
            pytest_baseline = doc["baselines"].get("pytest")
            if pytest_baseline is not None and "lines" not in pytest_baseline:
                if not lines_file().exists():  # the coverage is gone: run that baseline again
                    doc["baselines"].pop("pytest")
                else:
                    pytest_baseline["lines"] = json.loads(lines_file().read_text())
            return doc
        print(f"{path}: made with other settings; starting afresh", flush=True)
    return {"version": RESULTS_VERSION, "key": key, "baselines": {}, "mutants": {}, "runs": [], "judge_traces": {}}


def migrate(doc: dict) -> None:
    """A results file from before each kvsched judge kept its own trace count: the key's
    ``traces`` become ``judge_traces`` (so adding a judge keeps every other judge's verdicts)."""
    traces = doc.get("key", {}).pop("traces", None)
    if traces is not None:
        doc.setdefault("judge_traces", {}).update({f"kvsched:{n}": c for n, c in traces.items()})
    doc.setdefault("judge_traces", {})


def drop_judge(doc: dict, key: str) -> None:
    """Forget one judge's baseline and verdicts (its traces changed)."""
    doc["baselines"].pop(key, None)
    doc.get("baseline_seconds", {}).pop(key, None)
    for entry in doc["mutants"].values():
        entry.pop(key, None)


def stale_baseline(cached: list[dict], fresh: list[dict]) -> bool:
    """The cached baseline is not the suite's today: another count, or another finding or step count
    on some trace (its traces, the host or the reference changed since it was measured)."""
    return len(cached) != len(fresh) or any(a != b for a, b in zip(cached, fresh, strict=True))


def owns(key: str, judge_set: set[str]) -> bool:
    """Whether a run with ``judge_set`` writes the verdicts and baseline under ``key``."""
    return ("pytest" in judge_set and key == "pytest") or ("kvsched" in judge_set and key.startswith("kvsched:"))


def merge_from_disk(doc: dict, path: Path, judge_set: set[str]) -> None:
    """Take into ``doc`` what another run (the other judge, at the same time) wrote to ``path``:
    the baselines, trace counts and verdicts of the judges this run does not own, and its runs."""
    if not path.exists():
        return
    try:
        disk = json.loads(path.read_text())
    except ValueError:
        return
    migrate(disk)
    if disk.get("version") != doc["version"] or disk.get("key") != doc["key"]:
        return
    for section in ("baselines", "judge_traces", "baseline_seconds"):
        for k, v in disk.get(section, {}).items():
            if not owns(k, judge_set):
                doc.setdefault(section, {})[k] = v
    for mid, entry in disk["mutants"].items():
        mine = doc["mutants"].setdefault(mid, {})
        for k, v in entry.items():
            if not owns(k, judge_set):
                mine[k] = v
    seen = {(r.get("commit"), r.get("started", {}).get("date"), r.get("judges")) for r in doc.get("runs", [])}
    for r in disk.get("runs", []):
        if (r.get("commit"), r.get("started", {}).get("date"), r.get("judges")) not in seen:
            doc.setdefault("runs", []).append(r)
    doc["runs"].sort(key=lambda r: r.get("started", {}).get("date", ""))


def save_results(doc: dict, path: Path, judge_set: set[str] | None = None) -> None:
    """Write ``doc`` to ``path`` (atomically), first merging what a concurrent run of the other
    judge wrote there (``judge_set``: the judges this run owns; under a file lock)."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    workspace.root().mkdir(parents=True, exist_ok=True)
    with open(workspace.root() / f"{path.name}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if judge_set is not None:
            merge_from_disk(doc, path, judge_set)
        _write(doc, path)


def _write(doc: dict, path: Path) -> None:
    slim = json.loads(json.dumps(doc))
    lines = slim["baselines"].get("pytest", {}).pop("lines", None)
    if lines is not None:
        lines_file().parent.mkdir(parents=True, exist_ok=True)
        part = lines_file().with_suffix(f".{os.getpid()}.tmp")
        part.write_text(json.dumps(lines))
        os.replace(part, lines_file())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(slim, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip()
        # The results files themselves change while a run goes on (the other judge's run writes them).
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":!{OUT_DIR}"], capture_output=True,
                               text=True, check=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine() -> dict:
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "cpus": os.cpu_count(), "platform": platform.platform(), "load_1m": round(os.getloadavg()[0], 2)}


def cpu_seconds() -> float:
    """CPU time of this process and the children it waited for: the runner's side (traces, checks,
    the reference). The judged hosts and pytest runs are the fork server's children, which it does
    not wait for, so their CPU time is not in it."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def chosen(doc: dict, args: argparse.Namespace) -> list[dict]:
    mutants = doc["mutants"]
    if args.sample:
        mutants = desc.subsample(mutants, args.sample, args.seed)
    if args.only:
        wanted = set(args.only.split(","))
        mutants = [m for m in mutants if m["id"] in wanted]
    return mutants


def done_with_kvsched(entry: dict, names: list[str]) -> bool:
    """kvsched has its verdict: an oracle kill or a timeout by one judge, or every judge has run."""
    kinds = [kill_kind(entry[f"kvsched:{n}"]) for n in names if f"kvsched:{n}" in entry]
    return any(k in ("oracle", "timeout") for k in kinds) or all(f"kvsched:{n}" in entry for n in names) \
        or entry.get("kvsched:vllm-v1", {}).get("verdict") in ("crash-at-import", "not-applied")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    judge_set = set(args.judges.split(","))
    if not judge_set <= {"kvsched", "pytest"}:
        print(f"--judges: {args.judges!r} is not a comma-separated list of kvsched, pytest", file=sys.stderr)
        return 2
    target = get_target("vllm-v1")
    if not target.installed():
        print("vllm-v1 target not installed: run `kvsched targets install vllm-v1`", file=sys.stderr)
        return 2
    lock = _single_run(judge_set) if not args.summary_only else []  # a summary judges nothing: no lock
    if lock is None:
        print(f"another run of this benchmark's {' and '.join(sorted(judge_set))} judge holds its lock in "
              f"{workspace.root()}: wait for it to end (the other judge may run at the same time)", file=sys.stderr)
        return 2
    tool = workspace.ensure_tool()
    site = desc.site_packages(target.root / "venv")
    doc = desc.load(args.descriptors) if args.descriptors.exists() else None
    if doc is None or doc["seed"] != args.seed or len(doc["mutants"]) != args.population:
        print(f"generating {args.population} descriptors (seed {args.seed})", flush=True)
        doc = desc.generate(tool, target.root / "venv", args.population, args.seed)
        desc.save(doc, args.descriptors)
    desc.check_installed(doc, site)
    reread = desc.reread(doc, site)  # today's area rules and equivalence verdicts, same sample
    if reread:
        print(f"area or equivalence changed for {len(reread)} mutants: {' '.join(reread)}", flush=True)
        desc.save(doc, args.descriptors)
    review_file = args.descriptors.with_name("equivalence-review.md")
    if not review_file.exists() or review_file.read_text() != review(doc):
        review_file.write_text(review(doc))
    mutants = chosen(doc, args)
    counts = args.counts
    key = {"descriptors_seed": args.seed, "population": args.population, "sample": args.sample, "findings": FINDINGS}
    results = load_results(args.out, key)
    if "kvsched" in judge_set:
        for name, count in counts.items():  # a judge whose trace count changed is judged again
            if results["judge_traces"].get(f"kvsched:{name}", count) != count:
                print(f"kvsched:{name}: {count} traces, not {results['judge_traces'][f'kvsched:{name}']}: "
                      "judged again", flush=True)
                drop_judge(results, f"kvsched:{name}")
            if count:
                results["judge_traces"][f"kvsched:{name}"] = count
    names = order_judges([n for n in KVSCHED_JUDGES if counts[n]], results)
    population = [m for m in doc["mutants"] if m["id"] in {c["id"] for c in chosen(doc, args)}] \
        if args.sample else doc["mutants"]
    if args.summary_only:
        merge_from_disk(results, args.out, set())
        results["summary"] = summarize(population, results["mutants"])
        save_results(results, args.out)
        print(render(results["summary"]))
        return 0
    if args.rejudge_kvsched:
        for name in [k for k in results["baselines"] if k.startswith("kvsched:")]:
            drop_judge(results, name)
    redo = set(filter(None, args.redo.split(",")))
    if redo:  # e.g. hangs judged before they were confirmed on a fresh host (kvsched_judge)
        for entry in results["mutants"].values():
            for name in [k for k, v in entry.items() if k.startswith("kvsched:") and v.get("verdict") in redo]:
                entry.pop(name)

    def to_judge() -> list[dict]:
        todo = [m for m in desc.judging_order(mutants, args.seed)
                if ("kvsched" in judge_set and not done_with_kvsched(results["mutants"].get(m["id"], {}), names))
                or ("pytest" in judge_set and "pytest" not in results["mutants"].get(m["id"], {}))]
        return todo[:args.limit] if args.limit else todo

    todo = to_judge()
    family = "-".join(sorted(judge_set))  # the other judge's run may go on beside this one
    overlays = desc.materialize(tool, site, todo, workspace.scratch() / family)

    server = ForkServer(target.python, workspace.root() / f"fork-{family}.sock", hf_home=workspace.ensure_hf(),
                        pytest_path=workspace.ensure_pytest(target.python) if "pytest" in judge_set else None)
    workspace.ensure_tests()
    print("starting the fork server (imports vLLM once)", flush=True)
    run = {"commit": commit(), "started": machine(), "mutants_to_judge": len(todo), "jobs": args.jobs,
           "judges": ",".join(sorted(judge_set))}
    engine_cpu = [0.0]  # the forked judges' CPU seconds (hosts and pytest runs), as they report it
    wall, cpu = time.monotonic(), cpu_seconds()
    server.start()
    lock = Lock()
    try:
        kv = {}
        if "kvsched" in judge_set:
            for name in names:
                kv[name] = KvschedJudge(server, name, suite(name, counts[name], args.seed))
                # Every run measures its baselines again (seconds each): a suite whose traces, host or
                # reference changed since the cached baseline would judge mutants against another
                # trace's expectations, so a judge whose baseline changed is judged again.
                started = time.monotonic()
                fresh = kv[name].baseline()
                cached = results["baselines"].get(f"kvsched:{name}")
                if cached is not None and stale_baseline(cached, fresh):
                    print(f"kvsched:{name}: the unmutated engine's findings on its suite changed since the cached "
                          "baseline: judged again", flush=True)
                    drop_judge(results, f"kvsched:{name}")
                if f"kvsched:{name}" not in results["baselines"]:
                    results["baselines"][f"kvsched:{name}"] = fresh
                    results.setdefault("baseline_seconds", {})[f"kvsched:{name}"] = round(time.monotonic() - started, 1)
                    found = sum(bool(b["findings"]) for b in fresh)
                    print(f"baseline {name}: {counts[name]} traces in {time.monotonic() - started:.0f} s, "
                          f"{found} with expected findings", flush=True)
                    save_results(results, args.out, judge_set)
            names = order_judges(names, results)
            run["kvsched_order"] = names
            if len(again := to_judge()) > len(todo):  # a stale baseline's verdicts were dropped
                overlays.update(desc.materialize(tool, site, [m for m in again if m["id"] not in overlays],
                                                 workspace.scratch() / family))
                todo = again
                run["mutants_to_judge"] = len(todo)
            print(f"kvsched judges, cheapest first by their baseline's time: {', '.join(names)}", flush=True)
        pj = PytestJudge(server, workspace.sdist_root(), workspace.root() / "pytest-runs")
        if "pytest" in judge_set and "pytest" not in results["baselines"]:
            print("baseline vLLM tests/v1/core (every file, with per-test line coverage)", flush=True)
            results["baselines"]["pytest"] = pj.baseline()
            b = results["baselines"]["pytest"]
            print(f"baseline pytest: {len(b['passing'])} passing, {len(b['failing_unmutated'])} failing unmutated, "
                  f"{len(b['unusable'])} unusable files, {b['seconds']} s", flush=True)
            save_results(results, args.out, judge_set)
        if "pytest" in judge_set and not results["baselines"]["pytest"].get("durations"):
            kept = pj.durations_of()  # a baseline from before its per-test times were stored
            if kept is not None and set(kept) == set(results["baselines"]["pytest"]["passing"]):
                results["baselines"]["pytest"]["durations"] = kept
        run["baselines_seconds"] = round(time.monotonic() - wall, 1)

        def judge(m: dict) -> None:
            overlay = {desc.module_name(m["file"]): str(overlays[m["id"]])} if m["id"] in overlays else None
            entry: dict = {}
            if overlay is None:
                entry = {"kvsched:vllm-v1": {"verdict": "not-applied"}, "pytest": {"verdict": "not-applied"}}
            else:
                known = dict(results["mutants"].get(m["id"], {}))  # verdicts kept from an earlier run
                if "kvsched" in judge_set:
                    seen = {k: v for k, v in known.items() if k.startswith("kvsched:")}
                    for name in names:  # until one kills it with an oracle kill or a timeout
                        if done_with_kvsched(seen, names):
                            break
                        key = f"kvsched:{name}"
                        if key in seen:
                            continue
                        seen[key] = entry[key] = kv[name].judge(overlay, results["baselines"][key],
                                                                args.kvsched_seconds)
                if "pytest" in judge_set and "pytest" not in known:
                    tests = pj.select(results["baselines"]["pytest"], m, (site / m["file"]).read_text())
                    entry["pytest"] = pj.judge(m["id"], overlay, tests, args.pytest_seconds)
            with lock:
                engine_cpu[0] += sum(v.get("cpu_seconds", 0.0) + v.get("engine_cpu_seconds", 0.0)
                                     for v in entry.values())
                results["mutants"].setdefault(m["id"], {}).update(entry)
                run["mutants_judged"] = run.get("mutants_judged", 0) + 1
                save_results(results, args.out, judge_set)
                verdicts = " ".join(f"{k}={v['verdict']}{'/' + v['kind'] if v.get('kind') else ''}"
                                    for k, v in sorted(entry.items()))
                print(f"[{sum(1 for c in mutants if c['id'] in results['mutants'])}/{len(mutants)}] {m['id']} "
                      f"{m['file'].split('/')[-1]}:{m['line']} {m['operator'].split('/')[-1]} ({m['area']}): {verdicts}",
                      flush=True)

        pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
        futures = [pool.submit(judge, m) for m in todo]
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            for future in futures:
                future.result()
        except KeyboardInterrupt:  # stopped (Ctrl-C, SIGTERM): the judges under way finish, the run is recorded
            run["interrupted"] = True
            print("interrupted: the mutants being judged finish, the rest wait for the next run", flush=True)
            pool.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True)
    finally:
        server.stop()
    run.update({"ended": machine(), "wall_seconds": round(time.monotonic() - wall, 1),
                "runner_cpu_seconds": round(cpu_seconds() - cpu, 1), "judges_cpu_seconds": round(engine_cpu[0], 1)})
    results.setdefault("runs", []).append(run)
    merge_from_disk(results, args.out, judge_set)
    results["summary"] = summarize(population, results["mutants"])
    save_results(results, args.out, judge_set)
    print(f"judged {run.get('mutants_judged', 0)} of {len(todo)} mutants in {run['wall_seconds']:.0f} s wall, {run['runner_cpu_seconds']:.0f} s runner CPU, "
          f"{run['judges_cpu_seconds']:.0f} s forked judges' CPU "
          f"(load {run['started']['load_1m']} -> {run['ended']['load_1m']})")
    print(render(results["summary"]))
    return 0


def _interrupt(_signum, _frame) -> None:  # noqa: ANN001 - signal handler signature
    raise KeyboardInterrupt


def order_judges(names: list[str], results: dict) -> list[str]:
    """kvsched's judges, cheapest first: by the wall time of their baseline (one host, their
    traces), the registry's order where it is not known. The first oracle kill or timeout ends
    kvsched's turn, so the order changes what a mutant costs, never whether kvsched kills it."""
    seconds = results.get("baseline_seconds", {})
    return sorted(names, key=lambda n: (seconds.get(f"kvsched:{n}", float("inf")), KVSCHED_JUDGES.index(n)))


def _single_run(judge_set: set[str]):
    """An exclusive lock per judge on the workspace, held until exit: two runs of the same judge
    would judge the same mutants twice. (A run of each judge may go on at once: each has its own
    fork server socket and overlays, and `save_results` merges their verdicts.) None when another
    run holds one."""
    import fcntl

    workspace.root().mkdir(parents=True, exist_ok=True)
    handles = []
    for judge in sorted(judge_set):
        handle = open(workspace.root() / f"bench-{judge}.lock", "w")  # noqa: SIM115 - held for the whole run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            for h in handles:
                h.close()
            return None
        handles.append(handle)
    return handles


if __name__ == "__main__":
    raise SystemExit(main())
