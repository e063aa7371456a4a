"""Adapters that misbehave in every way a process can, for the isolation tests
(``fault_adapters:NAME``). Each is the reference scheduler until step 2's ``schedule()``, then
does its one bad thing. Run only in a child process the runner owns: several of these would
end or hang the process that calls them."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from dataclasses import replace

from conformance.runner.adapter import SchedulerAdapter
from reference_impl import Scheduler
from spec.observation import SeqView
from spec.types import ScheduledSeq

FAULT_STEP = 2


class _Faulty(SchedulerAdapter):
    def __init__(self, name: str, fault) -> None:
        super().__init__(name, Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities
        self._fault = fault

    def schedule(self):
        out = super().schedule()
        if out.step == FAULT_STEP:
            return self._fault(self, out)
        return out


def _raise(adapter, out):
    raise RuntimeError("scheduler exploded")


def _hang(adapter, out):
    time.sleep(3600)


def _hang_with_sigalrm_blocked(adapter, out):
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(3600)


def _hang_swallowing_everything(adapter, out):
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        try:
            time.sleep(0.01)
        except BaseException:  # noqa: BLE001, S110 - the point: it hides even the runner's own alarm
            pass


def _exit(code):
    def fault(adapter, out):
        sys.exit(code)
    return fault


def _os_exit(adapter, out):
    os._exit(0)


def _segfault(adapter, out):
    ctypes.string_at(0)


def _huge_memory(adapter, out):
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))  # 64 MB, touched (bytearray zero-fills)


def _huge_output(adapter, out):
    line = "x" * 8191
    while True:
        print(line)


def _none_scheduled(adapter, out):
    return replace(out, scheduled=(None,))


def _none_preempted(adapter, out):
    return replace(out, preempted=None)


def _absurd_tokens(adapter, out):
    return replace(out, scheduled=tuple(ScheduledSeq(s.seq_id, s.request_id, 10**30, s.is_prefill) for s in out.scheduled)
                   or (ScheduledSeq("r0#0", "r0", 10**30, False),))


class _NoneInSnapshot(SchedulerAdapter):
    """A snapshot with None where a status must be, from step 2 on."""

    def __init__(self) -> None:
        super().__init__("none-in-snapshot", Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities
        self._steps = 0

    def reset(self, config):
        self._steps = 0  # per trace: a fault that depends on the trace alone, not on what ran before
        return super().reset(config)

    def schedule(self):
        self._steps += 1
        return super().schedule()

    def snapshot(self):
        snap = super().snapshot()
        if self._steps > FAULT_STEP and snap.seqs:
            sid, view = next(iter(snap.seqs.items()))
            seqs = {**snap.seqs, sid: SeqView(view.seq_id, view.request_id, None, view.num_tokens)}  # type: ignore[arg-type]
            return replace(snap, seqs=seqs, base=None, changed_seqs=None)
        return snap


MATRIX = {
    "raises": (_raise, "FAULT-raised"),
    "hangs": (_hang, "FAULT-hang"),
    "sigalrm_blocked": (_hang_with_sigalrm_blocked, "FAULT-hang"),
    "swallows_base_exception": (_hang_swallowing_everything, "FAULT-hang"),
    "exit_0": (_exit(0), "FAULT-exit"),
    "exit_3": (_exit(3), "FAULT-exit"),
    "os_exit": (_os_exit, "FAULT-exit"),
    "segfault": (_segfault, "FAULT-crash"),
    "huge_memory": (_huge_memory, "FAULT-memory"),
    "huge_output": (_huge_output, "FAULT-output"),
    "none_scheduled": (_none_scheduled, "FAULT-malformed"),
    "none_preempted": (_none_preempted, "FAULT-malformed"),
    "absurd_tokens": (_absurd_tokens, "FAULT-malformed"),
}


def _factory(name: str):
    fault, _ = MATRIX[name]
    return lambda: _Faulty(name, fault)


for _name in MATRIX:
    globals()[_name] = _factory(_name)


def none_in_snapshot() -> SchedulerAdapter:
    return _NoneInSnapshot()


class _TwoBugs(SchedulerAdapter):
    """Correct but for two lies: at step 1 it schedules a sequence nobody added (OUT-001), and
    from step 3 on it reports every finished request twice (REQ-001). The first must not hide
    the second."""

    def __init__(self) -> None:
        super().__init__("two-bugs", Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities

    def schedule(self):
        out = super().schedule()
        if out.step == 1:
            return replace(out, scheduled=(*out.scheduled, ScheduledSeq("ghost#0", "ghost", 1, False)))
        return out

    def update(self, outcome):
        finished = list(super().update(outcome))
        return finished + finished if self.scheduler._step > 3 else finished


def two_bugs() -> SchedulerAdapter:
    return _TwoBugs()


class _Chatty(SchedulerAdapter):
    """A correct scheduler that prints on every call (its output must not reach the report)."""

    def __init__(self) -> None:
        super().__init__("chatty", Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities

    def schedule(self):
        print("CHATTY: scheduling")
        print("CHATTY: on stderr too", file=sys.stderr)
        return super().schedule()


def chatty() -> SchedulerAdapter:
    return _Chatty()


class _SlowReset(SchedulerAdapter):
    """A correct scheduler whose reset builds an engine slowly (as vLLM's does under load) and
    says so with ``reset_timeout``; with ``hang_in_reset`` its reset never returns at all."""

    def __init__(self, reset_s: float, declared: float | None) -> None:
        super().__init__("slow-reset", Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities
        self.reset_timeout = declared
        self._reset_s = reset_s

    def reset(self, config):
        time.sleep(self._reset_s)
        return super().reset(config)


def slow_reset_declared() -> SchedulerAdapter:
    return _SlowReset(1.5, declared=5.0)


def slow_reset_undeclared() -> SchedulerAdapter:
    return _SlowReset(1.5, declared=None)


def reset_hangs_past_its_declared_time() -> SchedulerAdapter:
    return _SlowReset(3600, declared=2.0)
