"""Engine-steps per second: the reference loop vs the batched torch twin, on the same traces.

    python benchmarks/bench_gpu_impl.py --device cpu
    python benchmarks/bench_gpu_impl.py --device cuda --quick

For each E in the list, E traces are drawn (seeded; each engine its own config, 16 requests
arriving over ~30 steps, n up to 2, priorities, a few stops and aborts). The reference runs
them one after another (the plain engine loop: add, abort, schedule, update, no snapshots);
the twin runs all E at once (`gpu_impl.encode.BatchedRun`, which stops stepping engines that
are done, as the reference loop does; ``--check`` runs through the same class). Both execute the same
engine-steps (checked); the ratio of their rates is printed, baseline = the reference measured
in the same run. ``--check N`` first runs N of the traces in lockstep against the reference.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from gpu_impl.encode import BatchedRun, TraceBatch  # noqa: E402
from gpu_impl.workload import random_trace  # noqa: E402
from reference_impl.scheduler import Scheduler  # noqa: E402
from spec.trace import Trace  # noqa: E402
from spec.types import StepOutcome  # noqa: E402


def run_reference(traces: list[Trace]) -> tuple[int, float, float]:
    """The reference engine loop (as `reference_impl.engine.iter_steps` with observe=False)."""
    steps = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for trace in traces:
        sched = Scheduler(trace.config)
        unfinished: set[str] = set()
        for step in range(trace.max_steps):
            for request in trace.arrivals_at(step):
                sched.add_request(request)
                unfinished.add(request.request_id)
            for rid in trace.aborts_at(step):
                f = sched.abort_request(rid)
                if f is not None:
                    unfinished.discard(f.request_id)
            sched.schedule()
            for f in sched.update(StepOutcome(trace.stops_at(step))):
                unfinished.discard(f.request_id)
            steps += 1
            if step >= trace.last_arrival_step and not unfinished:
                break
    return steps, time.perf_counter() - t0, time.process_time() - c0


def run_twin(traces: list[Trace], device: str) -> tuple[int, float, float, int]:
    batch = TraceBatch(traces, device)
    run = BatchedRun(batch, sync=False)  # done engines drop out; full state written back at the end
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    run.run()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return run.engine_steps, time.perf_counter() - t0, time.process_time() - c0, run.step


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__} ({torch.get_num_threads()} threads)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--engines", default="1,64,1024,4096", help="comma-separated E values")
    ap.add_argument("--quick", action="store_true", help="fewer requests per trace (shorter runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--check", type=int, default=0, help="lockstep-check this many traces first")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch intra-op threads on CPU (default 1; on the 2-core development machine 2 threads "
                         "gave +12%% wall at E=4096, -2%% at E=1024, for ~1.75x the CPU time; BENCHMARKS.md)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = "cuda" if args.device == "auto" and torch.cuda.is_available() else args.device
    if device == "auto":
        device = "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda but CUDA is not available", file=sys.stderr)
        return 2
    requests = 8 if args.quick else 16
    sizes = [int(x) for x in args.engines.split(",")]
    rng = random.Random(args.seed)
    pool = [random_trace(rng, requests) for _ in range(max(sizes))]
    dev_name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"machine: {machine()}")
    print(f"device: {device} ({dev_name}); traces: {requests} requests each, seed {args.seed}")
    if args.check:
        from gpu_impl.lockstep import run_lockstep

        res = run_lockstep(pool[: args.check], Scheduler, device=device, kv=True)
        print(f"lockstep check on {args.check} traces: {'ok' if res.ok else 'DIVERGED'} ({res.engine_steps} engine-steps)")
        if not res.ok:
            print(res.divergence.describe())
            return 1
    run_twin(pool[:8], device)  # warm-up (allocator, kernels)
    print("engine-steps per second (wall clock); ratio = twin / reference; cpu ratio = the same on process CPU time")
    print(f"{'E':>6} {'engine-steps':>12} {'batched':>8} {'reference/s':>12} {'twin/s':>10} {'ratio':>8} {'cpu ratio':>9}")
    for E in sizes:
        traces = pool[:E]
        ref_steps, ref_t, ref_c = run_reference(traces)
        twin_steps, twin_t, twin_c, batched = run_twin(traces, device)
        if twin_steps != ref_steps:
            print(f"error: engine-step counts differ (reference {ref_steps}, twin {twin_steps})", file=sys.stderr)
            return 1
        ref_rate, twin_rate = ref_steps / ref_t, twin_steps / twin_t
        print(f"{E:>6} {ref_steps:>12} {batched:>8} {ref_rate:>12.0f} {twin_rate:>10.0f} "
              f"{twin_rate / ref_rate:>7.2f}x {ref_c / max(twin_c, 1e-9):>8.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
