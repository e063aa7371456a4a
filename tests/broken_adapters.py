"""Adapters that misbehave, for the runner's own tests (importable as ``broken_adapters:NAME``)."""

from __future__ import annotations

import time

from conformance.runner.adapter import SchedulerAdapter
from conformance.selftest.mutants import MUTANTS
from reference_impl import Scheduler
from spec.observation import Capability


def _mutant(name: str, profiles: tuple[str, ...]) -> SchedulerAdapter:
    return SchedulerAdapter(name, MUTANTS[name].factory, profiles=profiles)


def fork_without_incref() -> SchedulerAdapter:  # safety
    return _mutant("fork-without-incref", ("safety",))


def victim_from_head() -> SchedulerAdapter:  # policy (claims the reference's policy)
    return _mutant("victim-from-head", ("vllm-v0",))


def never_fits_waits() -> SchedulerAdapter:  # liveness
    return _mutant("never-fits-waits-forever", ("liveness",))


def outputs_only() -> SchedulerAdapter:
    """A correct scheduler that exposes only its outputs: state invariants are not applicable."""
    return SchedulerAdapter("outputs-only", Scheduler, profiles=("safety",),
                            capabilities=frozenset({Capability.OUTPUT}))


class _Faulty(SchedulerAdapter):
    def __init__(self, name: str, at_step: int = 2) -> None:
        super().__init__(name, Scheduler, profiles=("safety",))
        self.at_step = at_step

    def schedule(self):
        out = super().schedule()
        if out.step == self.at_step:
            return self.fault(out)
        return out

    def fault(self, out):
        raise NotImplementedError


class _Raises(_Faulty):
    def fault(self, out):
        raise RuntimeError("scheduler exploded")


class _Hangs(_Faulty):
    def fault(self, out):
        time.sleep(3600)


class _Garbage(_Faulty):
    def fault(self, out):
        return {"scheduled": "everything"}


def raises() -> SchedulerAdapter:
    return _Raises("raises")


def hangs() -> SchedulerAdapter:
    return _Hangs("hangs")


def garbage() -> SchedulerAdapter:
    return _Garbage("garbage")
