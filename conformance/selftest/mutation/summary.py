"""Kill rates from a mutation results file: each judge's, the mutants each alone kills, and both.

A judge *kills* a mutant with a ``killed`` or ``timeout`` verdict (a hang is a finding: the
kvsched runner reports it as FAULT-hang, pytest's time cap as a failed run). Mutants that crash
at import are counted apart and left out of every rate (any judge "kills" them by importing the
module). The kvsched judge kills when either target (``vllm-v1``, ``vllm-v1-async``) does.
Mutants read as equivalent (a descriptor's ``equivalent`` reason, `descriptors.EQUIVALENT`) are
listed with their reason and left out of both judges' denominators, like crashes: no judge can
kill them, and counting them would only lower both rates alike.
"""

from __future__ import annotations

from typing import Any

KILLS = ("killed", "timeout")


def kvsched_verdict(entry: dict[str, Any]) -> str:
    verdicts = [v["verdict"] for k, v in entry.items() if k.startswith("kvsched:")]
    for wanted in ("crash-at-import", "killed", "timeout", "survived-budget", "survived"):
        if wanted in verdicts:
            return wanted
    return "not-run"


def pytest_verdict(entry: dict[str, Any]) -> str:
    return entry.get("pytest", {}).get("verdict", "not-run")


def summarize(descriptors: list[dict[str, Any]], results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = []
    for d in descriptors:
        entry = results.get(d["id"])
        if entry is None:
            continue
        rows.append((d, kvsched_verdict(entry), pytest_verdict(entry)))
    out: dict[str, Any] = {"mutants_run": len(rows)}
    for scope in ("all", "in"):
        chosen = [r for r in rows if scope == "all" or r[0]["scope"] == "in"]
        crashed = [r for r in chosen if "crash-at-import" in (r[1], r[2])]
        equivalent = [r for r in chosen if r[0].get("equivalent") and r not in crashed]
        judged = [r for r in chosen if r not in crashed and r not in equivalent
                  and r[1] != "not-run" and r[2] != "not-run"]
        k = {r[0]["id"] for r in judged if r[1] in KILLS}
        p = {r[0]["id"] for r in judged if r[2] in KILLS}
        n = len(judged)
        out[scope] = {
            "mutants": len(chosen), "crash_at_import": len(crashed), "judged": n,
            "equivalent": {r[0]["id"]: r[0]["equivalent"] for r in equivalent},
            "kvsched_kills": len(k), "pytest_kills": len(p), "both": len(k & p), "either": len(k | p),
            "kvsched_rate": round(len(k) / n, 3) if n else None,
            "pytest_rate": round(len(p) / n, 3) if n else None,
            "together_rate": round(len(k | p) / n, 3) if n else None,
            "kvsched_only": sorted(k - p), "pytest_only": sorted(p - k),
            "neither": sorted(r[0]["id"] for r in judged if r[0]["id"] not in k | p),
            "kvsched_timeouts": sorted(r[0]["id"] for r in judged if r[1] == "timeout"),
            "pytest_timeouts": sorted(r[0]["id"] for r in judged if r[2] == "timeout"),
            "pytest_not_reached": sorted(r[0]["id"] for r in judged
                                         if results[r[0]["id"]].get("pytest", {}).get("not_reached")),
        }
    return out


def render(summary: dict[str, Any]) -> str:
    lines = []
    for scope, title in (("all", "all sampled mutants"), ("in", "in-scope mutants")):
        s = summary.get(scope)
        if not s or not s["judged"]:
            continue
        lines.append(f"{title}: {s['judged']} judged ({s['crash_at_import']} crash at import, "
                     f"{len(s.get('equivalent', {}))} equivalent, left out); "
                     f"kvsched kills {s['kvsched_kills']} ({s['kvsched_rate']:.0%}), vLLM tests kill "
                     f"{s['pytest_kills']} ({s['pytest_rate']:.0%}), together {s['either']} "
                     f"({s['together_rate']:.0%}); kvsched alone {len(s['kvsched_only'])}, tests alone "
                     f"{len(s['pytest_only'])}, neither {len(s['neither'])}")
    return "\n".join(lines)
