"""Lockstep, one step behind: `AsyncV1Scheduler` at depth 1 against vLLM 0.33.0's AsyncScheduler.

    python -m conformance.selftest.campaigns.lockstep_async [--path plain|chunked|preemption|all]
        [--traces 1000] [--seed 20261201] [--out docs/results/async-lockstep.json]
        [--traces-dir docs/traces/async]

Each seeded trace runs through the ``vllm_v1_async_host.py`` wire host (the engine loop of
``EngineCore.step_with_batch_queue``) with the pipelined reference (depth 1) beside it. Every
step compares what is scheduled (tokens per request, prefill flag), preempted and ignored, and
which requests finished (delivered) in the step (`conformance.runner.lockstep.compare`), then the state
after the step (`conformance.selftest.campaigns.lockstep_v1.compare_state`: statuses, the processed
frontier, block tables, queues, free blocks in order) and every sequence's token count
(`compare_tokens`: the delivered streams). Paths:

* ``plain``: no chunked prefill; prefix caching on or off;
* ``chunked``: chunked prefill (with ``long_prefill_token_threshold``); prefix caching on or off;
* ``preemption``: either, with a cache of at most one block above one ``max_model_len``
  sequence, so that KV pressure preempts running requests whose steps are in flight.

The reference stands behind V1's front door as the host does (`conformance.selftest.campaigns.door`: a
generate prompt of exactly max_model_len tokens is refused on arrival). A trace runs to its end (violations of the ``safety`` profile are counted, not stopping); its
first divergence is classified (`classify`) by rerunning it against a reference that models one
known engine behaviour (`MODELS`). The first trace of each class is shrunk (`conformance.runner.shrink`,
keeping the class) and saved under ``--traces-dir``. Results: versioned JSON.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from typing import Any

from conformance.flows.profiles import get_profile
from conformance.generation.async_paths import PATHS, path_strategy
from conformance.generation.v0 import sample_traces
from conformance.runner.driver import run_checked
from conformance.selftest.campaigns.campaign_args import (
    campaign_parser,
    keep_class_trace,
    keep_other_paths,
    provenance,
    write_report,
)
from conformance.selftest.campaigns.door import GenerateDoor
from conformance.selftest.campaigns.lockstep_v1 import Outcome, compare_state
from conformance.selftest.campaigns.recording import RecordsSnapshots
from reference_impl.async_scheduler import AsyncV1Scheduler
from spec.config import SchedulerConfig
from spec.status import Status
from spec.trace import Trace

VERSION = 1

# class -> (kind, explanation with the vLLM source location); filled from what the runs found.
CLASSES: dict[str, tuple[str, str]] = {
    "chunk-clamped-below-max-model-len": (
        "vllm-deviation",
        "As for the synchronous target (lockstep_v1): V1 clamps every running chunk at `max_model_len - "
        "num_computed_tokens - 1` (vllm/v1/core/sched/scheduler.py:851-857), so a prompt of exactly max_model_len "
        "tokens continued as a running chunk stops one token short. The pipelined reference keeps the V1 "
        "reference's spec decision.",
    ),
}


class RecordingAsync(GenerateDoor, RecordsSnapshots, AsyncV1Scheduler):
    """The async reference at depth 1 behind V1's front door (`conformance.selftest.campaigns.door`: a
    generate prompt of exactly max_model_len tokens is refused on arrival, as the host does),
    keeping its snapshot after every step. The host runs vLLM at depth 1 whatever the trace's
    config says, so the reference does too."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(dataclasses.replace(config, pipeline_depth=1))


class ClampedAsync(RecordingAsync):
    """With V1's clamp of every running chunk at ``max_model_len - num_computed - 1``
    (scheduler.py:851-857). Used only to classify divergences."""

    def _running_chunk(self, tracked, budget: int, threshold: int) -> int:  # type: ignore[no-untyped-def]
        tokens = super()._running_chunk(tracked, budget, threshold)
        return max(min(tokens, self.config.max_model_len - tracked.num_computed - 1), 0)


MODELS: tuple[tuple[str, type[RecordingAsync]], ...] = (
    ("chunk-clamped-below-max-model-len", ClampedAsync),
)


def run_one(adapter, trace: Trace, invariants, reference: type[RecordingAsync] = RecordingAsync, timeout: float = 60) -> Outcome:
    holder: list[RecordingAsync] = []

    def factory(config: SchedulerConfig) -> RecordingAsync:
        holder.append(reference(config))
        return holder[-1]

    result = run_checked(adapter, trace, invariants, timeout=timeout, lockstep=True, reference_factory=factory,
                         stop_at_first=False)
    state = compare_state(result, holder[0]) if holder else None  # type: ignore[arg-type]
    tokens = compare_tokens(result, holder[0]) if holder else None
    if tokens is not None and (state is None or tokens[0] < state[0]):
        state = tokens
    return Outcome(result, state)


def compare_tokens(result, reference: RecordingAsync) -> tuple[int, str, Any, Any] | None:
    """The first step after which some sequence (finished ones included) holds a different number
    of tokens: the delivered streams differ (token values follow from positions on both sides,
    `spec.types.generated_token`), the PIP-001 check across the wire."""
    for record, ref in zip(result.records, reference.after, strict=False):
        # a prompt over max_model_len never reaches V1's scheduler: the host has no sequence for it
        want = {sid: v.num_tokens for sid, v in (ref.seqs or {}).items() if v.status is not Status.FINISHED_IGNORED}
        got = {sid: v.num_tokens for sid, v in (record.after.seqs or {}).items()
               if v.status is not Status.FINISHED_IGNORED}
        if want != got:
            diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            return record.step, "num_tokens", {k: want.get(k) for k in diff}, {k: got.get(k) for k in diff}
    return None


def lockstep_field(outcome: Outcome) -> str:
    """What differed first between the reference and the target: a decision (`compare`'s
    field), ``state.<field>`` (`compare_state`), or ``fault``. Invariant violations are counted
    apart: at depth 1 several ``safety`` invariants fire on the reference too (docs/ASYNC.md)."""
    divergence, state = outcome.result.divergence, outcome.state
    if state is not None and (divergence is None or state[0] < divergence.step):
        return f"state.{state[1]}"
    return divergence.field if divergence is not None else "fault"


def classify(adapter, trace: Trace, outcome: Outcome, invariants) -> str | None:
    """The divergence's class (a key of `CLASSES`), ``unclassified`` when no model explains it,
    or None when the trace agrees. A class is confirmed by a counterfactual: rerun against the
    reference with the engine's behaviour modelled, every decision and state then agree."""
    if outcome.result.divergence is None and outcome.state is None:
        return None if outcome.result.fault is None else "fault"
    for cls, model in MODELS:
        again = run_one(adapter, trace, invariants, reference=model)
        if again.result.divergence is None and again.state is None and again.result.fault is None:
            return cls
    return "unclassified"


def shrink_class(adapter, trace: Trace, cls: str, invariants) -> Trace:
    """The smallest trace (`conformance.runner.shrink`) whose divergence is still of class ``cls``,
    with the same chunked-prefill and prefix-caching settings."""
    from conformance.runner.shrink import shrink

    flags = (trace.config.enable_chunked_prefill, trace.config.enable_prefix_caching)

    def failing(candidate: Trace) -> int | None:
        if (candidate.config.enable_chunked_prefill, candidate.config.enable_prefix_caching) != flags:
            return None
        try:
            got = run_one(adapter, candidate, invariants)
        except Exception:  # noqa: BLE001 - a candidate outside what V1 accepts is no smaller instance
            return None
        if classify(adapter, candidate, got, invariants) != cls:
            return None
        steps = [s for s in (got.result.divergence and got.result.divergence.step, got.state and got.state[0])
                 if s is not None]
        return min(steps) if steps else None

    try:
        return shrink(trace, failing, budget=300, seconds=90)[0]
    except ValueError:
        return trace


def run_path(adapter, path: str, count: int, seed_value: int, first: dict, invariants) -> dict[str, Any]:
    traces = sample_traces(path_strategy(path), count, seed_value)
    by_field: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    steps = agreeing = preempting = in_flight_victims = aborts_in_flight = computed_past_stop = 0
    started = time.monotonic()
    for done, trace in enumerate(traces, 1):
        if done % 100 == 1 and done > 1:  # the traces before this one
            print(f"  {path}: {done - 1}/{len(traces)} traces, {agreeing} agree, {dict(by_class)}", flush=True)
        outcome = run_one(adapter, trace, invariants)
        result = outcome.result
        steps += len(result.records)
        preempting += any(r.output.preempted for r in result.records)
        for before, rec in zip(result.records, result.records[1:], strict=False):
            ran = {s.request_id for s in before.output.scheduled}
            in_flight_victims += sum(1 for p in rec.output.preempted if p.request_id in ran)
            aborts_in_flight += sum(1 for rid in rec.aborted if rid in ran)
            sampled_stop = {s.seq_id for s in before.output.scheduled if s.seq_id in before.stopped}
            computed_past_stop += sum(1 for s in rec.output.scheduled if s.seq_id in sampled_stop)
        for problem in result.problem_ids - {"LOCKSTEP"}:
            violations[problem] += 1
        cls = classify(adapter, trace, outcome, invariants)
        if cls is None:
            agreeing += 1
            continue
        by_field[lockstep_field(outcome)] += 1
        by_class[cls] += 1
        first.setdefault((path, cls), (trace, outcome))
    return {"traces": len(traces), "steps": steps, "traces_with_preemption": preempting,
            "preemptions_of_a_request_with_a_step_in_flight": in_flight_victims,
            "aborts_of_a_request_with_a_step_in_flight": aborts_in_flight,
            "steps_scheduled_past_a_stop": computed_past_stop,
            "agreeing_traces": agreeing, "divergent_by_field": dict(sorted(by_field.items())),
            "by_class": dict(sorted(by_class.items())), "violations": dict(sorted(violations.items())),
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    from conformance.targets import get_target

    parser = campaign_parser(__doc__.splitlines()[0], PATHS, seed=20261201, out="docs/results/async-lockstep.json",
                             traces_dir="docs/traces/async")
    parser.add_argument("--target", default="vllm-v1-async", help="vllm-v1-async (0.33.0) or vllm-v1-async-0.29")
    args = parser.parse_args(argv)
    started = provenance()
    paths = PATHS if args.path == "all" else (args.path,)
    target = get_target(args.target)
    adapter = target.adapter()
    invariants = get_profile("safety").invariants()
    report: dict[str, Any] = {"version": VERSION, "target": f"{args.target} (vllm_v1_async_host.py)",
                              "package": target.version, "reference": "reference_impl.async_scheduler:"
                              "AsyncV1Scheduler(depth=1)", "profile": "safety", "seed": args.seed,
                              "paths": {}, "classes": {}}
    if args.out.exists():  # keep the other paths' results
        old = json.loads(args.out.read_text())
        if old.get("version") == VERSION:
            keep_other_paths(report, old, paths)
    first: dict[tuple[str, str], tuple[Trace, Outcome]] = {}
    for path in paths:
        report["paths"][path] = entry = run_path(adapter, path, args.traces, args.seed, first, invariants)
        print(json.dumps({"path": path, **entry}), flush=True)
    for (path, cls), (trace, outcome) in sorted(first.items()):
        if not args.no_shrink:
            trace = shrink_class(adapter, trace, cls, invariants)
            outcome = run_one(adapter, trace, invariants)
        kind, why = CLASSES.get(cls, ("open", "not yet explained"))
        meta = {"adapter": args.target, "path": path, "class": cls, "kind": kind,
                "message": outcome.describe(), "steps": len(outcome.result.records)}
        keep_class_trace(report, args.traces_dir, path, cls, kind, why, trace, meta, outcome.describe())
    adapter.close()
    write_report(report, args.out, started=started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
