"""Time the Z3 invariant x action matrix (``kvsched prove``): the whole default matrix (every
flow: v0, v1, async and specdec, bounded and unbounded cells), ``kvsched prove --bound large`` (v0
at the ``large`` preset, the other flows at their own bounds), and the parametric block proof alone.

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
from spec.proofs.encoding_async import ASYNC_BOUND
from spec.proofs.encoding_specdec import SPECDEC_BOUND
from spec.proofs.matrix import prove


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def measure(bound: Bound, jobs: int, flow_name: str = "v0") -> tuple[float, float, int, int, bool]:
    """(wall s, CPU s, cells, unbounded cells, all proved)."""
    from spec.proofs import counting, parametric, sequence_cells, writes

    for cache in (parametric._CACHE, sequence_cells._CACHE, counting._CACHE, writes._CACHE):
        cache.clear()  # each measurement pays for its unbounded proofs
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
    whole = [measure(DEFAULT, args.jobs), measure(V1_BOUND, args.jobs, "v1"), measure(ASYNC_BOUND, args.jobs, "async"),
             measure(SPECDEC_BOUND, args.jobs, "specdec")]
    for name, w in zip(("v0", "v1", "async", "specdec"), whole, strict=True):
        print(f"  {name:7}: {w[0]:6.1f}s wall {w[1]:6.1f}s CPU  {w[2]} cells ({w[3]} unbounded)  all proved={w[4]}")
    _total(f"whole matrix (v0 + v1 + async + specdec default), {args.jobs} jobs", whole)
    r = measure(large, args.jobs)
    print(f"  v0 {large}: {r[0]:6.1f}s wall {r[1]:6.1f}s CPU  {r[2]} cells "
          f"({r[3]} unbounded, not re-solved)  all proved={r[4]}  x{r[0] / base[0]:.2f} of baseline")
    _total(f"kvsched prove --bound large (v0 large, the other flows at their bounds), {args.jobs} jobs",
           [r, measure(V1_BOUND, args.jobs, "v1"), measure(ASYNC_BOUND, args.jobs, "async"),
            measure(SPECDEC_BOUND, args.jobs, "specdec")])


def _total(what: str, runs: list[tuple[float, float, int, int, bool]]) -> None:
    print(f"{what}: {sum(w[0] for w in runs):6.1f}s wall {sum(w[1] for w in runs):6.1f}s CPU  "
          f"{sum(w[2] for w in runs)} cells ({sum(w[3] for w in runs)} unbounded)  all proved={all(w[4] for w in runs)}")


if __name__ == "__main__":
    main()
