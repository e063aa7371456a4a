"""Parallel workers: checked steps per second of `kvsched conform` at 1 and N workers, rounds
interleaved in one run, and the parallel efficiency (steps/s at N divided by N times steps/s at 1).

The adapter is the built-in reference in isolated children (as `kvsched conform` runs it); it
conforms, so the time is all search (no shrinking). The clock is the wall clock: the work is
spread over processes, which is the point. Each round uses a fresh ``--out`` so that nothing is
replayed.

    python benchmarks/bench_workers.py [--adapter reference] [--examples 400] [--workers 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from conformance.flows.profiles import get_profile
from conformance.runner.fuzz import fuzz
from conformance.runner.isolated import ChildRunner
from conformance.runner.plan import RunPlan


def one_round(spec: str, examples: int, workers: int, seed_value: int) -> float:
    runner = ChildRunner(spec)
    info = runner.start()
    profile = get_profile(info.profiles[0])
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        result = fuzz(runner, RunPlan(profile, max_examples=examples, seed=seed_value, out_dir=Path(out), workers=workers))
        elapsed = time.perf_counter() - started
    return result.steps_checked / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", default="reference")
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {1: [], args.workers: []}
    for r in range(args.rounds):
        for n in (1, args.workers) if r % 2 == 0 else (args.workers, 1):
            rates[n].append(one_round(args.adapter, args.examples, n, 100 + r))
    one, many = statistics.median(rates[1]), statistics.median(rates[args.workers])
    print(f"adapter {args.adapter}: {args.examples} traces a round, {args.rounds} interleaved rounds (median)")
    print(f"  1 worker   {one:8.0f} checked steps/s")
    print(f"  {args.workers} workers  {many:8.0f} checked steps/s")
    print(f"  speed-up {many / one:.2f}x; efficiency {many / (args.workers * one):.2f} (target >= 0.85)")


if __name__ == "__main__":
    main()
