"""Draft an upstream report (markdown) for a trace: what breaks, the exact step, expected against
actual, the standalone reproducer, the source lines, a proposed fix and the upstream thread.

The words come from the trace's `Finding` (`conformance.export.findings`); a trace with no finding
gets a draft whose unknown sections say what to fill in. The both-ways results, where they were
run (docs/reports/both-ways.json, written by `conformance.selftest.campaigns.export_both_ways`), are
quoted as measured: the reproducer's line on the release and with the fix applied.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from conformance.export.exporter import statement
from conformance.export.findings import Finding, finding_of
from conformance.export.record import Exporter
from conformance.export.strangers import export_target, venv_python_shown
from spec.trace import Trace

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "docs" / "reports"
RESULTS = REPORTS / "both-ways.json"
TODO = "_(to fill in)_"


def load_results(path: Path = RESULTS) -> dict[str, Any]:
    """The both-ways results by finding slug (empty when they were never run)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("findings", {}) if isinstance(data, dict) and data.get("version") == 1 else {}


def render_report(trace: Trace, exporter: Exporter, property_id: str, source: str, out: Path | None = None,
                  results: dict[str, Any] | None = None) -> str:
    finding = finding_of(trace, exporter.target)
    release = export_target(exporter.target).version
    measured = (load_results() if results is None else results).get(finding.slug if finding else "", {})
    lines = [f"# {finding.title if finding else f'{property_id} on {exporter.target}'}", ""]
    kind = "defect" if finding else f"{TODO} (a defect, or a deviation by design?)"
    lines += [f"**Engine:** {release} (kvsched target `{exporter.target}`). **Kind:** {kind}. "
              f"**Found by:** kvsched, trace `{source}`.", ""]
    lines += ["## What breaks", "", finding.breaks if finding else str(trace.meta.get("message", TODO)), ""]
    lines += ["## The exact step", ""]
    lines += _steps(measured, trace, source)
    lines += ["## Expected and actual", "",
              f"* expected: {finding.expected if finding else statement(property_id)}",
              f"* actual: {finding.actual if finding else str(trace.meta.get('message', TODO))}", ""]
    lines += ["## The trace", ""] + _trace_summary(trace) + ["## Reproducer", ""]
    lines += _reproducers(finding, measured, exporter, source, out)
    lines += ["## Source", ""] + ([f"* {s}" for s in finding.source] if finding else [f"* {TODO}"]) + [""]
    lines += ["## Proposed fix", "", finding.fix if finding else TODO, ""] + _fix_diff(finding)
    lines += ["## Checked both ways", ""] + _both_ways(finding, measured)
    lines += ["## Upstream", "", finding.upstream if finding else TODO, ""]
    return "\n".join(lines)


def _steps(measured: dict[str, Any], trace: Trace, source: str) -> list[str]:
    runs = [r for r in measured.get("runs", []) if r.get("release", {}).get("line")]
    if not runs:
        return [f"kvsched: {trace.meta.get('message', TODO)}", ""]
    out = ["The reproducer's line on the release (each committed reproducer):", ""]
    out += [f"* `{r['file']}`: {r['release']['line']}" for r in runs]
    return out + [""]


def _trace_summary(trace: Trace) -> list[str]:
    config = {k: v for k, v in trace.config.to_dict().items() if v not in (None, 0, False, 0.0) or k == "watermark"}
    lines = ["Config: `" + ", ".join(f"{k}={v}" for k, v in config.items()) + "`.", ""]
    for a in trace.arrivals:
        r = a.request
        lines.append(f"* step {a.step}: request `{r.request_id}`, a prompt of {r.prompt_len} token{'s' * (r.prompt_len != 1)}, max_tokens "
                     f"{r.max_tokens}" + (f", priority {r.priority}" if r.priority else "")
                     + (", a streaming session whose client sends " + ", then ".join(
                         f"{p.prompt_len} more token{'s' * (p.prompt_len != 1)} at step {p.step} (max_tokens "
                         f"{p.max_tokens})" for p in r.session) if r.session else ""))
    extra = [f"{len(trace.aborts)} abort(s)" if trace.aborts else "", f"{len(trace.stops)} stop(s)" if trace.stops else "",
             f"draft decisions at steps {sorted({s for s, _, _ in trace.drafts})}" if trace.drafts else ""]
    if any(extra):
        lines.append("* and " + ", ".join(x for x in extra if x))
    for rid, script in trace.connector.items():  # the KV connector's answers (spec/connector.py)
        lines.append(f"* the KV connector's script for `{rid}`: " + ", ".join(f"{k} {v}" for k, v in script.to_dict().items()))
    if trace.config.kv_connector:
        lines.append(f"* kv_load_failure_policy {trace.config.kv_load_failure_policy or 'recompute'}")
    return lines + [f"* at most {trace.max_steps} steps", ""]


def _reproducers(finding: Finding | None, measured: dict[str, Any], exporter: Exporter, source: str,
                 out: Path | None) -> list[str]:
    runs = measured.get("runs", [])
    lines = []
    if runs:
        lines += ["Standalone files (they import the engine, never kvsched), committed beside this report:", ""]
        for r in runs:
            lines.append(f"* [`{Path(r['file']).name}`]({Path(r['file']).relative_to('docs/reports')}) "
                         f"({r['target']}, {r['property']}; from `{r['trace']}`)")
        lines.append("")
    else:
        lines += [f"Export it: `kvsched export {source} --to pytest --target {exporter.target} --out repro.py`.", ""]
    python = venv_python_shown(export_target(exporter.target))
    lines += ["Run it with the engine installed (kvsched's venv of the target, or any environment with the release):",
              "", "```", f"{python} FILE.py            # exit 1 and one FAILED line on the release",
              f"{python} -m pytest FILE.py  # where pytest is installed", "```", ""]
    return lines


def _fix_diff(finding: Finding | None) -> list[str]:
    if finding is None or not finding.fix_patch:
        return []
    path = REPORTS / "fixes" / finding.fix_patch
    try:
        fix = json.loads(path.read_text())
    except (OSError, ValueError):
        return [f"(descriptor `fixes/{finding.fix_patch}` missing)", ""]
    lines = [f"As a descriptor ([`fixes/{finding.fix_patch}`](fixes/{finding.fix_patch}); "
             f"{'the upstream PR' if finding.fix_is_upstream else 'our own minimal fix'}): {fix['source']}", "",
             "```diff"]
    for edit in fix["edits"]:
        name = f"{fix['package']}/{edit['file']}"
        lines += [line.rstrip("\n") for line in difflib.unified_diff(
            edit["find"].splitlines(True), edit["replace"].splitlines(True), name, name, n=3)]
    lines += ["```", ""]
    for rep in finding.reproducers:  # an engine of the finding with a descriptor of its own
        if rep.fix_patch:
            lines += [f"For {rep.target}: [`fixes/{rep.fix_patch}`](fixes/{rep.fix_patch}).", ""]
    return lines


def _both_ways(finding: Finding | None, measured: dict[str, Any]) -> list[str]:
    runs = measured.get("runs", [])
    if not runs:
        slug = finding.slug if finding else "SLUG"
        return [f"Not run yet: `python -m conformance.selftest.campaigns.export_both_ways --finding {slug}`.", ""]
    lines = [f"Run {measured.get('run', '')}.", "",
             "| reproducer | on the release | with the fix |", "| --- | --- | --- |"]
    for r in runs:
        fixed = r.get("fixed")
        lines.append(f"| `{Path(r['file']).name}` | {_verdict(r['release'])} | "
                     f"{_verdict(fixed) if fixed else r.get('fix_note') or 'no fix to apply'} |")
    return lines + [""]


def _verdict(run: dict[str, Any]) -> str:
    cpu = f", {run['cpu_seconds']} s CPU" if "cpu_seconds" in run else ""
    return f"{run['verdict']} (exit {run['exit']}, {run['seconds']} s wall{cpu})"


def render_handwritten_report(finding: Finding, results: dict[str, Any] | None = None) -> str:
    """The report of a finding whose reproducers are written by hand (no trace: no kvsched host
    reaches that code), in the same sections as `render_report`."""
    target = export_target(finding.reproducers[0].target)
    measured = (load_results() if results is None else results).get(finding.slug, {})
    files = [r.handwritten for r in finding.reproducers]
    lines = [f"# {finding.title}", "",
             f"**Engine:** {target.version} (kvsched target `{target.name}`). **Kind:** defect. "
             f"**Found by:** kvsched, reading the installed source; reproduced by hand (`{files[0]}`).", "",
             "## What breaks", "", finding.breaks, "", "## The exact step", ""]
    runs = [r for r in measured.get("runs", []) if r.get("release", {}).get("line")]
    lines += ([f"* `{r['file']}`: {r['release']['line']}" for r in runs] or [f"Not run yet: {files[0]}"]) + [""]
    lines += ["## Expected and actual", "", f"* expected: {finding.expected}", f"* actual: {finding.actual}", ""]
    lines += ["## Reproducer", "", "Standalone files (they import the engine, never kvsched), written by hand and "
              "committed beside this report:", ""]
    lines += [f"* [`{Path(f).name}`]({Path(f).relative_to('docs/reports')})" for f in files] + [""]
    python = venv_python_shown(target)
    lines += ["```", f"{python} FILE.py            # exit 1 and one FAILED line on the release",
              f"{python} -m pytest FILE.py  # where pytest is installed", "```", ""]
    lines += ["## Source", ""] + [f"* {s}" for s in finding.source] + [""]
    lines += ["## Proposed fix", "", finding.fix, ""] + _fix_diff(finding)
    lines += ["## Checked both ways", ""] + _both_ways(finding, measured)
    lines += ["## Upstream", "", finding.upstream, ""]
    return "\n".join(lines)
