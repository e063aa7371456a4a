"""kvsched as a judge of a mutant: the lockstep campaigns, on fixed traces, against a baseline.

Each judge (`judges`: one per lockstep campaign and host) gets one fixed list of seeded traces
(`suite`: every path of its campaign in turn): synchronous (`lockstep_v1`), pipelined
(`lockstep_async`), speculative (`lockstep_specdec`), hybrid KV cache groups
(`lockstep_hybrid`, synchronous and pipelined), the scripted KV connector (`lockstep_connector`)
and the other budgets: encoder inputs, LoRA, pause and grammar waits (`lockstep_budgets`). The unmutated engine runs them once
(`KvschedJudge.baseline`): what it finds on each trace (`findings`: every invariant violation,
divergence, state mismatch and fault, each with its step and, for a fault, its location) is that
trace's expectation, with its where. Runs go on past a violation (`stop_at_first=False`), so a
finding the unmutated engine already has hides nothing after it. A mutant runs the same traces,
in the same order, and is killed by a finding the expectation does not hold: a new problem, the
same problem at another step or place, or more often (`new_findings`). Findings the mutant
*lacks* kill nothing: kvsched in a user's CI would read those as fixes.

Verdicts: ``killed`` with a ``kind``: ``oracle`` (a new invariant violation, lockstep divergence
or state mismatch), ``crash`` (only new exceptions raised inside the engine) or ``timeout`` (a
hang, confirmed on a fresh host with ten times the cap); a crash does not end the judge, which
goes on to look for an oracle kill on the next traces (until the engine has raised on
`CRASH_TRACES` of them) and judges. ``crash-at-import`` (the host
never said hello: the mutated module does not import), ``survived`` (nothing new on any trace),
``survived-budget`` (the time cap ended the run first).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.selftest.mutation.forks import ForkServer, read_cpu
from conformance.targets import HOSTS_DIR, get_target
from conformance.wire import WireAdapter, WireError
from spec.trace import Trace

V1_PATHS = ("default", "chunked", "prefix", "chunked+prefix")
CONNECTOR_PATHS = ("remote-sync", "remote-async", "offload", "fail-recompute", "fail-fail", "delayed-free")
CONNECTOR_SPEC_PATHS = tuple(f"{p}+spec" for p in CONNECTOR_PATHS)
ASYNC_CONNECTOR_PATHS = tuple(f"async-{p}" for p in CONNECTOR_PATHS)
BUDGETS_PATHS = ("encoder", "lora", "pause", "mixed", "grammar", "streaming", "streaming-pause", "streaming-mixed")
ASYNC_BUDGETS_PATHS = ("async-mixed", "async-grammar", "async-streaming", "async-streaming-mixed")
# A judge that has seen the engine raise on this many traces stops looking for an oracle kill in
# its suite (the next judge still looks in its own): each crashed trace costs a fresh host.
CRASH_TRACES = 5


@dataclass(frozen=True)
class Flavour:
    """One kvsched judge: a lockstep campaign's traces on one target, its reference run and its
    invariants. ``strategy(path)`` draws a trace of one of ``paths``; ``run(adapter, trace,
    timeout)`` runs it in lockstep and returns the campaign's `Outcome`, going on past an
    invariant violation (``stop_at_first=False``: what the baseline finds is expected with its
    where, and anything after it still counts)."""

    name: str  # results key ``kvsched:<name>``
    target: str  # the target whose host it drives
    paths: tuple[str, ...]
    traces: int  # per mutant, by default (the bench's ``--judge-traces NAME=N``)
    campaign: str  # the lockstep campaign whose traces and comparisons it uses
    strategy: Callable[[str], Any]
    run: Callable[..., Any]

    def run_one(self, adapter, trace: Trace, timeout: float = 60.0):
        return self.run(adapter, trace, timeout)


def _strategy_of(module: str) -> Callable[[str], Any]:
    """The path strategy of a campaign (or generator) module, imported when a trace is drawn: a
    judge's module is imported only by a bench that uses that judge."""

    def strategy(path: str):
        return importlib.import_module(module).path_strategy(path)

    return strategy


_async_strategy = _strategy_of("conformance.generation.async_paths")
_hybrid_strategy = _strategy_of("conformance.selftest.campaigns.lockstep_hybrid")
_connector_strategy = _strategy_of("conformance.selftest.campaigns.lockstep_connector")
_budgets_strategy = _strategy_of("conformance.selftest.campaigns.lockstep_budgets")


def _v1_strategy(path: str):
    from conformance.selftest.campaigns.lockstep_v1 import path_strategy

    return path_strategy(path, optional_calls=True)  # batched aborts, resets (issue 21)


def _v1_run(adapter, trace: Trace, timeout: float):
    from conformance.selftest.campaigns.lockstep_v1 import run_one

    return run_one(adapter, trace, get_profile("vllm-v1").invariants(), timeout=timeout, stop_at_first=False)


def _async_run(adapter, trace: Trace, timeout: float):
    from conformance.selftest.campaigns.lockstep_async import run_one

    return run_one(adapter, trace, get_profile("safety").invariants(), timeout=timeout)


def _specdec_strategy(path: str):
    from conformance.selftest.campaigns.lockstep_specdec import path_traces

    return path_traces(path)


def _specdec_run(adapter, trace: Trace, timeout: float):
    from conformance.selftest.campaigns.lockstep_specdec import RecordingAsyncSpec, run_one

    return run_one(adapter, trace, get_profile("safety").invariants(), RecordingAsyncSpec)


def _hybrid_run(adapter, trace: Trace, timeout: float):
    from conformance.selftest.campaigns.lockstep_hybrid import run_one

    # The campaign's own profiles: safety for the synchronous paths, async for the pipelined ones.
    profile = "async" if trace.config.pipeline_depth > 0 else "safety"
    return run_one(adapter, trace, get_profile(profile).invariants(), timeout=timeout, stop_at_first=False)


def _connector_run(adapter, trace: Trace, timeout: float):
    """A connector path's trace against its reference in vLLM's terms (`lockstep_connector.reference_of`:
    pipelined or not, drafts or not, read from the trace's config)."""
    from conformance.selftest.campaigns import lockstep_async, lockstep_v1
    from conformance.selftest.campaigns.lockstep_connector import reference_of

    pipelined, drafts = trace.config.pipeline_depth > 0, trace.config.num_speculative_tokens > 0
    reference = reference_of(("async-" if pipelined else "") + "path" + ("+spec" if drafts else ""))
    invariants = get_profile("connector").invariants()
    if pipelined:  # (the pipelined lockstep always runs on past a violation)
        return lockstep_async.run_one(adapter, trace, invariants, reference=reference, timeout=timeout)
    return lockstep_v1.run_one(adapter, trace, invariants, reference=reference, timeout=timeout, stop_at_first=False)


def _budgets_run(adapter, trace: Trace, timeout: float):
    from conformance.selftest.campaigns.lockstep_budgets import run_one

    # the campaign's profiles: async for its pipelined paths, vllm-v1 for the others
    profile = "async" if trace.config.pipeline_depth > 0 else "vllm-v1"
    return run_one(adapter, trace, get_profile(profile).invariants(), timeout=timeout, stop_at_first=False)


def _async_paths() -> tuple[str, ...]:
    from conformance.generation.async_paths import PATHS

    return tuple(PATHS)


def _hybrid_paths(pipelined: bool) -> tuple[str, ...]:
    from conformance.selftest.campaigns.lockstep_hybrid import PATHS, SYNC_PATHS

    return tuple(p for p in PATHS if p not in SYNC_PATHS) if pipelined else tuple(SYNC_PATHS)


def judges() -> tuple[Flavour, ...]:
    """Every kvsched judge, one per lockstep campaign (and host). To add one (a connector or an
    encoder-cache campaign), append a `Flavour` here with the campaign's path strategy and a run
    that goes on past a violation; the bench picks it up (``--judge-traces NAME=N``, results key
    ``kvsched:NAME``, its own pristine baseline), nothing else changes."""
    return (
        Flavour("vllm-v1", "vllm-v1", V1_PATHS, 100, "lockstep_v1", _v1_strategy, _v1_run),
        Flavour("vllm-v1-async", "vllm-v1-async", _async_paths(), 40, "lockstep_async", _async_strategy, _async_run),
        # The async scheduler with speculative decoding (path ``async``): the only campaign that
        # reaches a stale step's draft rollback (vLLM's output_is_stale).
        Flavour("vllm-v1-async+specdec", "vllm-v1-async", ("async",), 20, "lockstep_specdec", _specdec_strategy,
                _specdec_run),
        # Hybrid KV cache groups (HYB-001..008): full attention beside sliding-window, Mamba and
        # chunked local groups, synchronous and pipelined (conformance/targets/hosts/vllm_hybrid_groups.py).
        Flavour("vllm-v1-hybrid", "vllm-v1", _hybrid_paths(False), 50, "lockstep_hybrid", _hybrid_strategy,
                _hybrid_run),
        Flavour("vllm-v1-async+hybrid", "vllm-v1-async", _hybrid_paths(True), 20, "lockstep_hybrid",
                _hybrid_strategy, _hybrid_run),
        # The scripted KV connector (KVC-*): remote loads sync and async, offloading, failed loads
        # under both policies, delayed frees (conformance/targets/hosts/vllm_kv_connector.py).
        # Its paths are named, not read from the campaign: a path the campaign gains (the pipelined
        # ones need the async host) changes this judge's suite only when added here.
        # With drafts too (the +spec paths, k in 1..4 beside the connector).
        Flavour("vllm-v1-connector", "vllm-v1", (*CONNECTOR_PATHS, *CONNECTOR_SPEC_PATHS), 48, "lockstep_connector",
                _connector_strategy, _connector_run),
        # The same paths without drafts on the AsyncScheduler (the vllm-v1-async host, depth 1).
        Flavour("vllm-v1-async+connector", "vllm-v1-async", ASYNC_CONNECTOR_PATHS, 18, "lockstep_connector",
                _connector_strategy, _connector_run),
        # Encoder inputs, LoRA, pause, grammar waits and streaming sessions (ENC-*, LORA-001, PAU-001,
        # GRM-*, SES-*; conformance/targets/hosts/vllm_budgets.py).
        Flavour("vllm-v1-budgets", "vllm-v1", BUDGETS_PATHS, 48, "lockstep_budgets", _budgets_strategy, _budgets_run),
        # The same on the AsyncScheduler (the vllm-v1-async host, depth 1): encoder inputs, adapters and a
        # pause together, grammar waits, sessions, and everything together.
        Flavour("vllm-v1-async+budgets", "vllm-v1-async", ASYNC_BUDGETS_PATHS, 16, "lockstep_budgets",
                _budgets_strategy, _budgets_run),
    )


JUDGE_NAMES = tuple(j.name for j in judges())
TARGET_OF = {j.name: j.target for j in judges()}


def flavour(name: str) -> Flavour:
    for j in judges():
        if j.name == name:
            return j
    raise KeyError(f"no kvsched judge {name!r} (known: {', '.join(JUDGE_NAMES)})")


def suite(target: str, count: int, seed: int) -> list[Trace]:
    """``count`` traces spread over the target's paths, the same for the same seed."""
    f = flavour(target)
    per = -(-count // len(f.paths))
    drawn = [sample_traces(f.strategy(path), per, seed + i) for i, path in enumerate(f.paths)]
    out: list[Trace] = []
    for row in range(per):  # interleave the paths: a time cap still sees every path
        out += [d[row] for d in drawn if row < len(d)]
    return out[:count]


def findings(outcome) -> dict[str, Any]:
    """What a run found, each with its where: ``[id, step, where]`` per invariant violation (step
    -1: at the end of the run), lockstep divergence (``LOCKSTEP``, the field), state or token
    mismatch (``STATE``, the field) and fault (``FAULT-<kind>``, its location)."""
    result = outcome.result
    found = [[v.invariant_id, -1 if v.step is None else v.step, ""] for v in result.violations]
    if result.divergence is not None:
        found.append(["LOCKSTEP", result.divergence.step, str(result.divergence.field)])
    if outcome.state is not None:
        found.append(["STATE", outcome.state[0], str(outcome.state[1])])
    if result.fault is not None:
        step = result.fault_step if result.fault_step is not None else len(result.records)
        found.append([f"FAULT-{result.fault.kind}", step, str(getattr(result.fault, "location", "") or "")])
    return {"findings": sorted(found), "steps": len(result.records)}


def new_findings(got: dict[str, Any], expected: dict[str, Any]) -> list[list]:
    """The findings of ``got`` that the expectation ``expected`` (the unmutated run) does not hold,
    counted: one the baseline has twice at a step is new the third time."""
    allowed = Counter(tuple(f) for f in expected["findings"])
    out = []
    for f in got["findings"]:
        key = tuple(f)
        if allowed[key] > 0:
            allowed[key] -= 1
        else:
            out.append(f)
    return out


def kind_of(new: list[list]) -> str:
    """``oracle`` when a new finding is the checker's (an invariant, LOCKSTEP, STATE), ``timeout``
    for a hang, else ``crash`` (an exception inside the engine)."""
    ids = {f[0] for f in new}
    if any(not i.startswith("FAULT-") for i in ids):
        return "oracle"
    return "timeout" if "FAULT-hang" in ids else "crash"


def describe(outcome) -> str:
    try:
        return outcome.describe()[:400]
    except Exception as err:  # noqa: BLE001 - a description is for the report only
        return f"(no description: {err})"


class KvschedJudge:
    """Runs the fixed traces of one target through a host whose vLLM may be mutated."""

    def __init__(self, server: ForkServer, name: str, traces: list[Trace], *, call_timeout: float = 60.0) -> None:
        self.flavour = flavour(name)
        self.server, self.target, self.traces = server, get_target(self.flavour.target), traces
        self.call_timeout = call_timeout

    def adapter(self, overlay: dict[str, str], cpu_file: Path | None = None) -> WireAdapter:
        env = {**self.target.env, "KVSCHED_TARGET_DIR": str(self.target.root)}
        command = self.server.command("host", [str(HOSTS_DIR / self.target.host), *self.target.host_args],
                                      overlay=overlay, env=env, cpu_file=cpu_file)
        adapter = WireAdapter(self.target.name, command, profiles=self.target.profiles, timeout=self.call_timeout,
                              start_timeout=120.0, trace_strategy=self.target.strategy)
        adapter.domain = self.target.domain
        if self.target.lookahead_tokens:
            from spec.reservation import Reservation

            adapter.reservation = Reservation(lookahead_tokens=self.target.lookahead_tokens)
        return adapter

    def baseline(self) -> list[dict[str, Any]]:
        adapter = self.adapter({})
        try:
            return [findings(self.flavour.run_one(adapter, t)) for t in self.traces]
        finally:
            close(adapter)

    def judge(self, overlay: dict[str, str], baseline: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        """One mutant's verdict, with its cost: ``runner_cpu_seconds`` (this thread: the traces,
        the reference, the checks) and ``engine_cpu_seconds`` (the hosts, as they report it on
        exit; a host killed at a hang reports nothing)."""
        cpu, fd_path = time.thread_time(), tempfile.mkstemp(prefix="kvsched-judge-", suffix=".cpu")
        os.close(fd_path[0])
        cpu_file = Path(fd_path[1])
        try:
            verdict = self._judge(overlay, baseline, seconds, cpu_file)
        finally:
            engine = read_cpu(cpu_file)
            cpu_file.unlink(missing_ok=True)
        return {**verdict, "runner_cpu_seconds": round(time.thread_time() - cpu, 1), "engine_cpu_seconds": engine}

    def _judge(self, overlay: dict[str, str], baseline: list[dict[str, Any]], seconds: float,
               cpu_file: Path) -> dict[str, Any]:
        started = time.monotonic()
        adapter = self.adapter(overlay, cpu_file)
        crash: dict[str, Any] | None = None  # the first crash kill, kept while looking for an oracle kill

        def verdict(index: int, new: list[list], kind: str, message: str) -> dict[str, Any]:
            return {"verdict": "killed", "kind": kind, "trace": index, "new": new[:4], "message": message,
                    "traces_run": index + 1, "seconds": round(time.monotonic() - started, 1)}

        try:
            try:
                adapter.start()
            except Exception as err:  # noqa: BLE001 - the mutated module did not import
                return {"verdict": "crash-at-import", "message": str(err)[-400:], "traces_run": 0,
                        "seconds": round(time.monotonic() - started, 1)}
            for index, trace in enumerate(self.traces):
                outcome = self.flavour.run_one(adapter, trace, self.call_timeout)
                if _hung(outcome):
                    # Confirm on a fresh host with ten times the time: on a machine shared with
                    # other work a starved reset (vLLM builds a ModelConfig per max_model_len)
                    # can outlast the cap without any hang in the mutant.
                    close(adapter)
                    adapter = self.adapter(overlay, cpu_file)
                    adapter.timeout = self.call_timeout * 10
                    outcome = self.flavour.run_one(adapter, trace, self.call_timeout * 10)
                    adapter.timeout = self.call_timeout
                new = new_findings(findings(outcome), baseline[index])
                if new:
                    kind = kind_of(new)
                    if kind != "crash":
                        return {**verdict(index, new, kind, describe(outcome)), **({"crash": crash} if crash else {})}
                    if crash is None:
                        crash = verdict(index, new, kind, describe(outcome))
                    crash["crash_traces"] = crash.get("crash_traces", 0) + 1
                    if crash["crash_traces"] >= CRASH_TRACES:  # the crash is all this suite shows of it
                        return {**crash, "traces_run": index + 1, "seconds": round(time.monotonic() - started, 1)}
                    close(adapter)  # the engine raised: the next trace gets a fresh host
                    adapter = self.adapter(overlay, cpu_file)
                if time.monotonic() - started > seconds:
                    if crash is not None:
                        return {**crash, "traces_run": index + 1, "seconds": round(time.monotonic() - started, 1)}
                    return {"verdict": "survived-budget", "traces_run": index + 1,
                            "seconds": round(time.monotonic() - started, 1)}
            if crash is not None:
                return {**crash, "traces_run": len(self.traces), "seconds": round(time.monotonic() - started, 1)}
            return {"verdict": "survived", "traces_run": len(self.traces),
                    "seconds": round(time.monotonic() - started, 1)}
        finally:
            close(adapter)


def _hung(outcome) -> bool:
    fault = outcome.result.fault
    return fault is not None and (fault.kind == "hang" or "hung" in str(fault))


def close(adapter: WireAdapter) -> None:
    """Shut the adapter's host down (each mutant's host is used once). Asked to exit even when the
    wire client still marks it busy after a streamed run (its shutdown would kill it at once), so
    that the host ends by itself and reports its CPU time (`forks.read_cpu`); killed if it does not."""
    host = adapter.host
    if host is None:
        return
    if host.alive:
        try:
            host.call("shutdown", {}, 5)
            host.proc.wait(timeout=5)
        except (WireError, OSError, subprocess.TimeoutExpired):
            pass
    host.shutdown()
