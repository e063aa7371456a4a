"""Time the Z3 invariant x action matrix (``kvsched prove``): the whole default matrix (both
flows, bounded and unbounded cells), the ``large`` preset, and the parametric block proof alone.

CPU seconds are this process's plus its reaped worker processes' (user + system), the measure
issue 19 sets limits on (whole matrix <= 60 s CPU, ``--bound large`` <= 5 min). Baseline: the
default v0 matrix with one worker, same run.

    python benchmarks/bench_prove.py [--large BOUND] [--jobs N]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import time

from spec.proofs.bound import DEFAULT, LARGE, Bound
from spec.proofs.chunked import V1_BOUND
from spec.proofs.matrix import prove


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def measure(bound: Bound, jobs: int, flow_name: str = "v0") -> tuple[float, float, int, int, bool]:
    """(wall s, CPU s, cells, unbounded cells, all proved)."""
    from spec.proofs import parametric

    parametric._CACHE.clear()  # each measurement pays for the parametric proof
    t0, c0 = time.perf_counter(), _cpu()
    m = prove(bound, jobs=jobs, flow_name=flow_name)
    return (time.perf_counter() - t0, _cpu() - c0, len(m.cells), sum(c.scope == "unbounded" for c in m.cells),
            m.all_proved)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--large", default=str(LARGE))
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    large = Bound.parse(args.large)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load {os.getloadavg()[0]:.1f}")
    from spec.proofs.parametric import prove_blocks

    t0, c0 = time.perf_counter(), _cpu()
    proof = prove_blocks()
    print(f"parametric block proof: {time.perf_counter() - t0:.1f}s wall {_cpu() - c0:.1f}s CPU, "
          f"{len(proof.results)} (fact, micro-op) pairs, failing {len(proof.failing())}")
    base = measure(DEFAULT, 1)
    print(f"baseline  v0 default ({DEFAULT}), 1 job: {base[0]:6.1f}s wall {base[1]:6.1f}s CPU  "
          f"{base[2]} cells ({base[3]} unbounded)  all proved={base[4]}")
    whole = [measure(DEFAULT, args.jobs), measure(V1_BOUND, args.jobs, "v1")]
    wall, cpu = sum(w[0] for w in whole), sum(w[1] for w in whole)
    print(f"whole matrix (v0 + v1 default), {args.jobs} jobs: {wall:6.1f}s wall {cpu:6.1f}s CPU  "
          f"{sum(w[2] for w in whole)} cells ({sum(w[3] for w in whole)} unbounded)  "
          f"all proved={all(w[4] for w in whole)}")
    r = measure(large, args.jobs)
    print(f"large     v0 {large}, {args.jobs} jobs: {r[0]:6.1f}s wall {r[1]:6.1f}s CPU  {r[2]} cells "
          f"({r[3]} unbounded, not re-solved)  all proved={r[4]}  x{r[0] / base[0]:.2f} of baseline")


if __name__ == "__main__":
    main()
