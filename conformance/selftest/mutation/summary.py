"""Kill rates from a mutation results file, over one population: every mutant that is not
equivalent counts (issue 29).

A judge *kills* a mutant with a ``killed`` or ``timeout`` verdict, of one kind: ``oracle`` (an
invariant, a lockstep divergence, a state mismatch; for vLLM's tests, the test's own assertion),
``crash`` (an exception raised inside the engine, which any driver would see) or ``timeout`` (a
hang). kvsched kills when any of its judges (synchronous, pipelined, speculative) does, with the
best kind any of them found (oracle before timeout before crash). A mutant that does not import
(``crash-at-import``) is killed by both judges as a crash: it is in the population like any other.
Mutants read as equivalent (a descriptor's ``equivalent`` reason, `equivalence.EQUIVALENT`) are
listed with their reason and left out of the population, unless a judge kills one: then the claim
is refuted, listed as such, and the mutant counts. Also apart: a descriptor whose operator leaves
the source unchanged (``not-applied``: no mutant at all). Nothing else is left out: a mutant in a feature
kvsched does not model is a survivor for kvsched. `by_area` gives the same counts per feature
area (`descriptors.area_of`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

KILLS = ("killed", "timeout", "crash-at-import")
_KIND_ORDER = ("oracle", "timeout", "crash")


def kill_kind(verdict: dict[str, Any]) -> str | None:
    """The kind of one judge's kill, or None when it did not kill."""
    v = verdict.get("verdict")
    if v == "crash-at-import":
        return "crash"
    if v == "timeout":
        return "timeout"
    if v == "killed":
        return verdict.get("kind", "oracle")
    return None


def kvsched_kind(entry: dict[str, Any]) -> str | None:
    kinds = {kill_kind(v) for k, v in entry.items() if k.startswith("kvsched:")} - {None}
    return next((k for k in _KIND_ORDER if k in kinds), None)


def pytest_kind(entry: dict[str, Any]) -> str | None:
    return kill_kind(entry["pytest"]) if "pytest" in entry else None


def judged(entry: dict[str, Any]) -> bool:
    """Both judges gave a verdict (kvsched: at least its synchronous judge)."""
    return "pytest" in entry and any(k.startswith("kvsched:") for k in entry)


def _counts(rows: list[tuple[dict, str | None, str | None]]) -> dict[str, Any]:
    k = {d["id"] for d, kk, _ in rows if kk}
    p = {d["id"] for d, _, pk in rows if pk}
    n = len(rows)
    return {
        "mutants": n,
        "kvsched_kills": len(k), "kvsched_oracle": sum(kk == "oracle" for _, kk, _ in rows),
        "kvsched_crash": sum(kk == "crash" for _, kk, _ in rows),
        "kvsched_timeout": sum(kk == "timeout" for _, kk, _ in rows),
        "pytest_kills": len(p), "pytest_oracle": sum(pk == "oracle" for _, _, pk in rows),
        "pytest_crash": sum(pk == "crash" for _, _, pk in rows),
        "pytest_timeout": sum(pk == "timeout" for _, _, pk in rows),
        "both": len(k & p), "union": len(k | p),
        "kvsched_rate": round(len(k) / n, 3) if n else None,
        "kvsched_oracle_rate": round(sum(kk == "oracle" for _, kk, _ in rows) / n, 3) if n else None,
        "pytest_rate": round(len(p) / n, 3) if n else None,
        "union_rate": round(len(k | p) / n, 3) if n else None,
        "kvsched_only": sorted(k - p), "pytest_only": sorted(p - k),
        "neither": sorted(d["id"] for d, kk, pk in rows if not kk and not pk),
    }


def summarize(descriptors: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows, equivalent, refuted = [], {}, {}
    not_judged, not_applied = [], []
    for d in descriptors:
        entry = results.get(d["id"])
        if entry is None or not judged(entry):
            not_judged.append(d["id"])
            continue
        if entry["pytest"].get("verdict") == "not-applied":  # the operator left the source as it was: no mutant
            not_applied.append(d["id"])
            continue
        kk, pk = kvsched_kind(entry), pytest_kind(entry)
        if d.get("equivalent"):
            if not kk and not pk:
                equivalent[d["id"]] = d["equivalent"]
                continue
            refuted[d["id"]] = d["equivalent"]  # killed: not equivalent, whatever the reading said
        rows.append((d, kk, pk))
    areas: dict[str, list] = defaultdict(list)
    for row in rows:
        areas[row[0].get("area", "?")].append(row)
    files: dict[str, list] = defaultdict(list)
    for row in rows:
        files[row[0]["file"]].append(row)
    by_judge: dict[str, dict[str, int]] = defaultdict(lambda: {"oracle": 0, "crash": 0, "timeout": 0})
    for d, _, _ in rows:
        for key, verdict in results[d["id"]].items():
            kind = kill_kind(verdict) if key.startswith("kvsched:") else None
            if kind:
                by_judge[key.removeprefix("kvsched:")][kind] += 1
    return {"descriptors": len(descriptors), "judged": len(rows) + len(equivalent),
            "kvsched_by_judge": dict(sorted(by_judge.items())),
            "not_judged": not_judged, "not_applied": not_applied, "equivalent": equivalent, "equivalence_refuted": refuted,
            "population": _counts(rows),
            "by_area": {a: _counts(r) for a, r in sorted(areas.items(), key=lambda kv: (-len(kv[1]), kv[0]))},
            "by_file": {f: _counts(r) for f, r in sorted(files.items())}}


def _pct(n: int, of: int) -> str:
    return f"{n} ({n / of:.0%})" if of else str(n)


def render(summary: dict[str, Any]) -> str:
    """The headline line and the per-area table, as Markdown (what BENCHMARKS.md shows)."""
    s = summary["population"]
    n = s["mutants"]
    if not n:
        return "no mutant judged by both judges yet"
    lines = [
        f"population: {n} mutants ({len(summary['equivalent'])} equivalent left out, "
        f"{len(summary['equivalence_refuted'])} equivalence claims refuted by a kill, "
        f"{len(summary.get('not_applied', []))} not applied, {len(summary['not_judged'])} not judged)",
        "",
        "| population | kvsched: all kills | kvsched: oracle kills | vLLM's tests | union |",
        "| ---: | ---: | ---: | ---: | ---: |",
        f"| {n} | {_pct(s['kvsched_kills'], n)} | {_pct(s['kvsched_oracle'], n)} | {_pct(s['pytest_kills'], n)} "
        f"| {_pct(s['union'], n)} |",
        "",
        f"kvsched's kills: {s['kvsched_oracle']} oracle, {s['kvsched_crash']} crash, {s['kvsched_timeout']} timeout; "
        f"vLLM's tests': {s['pytest_oracle']} oracle, {s['pytest_crash']} crash, {s['pytest_timeout']} timeout; "
        f"kvsched alone {len(s['kvsched_only'])}, tests alone {len(s['pytest_only'])}, neither {len(s['neither'])}",
        "",
        "kvsched's kills by judge (each judge runs until one has an oracle kill or a timeout, cheapest first, so a "
        "later judge is not asked about a mutant an earlier one killed): "
        + ("; ".join(f"{j} {c['oracle']} oracle, {c['crash']} crash, {c['timeout']} timeout"
                     for j, c in summary.get("kvsched_by_judge", {}).items()) or "none"),
        "",
        "| area | mutants | kvsched kills (oracle) | vLLM's tests' kills | union |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for area, a in summary["by_area"].items():
        lines.append(f"| {area} | {a['mutants']} | {a['kvsched_kills']} ({a['kvsched_oracle']}) | {a['pytest_kills']} "
                     f"| {a['union']} |")
    lines += ["", "| file | mutants | kvsched kills (oracle) | vLLM's tests' kills | union |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for file, a in summary.get("by_file", {}).items():
        lines.append(f"| `{file.removeprefix('vllm/v1/core/')}` | {a['mutants']} | {a['kvsched_kills']} "
                     f"({a['kvsched_oracle']}) | {a['pytest_kills']} | {a['union']} |")
    return "\n".join(lines)
