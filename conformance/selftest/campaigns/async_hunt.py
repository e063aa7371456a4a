"""The hunt of issue 16 (item 5): vLLM's ``AsyncScheduler`` under ``safety`` and ``liveness``, on
every pinned version, with KV pressure, chunked prefill, prefix caching, aborts and stops.

    python -m conformance.selftest.campaigns.async_hunt --target vllm-v1-async --profiles safety liveness \
        --traces 300 --out docs/results/async-hunt-0.33.0.json --traces-dir docs/traces/async/hunt

Each trace is checked against the profiles' invariants together (one run serves both). Unlike
``kvsched conform`` (which stops searching a problem once it has a counterexample), every trace
is run whole (``stop_at_first=False``) and the problems it shows are classified
(`classify`): a known class names its vLLM source location, anything else is ``unclassified``.
The first trace of each class is shrunk for that class and saved. The traces are the target's
own (`conformance.generation.async_paths.all_paths_strategy`: the plain, chunked and preemption
paths at depth 1, prefix caching on in about half, aborts and stops), so a run is reproducible
from its seed. Not run in CI: it takes minutes per hundred traces.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from conformance.flows.profiles import invariants_of
from conformance.runner.driver import TraceResult, run_checked
from conformance.runner.shrink import shrink
from conformance.targets import get_target
from spec.trace import Trace

VERSION = 1
TIMEOUT = 120.0  # per call: the machine is shared, and a slow answer is not the engine's hang

# class -> (kind, explanation with the vLLM source location)
CLASSES: dict[str, tuple[str, str]] = {
    "chunk-clamped-below-max-model-len": (
        "vllm-deviation",
        "A prompt of exactly max_model_len tokens whose prefill continues as a running chunk is clamped at "
        "`max_model_len - num_computed_tokens - 1` (vllm/v1/core/sched/scheduler.py, Scheduler.schedule, running "
        "loop: 'Make sure the input position does not exceed the max model len'): its last prompt token is never "
        "scheduled, it holds its seat and never finishes (LIV-001 where it is the only work, LIV-002). The same "
        "class as the synchronous target's (conformance/selftest/campaigns/lockstep_v1.py); the async scheduler inherits it.",
    ),
}


def _clamp_shaped(trace: Trace) -> bool:
    """The shape of ``chunk-clamped-below-max-model-len``: chunked prefill and a prompt of exactly
    max_model_len tokens."""
    config = trace.config
    return config.enable_chunked_prefill and any(
        a.request.prompt_len == config.max_model_len for a in trace.arrivals)


def classify(trace: Trace, result: TraceResult) -> str | None:
    problems = result.problem_ids
    if not problems:
        return None
    if problems <= {"LIV-001", "LIV-002", "LIV-003"} and _clamp_shaped(trace):
        return "chunk-clamped-below-max-model-len"
    return "unclassified"


def _describe(result: TraceResult) -> str:
    if result.fault is not None:
        return f"step {result.fault_step}: {result.fault}"
    return "; ".join(str(v) for v in result.violations[:3])


def _run(args: argparse.Namespace, report: dict[str, Any], first: dict[str, tuple[Trace, TraceResult]]) -> None:
    target = get_target(args.target)
    invariants = invariants_of(args.profiles)
    holder = {"adapter": target.adapter()}
    counts: Counter[str] = Counter()
    stats = {"traces": 0, "steps": 0, "clean_traces": 0, "preemptions": 0, "aborts": 0, "stops": 0,
             "prefix_caching_on": 0, "chunked_prefill_on": 0}

    @settings(max_examples=args.traces, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.generate])
    @seed(args.seed)
    @given(target.strategy())  # type: ignore[misc]
    def one(trace: Trace) -> None:
        result = run_checked(holder["adapter"], trace, invariants, timeout=TIMEOUT, stop_at_first=False)
        stats["traces"] += 1
        stats["steps"] += len(result.records)
        stats["preemptions"] += sum(len(r.output.preempted) for r in result.records)
        stats["aborts"] += len(trace.aborts)
        stats["stops"] += len(trace.stops)
        stats["prefix_caching_on"] += trace.config.enable_prefix_caching
        stats["chunked_prefill_on"] += trace.config.enable_chunked_prefill
        if result.fault is not None:  # the host's state is unknown: a fresh one for the next trace
            holder["adapter"].close()
            holder["adapter"] = target.adapter()
        cls = classify(trace, result)
        if cls is None:
            stats["clean_traces"] += 1
        else:
            counts[f"{cls}: {','.join(sorted(result.problem_ids))}"] += 1
            first.setdefault(cls, (trace, result))
        if stats["traces"] % 25 == 0:
            print(f"{args.target}: {stats['traces']} traces, {stats['steps']} steps, {dict(counts)}", flush=True)

    one()
    holder["adapter"].close()
    report["invariants"] = sorted(inv.id for inv in invariants)
    report["run"] = {**stats, "by_class": dict(sorted(counts.items()))}
    print(f"{args.target}: {stats} {dict(counts)}", flush=True)


def _shrink_first(args: argparse.Namespace, report: dict[str, Any],
                  first: dict[str, tuple[Trace, TraceResult]]) -> None:
    target = get_target(args.target)
    invariants = invariants_of(args.profiles)
    adapter = target.adapter()
    for cls, (trace, result) in sorted(first.items()):
        problems = result.problem_ids

        def failing(candidate: Trace, cls: str = cls, problems: set[str] = problems) -> int | None:
            if target.domain is not None and not target.domain.admits(candidate):
                return None
            r = run_checked(adapter, candidate, invariants, timeout=TIMEOUT, stop_at_first=False)
            return r.failure_step if classify(candidate, r) == cls and r.problem_ids & problems else None

        small = trace
        if not args.no_shrink:
            try:
                small, _ = shrink(trace, failing, budget=200, seconds=args.shrink_seconds)
            except ValueError:
                small = trace
        final = run_checked(adapter, small, invariants, timeout=TIMEOUT, stop_at_first=False)
        kind, why = CLASSES.get(cls, ("unclassified", "not yet explained: read the shrunk trace"))
        meta = {"adapter": args.target, "profiles": args.profiles, "problems": sorted(final.problem_ids),
                "class": cls, "kind": kind, "message": _describe(final), "steps": len(final.records)}
        small = Trace(small.config, small.arrivals, small.aborts, small.stops, small.max_steps, meta)
        path = small.save(args.traces_dir / f"{target.name}-{cls}.json")
        report["classes"][cls] = {"kind": kind, "explanation": why, "trace": str(path), **meta}
        print(f"{cls} ({kind}): {path}\n  {meta['message'][:300]}", flush=True)
    adapter.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="vllm-v1-async")
    parser.add_argument("--profiles", nargs="+", default=["safety", "liveness"])
    parser.add_argument("--traces", type=int, default=300, help="traces (each checked against every profile)")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--traces-dir", type=Path, default=Path("docs/traces/async/hunt"))
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--shrink-seconds", type=float, default=120.0)
    args = parser.parse_args(argv)
    target = get_target(args.target)
    report: dict[str, Any] = {"version": VERSION, "target": args.target, "package": target.version,
                              "profiles": args.profiles, "seed": args.seed, "timeout_s": TIMEOUT, "classes": {}}
    first: dict[str, tuple[Trace, TraceResult]] = {}
    started = time.monotonic()
    _run(args, report, first)
    _shrink_first(args, report, first)
    report["seconds"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} in {report['seconds']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
