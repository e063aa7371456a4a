"""Benchmark (issue 18, part 3): the wire before and after, in one run — an older commit's tree
(exported with ``git archive``) against this one, this one with ``flush_ms`` 0 (each step line
written at once), and this one with each trace's reset sent on its own (not folded into the
first `steps` message), rounds interleaved, a fresh runner process per variant and round.

    python benchmarks/bench_wire_ab.py --target vllm-v1 [--before 27e9880] [--traces 100] [--rounds 3]

Prints wall and CPU (runner + host, /proc schedstat) µs per step, unchecked and with `safety`,
the median over rounds per variant. The targets' venvs are shared (the hosts run each tree's own
host scripts).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, target: str, traces: int, seed: int, extra: tuple[str, ...]) -> dict:
    cmd = ["python3", str(ROOT / "benchmarks/_wire_ab_run.py"), target, str(traces), str(seed), *extra]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="vllm-v1")
    ap.add_argument("--before", default="27e9880")
    ap.add_argument("--traces", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvsched-wire-ab-") as tmp:
        old = Path(tmp)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        variants = {f"before ({args.before})": (old, ()), "after": (ROOT, ()), "after, flush_ms 0": (ROOT, ("0",)),
                    "after, reset alone": (ROOT, ("-", "0"))}
        results: dict[str, list[dict]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            for name, (tree, extra) in variants.items():
                results[name].append(run(tree, args.target, args.traces, args.seed, extra))
                print(f"  {name}: {results[name][-1]}", flush=True)
    print(f"target {args.target}, {args.traces} traces, {args.rounds} rounds interleaved, median, µs per step, "
          f"load {os.getloadavg()[0]:.1f}")
    for name, runs in results.items():
        cells = []
        for check in ("unchecked", "safety"):
            wall = statistics.median(r[check]["wall"] for r in runs) * 1e6
            cpus = [r[check]["cpu"] for r in runs if r[check]["cpu"] is not None]
            cpu = f"{statistics.median(cpus) * 1e6:.0f}" if cpus else "n/a (host restarted)"
            cells.append(f"{check} wall {wall:.0f} CPU {cpu}")
        print(f"  {name:22s} " + " | ".join(cells))


if __name__ == "__main__":
    main()
