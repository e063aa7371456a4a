"""The hunt of issue 31 (item 5): vLLM 0.33.0 with hybrid KV cache groups under ``safety`` and
``liveness``, synchronous and pipelined, and a new attempt at vllm-project/vllm#57562.

    python -m conformance.selftest.campaigns.hybrid_hunt [--mode sync|async|both] [--traces 300]
        [--seed 20261202] [--out docs/results/hybrid-hunt-0.33.0.json]

``sync``: the hybrid flow's traces (`conformance.generation.hybrid`, every layout vLLM has: full +
sliding window, chunked local, Mamba none/align, three-kind mixes) through the ``vllm-v1`` host,
checked against safety, liveness and vLLM's own hybrid policy (HYB-004, HYB-005). ``async``: the
same traces at ``pipeline_depth`` 1 through ``vllm-v1-async`` (vLLM's AsyncScheduler), with
#57562's shape weighted in: a Mamba "align" group with prefix caching (the report's Gated
DeltaNet + attention model, whose default with prefix caching is "align"), chunked prefill,
several requests at once and a budget of a few tokens per seat, so that the aligned split and the
shared-prefix junction cut chunks while outcomes are in flight; checked against safety, liveness
and the PIP family, whose PIP-003 reads the host's in-flight counters (a placeholder count below
zero is #57562's ``assert request.num_output_placeholders >= 0``) and PIP-005 any failure of the
engine on an in-flight outcome.

The hosts announce no ``kv_groups`` capability (a one-group run would have nothing to show), so
the hunt adds it to the adapter once the host is up (`_with_groups`): the host sends
``group_tables`` for every hybrid config, and HYB-001 and BLK-003 over every group apply. The
prefix-cache content checks (HYB-002, HYB-006, HYB-007) need kvsched's keys, which vLLM's hashes
are not, so they stay with the reference. Every trace runs whole; its problems are counted by
invariant and the first trace of each is kept in the report.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import invariants_of
from conformance.generation.hybrid import fitting_pool, hybrid_configs
from conformance.generation.v0 import sample_traces
from conformance.generation.v1 import token_traces
from conformance.runner.driver import run_checked
from conformance.selftest.campaigns.campaign_args import provenance
from conformance.targets import get_target
from spec.catalogue import get
from spec.config import SchedulerConfig
from spec.kv_groups import KVGroup
from spec.observation import Capability

VERSION = 1
TIMEOUT = 120.0


def _vllm_has(config: SchedulerConfig) -> bool:
    return not any(g.kind == "mamba" and g.mode == "all" for g in config.kv_groups)


def sync_strategy() -> st.SearchStrategy:
    return hybrid_configs().filter(_vllm_has).flatmap(lambda c: token_traces("v1", config=c))


@st.composite
def _async_57562_configs(draw: st.DrawFn) -> SchedulerConfig:
    config = draw(hybrid_configs(draw(st.sampled_from(["mamba", "mamba", "swa+mamba", "swa"]))))
    seats = draw(st.integers(2, 6))
    if any(g.kind == "mamba" for g in config.kv_groups) and draw(st.booleans()):
        # the report's shape: prefix caching (so "align"), chunked prefill, a few tokens per seat
        groups = tuple(KVGroup("mamba", mode="align") if g.kind == "mamba" else g for g in config.kv_groups)
        config = dataclasses.replace(config, kv_groups=(), enable_prefix_caching=True, enable_chunked_prefill=True)
        config = dataclasses.replace(config, kv_groups=groups, max_num_seqs=seats,
                                     max_num_batched_tokens=max(seats, draw(st.integers(seats, seats * 3))))
    return fitting_pool(dataclasses.replace(config, watermark=0.0, pipeline_depth=1))


def async_strategy() -> st.SearchStrategy:
    return _async_57562_configs().flatmap(lambda c: token_traces("v1", config=c, max_requests=8))


def _with_groups(adapter):  # type: ignore[no-untyped-def]
    """``adapter`` that claims ``kv_groups`` once its host is up (see the module docstring)."""
    start = adapter.start

    def started():  # type: ignore[no-untyped-def]
        out = start()
        adapter.capabilities = adapter.capabilities | {Capability.KV_GROUPS}
        return out

    adapter.start = started
    return adapter


def hunt(target_name: str, strategy: st.SearchStrategy, invariants, count: int, seed_value: int) -> dict[str, Any]:
    target = get_target(target_name)
    adapter = _with_groups(target.adapter())
    problems: Counter[str] = Counter()
    first: dict[str, Any] = {}
    active: set[str] = set()  # invariants applicable on the target (with kv_groups claimed)
    stats = {"traces": 0, "steps": 0, "clean_traces": 0, "preemptions": 0, "prefix_caching_on": 0,
             "chunked_prefill_on": 0, "layouts": Counter()}
    started = time.monotonic()
    for trace in sample_traces(strategy, count, seed_value):
        result = run_checked(adapter, trace, invariants, timeout=TIMEOUT, stop_at_first=False)
        stats["traces"] += 1
        stats["steps"] += len(result.records)
        active |= {inv.id for inv in result.active}
        stats["preemptions"] += sum(len(r.output.preempted) for r in result.records)
        stats["prefix_caching_on"] += trace.config.enable_prefix_caching
        stats["chunked_prefill_on"] += trace.config.enable_chunked_prefill
        stats["layouts"]["+".join(g.kind + (f"-{g.mode}" if g.mode else "") for g in trace.config.kv_groups)] += 1
        if result.fault is not None:
            adapter.close()
            adapter = _with_groups(target.adapter())
        if not result.problem_ids:
            stats["clean_traces"] += 1
        for problem in result.problem_ids:
            problems[problem] += 1
            first.setdefault(problem, {"message": "; ".join(str(v) for v in result.violations[:2])
                                       or str(result.fault), "trace": trace.to_dict()})
        if stats["traces"] % 50 == 0:
            print(f"{target_name}: {stats['traces']} traces, {stats['steps']} steps, {dict(problems)}", flush=True)
    adapter.close()
    stats["layouts"] = dict(sorted(stats["layouts"].items()))
    return {"target": target_name, "package": target.version, "invariants": sorted(active),
            **stats, "problems": dict(sorted(problems.items())), "first": first,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("sync", "async", "both"), default="both")
    parser.add_argument("--traces", type=int, default=300)
    parser.add_argument("--seed", type=int, default=20261202)
    parser.add_argument("--out", type=Path, default=Path("docs/results/hybrid-hunt-0.33.0.json"))
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"version": VERSION, "seed": args.seed, "timeout_s": TIMEOUT, "runs": {}}
    if args.out.exists():
        report["runs"] = json.loads(args.out.read_text()).get("runs", {})
    policy = [get("HYB-004"), get("HYB-005")]
    if args.mode in ("sync", "both"):
        report["runs"]["sync"] = hunt("vllm-v1", sync_strategy(), invariants_of(["safety", "liveness"]) + policy,
                                      args.traces, args.seed)
        print(json.dumps({k: v for k, v in report["runs"]["sync"].items() if k != "first"}), flush=True)
    if args.mode in ("async", "both"):
        report["runs"]["async"] = hunt("vllm-v1-async", async_strategy(), invariants_of(["async", "liveness"]),
                                       args.traces, args.seed)
        print(json.dumps({k: v for k, v in report["runs"]["async"].items() if k != "first"}), flush=True)
    report["run"] = provenance()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
