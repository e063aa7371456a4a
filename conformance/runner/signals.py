"""Tell a signal the code under test sends its runner from one a person sends it.

An adapter's process can signal the runner (``os.kill(os.getppid(), signal.SIGTERM)``), and a
Python signal handler is not told who sent a signal: the run would stop as if a person had
pressed Ctrl-C (exit 130, no finding), or die (SIGUSR1's default). `SignalRouter` takes the
signals that stop a run out of the ordinary path:

1. `SignalRouter.install`, called on the main thread before any other thread starts (threads
   inherit the mask), blocks `ROUTED` there; the adapter's process unblocks them for itself
   (`unblock_all`, first thing in `conformance.runner.worker`).
2. A thread waits for them with ``sigtimedwait``, which names the sender's pid.
3. Sent from an adapter's process tree (the process, a descendant, or its session:
   `conformance.runner.process_tree.in_tree_of`, or a process the runner saw in the tree): the
   runner of that adapter is told (`signalled`), which ends the adapter's tree; the trace in hand
   ends in ``FAULT-signal`` naming the signal, and the run goes on.
4. Sent by anyone else: a stop, as SIGINT is (``_thread.interrupt_main``: KeyboardInterrupt in
   the main thread, which ``kvsched conform`` turns into an interrupted run), and SIGTSTP still
   suspends the runner.

What no process can be kept from doing to another of the same user is out of reach: SIGKILL and
SIGSTOP can be neither blocked nor handled.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
from typing import Any, Protocol

from conformance.runner.process_tree import in_tree_of

ROUTED = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                    signal.SIGTSTP})


class Signalled(Protocol):
    def signalled(self, signum: int, sender: int) -> None: ...
    def owns(self, pid: int) -> bool: ...


_RUNNERS: dict[int, Signalled] = {}  # the adapter process's pid -> its runner
_LOCK = threading.Lock()


def register(pid: int, runner: Signalled) -> None:
    with _LOCK:
        _RUNNERS[pid] = runner


def unregister(pid: int) -> None:
    with _LOCK:
        _RUNNERS.pop(pid, None)


def owner_of(pid: int) -> Signalled | None:
    """The runner whose adapter's tree ``pid`` belongs to, or None."""
    with _LOCK:
        runners = dict(_RUNNERS)
    for root, runner in runners.items():
        if pid == root or runner.owns(pid):
            return runner
    root = in_tree_of(pid, runners)
    return runners.get(root) if root is not None else None


def unblock_all() -> None:
    """Undo an inherited mask (the runner's `ROUTED`): the adapter's process takes signals normally."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ROUTED)


class SignalRouter:
    """Steps 1-4 above for the life of one command (a context manager); where there is no
    ``sigtimedwait`` or this is not the main thread, it does nothing and signals act as before."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._previous: set[int] = set()

    def __enter__(self) -> SignalRouter:
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()

    def install(self) -> None:
        if not hasattr(signal, "sigtimedwait") or threading.current_thread() is not threading.main_thread():
            return
        self._previous = set(signal.pthread_sigmask(signal.SIG_BLOCK, ROUTED))
        self._thread = threading.Thread(target=self._route, daemon=True, name="kvsched-signals")
        self._thread.start()

    def uninstall(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        # A signal that came after the thread's last wait is delivered now, as it would have been.
        signal.pthread_sigmask(signal.SIG_SETMASK, self._previous)

    def _route(self) -> None:
        while not self._stop.is_set():
            info = signal.sigtimedwait(ROUTED, 0.1)
            if info is None:
                continue
            runner = owner_of(info.si_pid) if info.si_pid not in (0, os.getpid()) else None
            if runner is not None:
                runner.signalled(info.si_signo, info.si_pid)
            elif info.si_signo == signal.SIGTSTP:
                os.kill(os.getpid(), signal.SIGSTOP)  # Ctrl-Z: suspended, as it would have been
            else:
                _thread.interrupt_main(signal.SIGINT)
