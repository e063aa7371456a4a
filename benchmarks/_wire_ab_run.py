"""Run by bench_wire_ab.py with PYTHONPATH set to one tree (this one, or an older commit's):
one pass of a target's traces over the wire, unchecked then with `safety`; prints one JSON line
with the wall and CPU (runner + host) seconds per step.

    python _wire_ab_run.py TARGET TRACES SEED [FLUSH_MS [FOLD_RESET]]

FLUSH_MS "-" keeps the tree's default; FOLD_RESET 0 sends each trace's reset on its own.
"""

from __future__ import annotations

import glob
import json
import sys
import time

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from conformance.targets import _TARGET_LIST


def host_cpu(pid: int) -> float:
    return sum(int(open(f).read().split()[0]) for f in glob.glob(f"/proc/{pid}/task/*/schedstat")) / 1e9


def main() -> None:
    name, count, seed_value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if len(sys.argv) > 4:
        import conformance.wire.client as client

        if sys.argv[4] != "-":
            client._FLUSH_MS = float(sys.argv[4])  # only trees that have it read it
        if len(sys.argv) > 5:
            client._FOLD_RESET = sys.argv[5] == "1"  # likewise
    target = next(t for t in _TARGET_LIST if t.name == name)
    corpus = sample_traces(target.strategy(), count, seed_value)
    adapter = load_adapter(name)
    safety = get_profile("safety").invariants()
    run_checked(adapter, corpus[0], safety, timeout=60)  # the host starts, the engine imports
    out = {}
    for label, invariants in (("unchecked", []), ("safety", safety)):
        pid = adapter.host.proc.pid
        h0, c0, w0 = host_cpu(pid), time.process_time(), time.perf_counter()
        steps = sum(len(run_checked(adapter, t, invariants, timeout=60, stop_at_first=False).records) for t in corpus)
        wall, runner = time.perf_counter() - w0, time.process_time() - c0
        same_host = adapter.host.proc.pid == pid  # a restarted host's CPU is not counted: None
        out[label] = {"steps": steps, "wall": wall / steps,
                      "cpu": (runner + host_cpu(pid) - h0) / steps if same_host else None}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
