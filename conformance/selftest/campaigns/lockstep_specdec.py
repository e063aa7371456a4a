"""Lockstep with speculative decoding: the V1 references with k > 0 against vLLM 0.33.0's
``Scheduler`` (path ``sync``) and ``AsyncScheduler`` (path ``async``, depth 1), both with an
n-gram ``SpeculativeConfig`` and the host playing the drafter and the rejection sampler.

    python -m conformance.selftest.campaigns.lockstep_specdec [--path sync|async|all] [--traces 1000]
        [--seed 20261202] [--out docs/results/specdec-lockstep.json]
        [--traces-dir docs/traces/specdec] [--reference vllm-compatible|policy]

The reference stands behind V1's front door (`conformance.selftest.campaigns.door`) and, by default, runs in
its vLLM-compatible mode: `V1Scheduler`'s knobs ``drafts_past_max_tokens`` (vLLM does not cap
drafts at max_tokens, scheduler.py:838-857), ``pads_new_decode_drafts`` (a one-token admission
padded to 1 + k with placeholder drafts, scheduler.py:1308-1330) and
``clamps_chunk_at_max_model_len`` (the running-chunk cap at max_model_len counts in-flight drafts
as accepted, scheduler.py:850-857) are on, so the campaign compares vLLM strictly past those
documented deviations of the spec's policies and every remaining divergence is a finding. ``--reference policy`` runs the spec's policies instead and
classifies the two as deviations (the earlier runs' tables).

Traces are the async campaign's three shapes (``plain``, ``chunked``, ``preemption``: prefix
caching drawn on or off, KV pressure on the last), drawn in turn, with k in 1..4 and the draft
decisions of `conformance.generation.specdec` (no empty outcomes: #42722's output is probed apart,
`conformance.targets.specdec_probe`). Every step compares the decisions (tokens and drafts per
request, prefill flag, preemptions, finishes), the state after the step (statuses, computed
tokens, block tables, queues, free blocks in order) and every sequence's token count. A
divergence is classified by counterfactual: the trace is rerun against the reference with one or
more known vLLM behaviours modelled (`BEHAVIOURS`); the first trace of each class is shrunk and saved.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import time
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.async_paths import PATHS as SHAPES
from conformance.generation.async_paths import one_behind_configs
from conformance.generation.specdec import MAX_K, with_drafts
from conformance.generation.v0 import sample_traces
from conformance.generation.v1 import token_traces
from conformance.runner.driver import run_checked
from conformance.selftest.campaigns.campaign_args import (
    campaign_parser,
    keep_class_trace,
    keep_other_paths,
    provenance,
    write_report,
)
from conformance.selftest.campaigns.door import GenerateDoor
from conformance.selftest.campaigns.lockstep_async import compare_tokens, lockstep_field
from conformance.selftest.campaigns.lockstep_v1 import Outcome, compare_state
from conformance.selftest.campaigns.recording import RecordsSnapshots
from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.specdec_scheduler import SpecDecScheduler
from spec.config import SchedulerConfig
from spec.speculative import NO_DECISION
from spec.trace import Trace

PATHS = ("sync", "async")
VERSION = 2  # 2: the reference is behind V1's door and vLLM-compatible by default (reference_mode)
# Seconds one call may take before the runner calls it hung: generous, because on a loaded machine
# a vLLM host's reset can take minutes, and a host declared hung is replaced by a fresh one.
CALL_TIMEOUT = 600

# class -> (kind, explanation with the vLLM 0.33.0 source location; paths relative to site-packages/vllm/)
CLASSES: dict[str, tuple[str, str]] = {
    "in-flight-drafts-clamped-at-max-model-len": (
        "vllm-deviation",
        "Async with drafts: vLLM caps every running chunk at `max_model_len - num_computed_tokens - "
        "num_sampled_tokens_per_step` (v1/core/sched/scheduler.py:850-857, 'This is necessary when using spec "
        "decoding'), and num_computed_tokens counts the in-flight step's drafts as if accepted, so a request whose "
        "in-flight drafts, all accepted, would reach max_model_len gets 0 tokens and is skipped; if they are "
        "rejected it waits a step. For max_tokens vLLM waits only until the in-flight sure tokens reach it "
        "(scheduler.py:800-815, 'so that we can be sure no further steps are needed even if they are all "
        "rejected'), and the async reference applies that rule to both limits (AsyncV1Scheduler."
        "_in_flight_reaches_limit): it schedules the token a rejection would still need. Latency, not safety: "
        "the delivered streams agree. Knob: V1Scheduler.clamps_chunk_at_max_model_len.",
    ),
    "drafts-past-max-tokens": (
        "vllm-deviation",
        "vLLM does not cap a running request's drafts at max_tokens (scheduler.py:838-857 caps the chunk at the "
        "budget, the threshold and max_model_len only); accepted tokens past max_tokens are trimmed by check_stop "
        "(scheduler.py:2744-2770). The reference caps them (SPD-004, a policy): same stream, fewer wasted slots.",
    ),
    "padded-admission-cut-by-threshold": (
        "vllm-defect",
        "EngineCore dies on `assert num_new_tokens == 1 + self.num_spec_tokens` (v1/core/sched/scheduler.py:1579): "
        "the waiting loop pads a one-token admission to 1 + k tokens (scheduler.py:1306-1330) and then caps it at "
        "long_prefill_token_threshold (scheduler.py:1332-1333) when the threshold is below 1 + k, which the config "
        "accepts; the Mamba branch drops the padding when alignment clips it (scheduler.py:1355-1370), this cap does "
        "not. Sync and async alike.",
    ),
    "pads-new-decode-drafts": (
        "vllm-deviation",
        "A request admitted from waiting with one token left (a prefix hit on all but its last token, or a one-token "
        "prompt while running requests were scheduled) is padded to 1 + k tokens with -1 placeholder drafts for "
        "full CUDA graphs (scheduler.py:1306-1330, 1578-1582); they were never proposed and are always rejected. "
        "The reference schedules the one token (SPD-002 holds either way).",
    ),
}


class Clamp:
    """vLLM's clamp of every running chunk at ``max_model_len - num_computed - 1``, in-flight drafts
    counted as computed (`V1Scheduler.clamps_chunk_at_max_model_len`, scheduler.py:850-857)."""

    clamps_chunk_at_max_model_len = True


class UncappedDrafts:
    """vLLM's drafts, not capped at ``max_tokens`` (`V1Scheduler.drafts_past_max_tokens`)."""

    drafts_past_max_tokens = True


class PadsNewDecode:
    """vLLM's padding of a one-token admission to 1 + k tokens with placeholder drafts that are
    never accepted (`V1Scheduler.pads_new_decode_drafts`, scheduler.py:1308-1330)."""

    pads_new_decode_drafts = True


class RecordingSpec(GenerateDoor, RecordsSnapshots, SpecDecScheduler):
    """The synchronous reference with k > 0 behind V1's front door (`conformance.selftest.campaigns.door`),
    in its vLLM-compatible mode (both knobs of `V1Scheduler` on: drafts past max_tokens, padded new
    decodes), keeping its snapshot after every step."""

    drafts_past_max_tokens = True
    pads_new_decode_drafts = True
    clamps_chunk_at_max_model_len = True


class RecordingAsyncSpec(GenerateDoor, RecordsSnapshots, AsyncV1Scheduler):
    """The async reference at depth 1 with k > 0 (the host runs vLLM at depth 1), behind V1's
    front door, in its vLLM-compatible mode."""

    drafts_past_max_tokens = True
    pads_new_decode_drafts = True
    clamps_chunk_at_max_model_len = True

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(dataclasses.replace(config, pipeline_depth=1))


class PolicySpec(RecordingSpec):
    """The synchronous reference with the spec's policies (SPD-004's draft cap, no padding)."""

    drafts_past_max_tokens = False
    pads_new_decode_drafts = False
    clamps_chunk_at_max_model_len = False


class PolicyAsyncSpec(RecordingAsyncSpec):
    """The async reference with the spec's policies."""

    drafts_past_max_tokens = False
    pads_new_decode_drafts = False
    clamps_chunk_at_max_model_len = False


# the knob of `V1Scheduler` each behaviour turns on
KNOBS = {"in-flight-drafts-clamped-at-max-model-len": "clamps_chunk_at_max_model_len",
         "drafts-past-max-tokens": "drafts_past_max_tokens", "pads-new-decode-drafts": "pads_new_decode_drafts"}
BEHAVIOURS = (("in-flight-drafts-clamped-at-max-model-len", Clamp), ("drafts-past-max-tokens", UncappedDrafts),
              ("pads-new-decode-drafts", PadsNewDecode))


def models(base: type) -> list[tuple[str, type]]:
    """Every non-empty combination of the known behaviours that ``base`` does not already have on
    (by its knobs), singles first: a class name is the behaviours joined by ``+``."""
    missing = [(name, model) for name, model in BEHAVIOURS if not getattr(base, KNOBS.get(name, ""), False)]
    found = []
    for size in range(1, len(missing) + 1):
        for combo in itertools.combinations(missing, size):
            name = "+".join(n for n, _ in combo)
            found.append((name, type(f"Model_{len(found)}", (*(m for _, m in combo), base), {})))
    return found


@st.composite
def path_traces(draw: st.DrawFn, path: str) -> Trace:
    shape = draw(st.sampled_from(SHAPES))
    config = draw(one_behind_configs(shape))
    config = dataclasses.replace(config, pipeline_depth=1 if path == "async" else 0,
                                 num_speculative_tokens=draw(st.integers(1, MAX_K)))
    trace = draw(token_traces("v1", config=config, max_requests=8 if shape == "preemption" else 6))
    return draw(with_drafts(trace, k=config.num_speculative_tokens))


def adapter_for(path: str):  # type: ignore[no-untyped-def]
    from conformance.targets import get_target

    adapter = get_target("vllm-v1" if path == "sync" else "vllm-v1-async").adapter()
    adapter.timeout = adapter.reset_timeout = CALL_TIMEOUT  # the host's own wait for an answer, too
    return adapter


def base_of(path: str, policy: bool = False) -> type:
    """The campaign's reference for a path: vLLM-compatible (the default), or with the spec's
    policies (``--reference policy``: the deviations are then classified, not compared past)."""
    if policy:
        return PolicySpec if path == "sync" else PolicyAsyncSpec
    return RecordingSpec if path == "sync" else RecordingAsyncSpec


def run_one(adapter, trace: Trace, invariants, reference: type) -> Outcome:  # type: ignore[no-untyped-def]
    holder: list[Any] = []

    def factory(config: SchedulerConfig):  # type: ignore[no-untyped-def]
        holder.append(reference(config))
        return holder[-1]

    result = run_checked(adapter, trace, invariants, timeout=CALL_TIMEOUT, lockstep=True, reference_factory=factory,
                         stop_at_first=False)
    state = compare_state(result, holder[0]) if holder else None
    tokens = compare_tokens(result, holder[0]) if holder else None
    if tokens is not None and (state is None or tokens[0] < state[0]):
        state = tokens
    return Outcome(result, state)


def classify(adapter, path: str, trace: Trace, outcome: Outcome, invariants,  # type: ignore[no-untyped-def]
             policy: bool = False) -> str | None:
    fault = outcome.result.fault
    if fault is not None and "scheduler.py:1579" in str(fault):
        return "padded-admission-cut-by-threshold"
    if outcome.result.divergence is None and outcome.state is None:
        return None if fault is None else "fault"
    for cls, model in models(base_of(path, policy)):
        again = run_one(adapter, trace, invariants, model)
        if again.result.fault is not None and fault is None:
            # The engine did not fault on this trace in the run being classified: a fault in the
            # rerun is the host's (a restart or a timeout on a loaded machine), not the model's
            # verdict. Said aloud and tried once more, so a verdict never depends on the load.
            print(f"  rerun under {cls} faulted ({str(again.result.fault)[:120]}); once more", flush=True)
            again = run_one(adapter, trace, invariants, model)
        if again.result.divergence is None and again.state is None and again.result.fault is None:
            return cls
    return "unclassified"


def shrink_class(adapter, path: str, trace: Trace, cls: str, invariants,  # type: ignore[no-untyped-def]
                 policy: bool = False) -> Trace:
    from conformance.runner.shrink import shrink

    def failing(candidate: Trace) -> int | None:
        if candidate.config.num_speculative_tokens != trace.config.num_speculative_tokens:
            return None
        try:
            got = run_one(adapter, candidate, invariants, base_of(path, policy))
        except Exception:  # noqa: BLE001 - a candidate vLLM refuses is no smaller instance
            return None
        if classify(adapter, path, candidate, got, invariants, policy) != cls:
            return None
        steps = [s for s in (got.result.divergence and got.result.divergence.step, got.state and got.state[0],
                             got.result.fault_step if got.result.fault else None) if s is not None]
        return min(steps) if steps else None

    try:
        return shrink(trace, failing, budget=200, seconds=90)[0]
    except ValueError:
        return trace


def run_path(path: str, count: int, seed_value: int, first: dict, invariants,  # type: ignore[no-untyped-def]
             policy: bool = False) -> dict[str, Any]:
    adapter = adapter_for(path)
    traces = sample_traces(path_traces(path), count, seed_value)
    by_field: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    steps = agreeing = drafted_steps = drafts = stops_in_runs = 0
    started = time.monotonic()
    for done, trace in enumerate(traces, 1):
        outcome = run_one(adapter, trace, invariants, base_of(path, policy))
        result = outcome.result
        steps += len(result.records)
        for rec in result.records:
            scheduled = [s for s in rec.output.scheduled if s.num_drafts]
            drafted_steps += bool(scheduled)
            drafts += sum(s.num_drafts for s in scheduled)
            stops_in_runs += sum(1 for s in scheduled if s.seq_id in rec.stopped
                                 and rec.drafts.get(s.seq_id, NO_DECISION).stop_at is not None)
        for problem in result.problem_ids - {"LOCKSTEP"}:
            violations[problem] += 1
        cls = classify(adapter, path, trace, outcome, invariants, policy)
        if cls is None:
            agreeing += 1
        else:
            by_field[lockstep_field(outcome)] += 1
            by_class[cls] += 1
            first.setdefault((path, cls), (trace, outcome))
        if done % 25 == 0:
            print(f"  {path}: {done}/{len(traces)} traces, {agreeing} agree, {dict(by_class)}", flush=True)
    adapter.close()
    return {"traces": len(traces), "steps": steps, "steps_with_drafts": drafted_steps, "drafts_scheduled": drafts,
            "stops_inside_a_verified_step": stops_in_runs, "agreeing_traces": agreeing,
            "divergent_by_field": dict(sorted(by_field.items())), "by_class": dict(sorted(by_class.items())),
            "violations": dict(sorted(violations.items())), "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser(__doc__.splitlines()[0], PATHS, seed=20261202, out="docs/results/specdec-lockstep.json",
                             traces_dir="docs/traces/specdec")
    parser.add_argument("--reference", choices=("vllm-compatible", "policy"), default="vllm-compatible",
                        help="vllm-compatible: compare past vLLM's documented draft behaviours (the default); "
                             "policy: the spec's policies, those behaviours classified")
    args = parser.parse_args(argv)
    started = provenance()
    policy = args.reference == "policy"
    paths = PATHS if args.path == "all" else (args.path,)
    invariants = get_profile("safety").invariants()
    report: dict[str, Any] = {"version": VERSION, "targets": {"sync": "vllm-v1", "async": "vllm-v1-async"},
                              "package": "vllm==0.33.0", "speculative_config": "ngram, k = num_speculative_tokens",
                              "references": {"sync": "reference_impl.specdec_scheduler:SpecDecScheduler",
                                             "async": "reference_impl.async_scheduler:AsyncV1Scheduler(depth=1)"},
                              "reference_mode": args.reference, "reference_knobs": {
                                  knob: getattr(base_of("sync", policy), knob) for knob in KNOBS.values()},
                              "door": "conformance.selftest.campaigns.door:GenerateDoor",
                              "profile": "safety", "seed": args.seed, "paths": {}, "classes": {}}
    if args.out.exists():
        old = json.loads(args.out.read_text())
        if old.get("version") == VERSION and old.get("reference_mode") == args.reference:
            keep_other_paths(report, old, paths)
    first: dict[tuple[str, str], tuple[Trace, Outcome]] = {}
    for path in paths:
        report["paths"][path] = entry = run_path(path, args.traces, args.seed, first, invariants, policy)
        print(json.dumps({"path": path, **entry}), flush=True)
    for (path, cls), (trace, outcome) in sorted(first.items()):
        adapter = adapter_for(path)
        if not args.no_shrink:
            trace = shrink_class(adapter, path, trace, cls, invariants, policy)
            outcome = run_one(adapter, trace, invariants, base_of(path, policy))
        adapter.close()
        kinds = {CLASSES.get(part, ("open", ""))[0] for part in cls.split("+")}
        kind = kinds.pop() if len(kinds) == 1 else "open"
        why = " / ".join(CLASSES.get(part, ("open", "not yet explained"))[1] for part in cls.split("+"))
        meta = {"adapter": report["targets"][path], "reference": args.reference, "path": path, "class": cls, "kind": kind,
                "message": outcome.describe(), "steps": len(outcome.result.records)}
        keep_class_trace(report, args.traces_dir, path, cls, kind, why, trace, meta, outcome.describe())
    write_report(report, args.out, started=started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
