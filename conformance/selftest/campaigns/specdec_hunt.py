"""A safety + liveness hunt on vLLM 0.33.0 with speculative decoding, sync and async, behind V1's
front door, and the probe for vllm-project/vllm#42722 (an outcome with no token for a request
with drafts).

    python -m conformance.selftest.campaigns.specdec_hunt [--traces 1000] [--minutes 14] [--seed 20261203]
        [--profiles safety liveness] [--out docs/results/specdec-hunt.json]
        [--traces-dir docs/traces/specdec/hunt] [--keep DIR]
    python -m conformance.selftest.campaigns.specdec_hunt --reclassify DIR   # after adding a class

The hunt runs `conformance.selftest.campaigns.lockstep_specdec.path_traces` (the plain, chunked and
preemption shapes: KV pressure, chunked prefill, prefix caching drawn on or off, aborts, stops
inside accepted runs; k in 1..4) through each target under the ``safety`` and ``liveness``
profiles together (one run serves both), without lockstep, every trace run whole.

The door: the V1 hosts refuse a generate prompt of exactly max_model_len at ``add_request``, as
vLLM's input processor does (`conformance.selftest.campaigns.door`). The refusal is an answer, not a stall:
the driver records it as the request's finish (``StepRecord.refused``; LEN-003 accepts it), so
the liveness invariants count the request done. The hunt counts such refusals apart
(``door_refusals``) to show they were drawn and not reported.

A finding is classified (`classify`) by the vLLM source line it comes from; anything else is
``unclassified``, shrunk for its problems and saved. ``--minutes`` stops a path in time: the
report then holds the exact number of traces that ran. Not run in CI.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from conformance.flows.profiles import get_profile, invariants_of
from conformance.generation.v0 import sample_traces
from conformance.runner.driver import TraceResult, run_checked
from conformance.selftest.campaigns.campaign_args import provenance
from conformance.selftest.campaigns.lockstep_specdec import CLASSES as LOCKSTEP_CLASSES
from conformance.selftest.campaigns.lockstep_specdec import PATHS, adapter_for, base_of, path_traces
from spec.config import SchedulerConfig
from spec.speculative import DraftDecision
from spec.trace import Arrival, Trace
from spec.types import Request

VERSION = 2  # 2: safety + liveness, behind the door, classified findings, provenance, time budget
# Seconds one call may take before the runner calls it hung: generous, because on a loaded machine
# a vLLM host's reset can take minutes, and a host declared hung is replaced by a fresh one.
CALL_TIMEOUT = 600
CHUNK = 250  # traces drawn at a time (`drawn`)
PADDED = "padded-admission-cut-by-threshold"
STALL = "padded-admission-over-budget-stalls"
LIVENESS = frozenset({"LIV-001", "LIV-002", "LIV-003"})
CLASSES: dict[str, tuple[str, str]] = {
    PADDED: LOCKSTEP_CLASSES[PADDED],
    STALL: (
        "vllm-defect",
        "A waiting request with one token left to compute (a prefix-cache hit on all but its last prompt token, or "
        "a request resumed after preemption) is padded to 1 + k tokens for full CUDA graphs, and when 1 + k exceeds "
        "the step's token budget vLLM 'prefers to not schedule than schedule un-padded' and breaks out of the "
        "waiting loop (v1/core/sched/scheduler.py:1310-1328; the padding applies with nothing running because "
        "`num_computed_tokens > 0`, line 1316). With max_num_batched_tokens < 1 + k the budget never grows: the "
        "head of waiting is never admitted and, with nothing running, the engine idles with work queued (LIV-001, "
        "LIV-003) until the request is aborted. The config is accepted: `VllmConfig._set_max_num_scheduled_tokens` "
        "(config/vllm.py:2370-2376) requires max_num_batched_tokens > num_lookahead_tokens only, which is 0 for the "
        "n-gram drafter. The vLLM-compatible reference (`pads_new_decode_drafts`) stalls on the same traces.",
    ),
}


def probe_42722(depth: int) -> Trace:
    """One request, k = 2: step 0 prefills it (the drafter proposes 2), step 1 verifies two drafts
    and the model returns no token for it."""
    config = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=64, max_model_len=64, watermark=0.0, preemption_mode="recompute",
                             num_speculative_tokens=2, pipeline_depth=depth)
    return Trace(config, (Arrival(0, Request("A", 5, 8, prompt_tokens=(1, 2, 3, 4, 5))),), max_steps=40,
                 drafts=((0, "A#0", DraftDecision(proposed=2)), (1, "A#0", DraftDecision(proposed=2, empty=True))))


def padded_shape(trace: Trace) -> bool:
    """The shape the padded-admission assert needs: a long-prefill threshold below 1 + k."""
    threshold = trace.config.long_prefill_token_threshold
    return 0 < threshold < 1 + trace.config.num_speculative_tokens


def over_budget_shape(trace: Trace) -> bool:
    """The shape the padded-admission stall needs: a token budget below 1 + k."""
    return trace.config.max_num_batched_tokens < 1 + trace.config.num_speculative_tokens


def padding_explains(trace: Trace, path: str, problems: set[str]) -> bool:
    """The counterfactual for a stall: the path's vLLM-compatible reference shows the same
    problems on the trace, and the same reference without the padding (`pads_new_decode_drafts`
    off) shows none of them."""
    from conformance.runner.adapter import SchedulerAdapter

    compat = base_of(path)
    unpadded = type(f"Unpadded{compat.__name__}", (compat,), {"pads_new_decode_drafts": False})
    invariants = invariants_of(["safety", "liveness"])

    def found(cls: type) -> set[str]:
        adapter = SchedulerAdapter(cls.__name__, cls, capabilities=cls.capabilities)  # type: ignore[attr-defined]
        return run_checked(adapter, trace, invariants, stop_at_first=False).problem_ids

    return problems <= found(compat) and not problems & found(unpadded)


def classify(trace: Trace, result: TraceResult, path: str = "sync") -> str | None:
    """None for a clean trace; the class of a known finding, by the source line vLLM names in its
    traceback (and the config's shape), or for a stall by its shape and a counterfactual rerun of
    the reference (`padding_explains`); else ``unclassified``."""
    if not result.problem_ids:
        return None
    if result.fault is not None and "scheduler.py:1579" in str(result.fault) and padded_shape(trace):
        return PADDED  # EngineCore died: what the checks say after that is about a dead engine
    if result.fault is None and result.problem_ids <= LIVENESS and over_budget_shape(trace) \
            and padding_explains(trace, path, result.problem_ids):
        return STALL
    return "unclassified"


def _describe(result: TraceResult) -> str:
    if result.fault is not None:
        return f"step {result.fault_step}: {str(result.fault)[-400:]}"
    return "; ".join(str(v) for v in result.violations[:3])


def drawn(path: str, count: int, seed: int, chunk: int = CHUNK) -> Iterator[Trace]:
    """``count`` traces for a path, drawn lazily in chunks (chunk i with seed ``seed + i``), so a
    time budget does not first pay for drawing traces it never runs (drawing 1000 takes ~1.5 min
    under load). Reproducible from the seed and the chunk size."""
    for i, start in enumerate(range(0, count, chunk)):
        yield from sample_traces(path_traces(path), min(chunk, count - start), seed + i)


def hunt_path(path: str, count: int, seed: int, minutes: float, invariants: list,
              first: dict[tuple[str, str], tuple[Trace, TraceResult]], keep: Path | None = None) -> dict[str, Any]:
    adapter = adapter_for(path)
    by_class: collections.Counter[str] = collections.Counter()
    problems: collections.Counter[str] = collections.Counter()
    stats = {"traces": 0, "steps": 0, "drained": 0, "clean_traces": 0, "faults": 0, "preemptions": 0,
             "door_refusals": 0, "traces_with_door_refusal": 0, "aborts": 0, "stops": 0, "prefix_caching_on": 0,
             "chunked_prefill_on": 0, "k": collections.Counter()}
    started_at = provenance()
    started = time.monotonic()
    for trace in drawn(path, count, seed):
        if time.monotonic() - started > minutes * 60:
            print(f"  {path}: time budget of {minutes} min spent after {stats['traces']} traces", flush=True)
            break
        result = run_checked(adapter, trace, invariants, timeout=CALL_TIMEOUT, stop_at_first=False)
        stats["traces"] += 1
        stats["steps"] += len(result.records)
        stats["drained"] += result.drained
        stats["preemptions"] += sum(len(r.output.preempted) for r in result.records)
        refused = sum(len(r.refused) for r in result.records)
        stats["door_refusals"] += refused
        stats["traces_with_door_refusal"] += bool(refused)
        stats["aborts"] += len(trace.aborts)
        stats["stops"] += len(trace.stops)
        stats["prefix_caching_on"] += trace.config.enable_prefix_caching
        stats["chunked_prefill_on"] += trace.config.enable_chunked_prefill
        stats["k"][str(trace.config.num_speculative_tokens)] += 1
        if result.fault is not None:  # the host's state is unknown: a fresh one for the next trace
            stats["faults"] += 1
            adapter.close()
            adapter = adapter_for(path)
        cls = classify(trace, result, path)
        if cls is None:
            stats["clean_traces"] += 1
        else:
            by_class[cls] += 1
            problems.update(result.problem_ids)
            first.setdefault((path, cls), (trace, result))
            if cls == "unclassified":
                print(f"  {path}: trace {stats['traces']} unclassified: {_describe(result)[:300]}", flush=True)
                if keep is not None:  # for --reclassify: a seed redraws these traces only at this commit
                    trace.save(keep / f"{path}-{stats['traces']}.json")
        if stats["traces"] % 25 == 0:
            print(f"  {path}: {stats['traces']}/{count} traces, {stats['steps']} steps, {int(time.monotonic() - started)} s,"
                  f" {dict(by_class)}", flush=True)
    adapter.close()
    stats["k"] = dict(sorted(stats["k"].items()))
    return {**stats, "by_class": dict(sorted(by_class.items())), "traces_violating": dict(sorted(problems.items())),
            "seconds": round(time.monotonic() - started, 1), "run": {"started": started_at, "written": provenance()}}


def run_probe(path: str) -> dict[str, Any]:
    adapter = adapter_for(path)
    trace = probe_42722(1 if path == "async" else 0)
    result = run_checked(adapter, trace, get_profile("liveness").invariants(), timeout=CALL_TIMEOUT, stop_at_first=False)
    adapter.close()
    first: dict[str, str] = {}
    for v in result.violations:
        first.setdefault(v.invariant_id, str(v))
    return {"drained": result.drained, "steps": len(result.records), "fault": str(result.fault) if result.fault else None,
            "violations": first}


def shrink_first(path: str, cls: str, trace: Trace, result: TraceResult, invariants: list,
                 seconds: float) -> Trace:
    """Shrink an unclassified finding, keeping its class and at least one of its problems."""
    from conformance.runner.shrink import shrink

    adapter = adapter_for(path)
    wanted = result.problem_ids

    def failing(candidate: Trace) -> int | None:
        try:
            got = run_checked(adapter, candidate, invariants, timeout=CALL_TIMEOUT, stop_at_first=False)
        except Exception:  # noqa: BLE001 - a candidate vLLM refuses is no smaller instance
            return None
        return got.failure_step if classify(candidate, got, path) == cls and got.problem_ids & wanted else None

    try:
        return shrink(trace, failing, budget=150, seconds=seconds)[0]
    except ValueError:
        return trace
    finally:
        adapter.close()


def save_first(report: dict[str, Any], traces_dir: Path, path: str, cls: str, trace: Trace, result: TraceResult,
               shrunk: bool) -> None:
    kind, why = CLASSES.get(cls, ("unclassified", "not yet explained: read the saved trace"))
    meta = {"adapter": "vllm-v1" if path == "sync" else "vllm-v1-async", "path": path, "class": cls,
            "kind": kind, "problems": sorted(result.problem_ids), "message": _describe(result)[:600], "shrunk": shrunk}
    out = dataclasses.replace(trace, meta=meta).save(traces_dir / f"{path}-{cls}.json")
    report["first"][f"{path}:{cls}"] = str(out)
    report["classes"].setdefault(cls, {"kind": kind, "explanation": why, "paths": {}})["paths"][path] = str(out)


def reclassify(report: dict[str, Any], saved: Path, traces_dir: Path, shrink_seconds: float) -> None:
    """After a run: rerun each trace the run reported ``unclassified``, saved as
    ``SAVED/PATH-N.json`` (trace N of the path), and classify it with the classes known now. For a
    class added while the run was going. The traces must be redrawn at the run's own commit: a seed
    names other traces at another (Hypothesis mixes the loaded modules' literals into generation,
    docs/SPECDEC.md section 5). The report says which traces were classified so (``reclassified``)."""
    wanted: dict[str, dict[int, Trace]] = collections.defaultdict(dict)
    for file in sorted(saved.glob("*.json")):
        match = re.fullmatch(r"(sync|async)-(\d+)\.json", file.name)
        if match:
            wanted[match.group(1)][int(match.group(2))] = Trace.load(file)
    invariants = invariants_of(report["profiles"])
    for path, traces in wanted.items():
        numbers = sorted(traces)
        adapter = adapter_for(path)
        moved: collections.Counter[str] = collections.Counter()
        done = []
        for n in numbers:
            result = run_checked(adapter, traces[n], invariants, timeout=CALL_TIMEOUT, stop_at_first=False)
            cls = classify(traces[n], result, path) or "clean-on-rerun"
            moved[cls] += 1
            done.append({"trace": n, "class": cls, "problems": sorted(result.problem_ids),
                         "message": _describe(result)[:300]})
            print(f"  {path}: trace {n} -> {cls} {sorted(result.problem_ids)}", flush=True)
            if cls == STALL and f"{path}:{cls}" not in report["first"]:
                small = shrink_first(path, cls, traces[n], result, invariants, shrink_seconds)
                final = run_checked(adapter, small, invariants, timeout=CALL_TIMEOUT, stop_at_first=False)
                save_first(report, traces_dir, path, cls, small, final, shrunk=True)
        adapter.close()
        by_class = report["paths"][path]["by_class"]
        by_class["unclassified"] = by_class.get("unclassified", 0) - len(numbers)
        for cls, n in moved.items():
            by_class[cls] = by_class.get(cls, 0) + n
        report["paths"][path]["by_class"] = {k: v for k, v in sorted(by_class.items()) if v}
        report.setdefault("reclassified", {})[path] = done
        if not report["paths"][path]["by_class"].get("unclassified"):
            old = report["first"].pop(f"{path}:unclassified", None)
            if old:
                Path(old).unlink(missing_ok=True)
                report["classes"].get("unclassified", {}).get("paths", {}).pop(path, None)
    if not report["classes"].get("unclassified", {}).get("paths", True):
        report["classes"].pop("unclassified")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=1000, help="traces drawn per path (the time budget may stop sooner)")
    ap.add_argument("--minutes", type=float, default=1e9, help="time budget per path, in minutes")
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--profiles", nargs="+", default=["safety", "liveness"])
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--out", type=Path, default=Path("docs/results/specdec-hunt.json"))
    ap.add_argument("--traces-dir", type=Path, default=Path("docs/traces/specdec/hunt"))
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-seconds", type=float, default=90.0)
    ap.add_argument("--keep", type=Path, metavar="DIR", help="save every unclassified trace as DIR/PATH-N.json")
    ap.add_argument("--reclassify", type=Path, metavar="DIR",
                    help="do not hunt: rerun and reclassify the run's unclassified traces saved as DIR/PATH-N.json, in --out")
    args = ap.parse_args(argv)
    if args.reclassify:
        report = json.loads(args.out.read_text())
        reclassify(report, args.reclassify, args.traces_dir, args.shrink_seconds)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
        return 0
    invariants = invariants_of(args.profiles)
    report: dict[str, Any] = {"version": VERSION, "package": "vllm==0.33.0", "profiles": args.profiles,
                              "profile": "+".join(args.profiles), "seed": args.seed, "chunk": CHUNK, "door": "conformance/selftest/campaigns/door.py",
                              "invariants": sorted(inv.id for inv in invariants), "paths": {}, "probe_42722": {},
                              "classes": {}, "first": {}}
    first: dict[tuple[str, str], tuple[Trace, TraceResult]] = {}
    for path in args.paths:
        if not args.no_probe:
            report["probe_42722"][path] = run_probe(path)
            print(json.dumps({"probe_42722": path, **report["probe_42722"][path]})[:600], flush=True)
        report["paths"][path] = hunt_path(path, args.traces, args.seed, args.minutes, invariants, first, args.keep)
        print(json.dumps({"path": path, **report["paths"][path]}), flush=True)
    for (path, cls), (trace, result) in sorted(first.items()):
        shrunk = cls != PADDED and not args.no_shrink  # the padded assert is shrunk in the lockstep campaign
        if shrunk:
            trace = shrink_first(path, cls, trace, result, invariants, args.shrink_seconds)
        save_first(report, args.traces_dir, path, cls, trace, result, shrunk)
    report["run"] = provenance()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
