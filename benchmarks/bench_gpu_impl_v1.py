"""Engine-steps per second: the V1 reference loop vs the batched V1 twin, on the same traces.

    python benchmarks/bench_gpu_impl_v1.py --device cpu [--engines 1 64 512] [--check 16]

For each E, E traces are drawn with `gpu_impl.workload_v1.random_v1_trace` (seeded; each engine
its own config: chunked prefill on in ~70%, block sizes 1-4, tight caches and budgets, FCFS and
priority, stops and aborts; prefix caching off, which the twin leaves out). The reference
(`reference_impl.v1_scheduler.V1Scheduler`) runs them one after another in the plain engine loop
(no snapshots); the twin runs all E at once (`gpu_impl.lockstep_v1.V1Run`). Both execute the
same engine-steps (checked); the ratio of their rates is printed, baseline = the reference
measured in the same run. ``--check N`` first runs N of the traces in lockstep (whole outputs
and snapshots compared every step).
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from gpu_impl.lockstep_v1 import V1Run, V1TraceBatch, run_lockstep_v1  # noqa: E402
from gpu_impl.workload_v1 import random_v1_trace  # noqa: E402
from reference_impl.engine import iter_steps  # noqa: E402
from reference_impl.v1_scheduler import V1Scheduler  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--engines", type=int, nargs="+", default=[1, 64, 512])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: as bench_gpu_impl)")
    ap.add_argument("--check", type=int, default=0, help="run this many traces in lockstep first")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"device {args.device}, {args.threads} intra-op thread(s), seed {args.seed}, {args.requests} requests per engine")
    if args.check:
        rng = random.Random(args.seed + 1)
        result = run_lockstep_v1([random_v1_trace(rng, args.requests) for _ in range(args.check)], V1Scheduler, args.device)
        print(f"# lockstep check: {args.check} traces, {result.engine_steps} engine-steps, "
              + ("all agree" if result.ok else "DIVERGED\n" + result.divergence.describe()))
        if not result.ok:
            return 1
    print("| E | engine-steps | batched steps | reference steps/s (baseline) | twin steps/s | ratio (wall) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for E in args.engines:
        rng = random.Random(args.seed)
        traces = [random_v1_trace(rng, args.requests) for _ in range(E)]
        t0 = time.perf_counter()
        ref_steps = sum(sum(1 for _ in iter_steps(t, V1Scheduler(t.config), observe=False)) for t in traces)
        ref_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        run = V1Run(V1TraceBatch(traces, args.device))
        twin_steps = run.run()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        twin_s = time.perf_counter() - t0
        assert twin_steps == ref_steps, (twin_steps, ref_steps)
        print(f"| {E} | {ref_steps:,} | {run.step} | {ref_steps / ref_s:,.0f} | {twin_steps / twin_s:,.0f} | "
              f"{ref_s / twin_s:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
