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
        sched = engine.sched
        for name in own:
            original = getattr(sched, name)

            def timed(*args, _original=original, _name=name, **kwargs):
                start = clock()
                try:
                    return _original(*args, **kwargs)
                finally:
                    own[_name] += clock() - start

            setattr(sched, name, timed)
        arrivals: dict[int, list] = {}
        for r in trace["requests"]:
            arrivals.setdefault(r["arrival_step"], []).append(r)
        aborts: dict[int, list] = {}
        for a in trace["aborts"]:
            aborts.setdefault(a["step"], []).append(a["request"])
        stops: dict[int, list] = {}
        for s in trace["stops"]:
            stops.setdefault(s["step"], []).append(s["seq"])
        unfinished: set[str] = set()
        last = max([r["arrival_step"] for r in trace["requests"]] or [0])
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
