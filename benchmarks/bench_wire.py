"""Benchmark (issue 18, part 3): where the wire's cost per step goes, on each side, CPU time.

    python benchmarks/bench_wire.py --target vllm-v1 [--traces 100] [--seed 0] [--rounds 3]
    python benchmarks/bench_wire.py --target nano-vllm ...

On the target's seeded traces (its registered strategy), unchecked (no snapshots) and with every
`safety` invariant checked, rounds interleaved, median. CPU clocks (`time.process_time` in each
process, the host's from /proc/PID/task/*/schedstat), so that a loaded machine (8 agents on 2
cores) slows every figure alike instead of adding its waits to one of them.

Host side (benchmarks/_host_inprocess.py, in the target's venv, no pipes):
  engine        the host's engine class driven directly: the target's own calls, the host's
                translation, and ``reset`` (the engine built per trace) — what the target costs;
  own           the target's own scheduler calls only (vLLM: schedule + update_from_output);
  snapshots     the snapshot dicts an observed run asks for (``snapshots - engine``);
  protocol      `kvsched_host.serve` reading the runner's messages and writing its lines, minus
                the engine (and snapshot dicts) it drives: decode, diff, encode;
  pipe          the host's CPU over the real pipe minus the in-process serve: syscalls, wake-ups.
Runner side (this process):
  driver        `run_checked` over an adapter that replays the answers already decoded: the
                checker and the driver, which an in-process target costs too;
  decode        the `WireAdapter` fed the host's recorded lines by a stand-in host, minus the
                driver: JSON decode, Snapshot/SchedulerOutput construction, the batching logic;
  pipe          the runner's CPU over the real pipe minus that: the reader thread, the queue
                hand-off, the pipe reads.
The wire's cost per step is host protocol + host pipe + runner decode + runner pipe (CPU), and,
by wall clock, the time over the wire minus the engine and the driver.
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from conformance.targets import _TARGET_LIST
from conformance.wire.client import result_of

ROOT = Path(__file__).resolve().parents[1]
TARGETS_DIR = Path(os.environ.get("KVSCHED_TARGETS_DIR", Path.home() / ".cache/kvsched/targets"))
ENGINES = {"vllm-v1": "vllm_v1_host:V1Engine", "nano-vllm": "nano_vllm_host:NanoEngine:nanovllmnpu"}


def host_cpu(pid: int) -> float:
    """CPU seconds of every thread of ``pid`` (nanoseconds in schedstat: no 10 ms ticks)."""
    return sum(int(open(f).read().split()[0]) for f in glob.glob(f"/proc/{pid}/task/*/schedstat")) / 1e9


class Recorder:
    """Wraps a wire adapter's host and methods for one pass: the host's lines (for `LineHost`) and
    the adapter's decoded answers (for `ReplayAdapter`), in order."""

    def __init__(self, adapter) -> None:
        self.adapter, self.lines, self.sent, self.answers, self.copies = adapter, [], [], [], {}
        host = adapter.host
        receive, send = host.receive, host.send

        def recorded_receive(mid, method, timeout):
            msg = receive(mid, method, timeout)
            self.lines.append(json.dumps(msg, separators=(",", ":")))
            return msg

        def recorded_send(method, params):
            mid = send(method, params)
            self.sent.append(mid)
            return mid

        host.receive, host.send = recorded_receive, recorded_send
        for name in ("reset", "add_request", "abort_request", "schedule", "update", "snapshot"):
            method = getattr(adapter, name)

            def wrapped(*args, _method=method, _name=name):
                if _name == "reset":
                    self.answers.append([])  # one list of answers per trace
                try:
                    value = _method(*args)
                except Exception as err:
                    self.answers[-1].append(err)  # replayed as the same failure
                    raise
                if _name != "reset":
                    self.answers[-1].append(_copy(value, self.copies) if _name == "snapshot" else value)
                return value

            setattr(self, name, wrapped)

    def __getattr__(self, name):
        return getattr(self.adapter, name)


class LineHost:
    """A stand-in `HostProcess` that answers with recorded lines, decoded as the real one does."""

    alive, busy, folds_reset = True, False, True  # recorded after the warm-up trace: resets folded

    def __init__(self, hello, lines, sent) -> None:
        self.hello, self._lines, self._sent = hello, iter(lines), iter(sent)

    def send(self, method, params):
        json.dumps({"id": 0, "method": method, "params": dict(params)})  # what the real send encodes
        return next(self._sent)

    def receive(self, mid, method, timeout):
        return json.loads(next(self._lines))

    def call(self, method, params, timeout):
        self.send(method, params)
        return result_of(self.receive(0, method, timeout), method)


def _copy(snap, copies: dict):
    """A fresh copy of a snapshot (a checked one carries its mark), whose ``base`` is the copy of
    its base: the chain the checks follow stays within the copies."""
    fresh = copy.copy(snap)
    fresh.__dict__.pop("_kvsched_checked", None)
    if snap.base is not None:
        object.__setattr__(fresh, "base", copies.get(id(snap.base), snap.base))
    copies[id(snap)] = fresh
    return fresh


class ReplayAdapter:
    """The answers a run decoded, handed back in order: the driver and checker alone."""

    def __init__(self, wire, answers) -> None:
        self.name, self.profiles, self.capabilities = wire.name, wire.profiles, wire.capabilities
        self.reservation = wire.reservation
        # fresh copies of the snapshots: a checked one carries its mark (normalize.check_snapshot)
        copies: dict[int, object] = {}
        self._traces = iter([[_copy(a, copies) if hasattr(a, "seqs") else a for a in trace] for trace in answers])
        self._next = iter(())

    def reset(self, config):
        self._next = iter(next(self._traces))

    def _take(self, *args):
        value = next(self._next)
        if isinstance(value, Exception):
            raise value
        return value

    add_request = abort_request = schedule = update = snapshot = _take


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", choices=sorted(ENGINES), default="vllm-v1")
    ap.add_argument("--traces", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    target = next(t for t in _TARGET_LIST if t.name == args.target)
    python = TARGETS_DIR / args.target / "venv" / "bin" / "python"
    if not python.exists():
        sys.exit(f"bench_wire: {args.target} is not installed (kvsched targets install {args.target})")
    corpus = sample_traces(target.strategy(), args.traces, args.seed)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([t.to_dict() for t in corpus], f)
    env = {**os.environ, "KVSCHED_TARGET_DIR": str(TARGETS_DIR / args.target), "VLLM_TARGET_DEVICE": "cpu"}
    start_load = os.getloadavg()[0]
    inproc = subprocess.Popen(
        [str(python), str(ROOT / "benchmarks/_host_inprocess.py"), f.name, str(ROOT / "conformance/targets/hosts"),
         ENGINES[args.target], "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env)
    host_rounds = []

    def host_round() -> None:  # one in-process round of the host, between the runner's own
        assert inproc.stdin is not None and inproc.stdout is not None
        inproc.stdin.write("\n")
        inproc.stdin.flush()
        host_rounds.append(json.loads(inproc.stdout.readline()))

    wire = load_adapter(args.target)
    safety = get_profile("safety").invariants()
    checks = {"unchecked": [], "safety": safety}
    run_checked(wire, corpus[0], safety, timeout=60)  # warm up: the host starts, the engine imports

    def each(adapter, invariants):
        return sum(len(run_checked(adapter, t, invariants, timeout=60, stop_at_first=False).records) for t in corpus)

    recorded = {}
    for name, invariants in checks.items():
        host_before = wire.host
        recorder = Recorder(wire)
        each(recorder, invariants)
        recorded[name] = recorder
        for method in ("receive", "send"):  # the class's own again
            host_before.__dict__.pop(method, None)
        if wire.host is not host_before:
            sys.exit(f"bench_wire: the {args.target} host was restarted while recording ({name}); its stderr: "
                     + " | ".join(list(host_before.stderr_tail)[-3:]))
    runs: dict[tuple[str, str], list[float]] = {}
    steps = {}
    for _ in range(args.rounds):
        host_round()
        for name, invariants in checks.items():
            pid = wire.host.proc.pid
            h0, c0, w0 = host_cpu(pid), time.process_time(), time.perf_counter()
            steps[name] = each(wire, invariants)
            wall, runner, host_side = time.perf_counter() - w0, time.process_time() - c0, host_cpu(pid) - h0
            for key, value in (("wall", wall), ("runner", runner), ("host", host_side)):
                runs.setdefault((name, key), []).append(value / steps[name])
            rec = recorded[name]
            real = wire.host
            wire.host = LineHost(real.hello, rec.lines, rec.sent)
            c0 = time.process_time()
            each(wire, invariants)
            runs.setdefault((name, "lines"), []).append((time.process_time() - c0) / steps[name])
            wire.host = real
            c0 = time.process_time()
            for line in rec.lines:
                json.loads(line)
            runs.setdefault((name, "json"), []).append((time.process_time() - c0) / steps[name])
            replay = ReplayAdapter(wire, rec.answers)
            c0 = time.process_time()
            each(replay, invariants)
            runs.setdefault((name, "driver"), []).append((time.process_time() - c0) / steps[name])
    inproc.stdin.close()
    inproc.wait()
    host = {"steps": host_rounds[0]["steps"], "bytes": host_rounds[0]["bytes"]}
    # Each round's figures and ratios first, then their medians: the load moves every CPU figure
    # between rounds (other processes' cache and SMT pressure, a VM's steal), less so a ratio
    # within one round.
    per_round = [_round_parts(host_rounds[r], {k: v[r] * 1e6 for k, v in runs.items()}, host["steps"])
                 for r in range(args.rounds)]
    fig = {key: statistics.median(r[key] for r in per_round) for key in per_round[0]}
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}; "
          f"load {start_load:.1f} -> {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"target {args.target}: {len(corpus)} traces (seed {args.seed}), {steps['unchecked']} steps over the wire "
          f"({host['steps']} in process); rounds {args.rounds} interleaved, median of each round's figure, CPU "
          f"us/step unless wall")
    print(f"  target's own step {fig['own']:.1f}; host engine (own + translation + reset {fig['reset']:.1f}) "
          f"{fig['engine']:.1f}; snapshot dicts {fig['snapshot dicts']:.1f}")
    for name in checks:
        print(f"  {name:9s} " + ", ".join(f"{k} {fig[(name, k)]:.1f}" for k in PARTS)
              + f"; driver {fig[(name, 'driver')]:.1f}; JSON in that: {fig[(name, 'json')]:.1f}")
        print(f"  {name:9s} wire CPU {fig[(name, 'cpu')]:.1f} us/step = {fig[(name, 'cpu/own')]:.2f}x the target's own "
              f"step, {fig[(name, 'cpu/engine')]:.2f}x the host engine; wall over the wire {fig[(name, 'wall')]:.1f}, "
              f"minus engine and driver {fig[(name, 'wall cost')]:.1f} = {fig[(name, 'wall cost/own')]:.2f}x own")
    print(json.dumps({"target": args.target, "figures": {str(k): v for k, v in fig.items()}, "bytes": host["bytes"]}))


PARTS = ("host protocol", "host pipe", "runner decode", "runner pipe")


def _round_parts(host_round: dict, runner: dict, steps: int) -> dict:
    """One round's figures (µs per step) and ratios: the host's in-process run and the runner's."""
    h = {k: v / steps * 1e6 for k, v in host_round["seconds"].items()}
    out = {"own": h["own"], "engine": h["engine"], "reset": h["reset"], "snapshot dicts": h["snapshots"] - h["engine"]}
    for name in ("unchecked", "safety"):
        in_proc = h["serve" if name == "unchecked" else "serve_observed"]
        base = h["engine"] if name == "unchecked" else h["snapshots"]
        parts = {"host protocol": in_proc - base, "host pipe": runner[(name, "host")] - in_proc,
                 "runner decode": runner[(name, "lines")] - runner[(name, "driver")],
                 "runner pipe": runner[(name, "runner")] - runner[(name, "lines")]}
        out.update({(name, k): v for k, v in parts.items()})
        cpu = sum(parts.values())
        wall = runner[(name, "wall")] - h["engine"] - runner[(name, "driver")]
        encode = h["serve_observed"] - h["serve_observed_unencoded"] if name == "safety" else 0.0
        out.update({(name, "cpu"): cpu, (name, "cpu/own"): cpu / h["own"], (name, "cpu/engine"): cpu / h["engine"],
                    (name, "wall"): runner[(name, "wall")], (name, "wall cost"): wall,
                    (name, "wall cost/own"): wall / h["own"], (name, "driver"): runner[(name, "driver")],
                    (name, "json"): runner[(name, "json")] + encode})
    return out

if __name__ == "__main__":
    main()
