"""Strict lockstep: Vidur's vLLM replica scheduler against the V0 reference (the ``vllm-v0`` profile).

    python -m conformance.selftest.campaigns.lockstep_vidur [--path spec|full|all] [--traces 1000]
        [--seed 20261201] [--out docs/results/lockstep-vidur-vllm.json]
        [--traces-dir docs/traces/lockstep-vidur] [--no-shrink]

Vidur (vidur==0.0.26) is a simulator for capacity planning; its ``VLLMReplicaScheduler``
(vidur/scheduler/replica_scheduler/vllm_replica_scheduler.py) stands for vLLM's scheduler in
those plans. A simulated scheduler that decides differently from the engine it models gives
wrong plans, so here every divergence is a finding. Two trace spaces (the traces of the
``vidur-vllm`` target: V0's default path, recompute, FCFS, watermark 0.01, no stops or aborts):

* **spec**: every request fits (prompt + max_tokens <= max_model_len, the cache holds one
  max_model_len sequence), the inputs Vidur's own request generators produce (they draw lengths
  at most ``max_tokens``);
* **full**: everything the target takes, over-long prompts and requests included.

Each trace runs with the ``vllm-v0`` profile's invariants (on the observations Vidur has) and the
V0 reference in lockstep, to its first divergence, violation or fault, which `classify` names
by its cause in Vidur's source (`CLASSES`). The first trace of each class is shrunk for that
class and saved under ``--traces-dir``. Needs ``kvsched targets install vidur-vllm``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.runner.driver import TraceResult, run_checked
from conformance.selftest.campaigns.campaign_args import campaign_parser, keep_class_trace, write_report
from conformance.targets import engine_configs, engine_traces, get_target
from spec.trace import Trace

SPACES = ("spec", "full")
VIDUR = "vidur/scheduler/replica_scheduler/vllm_replica_scheduler.py"

# class -> (kind, explanation with Vidur's source location)
CLASSES: dict[str, tuple[str, str]] = {
    "no-prompt-limit": (
        "vidur-deviation",
        f"vLLM ignores a prompt longer than its prompt limit (min of max_model_len and the token budget; "
        f"vllm/core/scheduler.py: Scheduler._schedule_prefills, FINISHED_IGNORED); `{VIDUR}: "
        "VLLMReplicaScheduler._get_next_batch` has no such check and admits it. Vidur's request generators "
        "never draw a request over `max_tokens`, so plans made with them do not meet it.",
    ),
    "never-fits-not-ignored": (
        "vidur-defect",
        f"vLLM ignores a prompt that needs more blocks than the pool can ever hold above the watermark "
        f"(SelfAttnBlockSpaceManager.can_allocate -> AllocStatus.NEVER); `{VIDUR}: _can_allocate_request` answers "
        "only 'not now', so the request waits at the head of the queue for ever and blocks every request behind it.",
    ),
    "no-max-model-len-cap": (
        "vidur-deviation",
        "vLLM finishes a sequence as FINISHED_LENGTH_CAPPED when it reaches max_model_len "
        "(vllm/engine/output_processor/stop_checker.py: StopChecker.maybe_stop_sequence); a Vidur request "
        "runs exactly its num_decode_tokens (vidur/entities/request.py: Request.on_batch_end), whatever its length.",
    ),
    "restart-assertion": (
        "vidur-defect",
        "A restarted (recompute-preempted) request crashes the simulator: `vidur/entities/request.py: "
        "Request.restart` (328-344) resets `_num_processed_tokens` but not `_num_stage_processed_tokens` or "
        "`_is_prefill_stage_complete`, so the re-prefill's stage tokens add to the old ones and "
        "`Request.on_batch_stage_end` fails `assert self._num_stage_processed_tokens <= self.total_tokens` "
        "(request.py:300).",
    ),
}


@st.composite
def _fitting(draw: st.DrawFn) -> Trace:
    """A vidur-vllm trace whose every request fits max_model_len (the spec space)."""
    config = draw(engine_configs(watermark=0.01, cpu_blocks=False, modes=("recompute",), policies=("fcfs",),
                                 cache_holds_model_len=True).filter(lambda c: c.max_model_len >= 2))
    trace = draw(engine_traces(st.just(config), max_n=1, allow_aborts=False))
    mml = config.max_model_len
    arrivals = []
    for a in trace.arrivals:
        r = a.request
        prompt = min(r.prompt_len, mml - 1)
        arrivals.append(dataclasses.replace(a, request=dataclasses.replace(
            r, prompt_len=prompt, max_tokens=min(r.max_tokens, mml - prompt))))
    return dataclasses.replace(trace, arrivals=tuple(arrivals), stops=())


def space_strategy(space: str) -> st.SearchStrategy:
    return _fitting() if space == "spec" else get_target("vidur-vllm").strategy()


def classify(result: TraceResult) -> str | None:
    """The class of a trace's first problem, or None when it agreed to the end."""
    if not result.failed:
        return None
    if result.fault is not None:
        return "restart-assertion" if "request.py:300" in result.fault.message else f"fault-{result.fault.kind}"
    ids = {v.invariant_id for v in result.violations}
    if ids & {"LEN-002", "LEN-003"}:
        return "no-prompt-limit"
    if "LEN-001" in ids:
        return "no-max-model-len-cap"
    d = result.divergence
    if d is None:
        return "violation-" + "+".join(sorted(ids))
    why = " ".join(d.reasons)
    if "exceeds the prompt limit" in why:  # the reference ignored it at the head; Vidur admits or waits on it
        return "no-prompt-limit"
    if "can ever be free" in why:
        return "never-fits-not-ignored"
    if d.field == "finished" and any(s == "FINISHED_LENGTH_CAPPED" for _, s in d.reference):
        return "no-max-model-len-cap"
    return f"open-{d.field}"


def failing_step(result: TraceResult) -> int:
    """The step of a failed trace's first problem (the shrinker cuts the trace after it)."""
    if result.divergence is not None:
        return result.divergence.step
    if result.fault is not None:
        return result.fault_step or 0
    steps = [v.step for v in result.violations if v.step is not None]
    return min(steps) if steps else max(len(result.records) - 1, 0)


def without_asserts(target):
    """The target's host under ``python -O``: Vidur's asserts off, so a trace goes on past the
    restart assertion and shows what the scheduler decides next (only the assertion is skipped:
    the counters it checks are not read by any scheduling decision)."""
    from conformance.wire import WireAdapter

    command = target.command()
    adapter = WireAdapter(target.name, [command[0], "-O", *command[1:]], profiles=target.profiles,
                          env={**target.env, "KVSCHED_TARGET_DIR": str(target.root)}, timeout=target.timeout,
                          trace_strategy=target.strategy)
    return adapter.start()


def run_space(adapter, invariants, space: str, count: int, seed_value: int, first: dict,
              unasserted=None) -> dict[str, Any]:
    traces = sample_traces(space_strategy(space), count, seed_value)
    by_class: collections.Counter[str] = collections.Counter()
    beyond: collections.Counter[str] = collections.Counter()
    steps = agreeing = 0
    started = time.monotonic()
    for i, trace in enumerate(traces):
        result = run_checked(adapter, trace, invariants, timeout=60, lockstep=True)
        steps += len(result.records)
        cls = classify(result)
        if cls is None:
            agreeing += 1
        else:
            by_class[cls] += 1
            first.setdefault((space, cls), (trace, result))
            if cls == "restart-assertion" and unasserted is not None:
                later = classify(run_checked(unasserted, trace, invariants, timeout=60, lockstep=True))
                beyond[later or "agrees"] += 1
                if later:
                    first.setdefault((space, later), (trace, None))
        if (i + 1) % 100 == 0:
            print(f"{space}: {i + 1}/{len(traces)} traces, {agreeing} agree", flush=True)
    return {"traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
            "divergent_traces": len(traces) - agreeing, "by_class": dict(sorted(by_class.items())),
            "restart_assertion_traces_under_python_O": dict(sorted(beyond.items())),
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    args = campaign_parser(__doc__.splitlines()[0], SPACES, seed=20261201, out="docs/results/lockstep-vidur-vllm.json",
                           traces_dir="docs/traces/lockstep-vidur").parse_args(argv)
    spaces = SPACES if args.path == "all" else (args.path,)
    target = get_target("vidur-vllm")
    adapter, profile = target.adapter(), get_profile("vllm-v0")
    unasserted = without_asserts(target)
    invariants = profile.invariants()
    report: dict[str, Any] = {"version": 1, "target": "vidur-vllm", "package": target.version,
                              "reference": "reference_impl.scheduler:Scheduler (profile vllm-v0)", "seed": args.seed,
                              "spaces": {}, "classes": {}}
    first: dict[tuple[str, str], tuple[Trace, TraceResult]] = {}
    for space in spaces:
        report["spaces"][space] = entry = run_space(adapter, invariants, space, args.traces, args.seed, first,
                                                         unasserted)
        print(json.dumps({"space": space, **entry}), flush=True)
    for (space, cls), (trace, result) in sorted(first.items()):
        small = trace
        runner = adapter if result is not None else unasserted  # None: found under python -O
        if not args.no_shrink:
            from conformance.runner.shrink import shrink

            def failing(candidate: Trace, cls: str = cls, runner=runner) -> int | None:
                try:
                    got = run_checked(runner, candidate, invariants, timeout=60, lockstep=True)
                except Exception:  # noqa: BLE001 - a candidate the target refuses is no smaller instance
                    return None
                return failing_step(got) if classify(got) == cls else None

            try:
                small, _ = shrink(trace, failing, budget=300, seconds=60, domain=target.domain)
            except ValueError:
                small = trace
        final = run_checked(runner, small, invariants, timeout=60, lockstep=True)
        kind, why = CLASSES.get(cls, ("open", "not yet explained"))
        message = (final.divergence.describe() if final.divergence else
                   final.fault.message if final.fault else "; ".join(v.message for v in final.violations[:2]))
        meta = {"adapter": "vidur-vllm", "profile": "vllm-v0", "space": space, "class": cls, "kind": kind,
                "python_O": result is None,
                "message": message, "steps": len(final.records)}
        keep_class_trace(report, args.traces_dir, space, cls, kind, why, small, meta, message, "spaces",
                         python_O=result is None)
    write_report(report, args.out, "spaces")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
