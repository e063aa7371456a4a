"""Benchmark (issue 18, part 5): the median time to the first violation over the museum's
exhibits, at 1 and N workers, wall clock, in one run (the two interleaved exhibit by exhibit).

Each exhibit's mutant runs isolated, as `kvsched conform --workers N` runs an adapter
(`benchmarks/_museum_adapters.py` gives the child the exhibit's adapter and trace strategy), with
the museum's seed and example budget. The clock starts once the first child is up and stops when
the search first holds one of the exhibit's expected problems (the extra workers start inside it,
each in its own worker's thread while the first searches, as `kvsched conform --workers N` runs); the search is then interrupted (no shrinking: that is not
the time to find). An exhibit not found within the budget counts as the whole search's time.

    python benchmarks/bench_museum_workers.py [--workers 2] [--exhibits 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from conformance.flows.profiles import get_profile
from conformance.runner.fuzz import fuzz
from conformance.runner.isolated import ChildRunner
from conformance.runner.plan import RunPlan
from conformance.selftest.museum.exhibits import EXHIBITS
from conformance.selftest.museum.run import MAX_EXAMPLES, SEED

SPEC = str(Path(__file__).resolve().parent / "_museum_adapters.py")


class _Found(KeyboardInterrupt):
    """Ends a search at its first expected problem (fuzz skips shrinking when interrupted)."""


def child_start(exhibit) -> float:
    """Seconds to start one more worker's child for this exhibit (inside the N-worker clock)."""
    runner = ChildRunner(f"{SPEC}:{exhibit.id}")
    started = time.monotonic()
    runner.start()
    seconds = time.monotonic() - started
    runner.close()
    return seconds


def time_to_first(exhibit, workers: int) -> tuple[float, bool]:
    runner = ChildRunner(f"{SPEC}:{exhibit.id}")
    runner.start()
    expected = set(exhibit.expected)
    started = time.monotonic()
    found: list[float] = []

    def stop_when(problems: frozenset[str]) -> bool:
        if problems & expected:
            found.append(time.monotonic() - started)
            raise _Found
        return False

    with tempfile.TemporaryDirectory() as out:
        fuzz(runner, RunPlan(get_profile(exhibit.profile), max_examples=MAX_EXAMPLES, seed=SEED, out_dir=Path(out), workers=workers, timeout=60), stop_when=stop_when)
    return (found[0], True) if found else (time.monotonic() - started, False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--exhibits", type=int, default=len(EXHIBITS))
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], args.workers: []}
    missed: dict[int, list[str]] = {1: [], args.workers: []}
    load = os.getloadavg()[0]
    starts: list[float] = []
    for i, exhibit in enumerate(EXHIBITS[:args.exhibits]):
        for n in (1, args.workers) if i % 2 == 0 else (args.workers, 1):
            seconds, hit = time_to_first(exhibit, n)
            times[n].append(seconds)
            if not hit:
                missed[n].append(exhibit.id)
        starts.append(child_start(exhibit))
        print(f"  {exhibit.id:40s} 1 worker {times[1][-1]:7.2f} s   {args.workers} workers "
              f"{times[args.workers][-1]:7.2f} s   (a child's start {starts[-1]:.2f} s)", flush=True)
    print(f"{len(times[1])} exhibits, load {load:.1f} -> {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    for n in times:
        print(f"  {n} worker(s): median time to the first violation {statistics.median(times[n]):.2f} s, "
              f"mean {statistics.mean(times[n]):.2f} s; not found within {MAX_EXAMPLES} examples: {missed[n] or 'none'}")
    ratio = statistics.median(times[1]) / statistics.median(times[args.workers])
    print(f"  median speed-up at {args.workers} workers: {ratio:.2f}x; a worker child's start: median "
          f"{statistics.median(starts):.2f} s (the extra workers start inside the {args.workers}-worker clock, while the first searches)")


if __name__ == "__main__":
    main()
