"""Every finding's reproducers, exported and run both ways; the upstream reports written from them.

    python -m conformance.selftest.campaigns.export_both_ways [--finding SLUG ...]

For each `Finding` (conformance/export/findings.py) and each of its reproducers:

1. export the trace (`kvsched export --to pytest`) to docs/reports/<slug>/<target>--<trace>.py;
2. run it on the installed release with the target venv's Python, in an empty folder and without
   PYTHONPATH (so it cannot import kvsched): it must exit 1 with a FAILED line that names the
   reported cause (`Reproducer.fails_with`);
3. where the finding has a fix descriptor (docs/reports/fixes/), apply it to a copy of the engine
   (`conformance.export.patching`) and run the file again with the copy first on PYTHONPATH: it
   must exit 0.

Then each `Demonstration` (conformance/export/demonstrations.py: SGLang and LMDeploy, which have
no defect finding) is exported to docs/reports/demonstrations/<slug>/ and run: a deviation trace
must fail on the release; a seeded one must pass on the release and fail on a copy of the engine
with the seeded defect (docs/reports/seeded/) applied. ``--demonstrations`` runs only these and
keeps the findings' committed results.

The results go to docs/reports/both-ways.json (versioned; wall and CPU seconds per run, the load),
then each finding's report (docs/reports/<slug>.md, `conformance.export.report`) and the index
(docs/reports/README.md). A target that is not installed is recorded as not run. Exit 1 when a
reproducer does not fail on the release, or does not pass with its fix (a demonstration: does not
do what its kind says).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance.export import exporter_for, render_pytest, render_report, trace_property
from conformance.export.demonstrations import DEMONSTRATIONS, Demonstration
from conformance.export.findings import FINDINGS, Finding, Reproducer
from conformance.export.patching import installed_package_dir, load_fix, patched_copy
from conformance.export.report import REPORTS, RESULTS, ROOT, load_results, render_handwritten_report
from conformance.export.strangers import export_target
from conformance.export.unsupported import UNSUPPORTED
from conformance.selftest.campaigns.campaign_args import provenance
from spec.trace import Trace

VERSION = 1
RUN_TIMEOUT = 600


def run_file(python: Path, path: Path, env_extra: dict[str, str]) -> dict[str, Any]:
    """Run an exported file as a plain script; its verdict line, exit code and seconds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(env_extra)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvsched-repro-") as cwd:
        try:
            done = subprocess.run([str(python), str(path.resolve())], cwd=cwd, env=env, capture_output=True, text=True,
                                  timeout=RUN_TIMEOUT, check=False)
            code, output = done.returncode, done.stdout
        except subprocess.TimeoutExpired:
            code, output = 124, f"TIMEOUT after {RUN_TIMEOUT} s"
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in output.splitlines() if line.startswith(("FAILED:", "ERROR:", "passed", "engine:", "TIMEOUT"))]
    verdict_line = next((line for line in reversed(lines) if not line.startswith("engine:")), "")
    return {"exit": code, "line": verdict_line, "engine": next((x for x in lines if x.startswith("engine:")), ""),
            "seconds": round(time.monotonic() - started, 1),
            "cpu_seconds": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1)}


def reproducer_name(rep: Reproducer | Demonstration) -> str:
    """test_<target>__<the trace's path below docs/traces or docs/reports/traces>.py, as a module name."""
    parts = Path(rep.trace).with_suffix("").parts
    below = parts[parts.index("traces") + 1:] if "traces" in parts else parts[-1:]
    return "test_" + "__".join(x.replace("-", "_").replace("+", "_") for x in (rep.target, "_".join(below))) + ".py"


def check_reproducer(finding: Finding, rep: Reproducer, fixed_copies: dict[str, Path], scratch: Path) -> dict[str, Any]:
    target = export_target(rep.target)
    if rep.handwritten:  # committed as written: nothing to export
        path, prop = ROOT / rep.handwritten, rep.property or finding.property
    else:
        trace = Trace.load(ROOT / rep.trace)
        exporter = exporter_for(trace, rep.target)
        prop = trace_property(trace, exporter, rep.property)
        path = REPORTS / finding.slug / reproducer_name(rep)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_pytest(trace, exporter, prop, rep.trace))
    record: dict[str, Any] = {"file": str(path.relative_to(ROOT)), "trace": rep.trace, "target": rep.target,
                              "property": prop}
    if not target.installed():
        record["release"] = {"verdict": "not run (target not installed)", "exit": None, "seconds": 0}
        return record
    release = run_file(target.python, path, dict(target.env))
    release["verdict"] = ("fails" if release["exit"] == 1 and rep.fails_with in release["line"]
                          else "UNEXPECTED")
    record["release"] = release
    fix_patch = rep.fix_patch or finding.fix_patch
    if fix_patch and rep.with_fix:
        key = f"{fix_patch}:{target.venv_of or target.name}"
        if key not in fixed_copies:
            fix = load_fix(REPORTS / "fixes" / fix_patch)
            fixed_copies[key] = patched_copy(fix, installed_package_dir(target.python, fix.package),
                                             Path(tempfile.mkdtemp(prefix="fixed-", dir=scratch)))
        fixed = run_file(target.python, path, {**target.env, "PYTHONPATH": str(fixed_copies[key])})
        fixed["verdict"] = "passes" if fixed["exit"] == 0 and str(fixed_copies[key]) in fixed["engine"] else "UNEXPECTED"
        record["fixed"] = fixed
    elif fix_patch:
        record["fix_note"] = rep.note or "not run with the fix"
    return record


def check_demonstration(demo: Demonstration, scratch: Path) -> dict[str, Any]:
    """Export a demonstration's trace and run it: on the release, and for a seeded one on the seeded copy."""
    target = export_target(demo.target)
    trace = Trace.load(ROOT / demo.trace)
    exporter = exporter_for(trace, demo.target)
    prop = trace_property(trace, exporter, demo.property)
    path = REPORTS / "demonstrations" / demo.slug / reproducer_name(demo)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_pytest(trace, exporter, prop, demo.trace))
    record: dict[str, Any] = {"file": str(path.relative_to(ROOT)), "trace": demo.trace, "target": demo.target,
                              "kind": demo.kind, "property": prop}
    if not target.installed():
        record["release"] = {"verdict": "not run (target not installed)", "exit": None, "seconds": 0}
        return record
    release = run_file(target.python, path, dict(target.env))
    if demo.kind == "deviation":
        release["verdict"] = "fails" if release["exit"] == 1 and demo.fails_with in release["line"] else "UNEXPECTED"
    else:
        release["verdict"] = "passes" if release["exit"] == 0 else "UNEXPECTED"
    record["release"] = release
    if demo.kind == "seeded":
        fix = load_fix(REPORTS / "seeded" / demo.seeded)
        copy = patched_copy(fix, installed_package_dir(target.python, fix.package),
                            Path(tempfile.mkdtemp(prefix="seeded-", dir=scratch)))
        seeded = run_file(target.python, path, {**target.env, "PYTHONPATH": str(copy)})
        seeded["verdict"] = ("fails" if seeded["exit"] == 1 and demo.fails_with in seeded["line"]
                             and str(copy) in seeded["engine"] else "UNEXPECTED")
        record["seeded"] = seeded
    return record


def write_report(finding: Finding, results: dict[str, Any]) -> None:
    rep = finding.reproducers[0]
    if rep.handwritten:
        (REPORTS / f"{finding.slug}.md").write_text(render_handwritten_report(finding, results))
        return
    trace = Trace.load(ROOT / rep.trace)
    exporter = exporter_for(trace, rep.target)
    text = render_report(trace, exporter, trace_property(trace, exporter, rep.property), rep.trace, results=results)
    (REPORTS / f"{finding.slug}.md").write_text(text)


def write_index(results: dict[str, Any], demos: dict[str, Any]) -> None:
    lines = ["# Upstream reports", "",
             "One report per defect kvsched found in a current release (docs/CONFORMANCE.md lists every finding; "
             "deviations by design are explained there and not reported). Each report links its standalone "
             "reproducers, in the folder of the same name: files that import the engine, never kvsched, and fail "
             "on the release with one plain-words line; fix descriptors are in `fixes/`.", "",
             "Regenerate (exports, both-ways runs, reports, this index): "
             "`python -m conformance.selftest.campaigns.export_both_ways`. Draft one report: "
             "`kvsched export TRACE --to report`; one reproducer: `kvsched export TRACE --to pytest --out FILE`.", "",
             "| report | engine | reproducers failing on the release | passing with the fix | upstream |",
             "| --- | --- | --- | --- | --- |"]
    for finding in FINDINGS:
        runs = results.get(finding.slug, {}).get("runs", [])
        failing = sum(r["release"].get("verdict") == "fails" for r in runs)
        with_fix = [r for r in runs if "fixed" in r]
        passing = (f"{sum(r['fixed']['verdict'] == 'passes' for r in with_fix)} of {len(with_fix)}"
                   + (" (upstream PR)" if finding.fix_is_upstream else " (our fix)")) if with_fix else "no fix"
        engines = ", ".join(sorted({export_target(t).version for t in finding.targets}))
        lines.append(f"| [{finding.title}]({finding.slug}.md) | {engines} | {failing} of {len(runs)} | {passing} | "
                     f"{finding.upstream.split(';')[0].split(': ')[0].split(' (')[0].rstrip('.')} |")
    lines += ["", "## Targets with no defect finding",
              "",
              "SGLang and LMDeploy have exporters but no defect to report (docs/CONFORMANCE.md: no SGLang failure in "
              "300 traces of either profile; LMDeploy's findings are deviations by design). Their exporters are "
              "checked both ways on demonstrations (conformance/export/demonstrations.py), exported to "
              "`demonstrations/`: a **deviation** trace must fail on the release for the documented reason (no "
              "upstream report: the behaviour is by design); a **seeded** trace must pass on the release and fail on "
              "a copy of the engine with a seeded defect applied (`seeded/`, a descriptor that plants a defect "
              "instead of fixing one), so the check catches a defect of the engine's own code. Run only these: "
              "`python -m conformance.selftest.campaigns.export_both_ways --demonstrations`.", "",
              "| demonstration | engine | kind | on the release | on the seeded copy | reproducer |",
              "| --- | --- | --- | --- | --- | --- |"]
    for demo in DEMONSTRATIONS:
        run = demos.get(demo.slug, {})
        release = run.get("release", {}).get("verdict", "not run")
        seeded = run.get("seeded", {}).get("verdict", "") if demo.kind == "seeded" else "-"
        file = run.get("file", "")
        shown = f"[{Path(file).name}]({Path(file).relative_to('docs/reports')})" if file else "-"
        lines.append(f"| {demo.title} ({demo.why}) | {export_target(demo.target).version} | {demo.kind} | "
                     f"{release} | {seeded or 'not run'} | {shown} |")
    lines += ["", "Targets with no exporter, and why:", ""]
    lines += [f"* **{name}**: {why}" for name, why in UNSUPPORTED.items()]
    lines += ["", "Not reported here:", "",
              "* the deviations by design of docs/CONFORMANCE.md (LMDeploy's lazy recompute eviction and empty "
              "completion, Vidur's missing length limits and Orca's token budget, nano-vllm's always-on prefix "
              "cache, V0's swap-space RuntimeError, V1's chunk clamp at max_model_len, which V1's door keeps from "
              "generate requests) and nano-vllm's missing max_model_len checks (its Scheduler is given no "
              "max_model_len: the limit is the caller's in that design);",
              "* the hybrid-KV-cache campaigns' own divergences (docs/CONFORMANCE.md: "
              "`padded-admission-starves-below-1+k` is the over-budget stall reported above, "
              "`padded-admission-cut-by-threshold` the #54028 assert; the two open async divergences are not yet "
              "traced to a line), and the two fail-recompute connector traces on which the spec's reference breaks "
              "BUD-004 and REQ-004 too (docs/CONNECTORS.md section 8: not diagnosed, so no finding);",
              "* the connector classes `failed-blocks-stay-cached` and `failed-load-pads-admission` (docs/CONNECTORS.md, sections 6 and 7): the first is vLLM's chosen design under `kv_load_failure_policy=recompute` (argued in the review of vllm-project/vllm#26813), and the wrong output it can lead to is already reported upstream (vllm-project/vllm#49250, open); the second is a deviation (a one-token admission beside a failed load's recompute is padded to 1 + k and waits a step), not a defect;",
              "* the streaming-pause class `paused-new-admits-held-session` (docs/CONFORMANCE.md): vLLM documents that "
              "PAUSE_NEW still schedules requests holding KV blocks (vllm/v1/core/sched/interface.py:28-29), and a "
              "waiting session holds its KV, so it is a deviation by design from PAU-001, not a defect."]
    (REPORTS / "README.md").write_text("\n".join(lines) + "\n")


def load_demonstration_results() -> dict[str, Any]:
    try:
        data = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("demonstrations", {}) if isinstance(data, dict) and data.get("version") == VERSION else {}


def save_results(results: dict[str, Any], demos: dict[str, Any]) -> None:
    RESULTS.write_text(json.dumps({"version": VERSION, "provenance": provenance(), "findings": results,
                                   "demonstrations": demos}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--finding", action="append", help="a finding's slug (default: all)")
    parser.add_argument("--demonstrations", action="store_true",
                        help="run only the demonstrations (targets with no defect finding), keep the findings' results")
    parser.add_argument("--reports-only", action="store_true",
                        help="rewrite the reports and the index from the committed results, running nothing")
    args = parser.parse_args(argv)
    chosen = [] if args.demonstrations else [f for f in FINDINGS if not args.finding or f.slug in args.finding]
    results, demos = load_results(), load_demonstration_results()
    if args.reports_only:
        for finding in chosen:
            write_report(finding, results)
        write_index(results, demos)
        return 0
    ok = True
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())

    def when() -> str:
        return (f"{started} to {time.strftime('%H:%M UTC', time.gmtime())}, "
                f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")

    with tempfile.TemporaryDirectory(prefix="kvsched-fixes-") as scratch:
        fixed_copies: dict[str, Path] = {}
        for finding in chosen:
            runs = [check_reproducer(finding, rep, fixed_copies, Path(scratch)) for rep in finding.reproducers]
            results[finding.slug] = {"run": when(), "runs": runs}
            for r in runs:
                bad = "UNEXPECTED" in (r["release"]["verdict"], r.get("fixed", {}).get("verdict"))
                ok = ok and not bad
                print(json.dumps({"finding": finding.slug, "file": r["file"], "release": r["release"].get("verdict"),
                                  "fixed": r.get("fixed", {}).get("verdict")}), flush=True)
            save_results(results, demos)
            write_report(finding, results)
        if args.demonstrations or not args.finding:
            for demo in DEMONSTRATIONS:
                record = check_demonstration(demo, Path(scratch))
                demos[demo.slug] = {"run": when(), **record}
                ok = ok and "UNEXPECTED" not in (record["release"]["verdict"], record.get("seeded", {}).get("verdict"))
                print(json.dumps({"demonstration": demo.slug, "file": record["file"],
                                  "release": record["release"]["verdict"],
                                  "seeded": record.get("seeded", {}).get("verdict")}), flush=True)
                save_results(results, demos)
    write_index(results, demos)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
