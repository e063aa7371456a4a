"""The KV-connector hunt: ``safety`` and ``liveness`` (with the KVC family) on vLLM 0.33.0's V1
scheduler with the scripted connector, under KV pressure (docs/CONNECTORS.md, section 6).

    python -m conformance.selftest.campaigns.connector_hunt [--traces 500] [--seed 20261202]
        [--spec-tokens K] [--out docs/results/connector-hunt.json]

Traces: `conformance.generation.connector.pressure_traces` (a pool a few blocks above the longest
prompt, most requests loading asynchronously) with failures and sends drawn in, under both
failure policies; with ``--spec-tokens K`` (K > 0) speculative decoding is on: K draft tokens and
the trace's draft decisions (`conformance.generation.specdec.with_drafts`), vLLM's n-gram drafter
proposing as the trace says (the lookahead slots of vllm-project/vllm#57104). Every problem is counted by invariant; the first trace of each is kept in the
results file. No lockstep here (lockstep_connector does that): whatever vLLM does that breaks an
invariant is a candidate finding, explained in docs/CONNECTORS.md or listed as open.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time
from pathlib import Path

from hypothesis import strategies as st

from conformance.flows.profiles import invariants_of
from conformance.generation.connector import pressure_traces
from conformance.generation.specdec import with_drafts
from conformance.generation.v0 import sample_traces
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from spec.trace import Trace


@st.composite
def hunt_traces(draw: st.DrawFn, spec_tokens: int = 0) -> Trace:
    trace = draw(pressure_traces())
    if spec_tokens:  # with_drafts rebuilds the trace from its V1 fields: the scripts are put back
        trace = dataclasses.replace(draw(with_drafts(trace, spec_tokens)), connector=trace.connector)
    policy = draw(st.sampled_from(["recompute", "fail"]))
    scripts = {rid: dataclasses.replace(s, failed_blocks=(0,) if draw(st.integers(0, 2)) == 0 else (),
                                        send_steps=draw(st.sampled_from([0, 0, 1, 3])))
               for rid, s in trace.connector.items()}
    return dataclasses.replace(trace, config=dataclasses.replace(trace.config, kv_load_failure_policy=policy),
                               connector=scripts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=500)
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--spec-tokens", type=int, default=0, help="speculative decoding with K drafts (0: off)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/connector-hunt.json"))
    args = parser.parse_args(argv)
    adapter = load_adapter("vllm-v1")
    invariants = invariants_of(["safety", "liveness", "connector"])
    counts: collections.Counter[str] = collections.Counter()
    first: dict[str, dict] = {}
    steps = 0
    started = time.monotonic()
    for trace in sample_traces(hunt_traces(args.spec_tokens), args.traces, args.seed):
        result = run_checked(adapter, trace, invariants, timeout=120)
        steps += len(result.records)
        for problem in sorted(result.problem_ids):
            counts[problem] += 1
            first.setdefault(problem, {"trace": trace.to_dict(), "message": next(
                (str(v) for v in result.violations if v.invariant_id == problem), str(result.fault))})
    report = {"version": 1, "target": "vllm-v1", "seed": args.seed, "spec_tokens": args.spec_tokens,
              "traces": args.traces, "steps": steps,
              "problems": dict(sorted(counts.items())), "first": first,
              "seconds": round(time.monotonic() - started, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("traces", "steps", "problems", "seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
