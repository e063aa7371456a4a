"""Benchmark (issue 18, part 4): does checked cost per request-step stay flat as the state grows?

Traces of vLLM V1's default path (recompute only, no chunked prefill, no prefix caching) with
R requests arriving at step 0, prompts 64-512 tokens, outputs 16-256, block size 16 and a pool
of 8 blocks per request (2048 blocks at 256 requests); the batch limits stay vLLM V1's defaults
(256 sequences, 8192 tokens), so at 4096 requests a step runs about as many requests as at 256
while the pool and the waiting queue are 16 times larger: what checking costs beyond the change
shows as growth. A request-step
is one request scheduled in one step (the unit of work the scheduler does); each cost is CPU
time (``time.process_time``) per request-step. Measured, interleaved round by round so that
a change in load hits every line alike:

* vLLM V1's own ``schedule()`` + ``update_from_output()`` on the same traces (the vllm-v1 target
  venv, in process there; its own CPU-time clock), at the smallest size only unless --vllm-all;
* the reference's V1 flow, engine loop, unchecked;
* the same through `run_checked` with every ``safety`` invariant checked after each step;
* with ``--floors``, two lines between the last two that say what this design costs before any
  statement is evaluated: ``observed`` (the same run with every predicate a no-op: the snapshots
  the profile needs, their type check, the driver) and ``walked`` (every predicate walks the
  views the incremental layer hands it, its `reads` kept, and evaluates nothing).

Targets: checked cost per request-step grows at most 1.25x from the smallest to the largest
size, and at the smallest size the checked reference costs at most 2.0x vLLM V1's own step
(DESIGN.md, 2026-12-02); on the V1 reference (default) and on the V0 one (``--flow v0``: the
workload of issue 28, whose snapshots scanned whole queues and pools).

With ``--shares N`` it also runs `benchmarks/_conform_shares.py` (N traces of ``kvsched conform``'s
default strategy on the reference, safety profile) in a fresh process, once per round between the
sizes, and prints where a conformance worker's CPU time goes on small traces: imports, Hypothesis
generation, running and checking.

    python benchmarks/bench_scale.py [--sizes 256,4096] [--rounds 2] [--seed 0] [--scale-batch] [--no-vllm] [--floors]
                                     [--flow v1|v0] [--shares N]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.flows.profiles import get_profile
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from reference_impl.engine import iter_steps
from reference_impl.scheduler import Scheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("KVSCHED_TARGETS_DIR", Path.home() / ".cache/kvsched/targets")) / "vllm-v1"


def scaled_trace(requests: int, seed: int, scale_batch: bool = False) -> Trace:
    """One trace of ``requests`` requests, the pool scaled with the request count (and the batch
    limits too with ``scale_batch``: ``requests`` sequences, 32 tokens per request)."""
    rng = random.Random(seed * 1_000_003 + requests)
    config = SchedulerConfig(
        block_size=16, num_gpu_blocks=8 * requests, num_cpu_blocks=0, max_num_seqs=requests if scale_batch else 256,
        max_num_batched_tokens=32 * requests if scale_batch else 8192, max_model_len=768, watermark=0.0,
        preemption_mode="recompute",
    )
    arrivals = tuple(Arrival(0, Request(f"r{i}", rng.randint(64, 512), rng.randint(16, 256))) for i in range(requests))
    return Trace(config, arrivals, max_steps=100_000)


def request_steps(records) -> int:
    return sum(len(r.output.scheduled) for r in records)


FLOWS = {"v1": (V1Scheduler, "reference-v1"), "v0": (Scheduler, "reference")}  # the reference and its adapter


def unchecked(trace: Trace, flow: str = "v1") -> tuple[float, int]:
    # The cyclic collector is paused as `run_checked` pauses it, so both lines pay the same for it.
    collecting = gc.isenabled()
    gc.disable()
    try:
        start = time.process_time()
        work = sum(len(r.output.scheduled) for r in iter_steps(trace, FLOWS[flow][0](trace.config), observe=False))
        return time.process_time() - start, work
    finally:
        if collecting:
            gc.enable()


def checked(trace: Trace, adapter, safety) -> tuple[float, int]:
    """The checked run, its records streamed (`run_checked`'s ``stream``): counted as they are
    checked, not kept. Keeping every step's snapshots, as a run that may be replayed must, is a
    cost of keeping, not of checking; at 4096 requests it also put each new pool-sized tuple in
    fresh memory."""
    work = [0]

    def count(record) -> None:  # type: ignore[no-untyped-def]
        work[0] += len(record.output.scheduled)

    start = time.process_time()
    result = run_checked(adapter, trace, safety, timeout=None, stop_at_first=False, stream=count)
    spent = time.process_time() - start
    if result.failed:
        raise SystemExit(f"bench_scale: the reference failed its own check: {result.violations[:1] or result.fault}")
    return spent, work[0]


def silent(safety: list) -> list:
    """Every predicate a no-op about the step, needs kept: what observing costs (snapshots, type
    check, driver)."""
    return [dataclasses.replace(inv, step=lambda ctx, rec: (), about="step", when=None, reads=None) if inv.step else inv
            for inv in safety]


def walking(safety: list) -> list:
    """Every predicate a no-op, subjects and triggers kept: the evaluation layer still finds the
    touched subjects and hands each to every rule whose trigger holds (`spec.invariants._evaluation`),
    which evaluates nothing: the floor of checking one subject at a time in Python."""
    return [dataclasses.replace(inv, step=lambda ctx, rec, subject=None: ()) if inv.step else inv for inv in safety]


def vllm(trace: Trace) -> tuple[float, int]:
    """vLLM V1's own CPU time and its request-steps, from its venv (benchmarks/_v1_inprocess.py)."""
    python = TARGET / "venv" / "bin" / "python"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([trace.to_dict()], f)
    env = {**os.environ, "KVSCHED_TARGET_DIR": str(TARGET), "VLLM_TARGET_DEVICE": "cpu", "KVSCHED_CPU_CLOCK": "1"}
    try:
        proc = subprocess.run([str(python), str(ROOT / "benchmarks/_v1_inprocess.py"), f.name,
                               str(ROOT / "conformance/targets/hosts")], capture_output=True, text=True, env=env,
                              check=True)
    finally:
        os.unlink(f.name)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["vllm_seconds"], out["request_steps"]


def shares(examples: int) -> dict[str, float]:
    """CPU seconds per part of a fresh `kvsched conform` worker on ``examples`` small traces
    (benchmarks/_conform_shares.py)."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/_conform_shares.py"), str(examples)],
                          capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="256,4096", help="comma-separated request counts (smallest first)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-all", action="store_true", help="time vLLM V1 at every size, not only the smallest")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--floors", action="store_true",
                    help="also time the run with no-op predicates (observed) and with predicates that only walk (walked)")
    ap.add_argument("--scale-batch", action="store_true",
                    help="scale max_num_seqs and max_num_batched_tokens with the requests (default: V1's 256 / 8192)")
    ap.add_argument("--flow", choices=sorted(FLOWS), default="v1",
                    help="the reference checked and timed unchecked: V1 (default) or V0 (the issue 28 workload)")
    ap.add_argument("--shares", type=int, default=0, metavar="N",
                    help="also measure a fresh conform worker's imports, generation and checking on N small traces")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    have_vllm = not args.no_vllm and (TARGET / "venv" / "bin" / "python").exists()
    adapter = load_adapter(FLOWS[args.flow][1])
    safety = get_profile("safety").invariants()
    traces = {n: scaled_trace(n, args.seed, args.scale_batch) for n in sizes}
    # Warm up once (imports, the catalogue, first-call caches), or the first checked line pays it.
    warm = scaled_trace(16, args.seed, args.scale_batch)
    unchecked(warm, args.flow)
    checked(warm, adapter, safety)
    costs: dict[tuple[str, int], list[float]] = {}
    work: dict[tuple[str, int], int] = {}
    parts: list[dict[str, float]] = []
    for _ in range(args.rounds):
        if args.shares:
            parts.append(shares(args.shares))
        for n in sizes:
            runs = [("unchecked", lambda t=traces[n]: unchecked(t, args.flow)),
                    ("checked", lambda t=traces[n]: checked(t, adapter, safety))]
            if args.floors:
                runs[1:1] = [("observed", lambda t=traces[n]: checked(t, adapter, silent(safety))),
                             ("walked", lambda t=traces[n]: checked(t, adapter, walking(safety)))]
            if have_vllm and (n == sizes[0] or args.vllm_all):
                runs.insert(0, ("vllm", lambda t=traces[n]: vllm(t)))
            for name, fn in runs:
                spent, steps = fn()
                costs.setdefault((name, n), []).append(spent / steps)
                work[(name, n)] = steps
    med = {key: statistics.median(values) for key, values in costs.items()}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; rounds {args.rounds}, seed {args.seed}, "
          f"flow {args.flow}, load {os.getloadavg()[0]:.1f}")
    print(f"{'what':12s} {'requests':>8s} {'request-steps':>13s} {'us/request-step':>16s} {'vs smallest':>12s}")
    for name in ("vllm", "unchecked", "observed", "walked", "checked"):
        for n in sizes:
            if (name, n) in med:
                print(f"{name:12s} {n:8d} {work[(name, n)]:13d} {med[(name, n)] * 1e6:16.3f} "
                      f"{med[(name, n)] / med[(name, sizes[0])]:11.2f}x")
    if parts:
        print(f"a fresh conform worker, {parts[0]['examples']} traces ({parts[0]['steps']} steps), CPU seconds "
              f"(median of {len(parts)}):")
        whole = statistics.median(sum(p[k] for k in ("imports", "generation", "run_and_check")) for p in parts)
        for key in ("imports", "generation", "run_and_check"):
            value = statistics.median(p[key] for p in parts)
            print(f"  {key:14s} {value:7.3f} s  {value / whole * 100:5.1f} %")
    growth = med[("checked", sizes[-1])] / med[("checked", sizes[0])]
    print(f"checked growth {sizes[0]} -> {sizes[-1]} requests: {growth:.2f}x (target <= 1.25x): "
          f"{'met' if growth <= 1.25 else 'not met'}")
    if ("vllm", sizes[0]) in med:
        for name in ("unchecked", "observed", "walked"):
            if (name, sizes[0]) in med:
                print(f"{name} vs vLLM V1 at {sizes[0]} requests: {med[(name, sizes[0])] / med[('vllm', sizes[0])]:.2f}x")
        ratio = med[("checked", sizes[0])] / med[("vllm", sizes[0])]
        print(f"checked reference vs vLLM V1 at {sizes[0]} requests: {ratio:.2f}x (target <= 2.0x): "
              f"{'met' if ratio <= 2.0 else 'not met'}")


if __name__ == "__main__":
    main()
