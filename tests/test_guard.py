"""The per-call timeout: a hung adapter is reported, whichever way the call was timed."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from conformance.runner.guard import AdapterFault, Guard


def _sleeps() -> None:
    time.sleep(30)


def _swallows_exceptions() -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            time.sleep(0.01)
        except Exception:  # noqa: BLE001 - an adapter that hides its own errors must still time out
            pass


@pytest.mark.parametrize("fn", [_sleeps, _swallows_exceptions])
def test_hang_on_main_thread_is_reported_and_the_adapter_marked_dead(fn):
    guard = Guard(0.2)
    started = time.monotonic()
    with pytest.raises(AdapterFault) as fault:
        guard.call("schedule", fn)
    assert fault.value.kind == "hang" and time.monotonic() - started < 5
    with pytest.raises(AdapterFault, match="hung earlier"):
        guard.call("update", lambda: None)


def test_hang_off_the_main_thread_is_reported():
    outcome: list[str] = []

    def run() -> None:
        try:
            Guard(0.2).call("schedule", _sleeps)
        except AdapterFault as fault:
            outcome.append(fault.kind)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(10)
    assert outcome == ["hang"]


def test_raises_and_returns_pass_through():
    guard = Guard(1.0)
    assert guard.call("snapshot", lambda: 7) == 7
    with pytest.raises(AdapterFault) as fault:
        guard.call("schedule", lambda: 1 / 0)
    assert fault.value.kind == "raised" and "ZeroDivisionError" in fault.value.message


def test_someone_elses_alarm_is_put_back():
    fired: list[int] = []

    def handler(*_: object) -> None:
        fired.append(1)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 30.0)
        Guard(1.0).call("schedule", lambda: None)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 25 < left <= 30
        assert signal.getsignal(signal.SIGALRM) is handler and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_guard_off_the_main_thread_leaves_no_thread_behind():
    """The driver makes a guard per trace; off the main thread each starts a worker thread, which
    must end with its guard (a campaign of thousands of traces once ran out of threads)."""
    counts: list[int] = []

    def traces() -> None:
        for _ in range(50):
            assert Guard(5.0).call("schedule", lambda: 1) == 1
        counts.append(threading.active_count())

    thread = threading.Thread(target=traces)
    thread.start()
    thread.join()
    assert counts[0] < 10, counts
