"""CPU seconds of checked steps in process: the V0 reference under profile ``safety``, over 300
traces drawn from seed 7 of `conformance.generation.v0.traces` (2,914 steps), as one JSON line.

Run it once per checkout to compare two of them, interleaved (BENCHMARKS.md, "What issue 35's
hardening costs a checked step"):

    for i in 1 2 3 4; do for root in /path/to/a /path/to/b; do
      PYTHONPATH=$root python3 $root/benchmarks/bench_checked_step_cost.py; done; done
"""

from __future__ import annotations

import json
import time

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import traces
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from conformance.runner.workers import draw


def main() -> None:
    batch = draw(traces(), 7, 300)
    checks = get_profile("safety").invariants()
    adapter = load_adapter("reference")
    steps = 0
    started = time.process_time()
    for trace in batch:
        steps += len(run_checked(adapter, trace, checks, timeout=None, stop_at_first=False).records)
    print(json.dumps({"cpu_s": round(time.process_time() - started, 3), "steps": steps}))


if __name__ == "__main__":
    main()
