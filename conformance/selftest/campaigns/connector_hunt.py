"""The KV-connector hunt: ``safety`` and ``liveness`` (with the KVC family) on vLLM 0.33.0's V1
scheduler with the scripted connector, under KV pressure (docs/CONNECTORS.md, section 6).

    python -m conformance.selftest.campaigns.connector_hunt [--traces 500] [--seed 20261202]
        [--spec-tokens K] [--pipelined] [--out docs/results/connector-hunt.json]

Traces: `conformance.generation.connector.pressure_traces` (a pool a few blocks above the longest
prompt, most requests loading asynchronously) with failures and sends drawn in, under both
failure policies; with ``--spec-tokens K`` (K > 0) speculative decoding is on: K draft tokens and
the trace's draft decisions (`conformance.generation.specdec.with_drafts`), vLLM's n-gram drafter
proposing as the trace says (the lookahead slots of vllm-project/vllm#57104); with ``--pipelined``
the traces run at pipeline depth 1 on vLLM's ``AsyncScheduler`` (the ``vllm-v1-async`` host).
Every problem is counted by invariant; the first trace of each is kept in the results file.
Whatever vLLM does that breaks an invariant is a candidate finding, explained in
docs/CONNECTORS.md or listed as open. Each trace with a problem is also run in
strict lockstep against the connector reference in vLLM's terms and its counterfactuals
(lockstep_connector's references and `MODELS`): where the engine agrees with the reference in
vLLM's terms, a problem that reference with one vLLM finding fixed no longer shows is that
finding's (`lockstep_connector.explain_violations`: the own-reservation stall); where it agrees
with a counterfactual (kept placeholders after a failed load), its problems are that class's.
Those are counted under ``explained``; the rest are ``open``. With drafts the references are the
``+spec`` paths' (`RecordingConnectorSpecV1`, `RecordingConnectorAsyncSpec`), whose findings include
vLLM's draft deviations and its speculative-step reservation.
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
from conformance.selftest.campaigns.campaign_args import provenance
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
    parser.add_argument("--pipelined", action="store_true", help="depth 1 on vLLM's AsyncScheduler (vllm-v1-async)")
    parser.add_argument("--out", type=Path, default=Path("docs/results/connector-hunt.json"))
    args = parser.parse_args(argv)
    begun = provenance()
    target = "vllm-v1-async" if args.pipelined else "vllm-v1"
    adapter = load_adapter(target)
    invariants = invariants_of(["safety", "liveness", "connector"])
    counts: collections.Counter[str] = collections.Counter()
    explained: collections.Counter[str] = collections.Counter()  # "CLASS: INVARIANT" -> traces
    first: dict[str, dict] = {}
    steps = 0
    started = time.monotonic()
    for trace in sample_traces(hunt_traces(args.spec_tokens), args.traces, args.seed):
        if args.pipelined:
            trace = dataclasses.replace(trace, config=dataclasses.replace(trace.config, pipeline_depth=1))
        result = run_checked(adapter, trace, invariants, timeout=120)
        steps += len(result.records)
        why = explain(adapter, trace, args.pipelined, result.problem_ids, bool(args.spec_tokens)) \
            if result.problem_ids else {}
        for problem in sorted(result.problem_ids):
            counts[problem] += 1
            if problem in why:
                explained[f"{why[problem]}: {problem}"] += 1
                continue
            first.setdefault(problem, {"trace": trace.to_dict(), "message": next(
                (str(v) for v in result.violations if v.invariant_id == problem), str(result.fault))})
    report = {"version": 1, "target": target, "seed": args.seed, "spec_tokens": args.spec_tokens,
              "pipeline_depth": int(args.pipelined), "traces": args.traces, "steps": steps,
              "problems": dict(sorted(counts.items())), "explained": dict(sorted(explained.items())),
              "open": {p: n - sum(v for k, v in explained.items() if k.endswith(f": {p}")) for p, n in sorted(counts.items())},
              "first": first, "seconds": round(time.monotonic() - started, 1),
              "run": {"started": begun, "written": provenance()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("traces", "steps", "problems", "explained", "seconds")}))
    return 0


def explain(adapter, trace: Trace, pipelined: bool, problems: set[str],  # type: ignore[no-untyped-def]
            drafts: bool = False) -> dict[str, str]:
    """Per problem, what explains it: when the engine agrees in strict lockstep with the reference
    in vLLM's terms (`RecordingConnectorV1` / `RecordingConnectorAsync`), the finding whose fixed
    reference no longer shows it (`lockstep_connector.explain_violations`; a problem none removes is
    open, though the reference in vLLM's terms shares it); when it agrees with a counterfactual of
    `lockstep_connector.MODELS` instead, that class. Empty when it agrees with none (open)."""
    from conformance.flows.profiles import get_profile
    from conformance.selftest.campaigns import lockstep_connector as lc

    path = ("async-hunt" if pipelined else "hunt") + ("+spec" if drafts else "")  # the +spec references with drafts
    invariants = get_profile("connector").invariants()
    problems = set(problems) - {"LOCKSTEP"}
    if lc.classify(lc.run_one(adapter, trace, invariants, path)) in (None, "frees-in-set-order"):
        return lc.explain_violations(trace, path, problems, invariants)
    for cls, model in (lc.SPEC_MODELS if drafts else lc.MODELS) if pipelined else ():
        if lc.classify(lc.run_one(adapter, trace, invariants, path, reference=model)) in (None, "frees-in-set-order"):
            return dict.fromkeys(problems, cls)
    return {}


if __name__ == "__main__":
    raise SystemExit(main())
