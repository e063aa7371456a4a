"""A safety + liveness hunt on vLLM 0.33.0 with speculative decoding, sync and async, and the probe
for vllm-project/vllm#42722 (an outcome with no token for a request with drafts).

    python -m conformance.targets.specdec_hunt [--traces 300] [--seed 20261203]
        [--out docs/results/specdec-hunt.json] [--traces-dir docs/traces/specdec]

The hunt runs `conformance.targets.lockstep_specdec.path_traces` (KV pressure, chunked prefill,
prefix caching, aborts, stops inside accepted runs; k in 1..4) through each target under the
``liveness`` profile (every safety invariant plus progress and completion), without lockstep.
Violations are counted per invariant; the first trace of each is shrunk and saved. The probe runs
one request with drafts whose second verifying step returns no token, on both paths.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from conformance.driver import run_checked
from conformance.generate import sample_traces
from conformance.profiles import get_profile
from conformance.targets.lockstep_specdec import PATHS, adapter_for, path_traces
from spec.config import SchedulerConfig
from spec.speculative import DraftDecision
from spec.trace import Arrival, Trace
from spec.types import Request

VERSION = 1
# Seconds one call may take before the runner calls it hung: generous, because on a loaded machine
# a vLLM host's reset can take minutes, and a host declared hung is replaced by a fresh one.
CALL_TIMEOUT = 600


def probe_42722(depth: int) -> Trace:
    """One request, k = 2: step 0 prefills it (the drafter proposes 2), step 1 verifies two drafts
    and the model returns no token for it."""
    config = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=64, max_model_len=64, watermark=0.0, preemption_mode="recompute",
                             num_speculative_tokens=2, pipeline_depth=depth)
    return Trace(config, (Arrival(0, Request("A", 5, 8, prompt_tokens=(1, 2, 3, 4, 5))),), max_steps=40,
                 drafts=((0, "A#0", DraftDecision(proposed=2)), (1, "A#0", DraftDecision(proposed=2, empty=True))))


def hunt_path(path: str, count: int, seed: int, first: dict) -> dict[str, Any]:
    adapter = adapter_for(path)
    invariants = get_profile("liveness").invariants()
    found: collections.Counter[str] = collections.Counter()
    steps = drained = 0
    started = time.monotonic()
    for done, trace in enumerate(sample_traces(path_traces(path), count, seed), 1):
        result = run_checked(adapter, trace, invariants, timeout=CALL_TIMEOUT, stop_at_first=False)
        steps += len(result.records)
        drained += result.drained
        for problem in sorted(result.problem_ids):
            found[problem] += 1
            first.setdefault((path, problem), trace)
        if done % 50 == 0:
            print(f"  {path}: {done}/{count}, {dict(found)}", flush=True)
    adapter.close()
    return {"traces": count, "steps": steps, "drained": drained, "traces_violating": dict(sorted(found.items())),
            "seconds": round(time.monotonic() - started, 1)}


def run_probe(path: str) -> dict[str, Any]:
    adapter = adapter_for(path)
    trace = probe_42722(1 if path == "async" else 0)
    result = run_checked(adapter, trace, get_profile("liveness").invariants(), timeout=CALL_TIMEOUT, stop_at_first=False)
    adapter.close()
    first = {}
    for v in result.violations:
        first.setdefault(v.invariant_id, str(v))
    return {"drained": result.drained, "steps": len(result.records), "fault": str(result.fault) if result.fault else None,
            "violations": first}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=300)
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--out", type=Path, default=Path("docs/results/specdec-hunt.json"))
    ap.add_argument("--traces-dir", type=Path, default=Path("docs/traces/specdec"))
    ap.add_argument("--no-shrink", action="store_true")
    args = ap.parse_args(argv)
    report: dict[str, Any] = {"version": VERSION, "package": "vllm==0.33.0", "profile": "liveness", "seed": args.seed,
                              "paths": {}, "probe_42722": {}, "first": {}}
    first: dict[tuple[str, str], Trace] = {}
    for path in PATHS:
        report["probe_42722"][path] = run_probe(path)
        print(json.dumps({"probe_42722": path, **report["probe_42722"][path]})[:600], flush=True)
        report["paths"][path] = hunt_path(path, args.traces, args.seed, first)
        print(json.dumps({"path": path, **report["paths"][path]}), flush=True)
    for (path, problem), trace in sorted(first.items()):
        if problem == "LOCKSTEP":
            continue
        if not args.no_shrink:
            from conformance.shrink import shrink

            adapter = adapter_for(path)
            invariants = get_profile("liveness").invariants()

            def failing(candidate: Trace, problem: str = problem, adapter=adapter, invariants=invariants) -> int | None:
                try:
                    got = run_checked(adapter, candidate, invariants, timeout=CALL_TIMEOUT, stop_at_first=False)
                except Exception:  # noqa: BLE001 - a candidate vLLM refuses is no smaller instance
                    return None
                return got.failure_step if problem in got.problem_ids else None

            try:
                trace = shrink(trace, failing, budget=150, seconds=60)[0]
            except ValueError:
                pass
            adapter.close()
        meta = {"adapter": "vllm-v1" if path == "sync" else "vllm-v1-async", "path": path, "problem": problem}
        out = dataclasses.replace(trace, meta=meta).save(args.traces_dir / f"hunt-{path}-{problem}.json")
        report["first"][f"{path}:{problem}"] = str(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
