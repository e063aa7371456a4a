"""The second round of attacks (issue 35): adapters that try to pass, hang or escape the runner in
ways the first round (``fault_adapters``) did not (``hostile_adapters:NAME``). Each is the V0
reference until step 2's ``schedule()`` (or its first call, or its load), then does its one
hostile thing. `CORPUS` maps each name to what the runner must report; `tests/test_hostile_adapters.py`
runs them all. Run only in a child process the runner owns.

Processes the adapters start write their pids to ``$KVSCHED_TEST_PIDS`` (one a line), so the test
can tell that none outlived the run. Paths come from the environment: ``$KVSCHED_TEST_OUT`` (the
run's ``--out``) and ``$KVSCHED_TEST_OUTSIDE`` (a file outside it that must stay untouched).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace

from conformance.runner.adapter import SchedulerAdapter
from reference_impl import Scheduler
from spec.types import ScheduledSeq

FAULT_STEP = 2


def _record(pid: int) -> None:
    where = os.environ.get("KVSCHED_TEST_PIDS")
    if where:
        with open(where, "a") as f:
            f.write(f"{pid}\n")


def _sleeper(*, session: bool, hold_mb: int = 0) -> int:
    """A process that sleeps for ten minutes (holding ``hold_mb`` MB), in its own session or not."""
    code = f"import time; hoard = bytearray({hold_mb} << 20); time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=session, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _record(proc.pid)
    return proc.pid


class _Hostile(SchedulerAdapter):
    def __init__(self, name: str, act) -> None:
        super().__init__(name, Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities
        self._act = act

    def schedule(self):
        out = super().schedule()
        return self._act(self, out) if out.step == FAULT_STEP else out


# -- answers that are not what they claim (item 1) ---------------------------------------------
def _step_as_string(adapter, out):
    return replace(out, step=str(out.step))


def _step_off_by_one(adapter, out):
    return replace(out, step=out.step + 1)


def _million_scheduled(adapter, out):
    return replace(out, scheduled=(ScheduledSeq("r0#0", "r0", 1, False),) * 1_000_000)


def _million_ignored(adapter, out):
    return replace(out, ignored=("r0",) * 1_000_000)


class _Sneaky(str):
    def __hash__(self):
        raise RuntimeError("a sequence id whose hash runs the adapter's code")


def _str_subclass_id(adapter, out):
    first = out.scheduled[0] if out.scheduled else ScheduledSeq("r0#0", "r0", 1, False)
    return replace(out, scheduled=(replace(first, seq_id=_Sneaky(first.seq_id)), *out.scheduled[1:]))


def _prefill_as_string(adapter, out):
    return replace(out, scheduled=tuple(replace(s, is_prefill="no") for s in out.scheduled)
                   or (ScheduledSeq("r0#0", "r0", 1, "no"),))  # type: ignore[arg-type]


def _negative_drafts(adapter, out):
    return replace(out, scheduled=tuple(replace(s, num_drafts=-1) for s in out.scheduled)
                   or (ScheduledSeq("r0#0", "r0", 1, False, -1),))


def _reason_garbage(adapter, out):
    return replace(out, reasons=("because",))  # type: ignore[arg-type]


class _HugeTokens(SchedulerAdapter):
    """A snapshot whose first sequence holds a million token ids, from step 2 on."""

    def __init__(self) -> None:
        super().__init__("huge-token-ids", Scheduler, profiles=("safety",))
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
            seqs = {**snap.seqs, sid: view._replace(token_ids=(1,) * 1_000_000, num_tokens=1_000_000)}
            return replace(snap, seqs=seqs, base=None, changed_seqs=None)
        return snap


class _MutatesRequest(SchedulerAdapter):
    """Changes the request it is given in place (a frozen dataclass, set anyway) to max_tokens 1, so
    it caps every request after one token: conforming only if the checks read the same object."""

    def __init__(self) -> None:
        super().__init__("mutates-request", Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities

    def add_request(self, request):
        object.__setattr__(request, "max_tokens", 1)
        return super().add_request(request)


class _CapsAfterOneToken(SchedulerAdapter):
    """Finishes every request length-capped after its first token (LEN-004)."""

    def __init__(self) -> None:
        from conformance.selftest.mutants import MUTANTS

        super().__init__("caps-after-one-token", MUTANTS["caps-after-one-token"].factory, profiles=("safety",))
        self.capabilities = Scheduler.capabilities


# -- exceptions, signals and terminal output (item 6) --------------------------------------------
class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("__str__ raises")

    def __repr__(self):
        raise RuntimeError("__repr__ raises")


def _str_raises(adapter, out):
    raise _Unprintable()


class _NoCode:
    def __repr__(self):
        raise RuntimeError("__repr__ raises")

    __str__ = __repr__


def _exit_unprintable(adapter, out):
    sys.exit(_NoCode())


def _signals_runner(sig):
    def act(adapter, out):
        os.kill(os.getppid(), sig)
        time.sleep(30)  # the runner ends this process long before
        return out
    return act


def _grandchild_signals_runner(adapter, out):
    runner = os.getppid()
    code = f"import os, signal; os.kill({runner}, signal.SIGTERM)"
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    _record(proc.pid)
    time.sleep(30)
    return out


ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x00nul\x9b31m"


def _escapes_in_message(adapter, out):
    raise RuntimeError(f"{ESCAPES} [bold]markup[/]")


# -- processes (item 2) --------------------------------------------------------------------------
def _setsid_sleeper(adapter, out):
    _sleeper(session=True)
    return out


def _double_fork_daemon(adapter, out):
    if os.fork() == 0:  # the classic daemon: fork, setsid, fork again, the middle one exits
        os.setsid()
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        _record(pid)
        os._exit(0)
    time.sleep(0.2)
    return out


def _setsid_sleeper_then_exit(adapter, out):
    _sleeper(session=True)
    time.sleep(0.8)  # seen by the runner's walk of the tree (every 0.5 s where /proc has no children files)
    os._exit(0)


def _grandchild_memory(adapter, out):
    _sleeper(session=True, hold_mb=400)
    time.sleep(30)  # the runner counts the grandchild and ends the tree
    return out


# -- files (item 3) ------------------------------------------------------------------------------
def _chdir_away(adapter, out):
    away = os.environ["KVSCHED_TEST_AWAY"]
    os.makedirs(away, exist_ok=True)
    os.chdir(away)
    raise RuntimeError("raised after changing folder")


def _plants_links(adapter, out):
    folder = os.path.join(os.environ["KVSCHED_TEST_OUT"], "counterexamples")
    outside = os.environ["KVSCHED_TEST_OUTSIDE"]
    os.makedirs(folder, exist_ok=True)
    for name in ("FAULT-raised.json", "FAULT-raised.html", ".hypothesis"):
        path = os.path.join(folder, name)
        if not os.path.lexists(path):
            os.symlink(outside, path)
    found = os.path.join(os.environ["KVSCHED_TEST_OUT"], "found")
    if not os.path.lexists(found):
        os.symlink(os.path.dirname(outside), found)
    raise RuntimeError("raised after planting links")


def _replaces_out(adapter, out):
    where = os.environ["KVSCHED_TEST_OUT"]
    shutil.rmtree(where, ignore_errors=True)
    with open(where, "w") as f:
        f.write("not a folder any more\n")
    raise RuntimeError("raised after replacing --out with a file")


# -- history (item 5) ----------------------------------------------------------------------------
class _FailsOnCall(SchedulerAdapter):
    """Raises on the 40th schedule() call of its process's life, whatever the trace: a fault that
    depends on history, which no trace alone reproduces."""

    def __init__(self) -> None:
        super().__init__("fails-on-call-40", Scheduler, profiles=("safety",))
        self.capabilities = Scheduler.capabilities
        self._calls = 0

    def schedule(self):
        self._calls += 1
        if self._calls == 40:
            raise RuntimeError("the 40th call of this process")
        return super().schedule()


# name -> (factory, the problem the runner must report)
CORPUS: dict[str, tuple[object, str]] = {
    "step_as_string": (lambda: _Hostile("step-as-string", _step_as_string), "FAULT-malformed"),
    "step_off_by_one": (lambda: _Hostile("step-off-by-one", _step_off_by_one), "FAULT-malformed"),
    "million_scheduled": (lambda: _Hostile("million-scheduled", _million_scheduled), "FAULT-malformed"),
    "million_ignored": (lambda: _Hostile("million-ignored", _million_ignored), "FAULT-malformed"),
    "str_subclass_id": (lambda: _Hostile("str-subclass-id", _str_subclass_id), "FAULT-malformed"),
    "prefill_as_string": (lambda: _Hostile("prefill-as-string", _prefill_as_string), "FAULT-malformed"),
    "negative_drafts": (lambda: _Hostile("negative-drafts", _negative_drafts), "FAULT-malformed"),
    "reason_garbage": (lambda: _Hostile("reason-garbage", _reason_garbage), "FAULT-malformed"),
    "huge_token_ids": (_HugeTokens, "FAULT-malformed"),
    "mutates_request": (_MutatesRequest, "LEN-004"),
    "caps_after_one_token": (_CapsAfterOneToken, "LEN-004"),
    "str_raises": (lambda: _Hostile("str-raises", _str_raises), "FAULT-raised"),
    "exit_unprintable": (lambda: _Hostile("exit-unprintable", _exit_unprintable), "FAULT-exit"),
    "sigterm_to_runner": (lambda: _Hostile("sigterm-to-runner", _signals_runner(signal.SIGTERM)), "FAULT-signal"),
    "sigint_to_runner": (lambda: _Hostile("sigint-to-runner", _signals_runner(signal.SIGINT)), "FAULT-signal"),
    "sigusr1_to_runner": (lambda: _Hostile("sigusr1-to-runner", _signals_runner(signal.SIGUSR1)), "FAULT-signal"),
    "grandchild_signals_runner": (lambda: _Hostile("grandchild-signals", _grandchild_signals_runner), "FAULT-signal"),
    "escapes_in_message": (lambda: _Hostile("escapes", _escapes_in_message), "FAULT-raised"),
    "setsid_sleeper": (lambda: _Hostile("setsid-sleeper", _setsid_sleeper), ""),
    "double_fork_daemon": (lambda: _Hostile("double-fork", _double_fork_daemon), ""),
    "setsid_sleeper_then_exit": (lambda: _Hostile("setsid-then-exit", _setsid_sleeper_then_exit), "FAULT-exit"),
    "grandchild_memory": (lambda: _Hostile("grandchild-memory", _grandchild_memory), "FAULT-memory"),
}
# -- wire hosts: the same attacks from a host the adapter's process starts (tests/wire_hosts) --------
def _host(factory: str):
    def make():
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "wire_hosts"))
        import helper_host

        return getattr(helper_host, factory)()
    return make


CORPUS.update({
    "host_setsid_helper": (_host("setsid_helper_at_step_3"), ""),
    "host_signals_runner": (_host("signals_runner_at_step_3"), "FAULT-signal"),
})
# Run through `kvsched conform` (they act on the run's folders): name -> the problem.
FILE_CORPUS: dict[str, tuple[object, str]] = {
    "chdir_away": (lambda: _Hostile("chdir-away", _chdir_away), "FAULT-raised"),
    "plants_links": (lambda: _Hostile("plants-links", _plants_links), "FAULT-raised"),
    "replaces_out": (lambda: _Hostile("replaces-out", _replaces_out), "FAULT-raised"),
    "fails_on_call_40": (_FailsOnCall, "FAULT-raised"),
}

for _name, (_factory, _) in {**CORPUS, **FILE_CORPUS}.items():
    globals()[_name] = _factory


def run_corpus(names: list[str], workers: int = 4) -> dict[str, object]:
    """Every named adapter of `CORPUS` on one trace, in its own child process, ``workers`` at a
    time, under the signal router (as ``kvsched conform`` runs them): for each, the problems found,
    the seconds it took and its first message; then the processes the adapters recorded that are
    still alive."""
    from concurrent.futures import ThreadPoolExecutor

    from conformance.flows.profiles import get_profile
    from conformance.runner.isolated import ChildRunner, Limits
    from conformance.runner.process_tree import alive
    from conformance.runner.signals import SignalRouter
    from spec.trace import Trace

    trace = Trace.from_dict({"version": 1, "config": {}, "requests": [
        {"id": "r0", "prompt_len": 3, "max_tokens": 8}, {"id": "r1", "prompt_len": 2, "max_tokens": 6, "arrival_step": 1}],
        "max_steps": 30})
    invariants = [inv.id for inv in get_profile("safety").invariants()]

    def one(name: str) -> tuple[str, dict[str, object]]:
        runner = ChildRunner(f"hostile_adapters:{name}", Limits(timeout=2.0, max_memory_mb=300))
        started = time.monotonic()
        try:
            runner.start()
            summary = runner.run(trace, invariants)
        finally:
            runner.close()
        problems = {p: s.message for p, s in summary.problems.items()}
        return name, {"problems": sorted(problems), "seconds": round(time.monotonic() - started, 2),
                      "message": next(iter(problems.values()), None)}

    with SignalRouter(), ThreadPoolExecutor(workers) as pool:
        results = dict(pool.map(one, names))
    time.sleep(0.2)
    where = os.environ.get("KVSCHED_TEST_PIDS")
    pids = [int(p) for p in open(where).read().split()] if where and os.path.exists(where) else []
    return {"results": results, "recorded": len(pids), "left": [p for p in pids if alive(p)]}


if __name__ == "__main__":  # `python tests/hostile_adapters.py NAME...`: the corpus, as JSON on stdout
    import json

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps(run_corpus(sys.argv[1:] or list(CORPUS))))
