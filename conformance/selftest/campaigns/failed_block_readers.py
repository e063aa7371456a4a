"""Hunt (issue 30): does a request read a failed load's block before anyone has recomputed it?

    python -m conformance.selftest.campaigns.failed_block_readers [--traces 300] [--out FILE]

Under ``kv_load_failure_policy = "recompute"`` vLLM 0.33.0 keeps the blocks a synchronous load
failed to fill in the prefix cache, so that the requests sharing them reuse them once the owner has
recomputed them ("only when not using recompute policy (where blocks will be recomputed and reused by
other requests sharing them)", vllm/v1/core/sched/scheduler.py:3755-3760; the owner is cut back to the
first failed block, :3655-3666). The hunt asks whether another request can count such a block as
computed *before* its content is recomputed: a request admitted with a prefix hit on it while the
owner's recompute is chunked, or after the owner was preempted and freed it still keyed. Such a
request attends to garbage KV and its own blocks are computed over it (vllm-project/vllm#49250 reports
the wrong output of the sharer case).

Traces (`conformance.generation.connector.failed_block_sharer_traces`): an owner whose synchronous load of its whole prompt but the last token
fails on one block, and a second request with the same prompt (and a tail of its own) arriving at
step 0 to 3; a small token budget and a long-prefill threshold of at most a block, so that the
owner's recompute is chunked and leaves budget to the sharer; sometimes a third request and a small
pool so that the owner is preempted.

What counts: KVC-011 (spec/invariants/connector.py), which this hunt led to: a scheduled chunk
that attends to positions of a block a failed load left invalid before any chunk computed them
again. Each trace runs on vLLM's scheduler (the vllm-v1 host with the scripted connector), on the
spec's reference (which drops a failed block's key and cuts its sharers back) and on the reference
in vLLM's terms (which does neither); a trace counts for a side when KVC-011 fires there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from conformance.flows.profiles import get_profile
from conformance.generation.connector import failed_block_sharer_traces as reader_traces
from conformance.generation.v0 import sample_traces
from conformance.runner.adapter import SchedulerAdapter, load_adapter
from conformance.runner.driver import run_checked
from reference_impl.kv_connector_scheduler import EngineConnectorV1
from reference_impl.v1_scheduler import V1Scheduler

OUT = Path("docs/results/connector-failed-block-readers.json")
TRACE_OUT = Path("docs/traces/connector/failed-block-read-before-recompute.json")


def run(traces: int, seed: int) -> dict[str, Any]:
    invariants = get_profile("connector").invariants()
    sides = {"vllm-v1": load_adapter("vllm-v1"), "spec reference": SchedulerAdapter("reference-v1", V1Scheduler),
             "reference in vLLM's terms": SchedulerAdapter("engine-connector-v1", EngineConnectorV1)}
    counts = {name: {"read": 0, "read, the sharer arriving with the owner": 0, "fault": 0} for name in sides}
    first: dict[str, Any] = {}
    drawn = {"with pressure": 0, "sharer at step 0": 0}
    for trace in sample_traces(reader_traces(), traces, seed):
        together = any(a.request.request_id == "sharer" and a.step == 0 for a in trace.arrivals)
        drawn["with pressure"] += len(trace.arrivals) > 2
        drawn["sharer at step 0"] += together
        for name, adapter in sides.items():
            result = run_checked(adapter, trace, invariants, timeout=60, stop_at_first=False)
            counts[name]["fault"] += result.fault is not None
            if result.fault is not None:
                first.setdefault(f"{name}: fault", {"fault": str(result.fault)[:300], "trace": trace.to_dict()})
            reads = [v for v in result.violations if v.invariant_id == "KVC-011"]
            if reads:
                counts[name]["read"] += 1
                counts[name]["read, the sharer arriving with the owner"] += together
                first.setdefault(f"{name}: read", {"reads": [{"step": v.step, "message": v.message} for v in reads[:3]],
                                                   "violations": sorted(result.problem_ids), "trace": trace.to_dict()})
    return {"version": 1, "traces": traces, "seed": seed, "drawn": drawn, "traces_with_a_reader": counts,
            "first": first}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--seed", type=int, default=20261204)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    report = run(args.traces, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(json.dumps({k: report[k] for k in ("traces", "drawn", "traces_with_a_reader")}))
    engine = report["first"].get("vllm-v1: read")
    if engine is not None:
        trace = dict(engine["trace"], meta={"hunt": "failed_block_readers", "reads": engine["reads"]})
        TRACE_OUT.write_text(json.dumps(trace, indent=1) + "\n")
        print(f"first vLLM read: {engine['reads'][0]}; trace in {TRACE_OUT}")
    return 1 if engine is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
