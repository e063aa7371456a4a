"""The command line every lockstep campaign shares (`lockstep_v1`, `lockstep_async`, ...): how
many traces per path, the seed, where the result JSON and the shrunk traces go."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def campaign_parser(description: str, paths: Sequence[str], *, seed: int, out: str, traces_dir: str,
                    ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--path", choices=(*paths, "all"), default="all")
    parser.add_argument("--traces", type=int, default=1000, help="traces per path")
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--traces-dir", type=Path, default=Path(traces_dir))
    parser.add_argument("--no-shrink", action="store_true")
    return parser


def keep_other_paths(report: dict, old: dict, rerun: Sequence[str], part: str = "paths") -> None:
    """Carry into ``report`` the results of an earlier run (``old``, same version) for the paths
    not rerun now, and their classes' saved traces; a class found only on rerun paths is dropped,
    so a class a fix made impossible does not outlive the fix in the file."""
    run = old.get("run")  # the kept paths' provenance: the run that wrote the old file
    report[part].update({p: {**entry, "run": entry.get("run", run)} if run else entry
                         for p, entry in old.get(part, {}).items() if p not in rerun})
    for cls, entry in old.get("classes", {}).items():
        kept = {p: e for p, e in entry.get("paths", {}).items() if p not in rerun}
        if kept:
            report["classes"][cls] = {**entry, "paths": kept}


def _loaded_commit() -> str:
    """The commit whose code this process loaded (read once, at import): HEAD may move while a
    long campaign runs, and the result file must name the code that ran, not the code checked out
    when it was written. A tree with uncommitted changes is marked ``+dirty``."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True, cwd=here).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True, cwd=here).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


_COMMIT = _loaded_commit()


def provenance() -> dict:
    """When, at which commit and under what load a result file was written: campaign times on a
    shared two-core machine mean little without the load beside them."""
    return {"at": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": _COMMIT, "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()]}


def write_report(report: dict, out: Path, part: str = "paths", started: dict | None = None) -> tuple[int, int]:
    """Write a campaign's result file (versioned JSON) and say how many of its traces agree, over
    ``report[part]`` (paths, or Vidur's spaces); returns (agreeing, total). ``started``: the
    campaign's `provenance` when it began (the commit it ran), kept beside the one at the end."""
    out.parent.mkdir(parents=True, exist_ok=True)
    report["run"] = {"started": started, "written": provenance()} if started else provenance()
    out.write_text(json.dumps(report, indent=2) + "\n")
    total = sum(p["traces"] for p in report[part].values())
    agree = sum(p["agreeing_traces"] for p in report[part].values())
    print(f"wrote {out}: {agree}/{total} traces agree")
    return agree, total


def keep_class_trace(report: dict, traces_dir: Path, path: str, cls: str, kind: str, why: str, trace: Any,
                     meta: dict, message: str, part: str = "paths", name: str | None = None,
                     **extra: Any) -> Path:
    """Save ``trace`` (with ``meta``) as the shrunk example of class ``cls`` met on ``path``, note it
    in ``report["classes"][cls][part]`` (with ``extra``) and say where: what every campaign keeps
    of a class. ``name``: the file's name (default ``<path>-<cls>.json``)."""
    out = dataclasses.replace(trace, meta=meta).save(traces_dir / (name or f"{path}-{cls}.json"))
    entry = report["classes"].setdefault(cls, {"kind": kind, "explanation": why, part: {}})
    entry["kind"], entry["explanation"] = kind, why
    entry[part][path] = {"trace": str(out), "message": message, **extra}
    print(f"{path} {cls} ({kind}): {out}\n  {message.splitlines()[0] if message else ''}", flush=True)
    return out


def run_line(data: dict) -> str:
    """When, at which commit and under what load a campaign's result file was written
    (`provenance`); empty for files from before it was kept."""
    run = data.get("run")
    if not run:
        return ""
    started, written = (run.get("started"), run.get("written")) if "written" in run else (None, run)
    commit = (started or written)["commit"]
    load = ", ".join(f"{x:g}" for x in written["load_average_1_5_15"])
    since = f"{started['at']} to " if started else ""
    return f"\nRun {since}{written.get('at', '?')} at commit {commit} (load average at the end {load}; two cores).\n"
