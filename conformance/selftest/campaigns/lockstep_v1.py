"""Strict lockstep: the reference's ``vllm-v1`` flow against vLLM 0.33.0's V1 scheduler.

    python -m conformance.selftest.campaigns.lockstep_v1 [--path default|chunked|prefix|chunked+prefix|all]
        [--traces 1000] [--seed 20261130] [--out docs/results/lockstep-vllm-v1.json]
        [--traces-dir docs/traces/lockstep-v1] [--no-shrink] [--target vllm-v1|aphrodite]

Runs seeded traces of one of V1's paths through the installed ``vllm-v1`` target with the
``vllm-v1`` profile's reference beside it:

* ``default``: `conformance.targets._v1_strategy` (recompute only, no chunked prefill, no prefix
  caching, V0-style prompts);
* ``chunked``, ``prefix``, ``chunked+prefix``: `path_strategy` (the token traces of
  `conformance.generation.v1`, prompts drawn from a few shared stems, with the path's features on);
* ``chunked+partial``: chunked prefill with ``max_num_partial_prefills`` 1 or 2, which V1 does not
  have (a spec decision, shown here).

Every step compares the decisions (`conformance.runner.lockstep.compare`: scheduled tokens per request
with the prefill flag, preemptions, ignored and finished requests) and then the state after the
step (`compare_state`: each unfinished request's status, computed tokens and block table, the
running queue in order, the waiting queue, the free block count and the free queue in order).
Block ids are comparable: the host reports V1's ids minus one (block 0 is V1's null block) and
the reference's pool frees and evicts in V1's order. The reference stands behind V1's front door
(`conformance.selftest.campaigns.door`): a generate prompt of exactly max_model_len tokens is refused on
arrival on both sides, so such a trace is compared to its end. A trace runs to its first divergence, which
is classified (`classify`: rerun against the reference with an engine behaviour modelled, see
`PARTS`); the first trace of each class is shrunk for that class and saved under
``--traces-dir``. The results file keeps one entry per path (version 2). Needs
``kvsched targets install vllm-v1``.
"""

from __future__ import annotations

import collections
import itertools
import json
import time
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.generation.v1 import token_traces
from conformance.generation.v1_paths import path_configs
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import TraceResult, run_checked
from conformance.selftest.campaigns.campaign_args import (
    campaign_parser,
    keep_class_trace,
    keep_other_paths,
    provenance,
    write_report,
)
from conformance.selftest.campaigns.door import GenerateDoor
from conformance.selftest.campaigns.recording import RecordsSnapshots
from conformance.targets import _v1_strategy, get_target
from reference_impl.v1_scheduler import EngineWatermarkV1
from spec.config import SchedulerConfig
from spec.observation import Snapshot
from spec.trace import Trace

V1_TARGETS = ("vllm-v1", "aphrodite")  # targets whose scheduler is vLLM's V1 Scheduler
PATHS = ("default", "chunked", "prefix", "chunked+prefix", "chunked+partial")

# class -> (kind, explanation with the vLLM source location); filled from what the runs found.
CLASSES: dict[str, tuple[str, str]] = {
    "chunk-clamped-below-max-model-len": (
        "vllm-defect (pooling requests only)",
        "V1 clamps every running request's chunk at `max_model_len - num_computed_tokens - 1` "
        "(vllm/v1/core/sched/scheduler.py: Scheduler.schedule, running loop, 'Make sure the input position "
        "does not exceed the max model len'; `num_sampled_tokens_per_step` is 1 for every non-diffusion runner). "
        "A prompt of exactly max_model_len tokens whose prefill continues as a running chunk stops one token short "
        "and never finishes. A generate request never meets it: V1's input processor refuses a generate prompt of "
        "exactly max_model_len tokens (vllm/v1/engine/input_processor.py: InputProcessor._validate_prompt_len), and "
        "since issue 21 the host refuses it at the door as well, and the campaign's reference does too "
        "(conformance/selftest/campaigns/door.py), so on these generate-only traces the class cannot occur. It is real for pooling requests, which produce no "
        "token and may fill max_model_len: the embedding hangs of vllm-project/vllm #47971, #24704 and #55427, "
        "fixed by #48039 (no sampled-token slot for pooling runners).",
    ),
    "threshold-caps-a-lone-request": (
        "aphrodite-deviation",
        "Aphrodite 0.24.1 caps every chunk at long_prefill_token_threshold, also the chunk of a request that is "
        "alone in the scheduler (aphrodite/v1/core/sched/scheduler.py: Scheduler.schedule, 566-567 for running and "
        "923-925 for waiting requests). vLLM 0.33.0, which the reference follows, skips the cap when there is no "
        "other request to starve (vllm/v1/core/sched/scheduler.py:754-770; vllm/config/scheduler.py, "
        "long_prefill_token_threshold); Aphrodite forked before that change. The lone request takes more steps.",
    ),
    "self-preemption-ends-the-running-scan": (
        "aphrodite-deviation",
        "Under the priority policy, when the running request that needs blocks is itself the lowest-priority one, "
        "it preempts itself; Aphrodite 0.24.1 then stops scheduling running requests for the step "
        "(aphrodite/v1/core/sched/scheduler.py:682-684, `if new_blocks is None: break`), while vLLM 0.33.0 goes on "
        "to the higher-priority requests after it, which may still fit now that it freed its blocks "
        "(vllm/v1/core/sched/scheduler.py:983-995). Aphrodite forked before that fix: those requests wait a step "
        "(and with nothing else to run, the step schedules nothing).",
    ),
    "partial-prefills-not-applied": (
        "spec-decision",
        "vLLM 0.33.0's scheduler has no max_num_partial_prefills (vllm/config/scheduler.py: SchedulerConfig has no "
        "such field; vllm/v1/core/sched/scheduler.py: Scheduler.schedule admits a waiting request whatever the "
        "number of requests mid-prefill); the host accepts the setting and ignores it. The reference honours it when "
        "set (0, V1's behaviour, is the default), so it holds back an admission that V1 makes.",
    ),
}


def path_strategy(path: str, optional_calls: bool = False) -> st.SearchStrategy:
    """The traces of one path. ``optional_calls``: with batched aborts and, on the prefix paths,
    ``reset_prefix_cache`` calls (a host that announces them: vllm-v1; Aphrodite's does not)."""
    if path == "default":
        return _v1_strategy()
    return path_configs(path, watermark=True).flatmap(
        lambda config: token_traces("v1", config=config, batch_aborts=optional_calls, resets=optional_calls))


# ------------------------------------------------------------------------------ state comparison
class RecordingV1(GenerateDoor, RecordsSnapshots, EngineWatermarkV1):
    """The reference behind V1's front door (`conformance.selftest.campaigns.door`: a generate prompt of
    exactly max_model_len tokens is refused on arrival, as the host refuses it), with vLLM V1's
    watermark rule (`EngineWatermarkV1`: only admissions made while a request runs keep it free),
    keeping its snapshot after every step's update."""


class ClampedV1(RecordingV1):
    """The reference with vLLM V1's extra cap on a running request's chunk: ``max_model_len -
    num_computed - 1`` (vllm/v1/core/sched/scheduler.py: Scheduler.schedule, running loop), and
    V1's skip of a running request that gets 0 tokens. Used only to classify divergences."""

    def _running_chunk(self, tracked, budget: int, threshold: int) -> int:
        tokens = super()._running_chunk(tracked, budget, threshold)
        return max(min(tokens, self.config.max_model_len - tracked.num_computed - 1), 0)


class NoPartialLimitV1(RecordingV1):
    """The reference without ``max_num_partial_prefills``, as vLLM V1 (which has no such limit)."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(SchedulerConfig(**{**config.to_dict(), "max_num_partial_prefills": 0}))


class AlwaysCappedV1(RecordingV1):
    """The reference capping every chunk at ``long_prefill_token_threshold``, also a request's that
    is alone (Aphrodite 0.24.1: aphrodite/v1/core/sched/scheduler.py:566-567 for running requests,
    923-925 for waiting ones; vLLM 0.33.0 skips the cap for a lone request)."""

    def _long_prefill_threshold(self) -> int:
        return self.config.long_prefill_token_threshold


class StopsAtSelfPreemptionV1(RecordingV1):
    """The reference ending the running scan when, under the priority policy, a request preempts
    itself (Aphrodite 0.24.1: aphrodite/v1/core/sched/scheduler.py:682-684 `break`; vLLM 0.33.0
    goes on to the next running request, scheduler.py:983-995)."""

    scan_past_self_preemption = False


# the engine behaviours a divergence is tried against: each a reference variant overriding one
# hook; `classify` tries every combination of the ones a trace can meet, smallest first
PARTS: tuple[tuple[str, type[RecordingV1]], ...] = (
    ("chunk-clamped-below-max-model-len", ClampedV1),
    ("partial-prefills-not-applied", NoPartialLimitV1),
    ("threshold-caps-a-lone-request", AlwaysCappedV1),
    ("self-preemption-ends-the-running-scan", StopsAtSelfPreemptionV1),
)


def model_of(parts: tuple[str, ...]) -> type[RecordingV1]:
    """One reference class with every named behaviour modelled."""
    mixins = tuple(model for name, model in PARTS if name in parts)
    return mixins[0] if len(mixins) == 1 else type("+".join(parts), mixins, {})


def state_of(snap: Snapshot, priority: bool) -> dict[str, Any]:
    live = {rid for rid, s in snap.statuses.items() if not s.is_finished}
    seqs = {v.request_id: v for v in snap.seqs.values() if v.request_id in live}
    return {
        "statuses": {rid: snap.statuses[rid].value for rid in sorted(live)},
        "computed": {rid: seqs[rid].num_computed for rid in sorted(seqs)},
        "blocks": {rid: tuple(seqs[rid].blocks or ()) for rid in sorted(seqs)},
        "running": tuple(snap.running or ()),
        # V1's priority waiting queue is a heap: its iteration order is not its policy order
        "waiting": tuple(sorted(snap.waiting or ())) if priority else tuple(snap.waiting or ()),
        "gpu_free": snap.gpu_free,
        "gpu_free_ids": tuple(snap.gpu_free_ids or ()),  # the free queue, front first: the eviction order
    }


def compare_state(result: TraceResult, reference: RecordingV1) -> tuple[int, str, Any, Any] | None:
    """The first step whose state after the step differs: (step, field, reference, target)."""
    priority = result.trace.config.policy == "priority"
    for record, ref in zip(result.records, reference.after, strict=False):
        want, got = state_of(ref, priority), state_of(record.after, priority)
        for key, value in want.items():
            if got[key] != value:
                if isinstance(value, dict):
                    diff = sorted(k for k in set(value) | set(got[key]) if value.get(k) != got[key].get(k))
                    return record.step, f"{key}", {k: value.get(k) for k in diff}, {k: got[key].get(k) for k in diff}
                return record.step, key, value, got[key]
    return None


@dataclass
class Outcome:
    result: TraceResult
    state: tuple[int, str, Any, Any] | None

    @property
    def divergence_step(self) -> int | None:
        steps = [s for s in (self.result.failure_step, self.state and self.state[0]) if s is not None]
        return min(steps) if steps else None

    @property
    def field(self) -> str | None:
        if self.divergence_step is None:
            return None
        if self.state is not None and self.state[0] == self.divergence_step and (
                self.result.divergence is None or self.result.divergence.step > self.state[0]):
            return f"state.{self.state[1]}"
        if self.result.divergence is not None and self.result.divergence.step == self.divergence_step:
            return self.result.divergence.field
        return "+".join(sorted(self.result.problem_ids - {"LOCKSTEP"})) or "fault"

    def describe(self) -> str:
        if self.field and self.field.startswith("state.") and self.state is not None:
            return f"step {self.state[0]}: {self.state[1]} differs\n  reference: {self.state[2]}\n  target:    {self.state[3]}"
        if self.result.divergence is not None:
            return self.result.divergence.describe()
        if self.result.fault is not None:
            return str(self.result.fault)
        return "; ".join(str(v) for v in self.result.violations[:2])


def run_one(adapter, trace: Trace, invariants, reference: type = RecordingV1, timeout: float = 60,
            stop_at_first: bool = True) -> Outcome:
    """One lockstep run: decisions by the driver against ``reference`` (a scheduler that keeps its
    snapshot after every step, `conformance.selftest.campaigns.recording`), then the state after every step.
    ``stop_at_first=False`` runs on past an invariant violation (a divergence or a fault still ends
    the run): the mutation benchmark's baselines expect what the unmutated engine finds, where it
    finds it, and look for anything else."""
    holder: list = []

    def factory(config: SchedulerConfig):
        holder.append(reference(config))
        return holder[-1]

    result = run_checked(adapter, trace, invariants, timeout=timeout, lockstep=True, reference_factory=factory,
                         stop_at_first=stop_at_first)
    state = compare_state(result, holder[0]) if holder else None
    return Outcome(result, state)


def classify(adapter, trace: Trace, outcome: Outcome) -> str | None:
    """The divergence's class (a key of `CLASSES`), ``unclassified`` when none fits, or None.

    A class is confirmed by a counterfactual: the trace is rerun against the reference with the
    engine's behaviour modelled (`ClampedV1`); if then every decision and every state agree, the
    divergence is that behaviour. (The target's own invariant violations, such as the stall's
    LIV-001, still show; they are not divergences.)"""
    if outcome.divergence_step is None:
        return None
    if outcome.result.divergence is None and outcome.state is None:
        return "violation-only"
    config = trace.config
    clamp = config.enable_chunked_prefill and any(a.request.prompt_len == config.max_model_len for a in trace.arrivals)
    possible = {"chunk-clamped-below-max-model-len": clamp,
                "partial-prefills-not-applied": bool(config.max_num_partial_prefills),
                "threshold-caps-a-lone-request": bool(config.enable_chunked_prefill and config.long_prefill_token_threshold),
                "self-preemption-ends-the-running-scan": config.policy == "priority"}
    names = [name for name, _ in PARTS if possible[name]]
    for size in range(1, len(names) + 1):
        for parts in itertools.combinations(names, size):
            again = run_one(adapter, trace, get_profile("safety").invariants(), reference=model_of(parts))
            if again.result.fault is not None:
                # the engine did not fault on this trace in the run being classified: a fault in the
                # rerun is the host's (a restart past the timeout on a loaded machine), so once more
                again = run_one(adapter, trace, get_profile("safety").invariants(), reference=model_of(parts))
            if again.result.divergence is None and again.state is None and again.result.fault is None:
                return "+".join(parts)
    return "unclassified"


def run_path(adapter, profile, path: str, count: int, seed_value: int, first: dict, invariants,
             optional_calls: bool = False) -> dict[str, Any]:
    traces = sample_traces(path_strategy(path, optional_calls), count, seed_value)
    by_field: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    steps = agreeing = 0
    started = time.monotonic()
    for done, trace in enumerate(traces, 1):
        if done % 100 == 1 and done > 1:  # the traces before this one
            print(f"  {path}: {done - 1}/{len(traces)} traces, {agreeing} agree, {dict(by_class)}", flush=True)
        outcome = run_one(adapter, trace, invariants)
        result = outcome.result
        steps += len(result.records)
        for problem in result.problem_ids - {"LOCKSTEP"}:
            violations[problem] += 1
        cls = classify(adapter, trace, outcome)
        if cls is None:
            agreeing += 1
            continue
        by_field[outcome.field or "?"] += 1
        by_class[cls] += 1
        first.setdefault((path, cls), (trace, outcome))
    return {"traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
            "divergent_by_field": dict(sorted(by_field.items())), "by_class": dict(sorted(by_class.items())),
            "violations": dict(sorted(violations.items())), "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser(__doc__.splitlines()[0], PATHS, seed=20261130, out="docs/results/lockstep-vllm-v1.json",
                             traces_dir="docs/traces/lockstep-v1")
    # Aphrodite's V1 scheduler is vLLM's under another package name: the same reference, the same paths.
    parser.add_argument("--target", choices=V1_TARGETS, default="vllm-v1")
    args = parser.parse_args(argv)
    started = provenance()
    paths = PATHS if args.path == "all" else (args.path,)
    adapter, profile = load_adapter(args.target), get_profile("vllm-v1")
    invariants = profile.invariants()
    report: dict[str, Any] = {"version": 2, "target": args.target, "package": get_target(args.target).version,
                              "reference": profile.reference, "seed": args.seed, "paths": {}, "classes": {}}
    if args.out.exists():  # keep the other paths' results
        old = json.loads(args.out.read_text())
        if old.get("version") == 2:
            keep_other_paths(report, old, paths)
        elif old.get("version") == 1:  # the default path's first run
            report["paths"]["default"] = {k: old[k] for k in ("traces", "steps", "agreeing_traces",
                                                              "divergent_by_field", "violations")}
    first: dict[tuple[str, str], tuple[Trace, Outcome]] = {}
    for path in paths:
        report["paths"][path] = entry = run_path(adapter, profile, path, args.traces, args.seed, first, invariants,
                                                 optional_calls=args.target == "vllm-v1")
        print(json.dumps({"path": path, **entry}), flush=True)
    for (path, cls), (trace, _outcome) in sorted(first.items()):
        small = trace
        if not args.no_shrink:
            from conformance.runner.shrink import shrink

            flags = (trace.config.enable_chunked_prefill, trace.config.enable_prefix_caching)

            def failing(candidate: Trace, cls: str = cls, flags: tuple[bool, bool] = flags) -> int | None:
                if (candidate.config.enable_chunked_prefill, candidate.config.enable_prefix_caching) != flags:
                    return None
                try:
                    got = run_one(adapter, candidate, invariants)
                except Exception:  # noqa: BLE001 - a candidate outside what V1 accepts is no smaller instance
                    return None
                return got.divergence_step if classify(adapter, candidate, got) == cls else None

            try:
                small, _ = shrink(trace, failing, budget=300, seconds=90)
            except ValueError:
                small = trace
        final = run_one(adapter, small, invariants)
        if small is not trace and classify(adapter, small, final) != cls:
            # the shrinker cut the trace to where its class cannot be told apart (a cut that ends
            # before the later divergence that made it unclassified): keep the trace as drawn
            small, final = trace, run_one(adapter, trace, invariants)
        parts = [CLASSES.get(part, ("open", "not yet explained")) for part in cls.split("+")]
        kind = "+".join(dict.fromkeys(k for k, _ in parts))
        why = parts[0][1] if len(parts) == 1 else "both classes met in one trace: " + ", ".join(cls.split("+"))
        meta = {"adapter": args.target, "profile": "vllm-v1", "path": path, "class": cls, "kind": kind,
                "message": final.describe(), "steps": len(final.result.records)}
        keep_class_trace(report, args.traces_dir, path, cls, kind, why, small, meta, final.describe(),
                         name=f"{path.replace('+', '-')}-{cls}.json")
    write_report(report, args.out, started=started)
    return 0 if all(report["paths"][p]["agreeing_traces"] == report["paths"][p]["traces"] for p in paths) else 1


if __name__ == "__main__":
    raise SystemExit(main())
