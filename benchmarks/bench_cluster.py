"""The search on Ray against local workers: checked steps per second of the same campaign with
local ``--workers`` 1 and 2 and with ``--ray`` at 1 and 2 actors, rounds interleaved in one run.

The adapter is the built-in reference (it conforms, so the time is all search). The clock is
the wall clock, from the first runner started to the report, the extra workers' start included,
as in `benchmarks/bench_workers.py`. Each round uses a fresh ``--out``. Start a cluster first
(on one machine: ``ray start --head --port=26380 --num-cpus=2 --include-dashboard=false``).

    python benchmarks/bench_cluster.py --ray 127.0.0.1:26380 [--examples 400] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from conformance.cluster.ray_search import RayRunner, connect, disconnect
from conformance.flows.profiles import get_profile
from conformance.runner.fuzz import fuzz
from conformance.runner.isolated import ChildRunner
from conformance.runner.plan import RunPlan


def one_round(spec: str, examples: int, workers: int, on_ray: bool, seed_value: int) -> float:
    runner = RayRunner(spec) if on_ray else ChildRunner(spec)
    info = runner.start()
    profile = get_profile(info.profiles[0])
    try:
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            result = fuzz(runner, RunPlan(profile, max_examples=examples, seed=seed_value, out_dir=Path(out), workers=workers))
            elapsed = time.perf_counter() - started
    finally:
        runner.close()
    return result.steps_checked / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ray", required=True, metavar="ADDRESS")
    parser.add_argument("--adapter", default="reference")
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    connect(args.ray)
    kinds = [("local", 1), ("local", 2), ("ray", 1), ("ray", 2)]
    rates: dict[tuple[str, int], list[float]] = {k: [] for k in kinds}
    try:
        for r in range(args.rounds):
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                rates[kind].append(one_round(args.adapter, args.examples, kind[1], kind[0] == "ray", 100 + r))
    finally:
        disconnect()
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(f"adapter {args.adapter}: {args.examples} traces a round, {args.rounds} interleaved rounds (median)")
    for (where, n), rate in median.items():
        label = f"--workers {n}" if where == "local" else f"--ray, {n} actor{'s' * (n > 1)}"
        print(f"  {label:<18} {rate:8.0f} checked steps/s  ({rate / median[('local', 1)]:.2f}x local 1)")
    for where in ("local", "ray"):
        print(f"  {where} efficiency at 2: {median[(where, 2)] / (2 * median[(where, 1)]):.2f}")


if __name__ == "__main__":
    main()
