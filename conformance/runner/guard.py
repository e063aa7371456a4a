"""Calls into an adapter, guarded: a per-call timeout, and exceptions turned into faults.

Two ways to time a call out, the cheaper one where it works:

- On the main thread of a POSIX process, the call runs in place under an interval timer
  (``signal.setitimer``); when it expires, a `BaseException` is raised inside the adapter's code
  (so its ``except Exception`` blocks cannot swallow it, and it fires again every 50 ms if they
  try ``except BaseException``). Arming and disarming costs under 1 µs; handing each call to a
  worker thread cost about 100 µs, three times the reference scheduler's whole step. A timer and
  a SIGALRM handler someone else had set (pytest-timeout's, say) are put back after the call;
  where SIGALRM had only its default disposition, kvsched's handler stays installed and ignores
  alarms that come between calls.
- Elsewhere (another thread, Windows), each guarded adapter gets one daemon worker thread; on a
  timeout the worker is abandoned (it can never block the runner's exit).

Either way a hung adapter is reported as such and marked dead: later calls fail at once. The one
hang only the worker thread survives is a C call that never returns to the interpreter.
"""

from __future__ import annotations

import os
import queue
import signal
import sysconfig
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


class AdapterFault(Exception):
    """The adapter misbehaved. ``kind``: ``raised``, ``hang``, ``malformed``, ``config-rejected``;
    from an isolated adapter's process also ``exit`` (it ended), ``crash`` (a signal killed it),
    ``memory`` and ``output`` (it passed the runner's limits); ``crash`` also for a wire host killed
    by a signal. ``location`` is the adapter's ``file:line`` where it is known.
    ``step_uncertain``: the adapter could not tell at which step this happened (a wire host
    killed while it held step lines); the driver replays the trace to find it."""

    def __init__(self, kind: str, call: str, message: str, location: str | None = None,
                 step_uncertain: bool = False) -> None:
        super().__init__(f"adapter {kind} in {call}: {message}" + (f" (at {location})" if location else ""))
        self.kind = kind
        self.call = call
        self.message = message
        self.location = location
        self.step_uncertain = step_uncertain


_RAISED_KINDS = frozenset({"raised", "exit", "crash", "config-rejected"})  # what an exception may say it is (`fault_kind`)


def fault_from(call: str, err: BaseException) -> AdapterFault:
    """The fault for an exception out of an adapter call: ``raised``, unless the exception says
    otherwise in ``fault_kind`` (a wire host's exit is an ``exit`` and its death by a signal a
    ``crash``, as an isolated adapter's process's are; a wire reset sent with the next message and refused there
    is ``config-rejected``) and ``fault_call``, with its ``step_uncertain``."""
    kind = _attribute(err, "fault_kind", "raised")
    named = _attribute(err, "fault_call", None)
    call = named if isinstance(named, str) and named else call
    kind = kind if isinstance(kind, str) and kind in _RAISED_KINDS else "raised"
    try:
        location = exception_location(err)
    except Exception:  # noqa: BLE001 - a traceback the adapter doctored: no location, still its fault
        location = None
    return AdapterFault(kind, call, f"{_type_name(err)}: {shown_text(err)}", location,
                        _attribute(err, "step_uncertain", False) is True)


def shown_text(value: object, limit: int = 2000) -> str:
    """``str(value)``, or what can be said of it when its ``__str__`` (then ``__repr__``) raises or
    returns no string: an adapter's exception is its fault whatever its methods do, and the
    message must never become the runner's own crash."""
    for show in (str, repr):
        try:
            text = show(value)
        except Exception:  # noqa: BLE001 - the adapter's code, failing
            continue
        if type(text) is str:
            return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
    return f"<{_type_name(value)} whose str() and repr() raise>"


def _type_name(value: object) -> str:
    name = getattr(type(value), "__name__", None)
    return name if type(name) is str else "object"


def _attribute(err: BaseException, name: str, default: object) -> object:
    """``getattr(err, name, default)``, where a property that raises counts as absent."""
    try:
        return getattr(err, name, default)
    except Exception:  # noqa: BLE001
        return default


# Frames in these folders are the runner's and the spec's, not the adapter's.
_RUNNER_DIRS = tuple(str(Path(__file__).resolve().parents[2] / d) + os.sep for d in ("conformance", "spec"))
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def adapter_location(frames: Iterable[tuple[str, int]]) -> str | None:
    """The adapter's ``file:line`` among ``frames`` (innermost first): the innermost frame outside
    the runner and the standard library, else the innermost one at all."""
    frames = list(frames)
    for filename, line in frames:
        path = os.path.abspath(filename)
        if not path.startswith(_RUNNER_DIRS) and not path.startswith(_STDLIB) and not filename.startswith("<"):
            return f"{filename}:{line}"
    return f"{frames[0][0]}:{frames[0][1]}" if frames else None


def exception_location(err: BaseException) -> str | None:
    said = _attribute(err, "location", None)
    if type(said) is str:  # raised in another process, which said where
        return said
    return adapter_location((f.filename, f.lineno or 0) for f in reversed(traceback.extract_tb(err.__traceback__)))


class _Overdue(BaseException):
    """Raised inside an adapter call whose time is up (a BaseException: not swallowed by
    ``except Exception``)."""


_ALARM_REPEAT = 0.05  # seconds between repeated alarms once the deadline has passed


def _alarm_available() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


_armed = False  # whether an in-place call is running under its deadline


def _overdue(signum: int, frame: object) -> None:
    """The SIGALRM handler: raise inside the adapter's call, or ignore a stray alarm between calls.
    Where SIGALRM had no handler of its own (the default or ignored), this one stays installed."""
    if _armed:
        raise _Overdue


_PLAIN_DISPOSITIONS = (signal.SIG_DFL, signal.SIG_IGN, None, int(signal.SIG_DFL), int(signal.SIG_IGN))

try:  # the C getsignal: signal.getsignal wraps its answer in an enum through an exception (~4 µs)
    from _signal import getsignal as _raw_getsignal
except ImportError:  # pragma: no cover - other Python implementations
    _raw_getsignal = signal.getsignal


def _serve(jobs: queue.Queue, results: queue.Queue) -> None:
    """A guard's worker thread: runs the calls put on ``jobs`` until it is handed ``None``."""
    while (job := jobs.get()) is not None:
        fn, args, kwargs = job
        try:
            results.put((True, fn(*args, **kwargs)))
        except BaseException as err:  # noqa: BLE001 - reported to the caller as a fault
            results.put((False, err))


class Guard:
    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._jobs: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] | None = None
        self._result: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.dead = False
        self._in_place: bool | None = None  # decided at the first call, on the thread that makes it

    def at_step(self, step: int) -> None:
        """The driver says which step the next calls belong to (a watching guard records it)."""

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.dead:
            raise AdapterFault("hang", name, "the adapter hung earlier and was abandoned")
        if self.timeout is None:
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001
                raise fault_from(name, err) from err
        if self._in_place is None:
            self._in_place = _alarm_available()
        if self._in_place:
            return self._call_with_alarm(name, fn, args, kwargs)
        return self._call_in_worker(name, fn, args, kwargs)

    # -- in place, under an interval timer ---------------------------------------------------
    def _call_with_alarm(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        global _armed
        previous_handler = _raw_getsignal(signal.SIGALRM)
        if previous_handler is not _overdue:
            signal.signal(signal.SIGALRM, _overdue)
        previous_delay, previous_interval = signal.setitimer(signal.ITIMER_REAL, self.timeout, _ALARM_REPEAT)
        started = time.monotonic() if previous_delay else 0.0
        _armed = True
        try:
            try:
                return fn(*args, **kwargs)
            finally:
                _armed = False  # an alarm after this line is ignored; one before it is caught below
        except _Overdue:
            self.dead = True
            raise AdapterFault("hang", name, f"no answer within {self.timeout:g} s") from None
        except Exception as err:  # noqa: BLE001 - reported to the caller as a fault
            raise fault_from(name, err) from err
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if previous_handler is not _overdue and previous_handler not in _PLAIN_DISPOSITIONS:
                signal.signal(signal.SIGALRM, previous_handler)  # someone's own handler goes back
            if previous_delay:  # and someone's timer goes on with what it had left
                left = max(previous_delay - (time.monotonic() - started), 1e-6)
                signal.setitimer(signal.ITIMER_REAL, left, previous_interval)

    # -- on a worker thread --------------------------------------------------------------------
    def _call_in_worker(self, name: str, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if self._jobs is None:
            self._jobs = queue.Queue()
            threading.Thread(target=_serve, args=(self._jobs, self._result), daemon=True, name="kvsched-adapter").start()
            # The thread holds the queues, never the guard: once the guard is gone it is told to
            # end, so a guard per trace off the main thread no longer leaves a thread per trace
            # (a lockstep campaign of thousands of traces ran out of threads).
            weakref.finalize(self, self._jobs.put, None)
        self._jobs.put((fn, args, kwargs))
        try:
            ok, value = self._result.get(timeout=self.timeout)
        except queue.Empty:
            self.dead = True
            raise AdapterFault("hang", name, f"no answer within {self.timeout:g} s") from None
        if not ok:
            if isinstance(value, Exception):
                raise fault_from(name, value) from value
            raise value
        return value
