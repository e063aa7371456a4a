"""Benchmark (issue 6): vLLM V1's own scheduler step vs the reference's, checked and unchecked.

On the same seeded traces of V1's default path (recompute only, no chunked prefill, no prefix
caching), in process (no protocol):

* baseline: vLLM 0.33.0's own ``schedule()`` + ``update_from_output()`` (timed inside the
  vllm-v1 target venv, only those two calls);
* the reference's V1 flow (`reference_impl.v1_scheduler`) and V0 reference, engine loop only;
* the V1 reference through the runner with every `safety` invariant checked after each step.

Separately: the wire protocol's cost per step (the vllm-v1 target over JSON lines minus the same
engine driven in process by its host class).

    python benchmarks/bench_targets.py [--traces 100] [--seed 0]   # needs `kvsched targets install vllm-v1`
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.adapter import load_adapter
from conformance.driver import run_checked
from conformance.generate import sample_traces
from conformance.profiles import get_profile
from conformance.targets import _v1_strategy
from reference_impl.engine import iter_steps
from reference_impl.scheduler import Scheduler
from reference_impl.v1_scheduler import V1Scheduler

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("KVSCHED_TARGETS_DIR", Path.home() / ".cache/kvsched/targets")) / "vllm-v1"


def draw(count: int, seed_value: int) -> list:
    return sample_traces(_v1_strategy(), count, seed_value)


def timed(fn) -> tuple[float, int]:
    start = time.perf_counter()
    steps = fn()
    return time.perf_counter() - start, steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    python = TARGET / "venv" / "bin" / "python"
    if not python.exists():
        sys.exit("bench_targets: vllm-v1 is not installed (kvsched targets install vllm-v1)")
    corpus = draw(args.traces, args.seed)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([t.to_dict() for t in corpus], f)
    env = {**os.environ, "KVSCHED_TARGET_DIR": str(TARGET), "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run([str(python), str(ROOT / "benchmarks/_v1_inprocess.py"), f.name,
                           str(ROOT / "conformance/targets/hosts")], capture_output=True, text=True, env=env, check=True)
    vllm = json.loads(proc.stdout.strip().splitlines()[-1])

    def loop(factory):
        return lambda: sum(sum(1 for _ in iter_steps(t, factory(t.config), observe=False)) for t in corpus)

    ref_v1, steps_v1 = timed(loop(V1Scheduler))
    ref_v0, steps_v0 = timed(loop(Scheduler))
    adapter = load_adapter("reference-v1")
    safety = get_profile("safety").invariants()
    checked, steps_checked = timed(lambda: sum(len(run_checked(adapter, t, safety, timeout=None, stop_at_first=False).records)
                                               for t in corpus))
    wire = load_adapter("vllm-v1")
    wire_s, wire_steps = timed(lambda: sum(len(run_checked(wire, t, [], timeout=60).records) for t in corpus))

    per = {
        "vLLM V1 schedule()+update_from_output() (baseline)": vllm["vllm_seconds"] / vllm["steps"],
        "reference V1 flow, engine loop": ref_v1 / steps_v1,
        "reference V0, engine loop": ref_v0 / steps_v0,
        "reference V1 flow + every safety invariant checked": checked / steps_checked,
    }
    base = per["vLLM V1 schedule()+update_from_output() (baseline)"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}")
    print(f"traces: {len(corpus)} (seed {args.seed}); steps: vLLM {vllm['steps']}, reference V1 {steps_v1}, "
          f"V0 {steps_v0}, checked {steps_checked}")
    for name, value in per.items():
        print(f"{name:55s} {value * 1e6:9.1f} us/step   {base / value:6.2f}x the baseline's speed")
    met = per["reference V1 flow + every safety invariant checked"] <= base
    print(f"target (checked reference at least as fast as vLLM V1's own scheduler): {'met' if met else 'not met'}")
    host_in_process = vllm["host_seconds"] / vllm["steps"]
    print(f"protocol: {wire_s / wire_steps * 1e6:.1f} us/step over JSON lines vs {host_in_process * 1e6:.1f} us/step "
          f"in process (same host engine): {(wire_s / wire_steps - host_in_process) * 1e6:.1f} us/step for the protocol")


if __name__ == "__main__":
    main()
