"""Which ``safety`` invariants assume that a step's outcome is applied in the same step.

    python -m conformance.selftest.async_safety_gaps [--traces 300] [--seed 20261201]
        [--out docs/results/async-safety-gaps.json]

Runs the same seeded traces (`conformance.selftest.campaigns.lockstep_async.path_strategy`, every
path) through the pipelined reference at depth 0 and at depth 1 (in process, through
`SchedulerAdapter`) under today's ``safety`` profile, and counts per invariant the traces that
violate it. Depth 0 is the V1 reference, so an invariant that fires only at depth 1 states a
synchronous-step assumption, not a scheduler bug: the reference at depth 1 delivers the
synchronous token stream (tests/test_async_reference.py). This is the list the spec part
of issue 16 has to make depth-aware (docs/ASYNC.md, "What today's safety profile says").
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

VERSION = 1


def violations_by_invariant(depth: int, path: str, count: int, seed_value: int) -> dict[str, Any]:
    from conformance.flows.profiles import get_profile
    from conformance.generation.async_paths import path_strategy
    from conformance.generation.v0 import sample_traces
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from reference_impl.async_scheduler import AsyncV1Scheduler

    adapter = SchedulerAdapter(f"async-d{depth}", lambda config: AsyncV1Scheduler(config, depth=depth))
    invariants = get_profile("safety").invariants()
    counts: collections.Counter[str] = collections.Counter()
    first: dict[str, str] = {}
    traces = sample_traces(path_strategy(path), count, seed_value)
    for trace in traces:
        result = run_checked(adapter, trace, invariants, timeout=None, stop_at_first=False)
        for problem in sorted(result.problem_ids):
            counts[problem] += 1
        for violation in result.violations:
            first.setdefault(violation.invariant_id, str(violation))
    return {"traces": len(traces), "violating_traces": dict(sorted(counts.items())), "first_message": first}


def main(argv: list[str] | None = None) -> int:
    from conformance.generation.async_paths import PATHS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--out", type=Path, default=Path("docs/results/async-safety-gaps.json"))
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"version": VERSION, "profile": "safety", "seed": args.seed,
                              "reference": "reference_impl.async_scheduler:AsyncV1Scheduler", "paths": {}}
    for path in PATHS:
        report["paths"][path] = {f"depth_{d}": violations_by_invariant(d, path, args.traces, args.seed) for d in (0, 1)}
        print(json.dumps({"path": path, **{k: v["violating_traces"] for k, v in report["paths"][path].items()}}),
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
