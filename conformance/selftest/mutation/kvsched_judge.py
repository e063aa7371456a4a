"""kvsched as a judge of a mutant: the lockstep campaigns, on fixed traces, against a baseline.

Each judge gets one fixed list of seeded traces (`suite`: every path of
`conformance.selftest.campaigns.lockstep_v1` / `lockstep_async` / `lockstep_specdec`, in turn):
synchronous, pipelined and speculative. The unmutated engine runs them once
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

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.selftest.mutation.forks import ForkServer
from conformance.targets import HOSTS_DIR, get_target
from conformance.wire import WireAdapter
from spec.trace import Trace

V1_PATHS = ("default", "chunked", "prefix", "chunked+prefix")
# A judge name -> the target whose host it drives. ``vllm-v1-async+specdec``: the async scheduler
# with speculative decoding (conformance/selftest/campaigns/lockstep_specdec.py, path ``async``), the only
# campaign that reaches a stale step's draft rollback (vLLM's output_is_stale).
# A judge that has seen the engine raise on this many traces stops looking for an oracle kill in
# its suite (the next judge still looks in its own): each crashed trace costs a fresh host.
CRASH_TRACES = 5
TARGET_OF = {"vllm-v1": "vllm-v1", "vllm-v1-async": "vllm-v1-async", "vllm-v1-async+specdec": "vllm-v1-async"}


@dataclass(frozen=True)
class Flavour:
    """How one target is judged: its traces, its reference run and its invariants."""

    target: str
    paths: tuple[str, ...]

    def strategy(self, path: str):
        if self.target == "vllm-v1-async+specdec":
            from conformance.selftest.campaigns.lockstep_specdec import path_traces

            return path_traces(path)
        if self.target == "vllm-v1-async":
            from conformance.generation.async_paths import path_strategy
        else:
            from conformance.selftest.campaigns.lockstep_v1 import path_strategy

            return path_strategy(path, optional_calls=True)  # batched aborts, resets (issue 21)
        return path_strategy(path)

    def run_one(self, adapter, trace: Trace, timeout: float = 60.0):
        if self.target == "vllm-v1-async+specdec":
            from conformance.selftest.campaigns.lockstep_specdec import RecordingAsyncSpec, run_one

            return run_one(adapter, trace, get_profile("safety").invariants(), RecordingAsyncSpec)
        if self.target == "vllm-v1-async":
            from conformance.selftest.campaigns.lockstep_async import run_one

            return run_one(adapter, trace, get_profile("safety").invariants(), timeout=timeout)
        from conformance.selftest.campaigns.lockstep_v1 import run_one

        return run_one(adapter, trace, get_profile("vllm-v1").invariants(), timeout=timeout, stop_at_first=False)


def flavour(target: str) -> Flavour:
    if target == "vllm-v1-async+specdec":
        return Flavour(target, ("async",))
    if target == "vllm-v1-async":
        from conformance.generation.async_paths import PATHS

        return Flavour(target, PATHS)
    return Flavour(target, V1_PATHS)


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

    def __init__(self, server: ForkServer, target: str, traces: list[Trace], *, call_timeout: float = 60.0) -> None:
        self.server, self.target, self.traces = server, get_target(TARGET_OF[target]), traces
        self.flavour = flavour(target)
        self.call_timeout = call_timeout

    def adapter(self, overlay: dict[str, str]) -> WireAdapter:
        env = {**self.target.env, "KVSCHED_TARGET_DIR": str(self.target.root)}
        command = self.server.command("host", [str(HOSTS_DIR / self.target.host), *self.target.host_args],
                                      overlay=overlay, env=env)
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
        started = time.monotonic()
        adapter = self.adapter(overlay)
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
                    adapter = self.adapter(overlay)
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
                    adapter = self.adapter(overlay)
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
    """Shut the adapter's host down (each mutant's host is used once)."""
    if adapter.host is not None:
        adapter.host.shutdown()
