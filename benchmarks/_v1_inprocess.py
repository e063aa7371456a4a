"""Run by bench_targets.py with the vllm-v1 target venv's Python (no kvsched installed there).

Drives vLLM 0.33.0's V1 scheduler through the host's engine class, in process, over the traces
in a JSON file, and reports the time spent inside vLLM's own ``schedule()`` and
``update_from_output()`` separately from the host's translation.
"""

from __future__ import annotations

import json
import os
import sys
import time

HOSTS = sys.argv[2]
sys.path.insert(0, HOSTS)
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
import vllm_v1_host  # noqa: E402
from _host_inprocess import _by_step, _time_own  # noqa: E402  (this folder, first on sys.path)

clock = time.process_time if os.environ.get("KVSCHED_CPU_CLOCK") == "1" else time.perf_counter


def main() -> None:
    traces = json.loads(open(sys.argv[1]).read())
    engine = vllm_v1_host.V1Engine()
    own = {"schedule": 0.0, "update_from_output": 0.0}
    steps = 0
    request_steps = 0
    host_total = reset_total = 0.0
    for trace in traces:
        start = clock()
        engine.reset(trace["config"])
        reset_total += clock() - start
        _time_own(engine, own, clock)
        arrivals, aborts, stops, last = _by_step(trace)
        unfinished: set[str] = set()
        start = clock()
        for step in range(trace["max_steps"]):
            for r in arrivals.get(step, []):
                engine.add_request(r)
                unfinished.add(r["id"])
            done = [engine.abort_request(rid) for rid in aborts.get(step, [])]
            request_steps += len(engine.schedule()["scheduled"])
            done += engine.update(stops.get(step, []))
            steps += 1
            for f in done:
                if f:
                    unfinished.discard(f["request"])
            if step >= last and not unfinished:
                break
        host_total += clock() - start
    print(json.dumps({"steps": steps, "vllm_seconds": sum(own.values()), "own": own, "host_seconds": host_total,
                      "reset_seconds": reset_total, "request_steps": request_steps}))


if __name__ == "__main__":
    main()
