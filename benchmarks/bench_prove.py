"""Time the Z3 invariant x action matrix (``kvsched prove``) at the default and a larger bound,
and the v1 flow's (chunked prefill) at its bound.

Baseline (same run): the default bound with one worker. Prints seconds, cells, and each
measurement's ratio to the baseline.

    python benchmarks/bench_prove.py [--large BOUND] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from spec.proofs.bound import DEFAULT, LARGE, Bound
from spec.proofs.chunked import V1_BOUND
from spec.proofs.matrix import prove


def measure(bound: Bound, jobs: int, flow_name: str = "v0") -> tuple[float, int, bool]:
    t0 = time.perf_counter()
    m = prove(bound, jobs=jobs, flow_name=flow_name)
    return time.perf_counter() - t0, len(m.cells), m.all_proved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", default=str(LARGE))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    large = Bound.parse(args.large)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}")
    base, cells, ok = measure(DEFAULT, 1)
    print(f"baseline  default bound ({DEFAULT}), 1 job : {base:7.1f}s  {cells} cells  all proved={ok}")
    for name, bound in (("default", DEFAULT), ("large", large)):
        secs, cells, ok = measure(bound, args.jobs)
        print(f"{name:8s}  {bound}, {args.jobs} jobs: {secs:7.1f}s  {cells} cells  all proved={ok}  "
              f"x{secs / base:.2f} of baseline")
    secs, cells, ok = measure(V1_BOUND, args.jobs, "v1")
    print(f"v1 flow   {V1_BOUND}, {args.jobs} jobs: {secs:7.1f}s  {cells} cells  all proved={ok}  "
          f"x{secs / base:.2f} of baseline")


if __name__ == "__main__":
    main()
