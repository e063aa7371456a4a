"""Benchmark: the cost of checking the `safety` profile on the reference adapter.

Baseline, measured in the same run on the same traces: the reference scheduler driven by the
engine loop with no observation at all (``observe=False``). Prints checked steps per second and
the checking overhead as a ratio: (checked time - unchecked time) / unchecked time.

    python benchmarks/bench_conform.py [--traces 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import platform
import time

from conformance.adapter import load_adapter
from conformance.driver import run_checked
from conformance.generate import sample_traces, traces
from conformance.profiles import get_profile
from reference_impl.engine import iter_steps
from reference_impl.scheduler import Scheduler


def draw_traces(count: int, seed_value: int) -> list:
    return sample_traces(traces(max_requests=12), count, seed_value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    corpus = draw_traces(args.traces, args.seed)
    invariants = get_profile("safety").invariants()
    adapter = load_adapter("reference")

    def unchecked() -> int:
        steps = 0
        for t in corpus:
            steps += sum(1 for _ in iter_steps(t, Scheduler(t.config), observe=False))
        return steps

    def checked() -> int:
        steps = 0
        for t in corpus:
            steps += len(run_checked(adapter, t, invariants, timeout=None, stop_at_first=False).records)
        return steps

    def best(fn):
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            steps = fn()
            times.append(time.perf_counter() - start)
        return min(times), steps

    base, steps = best(unchecked)
    full, steps_checked = best(checked)
    assert steps == steps_checked, (steps, steps_checked)
    print(f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}")
    print(f"traces: {len(corpus)}, steps: {steps}")
    print(f"unchecked reference (baseline): {steps / base:,.0f} steps/s")
    print(f"checked, safety profile:        {steps / full:,.0f} steps/s")
    print(f"checking overhead: {(full - base) / base:.2f}x the scheduler's own time (target <= 1x)")


if __name__ == "__main__":
    main()
