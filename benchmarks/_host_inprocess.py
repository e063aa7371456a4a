"""Run by bench_wire.py (and bench_targets.py) with a target venv's Python (no kvsched there): the
host side of the wire, in process, CPU time (``time.process_time``), no pipes.

    python _host_inprocess.py TRACES.json HOSTS_DIR MODULE:CLASS[:ARG] ROUNDS
    (ROUNDS 0: a round for each line read from stdin, its JSON line printed)

Drives the host's engine class over the traces in four ways, round by round, interleaved:

* ``engine``: ``reset`` and the step loop calling the engine's methods directly (what the target
  costs with no protocol at all); ``reset`` is also reported alone;
* ``own``: the same loop, timing only the target's own scheduler calls (vLLM V1:
  ``schedule`` + ``update_from_output``; nano-vllm: ``schedule`` + ``postprocess``);
* ``snapshots``: ``engine`` plus the snapshot dicts the observed protocol asks for (before a step
  that added or aborted, mid-step, after), so their cost is ``snapshots - engine``;
* ``serve``/``serve_observed``: `kvsched_host.serve` itself reading the very messages the runner
  sends (``reset``, then ``steps`` of 64 steps until the host says ``ended``), and
  writing its answer lines into a sink, unchecked and observed (mid-step snapshots on). The
  host's protocol cost is ``serve - engine`` (and ``serve_observed - snapshots``).

Prints one JSON line: CPU seconds per way (median over rounds) and the engine-steps run.
"""

from __future__ import annotations

import importlib
import json
import statistics
import sys
import time

clock = time.process_time
OWN = {"V1Engine": ("schedule", "update_from_output"), "NanoEngine": ("schedule", "postprocess")}


def _by_step(trace: dict):
    arrivals: dict[int, list] = {}
    for r in trace["requests"]:
        arrivals.setdefault(r["arrival_step"], []).append({k: v for k, v in r.items() if k != "arrival_step"})
    aborts: dict[int, list] = {}
    for a in trace["aborts"]:
        aborts.setdefault(a["step"], []).append(a["request"])
    stops: dict[int, list] = {}
    for s in trace["stops"]:
        stops.setdefault(s["step"], []).append(s["seq"])
    last = max([r["arrival_step"] for r in trace["requests"]] or [0])
    return arrivals, aborts, stops, last


def loop(engine, traces, observe: bool, own: dict | None = None) -> tuple[float, float, int]:
    """(CPU seconds of the whole loop, of its resets, engine-steps) calling the engine directly."""
    total = resets = 0.0
    count = [0]
    for trace in traces:
        arrivals, aborts, stops, last = _by_step(trace)
        start = clock()
        engine.reset(trace["config"])
        resets += clock() - start
        if own is not None:
            _time_own(engine, own)
        try:
            _steps(engine, trace, (arrivals, aborts, stops, last), observe, count)
        except Exception:  # noqa: BLE001 - an engine that fails a trace ends it, as the runner does
            pass
        total += clock() - start
    return total, resets, count[0]


def _steps(engine, trace: dict, by_step: tuple, observe: bool, count: list) -> None:
    """One trace's steps as the runner's driver calls them; ``count[0]`` counts the steps begun."""
    arrivals, aborts, stops, last = by_step
    unfinished: set[str] = set()
    for step in range(trace["max_steps"]):
        count[0] += 1
        added, aborted = arrivals.get(step, []), aborts.get(step, [])
        done = []
        for r in added:
            done.append(engine.add_request(r))
            unfinished.add(r["id"])
        done += [engine.abort_request(rid) for rid in aborted]
        if observe and (added or aborted or step == 0):
            engine.snapshot()
        engine.schedule()
        if observe:
            engine.snapshot()
        done += engine.update(sorted(stops.get(step, [])))
        if observe:
            engine.snapshot()
        for f in done:
            if f:
                unfinished.discard(f["request"])
        if step >= last and not unfinished:
            break


def _time_own(engine, own: dict, clock=clock) -> None:
    """Wrap the engine's scheduler methods named in ``own`` to add their time there (also used by
    benchmarks/_v1_inprocess.py, which may pass a wall clock)."""
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


def messages(traces, observe: bool) -> list[list[str]]:
    """Per trace, the lines the runner would send (conformance/wire/client.py `_send_steps`)."""
    out, mid = [], 0
    for trace in traces:
        arrivals, aborts, stops, last = _by_step(trace)
        mid += 1
        lines = [json.dumps({"id": mid, "method": "reset", "params": {"config": trace["config"]}})]
        first, size = 0, 64
        while first < trace["max_steps"]:
            end = min(first + size, trace["max_steps"])
            steps = [{"step": k, "add": arrivals.get(k, []), "abort": aborts.get(k, []), "stopped": sorted(stops.get(k, []))}
                     for k in range(first, end)]
            mid += 1
            lines.append(json.dumps({"id": mid, "method": "steps", "params": {
                "steps": steps, "observe": observe, "mid_step": observe, "last_arrival_step": last, "flush_ms": 1.0}}))  # as the runner sends (client._FLUSH_MS)
            first = end
        out.append(lines)
    return out


class Sink:
    """The host's stdout: counts what it is given and notices the end of a trace."""

    def __init__(self) -> None:
        self.ended = False
        self.bytes = 0
        self.lines = 0

    def write(self, text: str) -> int:
        self.bytes += len(text)
        self.lines += 1
        if '"ended":true' in text or '"error":' in text:  # the runner sends no more steps of this trace
            self.ended = True
        return len(text)

    def flush(self) -> None:
        pass


def serve(host_module, engine, per_trace: list[list[str]], encode: bool = True) -> tuple[float, Sink]:
    """CPU seconds of `kvsched_host.serve` over the messages; ``encode=False``: its answers are
    handed to the sink unencoded (so the JSON encoding's share is the difference)."""
    sink = Sink()
    helper = host_module.kvsched_host
    real_sender = helper._sender
    if not encode:
        def sender(out):
            def write_objects(objs: list) -> None:
                for obj in objs:
                    out.write('"ended":true' if obj.get("result", {}) == {"ended": True} or "error" in obj else "")

            return write_objects

        helper._sender = sender

    def feed():
        for lines in per_trace:
            sink.ended = False
            for line in lines:
                yield line
                if sink.ended:
                    break

    start = clock()
    try:
        helper.serve(engine, "bench", stdin=feed(), stdout=sink)
    finally:
        helper._sender = real_sender
    return clock() - start, sink


def main() -> None:
    traces = json.loads(open(sys.argv[1]).read())
    sys.path.insert(0, sys.argv[2])
    module_name, cls_name, *arg = sys.argv[3].split(":")
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    module = importlib.import_module(module_name)
    engine = getattr(module, cls_name)(*arg)
    plain, observed = messages(traces, False), messages(traces, True)
    loop(engine, traces[:5], True)  # warm up

    def one_round() -> dict:
        seconds, sizes = {}, {}
        seconds["engine"], seconds["reset"], steps = loop(engine, traces, False)
        own = dict.fromkeys(OWN[cls_name], 0.0)
        loop(engine, traces, False, own)
        seconds["own"] = sum(own.values())
        seconds["snapshots"] = loop(engine, traces, True)[0]
        seconds["serve"], sink = serve(module, engine, plain)
        sizes["serve"] = sink.bytes
        seconds["serve_observed"], sink = serve(module, engine, observed)
        sizes["serve_observed"] = sink.bytes
        seconds["serve_observed_unencoded"] = serve(module, engine, observed, encode=False)[0]
        return {"steps": steps, "seconds": seconds, "bytes": sizes}

    if rounds == 0:  # one round per line read from stdin (bench_wire.py interleaves them with its own)
        for _ in sys.stdin:
            print(json.dumps(one_round()), flush=True)
        return
    runs = [one_round() for _ in range(rounds)]
    print(json.dumps({"steps": runs[0]["steps"], "bytes": runs[0]["bytes"],
                      "seconds": {k: statistics.median(r["seconds"][k] for r in runs) for k in runs[0]["seconds"]}}))


if __name__ == "__main__":
    main()
