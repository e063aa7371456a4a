"""Reports of a conformance run: a terminal summary, JSON (versioned) and JUnit XML.

Each invariant of the profile gets one status, like a test262 row: ``pass`` (checked on every
step of every trace, its trigger held at least once, and never violated), ``vacuous`` (never
violated because its trigger never held: the run gave it nothing to check, so it is no pass),
``fail`` (with a shrunk, replayable trace),
``not_applicable`` (the adapter does not expose what it needs: never counted as a pass),
``expected`` (failed, and the expectations file lists it: shrunk and saved all the same),
``unexpected_pass`` (listed as expected, not seen in this run), or ``skipped`` (``--skip`` or the
expectations file: not checked).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.reports.printable import markup_safe, printable
from spec.catalogue import get

if TYPE_CHECKING:  # the runner's result type: reports read it, never import the runner
    from conformance.runner.fuzz import FuzzResult

REPORT_VERSION = 1


STATUSES = ("pass", "fail", "vacuous", "expected", "unexpected_pass", "not_applicable", "skipped")


def _status(result: FuzzResult, problem: str, finding: Any) -> str:
    if problem in result.expected:
        return "expected" if finding else "unexpected_pass"
    if finding:
        return "fail"
    if result.coverage is not None and problem in result.active and result.coverage.vacuous(problem):
        return "vacuous"
    return "pass"


def vacuous_reason(invariant_id: str) -> str:
    """Why a vacuous invariant is no pass: its trigger, as its declaration names it."""
    inv = get(invariant_id)
    return f"its trigger ({inv.trigger_text}) never held in this run: nothing to check"


def replay_command(result: FuzzResult, finding: Any) -> str:
    """The command that runs ``finding``'s trace again, as the user can paste it."""
    import shlex

    spec = result.adapter_spec or result.adapter
    return f"kvsched replay {shlex.quote(str(finding.path))} --adapter {shlex.quote(spec)} --profile {result.profile}"


# Problems that are not the adapter's: a disagreement with the reference, a crash of kvsched's own checks.
_FAULT_CATEGORY = {"LOCKSTEP": "lockstep", "FAULT-checker": "kvsched"}
_FAULT_STATEMENT = {"LOCKSTEP": "agrees with the reference step for step",
                    "FAULT-checker": "kvsched's own checks ran (a failure here is a kvsched bug)"}


def rows(result: FuzzResult) -> list[dict[str, Any]]:
    out = []
    for inv_id in [*result.active, *result.not_applicable]:
        inv = get(inv_id)
        finding = result.findings.get(inv_id)
        status = "not_applicable" if inv_id in result.not_applicable else _status(result, inv_id, finding)
        out.append({
            "id": inv_id,
            "category": inv.category,
            "statement": inv.statement,
            "status": status,
            "exercised_steps": result.coverage.steps[inv_id] if result.coverage else 0,
            "counterexample": str(finding.path) if finding and finding.path else None,
            "html": str(finding.html) if finding and finding.html else None,
            "counterexample_steps": finding.steps if finding else None,
            "message": finding.message if finding else None,
            "needs": sorted(c.value for c in inv.needs) if status == "not_applicable" else None,
            **({"reason": vacuous_reason(inv_id)} if status == "vacuous" else {}),
        })
    for inv_id, reason in sorted(result.skipped.items()):
        if inv_id == "LOCKSTEP" or inv_id in result.active or inv_id in result.not_applicable:
            continue
        inv = get(inv_id)
        out.append({"id": inv_id, "category": inv.category, "statement": inv.statement, "status": "skipped",
                    "exercised_steps": 0, "counterexample": None, "html": None, "counterexample_steps": None,
                    "message": reason, "needs": None})
    for problem, finding in sorted(result.findings.items()):
        if problem == "LOCKSTEP" or problem.startswith("FAULT-"):
            out.append({
                "id": problem,
                "category": _FAULT_CATEGORY.get(problem.split("@")[0], "adapter"),  # FAULT-raised@file:line too
                "statement": _FAULT_STATEMENT.get(problem.split("@")[0], "the adapter answered"),
                "status": _status(result, problem, finding),
                "location": finding.location,
                "exercised_steps": result.steps_checked,
                "counterexample": str(finding.path) if finding.path else None,
                "html": str(finding.html) if finding.html else None,
                "counterexample_steps": finding.steps,
                "message": finding.message,
                "needs": None,
            })
    for problem in sorted(result.expected):
        if problem.startswith("FAULT-") and problem not in result.findings:
            out.append({"id": problem, "category": "adapter", "statement": "the adapter answered",
                        "status": "unexpected_pass", "exercised_steps": result.steps_checked, "counterexample": None,
                        "html": None, "counterexample_steps": None, "message": result.expected[problem], "needs": None})
    if result.lockstep and "LOCKSTEP" not in result.findings:
        out.append({"id": "LOCKSTEP", "category": "lockstep", "statement": "agrees with the reference step for step",
                    "status": _status(result, "LOCKSTEP", None), "exercised_steps": result.steps_checked, "counterexample": None, "html": None,
                    "counterexample_steps": None, "message": None, "needs": None})
    for row in out:  # said only where it holds: a flaky finding, or one whose trace could not be written
        finding = result.findings.get(row["id"])
        if finding is not None and (getattr(finding, "flaky", False) or getattr(finding, "unsaved", None)):
            row["flaky"], row["unsaved"] = bool(getattr(finding, "flaky", False)), getattr(finding, "unsaved", None)
    return out


def conforming(result: FuzzResult) -> bool:
    """No finding that the expectations do not list."""
    return not result.unexpected


def to_json(result: FuzzResult) -> dict[str, Any]:
    table = rows(result)
    return {
        "version": REPORT_VERSION,
        "adapter": result.adapter,
        "profile": result.profile,
        "seed": result.seed,
        "examples": result.examples,
        "steps_checked": result.steps_checked,
        "seconds": round(result.seconds, 3),
        "adapter_spec": result.adapter_spec,
        "lockstep": result.lockstep,
        "reservation": result.reservation,
        "conforming": conforming(result),
        "expectations_file": result.expectations_file,
        # New findings make the run fail; expected ones are known deviations seen again.
        "new_findings": sorted(result.unexpected),
        "expected_findings": sorted(result.expected_found),
        "interrupted": result.interrupted,
        "stopped_early": result.stopped_early,
        "not_run": dict(getattr(result, "not_run", {})),  # parts of the profile that did not run, with why
        "replayed": result.replayed,
        "summary": {s: sum(1 for r in table if r["status"] == s) for s in STATUSES},
        "invariants": table,
        "coverage": result.coverage.to_dict() if result.coverage else None,
    }


def write_json(result: FuzzResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result), indent=2) + "\n")


def write_junit(result: FuzzResult, path: Path) -> None:
    table = rows(result)
    suite = ET.Element(
        "testsuite", name=f"kvsched.{result.adapter}.{result.profile}", tests=str(len(table)),
        failures=str(sum(r["status"] == "fail" for r in table)),
        skipped=str(sum(r["status"] in ("not_applicable", "skipped", "expected", "vacuous") for r in table)),
        time=f"{result.seconds:.3f}",
    )
    for r in table:
        case = ET.SubElement(suite, "testcase", classname=f"kvsched.{result.profile}.{r['category']}", name=r["id"])
        if r["status"] == "fail":
            failure = ET.SubElement(case, "failure", message=(r["message"] or "")[:500])
            failure.text = f"{r['statement']}\ncounterexample: {r['counterexample']}\n{r['message']}"
        elif r["status"] == "not_applicable":
            ET.SubElement(case, "skipped", message=f"adapter lacks {', '.join(r['needs'] or [])}")
        elif r["status"] == "vacuous":
            ET.SubElement(case, "skipped", message=f"vacuous: {r['reason']}"[:500])
        elif r["status"] in ("skipped", "expected"):
            ET.SubElement(case, "skipped", message=f"{r['status']}: {r['message'] or ''}"[:500])
    path.parent.mkdir(parents=True, exist_ok=True)
    root = ET.Element("testsuites", name="kvsched")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="unicode", xml_declaration=True)


def print_terminal(result: FuzzResult) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    table = Table(title=f"kvsched conform: adapter {markup_safe(result.adapter)}, profile {result.profile}")
    for col in ("invariant", "category", "status", "exercised", "counterexample"):
        table.add_column(col, no_wrap=col != "counterexample")
    style = {"pass": "green", "fail": "bold red", "vacuous": "yellow", "not_applicable": "yellow", "expected": "magenta",
             "unexpected_pass": "cyan", "skipped": "yellow"}
    for r in rows(result):
        where = f"{markup_safe(r['counterexample'])} ({r['counterexample_steps']} steps)" if r["counterexample"] else ""
        table.add_row(r["id"], r["category"], f"[{style[r['status']]}]{r['status']}[/]", str(r["exercised_steps"]), where)
    console.print(table)
    summary = to_json(result)["summary"]
    counts = ", ".join(f"{s.replace('_', ' ')} {summary[s]}" for s in STATUSES if summary[s] or s in ("pass", "fail"))
    replayed = f", {result.replayed} saved traces replayed first" if result.replayed else ""
    console.print(
        f"{result.examples} traces, {result.steps_checked} steps checked in {result.seconds:.1f} s "
        f"(seed {result.seed}{replayed}); {counts}"
    )
    if result.reservation:
        console.print(f"the adapter declares it reserves: {escape(_reserves(result.reservation))} (CAP-006 allows it)")
    for part, why in getattr(result, "not_run", {}).items():
        console.print(f"[bold yellow]not run[/]: {part}: {markup_safe(why)}")
    if result.stopped_early:
        console.print(f"[bold yellow]stopped early[/]: {markup_safe(result.stopped_early)}")
    if result.interrupted:
        console.print("[bold yellow]interrupted[/]: the search stopped early; findings below are unshrunk where marked")
    if result.coverage:
        # a failed invariant was exercised, whatever its counted steps (a violation stops a trace)
        unreached_inv = [i for i in result.active if not result.coverage.steps[i] and i not in result.findings]
        unreached = result.coverage.unreached_edges()
        if unreached_inv:
            console.print(f"[yellow]never exercised:[/] {', '.join(unreached_inv)}")
        if unreached:
            console.print("[yellow]lifecycle edges not reached:[/] " + ", ".join(f"{a}->{b} ({c})" for a, b, c in unreached))
        else:
            console.print("every lifecycle edge was reached")
    if result.expected_found or result.expectations_file:
        source = f" ({markup_safe(result.expectations_file)})" if result.expectations_file else ""
        console.print(f"[magenta]expected findings[/]{source}: {', '.join(sorted(result.expected_found)) or 'none'}; "
                      f"[bold]new findings[/]: {', '.join(sorted(result.unexpected)) or 'none'}", highlight=False)
    # New findings first: they are what the run is for; expected ones follow, marked.
    ordered = sorted(result.findings.items(), key=lambda item: (item[0] in result.expected, item[0]))
    for problem, finding in ordered:
        label = "[magenta]expected[/] " if problem in result.expected else "[bold]new[/] "
        flaky = "[yellow]flaky[/] " if getattr(finding, "flaky", False) else ""
        console.print(f"{label}{flaky}[bold red]{markup_safe(problem)}[/]: {markup_safe(finding.message)}",
                      highlight=False)
        if finding.location:
            console.print(f"  at {printable(finding.location)}", highlight=False, markup=False, soft_wrap=True)
        hint = _domain_hint(problem, finding)
        if hint:
            console.print(f"  hint: {printable(hint)}", highlight=False, markup=False, soft_wrap=True)
        if getattr(finding, "unsaved", None):
            console.print(f"  not saved ({printable(finding.unsaved)}): the trace is on stderr, as JSON", highlight=False,
                          markup=False, soft_wrap=True)
            continue
        shrunk = "" if finding.shrunk else " (not shrunk: the run was interrupted)" if result.interrupted else \
            " (not shrunk: no smaller trace failed alone)"
        # One line however long, so the command can be copied and run as printed.
        console.print(f"  replay: {printable(replay_command(result, finding))}{shrunk}", highlight=False, markup=False,
                      soft_wrap=True)
    unexpected = len(result.unexpected)
    console.print("[green]conforming[/]" if conforming(result) else f"[red]{unexpected} problem(s) found[/]")


def _features(trace: Any) -> list[str]:
    """The optional scheduler features ``trace`` uses, named by their `ConfigDomain` field."""
    config, used = trace.config, []
    if any(a.request.n > 1 for a in trace.arrivals):
        used.append("max_n (a request with n > 1)")
    if config.preemption_mode != "recompute" and config.num_cpu_blocks:
        used.append("swap (preemption by swap)")
    if config.policy == "priority":
        used.append("priority")
    if trace.aborts:
        used.append("aborts")
    if config.enable_chunked_prefill:
        used.append("chunked_prefill")
    if config.enable_prefix_caching:
        used.append("prefix_caching")
    return used


def _domain_hint(problem: str, finding: Any) -> str | None:
    """For a crash or a malformed answer on a trace that uses optional features: the first thing a
    stranger's adapter meets (a scheduler without n > 1 or swap given such a trace) is named, with
    where to declare what the scheduler takes."""
    if problem.split("@")[0] not in ("FAULT-raised", "FAULT-malformed") or finding.trace is None:
        return None
    used = _features(finding.trace)
    if not used:
        return None
    return (f"the trace uses {', '.join(used)}; if your scheduler does not support that, declare a config domain "
            "(docs/ADAPTERS.md, 'Declaring the config domain') and the runner will not draw it")


def _reserves(reservation: dict[str, Any]) -> str:
    parts = []
    if reservation.get("lookahead_tokens"):
        parts.append(f"{reservation['lookahead_tokens']} token(s) past its last")
    if reservation.get("whole_request"):
        parts.append("the whole request (prompt + max_tokens) from admission")
    return " and ".join(parts) or "nothing beyond its tokens"
