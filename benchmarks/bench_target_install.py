"""Benchmark (issue 20 item 4): how long `kvsched targets install NAME` takes from scratch.

CI (`.ci/run`) installs every default-profile target into its cached venv; a cold cache pays
for all of them at once, so the CI budget (30 min quiet on 2 cores with cached venvs, 60 from
scratch) must hold their sum. Each target here is installed one at a time into a fresh
temporary ``KVSCHED_TARGETS_DIR`` (a new venv, every pinned wheel from the local index, the
smoke import), timed, and the folder removed, so nothing cached by an earlier target helps
a later one except pip's own wheel cache (which CI keeps too). Targets that share a venv
(vllm-v1-async, vidur-sarathi, vidur-orca) cost nothing of their own and are not timed.

    nice -n 10 python benchmarks/bench_target_install.py [NAME ...] [--out docs/results/target-install.json]

With no names: every target that owns its venv. The load average before and after each
install is recorded beside its time: on a machine shared with other work the times are upper
bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.targets import TARGET_SPECS


def time_install(name: str) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"kvsched-install-{name}-"))
    env = {**os.environ, "KVSCHED_TARGETS_DIR": str(root)}
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "conformance", "targets", "install", name], env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    shutil.rmtree(root, ignore_errors=True)
    lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
    return {"target": name, "install_profile": TARGET_SPECS[name].install_profile, "ok": proc.returncode == 0,
            "seconds": round(seconds, 1), "venv_mb": size >> 20, "load_before": round(load_before, 1),
            "load_after": round(os.getloadavg()[0], 1), **({} if proc.returncode == 0 else {"error": lines[-1:]})}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    names = args.names or [t.name for t in TARGET_SPECS.values() if not t.venv_of]
    rows = []
    for name in names:
        print(f"installing {name} from scratch ...", flush=True)
        rows.append(time_install(name))
        print(json.dumps(rows[-1]), flush=True)
    result = {"version": 1, "date": time.strftime("%Y-%m-%d"), "cores": os.cpu_count(), "installs": rows,
              "default_total_s": round(sum(r["seconds"] for r in rows if r["install_profile"] == "default"), 1)}
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "installs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
