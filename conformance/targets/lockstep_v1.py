"""Strict lockstep: the reference's ``vllm-v1`` flow against vLLM 0.33.0's V1 scheduler.

    python -m conformance.targets.lockstep_v1 [--traces 1000] [--seed 20261130] [--out docs/results/lockstep-vllm-v1.json]

Runs seeded traces of V1's default path (`conformance.targets._v1_strategy`: recompute only,
no chunked prefill, no prefix caching) through the installed ``vllm-v1`` target with the
``vllm-v1`` profile's reference beside it, and tallies the divergences by the field that
differed first. Needs ``kvsched targets install vllm-v1``.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from conformance.adapter import load_adapter
from conformance.driver import run_checked
from conformance.generate import sample_traces
from conformance.profiles import get_profile
from conformance.targets import _v1_strategy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--out", type=Path, default=Path("docs/results/lockstep-vllm-v1.json"))
    args = ap.parse_args(argv)
    traces = sample_traces(_v1_strategy(), args.traces, args.seed)
    adapter, profile = load_adapter("vllm-v1"), get_profile("vllm-v1")
    by_field: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    steps = agreeing = 0
    for trace in traces:
        result = run_checked(adapter, trace, profile.invariants(), timeout=60, lockstep=True,
                             reference_factory=profile.make_reference)
        steps += len(result.records)
        if result.divergence is not None:
            by_field[result.divergence.field] += 1
        for problem in result.problem_ids - {"LOCKSTEP"}:
            violations[problem] += 1
        agreeing += not result.failed
    report = {"version": 1, "target": "vllm-v1", "reference": profile.reference, "seed": args.seed,
              "traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
              "divergent_by_field": dict(by_field), "violations": dict(violations)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0 if agreeing == len(traces) else 1


if __name__ == "__main__":
    raise SystemExit(main())
