"""What isolation costs: checked steps per second with the adapter in the runner's process
(`LocalRunner`) against the same adapter in a child process (`ChildRunner`), on the same traces,
in the same run, rounds interleaved.

Two processes share the work when isolated, so the clock is the wall clock (the machine is
noisy: rounds alternate, and the median is reported). The runner's own CPU time is printed too:
what the parent spends per step when isolated (JSON in and out, the watchdog's polls).

    python benchmarks/bench_isolation.py [--adapter reference] [--traces 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

from hypothesis import HealthCheck, given, seed, settings

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import traces
from conformance.runner.adapter import load_adapter
from conformance.runner.isolated import ChildRunner, LocalRunner


def corpus(n: int, seed_value: int) -> list:
    out: list = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @seed(seed_value)
    @given(traces())
    def collect(trace) -> None:
        out.append(trace)

    collect()
    return out


def timed(runner, corpus, invariants) -> tuple[float, float, int]:
    wall, cpu = time.perf_counter(), time.process_time()
    steps = sum(runner.run(t, invariants).steps for t in corpus)
    return time.perf_counter() - wall, time.process_time() - cpu, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", default="reference")
    parser.add_argument("--profile", default="safety")
    parser.add_argument("--traces", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    traces_ = corpus(args.traces, args.seed)
    invariants = [inv.id for inv in get_profile(args.profile).invariants()]
    local = LocalRunner(lambda: load_adapter(args.adapter))
    child = ChildRunner(args.adapter)
    child.start()
    rates: dict[str, list[float]] = {"in process": [], "isolated": []}
    parent_cpu: list[float] = []
    try:
        timed(child, traces_[:5], invariants)  # warm both
        timed(local, traces_[:5], invariants)
        for _ in range(args.rounds):
            for name, runner in (("in process", local), ("isolated", child)):
                wall, cpu, steps = timed(runner, traces_, invariants)
                rates[name].append(steps / wall)
                if name == "isolated":
                    parent_cpu.append(cpu / steps * 1e6)
    finally:
        child.close()
    print(f"adapter {args.adapter}, profile {args.profile}: {len(traces_)} traces, {steps} steps a round, "
          f"{args.rounds} interleaved rounds (median)")
    for name, values in rates.items():
        print(f"  {name:10s}  {statistics.median(values):9.0f} checked steps/s")
    ratio = statistics.median(rates["isolated"]) / statistics.median(rates["in process"])
    print(f"  isolated / in process = {ratio:.2f}x; the runner's own CPU when isolated: "
          f"{statistics.median(parent_cpu):.1f} us/step")


if __name__ == "__main__":
    main()
