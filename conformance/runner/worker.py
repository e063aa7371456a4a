"""The adapter's own process: load the adapter, then run whole traces for the runner.

Started by `conformance.runner.isolated.ChildRunner` as ``python -m conformance.runner.worker``; never run by
hand. The runner's process never imports the adapter: everything that touches it happens here.
One round trip per trace, not per call: the runner sends a trace and the checks to make, this
process drives the adapter through it with `conformance.runner.driver.run_checked` (the same driver as
in process), checks every step, and answers with a `conformance.runner.summary.TraceSummary`.

What it does so that nothing the adapter does can pass, hang or crash the runner:
1. It dies with the runner (``PR_SET_PDEATHSIG``) and sits in its own session, so a Ctrl-C at
   the terminal reaches only the runner, which then ends it.
2. Each adapter call is stamped (`conformance.runner.channel.Stamp`) so the runner's watchdog can time
   it and kill this process when it hangs, however the adapter treats signals or exceptions.
3. ``faulthandler`` writes the Python stack to a file on a crash (SIGSEGV, ...) and on SIGUSR1,
   which the watchdog sends before killing a hung call: that is how a fault gets the adapter's
   file:line.
4. Every exception an adapter call raises, ``SystemExit`` and ``KeyboardInterrupt`` included, is
   a fault of that call, with the adapter's frame as its location.
5. Its stdout and stderr are a pipe the runner drains into a capped log, away from the report.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from conformance.runner.channel import ChannelClosed, Stamp, receive, send
from conformance.runner.guard import AdapterFault, exception_location, fault_from


class StampedGuard:
    """The driver's guard in this process: no timer (the runner's watchdog times calls), every
    exception a fault, and a stamp around each call."""

    dead = False

    def __init__(self, stamp: Stamp) -> None:
        self.stamp = stamp

    def at_step(self, step: int) -> None:
        self.stamp.step = step

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.stamp.enter(name)
        try:
            return fn(*args, **kwargs)
        except SystemExit as err:
            raise AdapterFault("exit", name, f"called sys.exit({err.code!r})", exception_location(err)) from None
        except BaseException as err:  # noqa: BLE001 - whatever the adapter raises is its fault
            raise fault_from(name, err) from None
        finally:
            self.stamp.leave()


def _die_with_parent() -> None:
    """End this process when the runner's process ends, however it ends (even SIGKILL).

    PR_SET_PDEATHSIG fires when the *thread* that started this process exits, not the process;
    the runner starts children from worker threads too, so it is set only when the runner says
    it started this one from its main thread. A thread that watches the parent's pid covers
    every case (while the adapter lets Python run; a closed request pipe ends the rest)."""
    parent = os.getppid()
    if os.environ.get("KVSCHED_FROM_MAIN_THREAD") == "1":
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: the watcher below does it
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="kvsched-parent-watch").start()


def _hello(adapter: Any) -> dict[str, Any]:
    """What the runner learns of the adapter without importing it, the config domain included:
    the runner generates and shrinks traces inside it."""
    from conformance.runner.adapter import adapter_domain

    return {
        "op": "hello",
        "name": str(getattr(adapter, "name", "adapter")),
        "profiles": [str(p) for p in getattr(adapter, "profiles", ("safety",))],
        "capabilities": sorted(str(c) for c in getattr(adapter, "capabilities", ())),
        "domain": adapter_domain(adapter).to_dict(),
        "reset_timeout": _seconds(getattr(adapter, "reset_timeout", None)),
        "reservation": _reservation(adapter),
    }


def _reservation(adapter: Any) -> dict[str, Any] | None:
    """What the adapter declares it reserves (CAP-006 allows it), for the report; a declaration
    that is not a `spec.reservation.Reservation` is the adapter's input error, said at load."""
    from dataclasses import asdict

    from spec.errors import InputError
    from spec.reservation import Reservation

    declared = getattr(adapter, "reservation", None)
    if declared is None:
        return None
    if not isinstance(declared, Reservation):
        raise InputError("adapter.reservation",
                         f"must be a spec.reservation.Reservation or None, got {type(declared).__name__}")
    return asdict(declared)


def _seconds(value: Any) -> float | None:
    """An adapter's declared time limit, or None when it declares none (or nonsense)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 < value < float("inf") else None


def _run(adapter: Any, request: dict[str, Any], guard: StampedGuard, trace: Any = None) -> dict[str, Any]:
    """One trace, checked here; the answer is the verdict (``run``) or the whole story (``replay``)."""
    from conformance.runner.coverage import step_tests
    from conformance.runner.driver import run_checked
    from conformance.runner.summary import summarize
    from spec.catalogue import get
    from spec.trace import Trace

    trace = trace if trace is not None else Trace.from_dict(request["trace"])
    invariants = [get(i) for i in request["invariants"]]
    reference = request.get("reference")
    factory = None
    if reference:
        import importlib

        module, _, attr = reference.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    result = run_checked(adapter, trace, invariants, lockstep=bool(request.get("lockstep")),
                         stop_at_first=bool(request.get("stop_at_first")), reference_factory=factory, guard=guard,
                         stop_on=request.get("stop_on"))
    html = None
    if request.get("html"):
        from conformance.reports.html_view import write_run_view

        written = write_run_view(request["html"], trace, result)
        html = str(written) if written else None
    if request.get("op") == "replay":
        from conformance.reports.replay_view import replay_view

        return {"op": "result", "replay": replay_view(result), "html": html}
    summary = summarize(result, step_tests(i.id for i in invariants))
    summary.html = html
    return {"op": "result", "summary": summary.to_dict()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.runner.worker")
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--requests", type=int, required=True, help="fd the runner writes requests to")
    parser.add_argument("--answers", type=int, required=True, help="fd this process answers on")
    parser.add_argument("--stamp", required=True)
    parser.add_argument("--dump", required=True, help="file for faulthandler's stacks")
    args = parser.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the runner decides when this process ends
    dump = open(args.dump, "w")  # noqa: SIM115 - open for the life of the process
    faulthandler.enable(dump, all_threads=True)
    faulthandler.register(signal.SIGUSR1, dump, all_threads=True)
    for entry in os.environ.get("KVSCHED_PARENT_PATH", "").split(os.pathsep):
        if entry and entry not in sys.path:
            sys.path.append(entry)  # what the runner could import, this process can too
    stamp = Stamp(args.stamp)
    guard = StampedGuard(stamp)

    from conformance.runner.adapter import load_adapter, user_location
    from spec.errors import InputError

    stamp.enter("load")
    try:
        adapter = load_adapter(args.adapter)
    except InputError as err:
        send(args.answers, {"op": "input-error", "where": err.where, "message": err.message})
        return 0
    except BaseException as err:  # noqa: BLE001 - a factory may fail in any way: one line for the user
        send(args.answers, {"op": "input-error", "where": "--adapter",
                            "message": f"{args.adapter} failed to load: {type(err).__name__}: {err} "
                                       f"(at {user_location(err)})"})
        return 0
    finally:
        stamp.leave()
    try:
        hello = _hello(adapter)
    except InputError as err:
        send(args.answers, {"op": "input-error", "where": err.where, "message": err.message})
        return 0
    send(args.answers, hello)
    strategy = None
    while True:
        try:
            request = receive(args.requests)
        except ChannelClosed:
            return 0
        if request.get("op") == "stop":
            continue  # a stop that crossed the end of its search on the way
        if request.get("op") in ("search", "draw"):
            if strategy is None:
                from conformance.runner.adapter import adapter_strategy

                strategy = adapter_strategy(adapter)
            if request["op"] == "draw":  # one trace of a batch again (a fault ended the process that ran it)
                from conformance.runner.workers import draw

                batch = draw(strategy, int(request["seed"]), int(request["count"]))
                index = int(request["index"])
                send(args.answers, {"op": "trace", "trace": batch[index].to_dict() if index < len(batch) else None})
            else:
                _search(adapter, request, guard, strategy, args)
            continue
        if request.get("op") not in ("run", "replay"):
            return 0
        send(args.answers, _checked(adapter, request, guard))


def _checked(adapter: Any, request: dict[str, Any], guard: StampedGuard, trace: Any = None) -> dict[str, Any]:
    guard.stamp.step = 0
    try:
        return _run(adapter, request, guard, trace)
    except Exception as err:  # noqa: BLE001 - kvsched's own code failed, not an adapter call
        return _checker_failed(err, guard.stamp.step)


def _search(adapter: Any, request: dict[str, Any], guard: StampedGuard, strategy: Any, args: argparse.Namespace) -> None:
    """Draw ``count`` traces from ``seed`` here and check each, one ``item`` frame per trace (the
    trace itself only when it showed a problem), then ``done``. The runner draws nothing and
    sends no trace: that is the cost parallel workers would otherwise share in one process. A
    ``stop`` frame from the runner ends the batch after the trace in hand."""
    from conformance.runner.workers import draw

    traces = draw(strategy, int(request["seed"]), int(request["count"]))
    for index, trace in enumerate(traces):
        if index < int(request.get("start", 0)):
            continue  # run before a fault ended an earlier process
        if select.select([args.requests], [], [], 0)[0] and receive(args.requests).get("op") == "stop":
            break
        summary = _checked(adapter, request, guard, trace)["summary"]
        send(args.answers, {"op": "item", "index": index, "summary": summary,
                            "trace": trace.to_dict() if summary.get("problems") else None})
    send(args.answers, {"op": "done", "drawn": len(traces)})


def _checker_failed(err: Exception, step: int) -> dict[str, Any]:
    """A trace whose checking crashed in kvsched's own code (every adapter call is guarded, so
    this is not the adapter's doing): a ``FAULT-checker`` problem with kvsched's file:line and
    the trace kept like any finding, instead of the process dying as if the adapter had exited.
    The answer serves both ops (``run`` reads the summary, ``replay`` the story)."""
    import traceback

    from conformance.runner.summary import Problem, TraceSummary

    frames = traceback.extract_tb(err.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None
    step = max(step, 0)
    message = (f"step {step}: kvsched's own checking raised {type(err).__name__}: {err} (a kvsched bug, not the "
               "adapter's: please report it with this trace)")
    problem = Problem("FAULT-checker", step, message, where)
    story = {"steps": [], "violations": [], "fault": message, "fault_step": step, "divergence": None, "failed": True,
             "lines": [f"KVSCHED ERROR {message} (at {where})"]}
    return {"op": "result", "summary": TraceSummary(step + 1, {problem.id: problem}).to_dict(), "replay": story,
            "html": None}


if __name__ == "__main__":
    sys.exit(main())
