"""kvsched as a judge of a mutant: the lockstep campaigns, on fixed traces, against a baseline.

Each target gets one fixed list of seeded traces (`suite`: every path of
`conformance.selftest.campaigns.lockstep_v1` / `lockstep_async`, in turn). The unmutated engine runs them
once (`KvschedJudge.baseline`); a mutant runs the same traces, in the same order, and is killed
by the first trace whose outcome differs from the baseline's on that trace (`signature`: the
first divergence step and field, the problems found). So a mutant is never killed by a finding
the unmutated target also has on the same trace (a known deviation such as the chunk clamp),
only by one it does not have, or has at another step or of another kind.

Verdicts: ``killed`` (a new finding), ``timeout`` (the new finding is a hang, confirmed on a
fresh host with ten times the cap), ``crash-at-import``
(the host never said hello: the mutated module does not import), ``survived`` (every trace
matched the baseline), ``survived-budget`` (the time cap ended the run first).
"""

from __future__ import annotations

import time
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

        return run_one(adapter, trace, get_profile("vllm-v1").invariants(), timeout=timeout)


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


def signature(outcome) -> dict[str, Any]:
    """What a run found, in the terms that must match the baseline's for the mutant to survive."""
    result = outcome.result
    return {"step": outcome.divergence_step, "field": outcome.field,
            "problems": sorted(result.problem_ids), "steps": len(result.records)}


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
            return [signature(self.flavour.run_one(adapter, t)) for t in self.traces]
        finally:
            close(adapter)

    def judge(self, overlay: dict[str, str], baseline: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        started = time.monotonic()
        adapter = self.adapter(overlay)
        try:
            try:
                adapter.start()
            except Exception as err:  # noqa: BLE001 - the mutated module did not import
                return {"verdict": "crash-at-import", "message": str(err)[-400:], "traces_run": 0,
                        "seconds": round(time.monotonic() - started, 1)}
            for index, trace in enumerate(self.traces):
                outcome = self.flavour.run_one(adapter, trace, self.call_timeout)
                got = signature(outcome)
                hung = _hung(outcome)
                if hung:
                    # Confirm on a fresh host with ten times the time: on a machine shared with
                    # other work a starved reset (vLLM builds a ModelConfig per max_model_len)
                    # can outlast the cap without any hang in the mutant.
                    close(adapter)
                    adapter = self.adapter(overlay)
                    adapter.timeout = self.call_timeout * 10
                    outcome = self.flavour.run_one(adapter, trace, self.call_timeout * 10)
                    adapter.timeout = self.call_timeout
                    got, hung = signature(outcome), _hung(outcome)
                if got != baseline[index]:
                    return {"verdict": "timeout" if hung else "killed", "trace": index, "found": got,
                            "baseline": baseline[index], "message": describe(outcome), "traces_run": index + 1,
                            "seconds": round(time.monotonic() - started, 1)}
                if time.monotonic() - started > seconds:
                    return {"verdict": "survived-budget", "traces_run": index + 1,
                            "seconds": round(time.monotonic() - started, 1)}
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
