"""Calls into an adapter, guarded: a per-call timeout, and exceptions turned into faults.

A hung adapter cannot be stopped from inside Python, so each guarded adapter gets one daemon
worker thread; on a timeout the worker is abandoned (it can never block the runner's exit) and
the adapter is reported as hung.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


class AdapterFault(Exception):
    """The adapter misbehaved: ``kind`` is ``raised``, ``hang`` or ``malformed``."""

    def __init__(self, kind: str, call: str, message: str) -> None:
        super().__init__(f"adapter {kind} in {call}: {message}")
        self.kind = kind
        self.call = call
        self.message = message


class Guard:
    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self._jobs: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] | None = None
        self._result: queue.Queue[tuple[bool, Any]] = queue.Queue()
        self.dead = False

    def _worker(self) -> None:
        assert self._jobs is not None
        while True:
            fn, args, kwargs = self._jobs.get()
            try:
                self._result.put((True, fn(*args, **kwargs)))
            except BaseException as err:  # noqa: BLE001 - reported to the caller as a fault
                self._result.put((False, err))

    def call(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.dead:
            raise AdapterFault("hang", name, "the adapter hung earlier and was abandoned")
        if self.timeout is None:
            try:
                return fn(*args, **kwargs)
            except Exception as err:  # noqa: BLE001
                raise AdapterFault("raised", name, f"{type(err).__name__}: {err}") from err
        if self._jobs is None:
            self._jobs = queue.Queue()
            threading.Thread(target=self._worker, daemon=True, name="kvsched-adapter").start()
        self._jobs.put((fn, args, kwargs))
        try:
            ok, value = self._result.get(timeout=self.timeout)
        except queue.Empty:
            self.dead = True
            raise AdapterFault("hang", name, f"no answer within {self.timeout:g} s") from None
        if not ok:
            if isinstance(value, Exception):
                raise AdapterFault("raised", name, f"{type(value).__name__}: {value}") from value
            raise value
        return value
