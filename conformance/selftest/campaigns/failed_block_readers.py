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

What counts (`readers`): a block is *invalid* from the outcome that reports its load failed. The
positions of an invalid block a scheduled chunk computes are rewritten, in order from the block's
first (a chunk of the step that also reads it counts: each layer writes a step's KV before it
attends). A *read* is a scheduled chunk, of a request holding an invalid block at table index i,
that starts past ``i * block_size`` plus the rewritten positions: it attends to what nobody
rewrote. *Counted*: after a step, a request's computed tokens pass that mark (the state a read
follows from, once the request is scheduled before the owner's recompute). This is
the hunt's own reading of the snapshots, which KVC-011 (spec/invariants/connector.py) now states
as an invariant; each trace runs on vLLM's scheduler (the vllm-v1 host with the scripted
connector), on the spec's reference (which drops a failed block's key and cuts its sharers back) and
on the reference in vLLM's terms (which does neither).
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
from spec.invariants.connector import load_failed

OUT = Path("docs/results/connector-failed-block-readers.json")
TRACE_OUT = Path("docs/traces/connector/failed-block-read-before-recompute.json")


def readers(records, block_size: int) -> dict[str, list[dict[str, Any]]]:
    """What the hunt looks for (module docstring), in step order: ``read``, a scheduled chunk that
    attends to positions of an invalid block that nobody rewrote (its chunk starts past them), and
    ``counted``, a request that after a step counts such positions as computed."""
    rewritten: dict[int, int] = {}  # invalid block -> its leading positions computed again
    found: dict[str, list[dict[str, Any]]] = {"read": [], "counted": []}
    for rec in records:
        for t in (rec.after.kv_reported or {}).values():  # a load that fills a block writes it whole
            if t.kind == "load":
                for block in t.blocks:
                    if block not in t.failed:
                        rewritten.pop(block, None)
        planned = rec.mid if rec.mid is not None else rec.before
        void = load_failed(rec)  # their step is redone: it computed nothing
        chunks = []
        for item in rec.output.scheduled:
            if item.request_id in void:
                continue
            view = (planned.seqs or {}).get(item.seq_id)
            if view is not None and view.num_computed is not None:
                chunks.append((view, view.num_computed, view.num_computed + item.num_tokens))
        for view, start, end in chunks:  # this step's chunks rewrite what they compute ...
            for index, block in enumerate(view.blocks or ()):
                if block in rewritten and start <= index * block_size + rewritten[block] < end:
                    rewritten[block] = min(block_size, end - index * block_size)
        for block in [b for b, n in rewritten.items() if n == block_size]:
            del rewritten[block]  # computed again whole: valid from now on
        for view, start, _ in chunks:  # ... before any of them attends (each layer writes, then reads)
            for index, block in enumerate(view.blocks or ()):
                if block in rewritten and index * block_size + rewritten[block] < min(start, (index + 1) * block_size):
                    found["read"].append({"step": rec.step, "seq": view.seq_id, "block": block, "index": index,
                                          "chunk_start": start, "rewritten": rewritten[block]})
        for t in (rec.after.kv_reported or {}).values():
            if t.kind == "load":
                for block in t.failed:
                    rewritten[block] = 0
        for view in (rec.after.seqs or {}).values():
            if view.status.is_finished or view.num_computed is None:
                continue
            for index, block in enumerate(view.blocks or ()):
                if block in rewritten and min(view.num_computed, (index + 1) * block_size) > index * block_size + rewritten[block]:
                    found["counted"].append({"step": rec.step, "seq": view.seq_id, "block": block, "index": index,
                                             "num_computed": view.num_computed, "rewritten": rewritten[block]})
    return found


def run(traces: int, seed: int) -> dict[str, Any]:
    invariants = get_profile("connector").invariants()
    sides = {"vllm-v1": load_adapter("vllm-v1"), "spec reference": SchedulerAdapter("reference-v1", V1Scheduler),
             "reference in vLLM's terms": SchedulerAdapter("engine-connector-v1", EngineConnectorV1)}
    counts = {name: {"read": 0, "read, the sharer arriving with the owner": 0, "counted": 0, "fault": 0}
              for name in sides}
    first: dict[str, Any] = {}
    drawn = {"with pressure": 0, "sharer at step 0": 0}
    for trace in sample_traces(reader_traces(), traces, seed):
        drawn["with pressure"] += len(trace.arrivals) > 2
        drawn["sharer at step 0"] += any(a.request.request_id == "sharer" and a.step == 0 for a in trace.arrivals)
        for name, adapter in sides.items():
            result = run_checked(adapter, trace, invariants, timeout=60, stop_at_first=False)
            counts[name]["fault"] += result.fault is not None
            if result.fault is not None:
                first.setdefault(f"{name}: fault", {"fault": str(result.fault)[:300], "trace": trace.to_dict()})
            found = readers(result.records, trace.config.block_size)
            together = any(a.request.request_id == "sharer" and a.step == 0 for a in trace.arrivals)
            counts[name]["read, the sharer arriving with the owner"] += bool(found["read"]) and together
            for kind, events in found.items():
                if events:
                    counts[name][kind] += 1
                    first.setdefault(f"{name}: {kind}", {"events": events[:3], "violations": sorted(result.problem_ids),
                                                          "trace": trace.to_dict()})
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
        trace = dict(engine["trace"], meta={"hunt": "failed_block_readers", "reads": engine["events"]})
        TRACE_OUT.write_text(json.dumps(trace, indent=1) + "\n")
        print(f"first vLLM read: {engine['events'][0]}; trace in {TRACE_OUT}")
    return 1 if engine is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
