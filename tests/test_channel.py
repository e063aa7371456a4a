"""The call stamp (conformance/runner/channel.py) never shows the watchdog a half-written call.

The Vidur targets' FAULT-hang (docs/CONFORMANCE.md) was a torn stamp: a child preempted inside
`Stamp.leave`, between storing the start time 0.0 and clearing the call, showed the watchdog a
call "started" at 0.0 on the monotonic clock, and the runner killed it as hung.
"""

from __future__ import annotations

import multiprocessing
import struct
import time

from conformance.runner.channel import _BEGUN, _STAMP, CALLS, Stamp


def test_a_stamp_caught_mid_write_reads_as_the_last_whole_one(tmp_path):
    child, parent = Stamp(str(tmp_path / "stamp"), create=True), Stamp(str(tmp_path / "stamp"))
    child.enter("update")
    calls, started, step, call = parent.read()
    assert (calls, call) == (1, "update") and started > 0
    # leave() stopped after its first store and part of the fields (start time 0.0, call still set)
    _BEGUN.pack_into(child._map, 0, child._writes + 1)
    child._map[_BEGUN.size + 8:_BEGUN.size + 16] = struct.pack("<d", 0.0)
    assert parent.read() == (calls, started, step, "update")  # not (1, 0.0, 0, "update")
    child.leave()
    assert parent.read()[3] == ""


def test_a_stamp_caught_in_two_writes_zeroing_reads_as_the_last_whole_one(tmp_path):
    # pack_into zeroes what it packs before storing it, so both counts pass through 0 in every
    # write: a reader that meets one write's zeroed end count and the next write's zeroed begin
    # count sees equal counts over torn fields (a call "started" at 0.0)
    child, parent = Stamp(str(tmp_path / "stamp"), create=True), Stamp(str(tmp_path / "stamp"))
    child.enter("update")
    whole = parent.read()
    _BEGUN.pack_into(child._map, 0, 0)
    _STAMP.pack_into(child._map, _BEGUN.size, 0, 0.0, 0, CALLS.index("update"), 0)
    assert parent.read() == whole  # not (0, 0.0, 0, "update")
    blank = Stamp(str(tmp_path / "blank"), create=True)
    assert blank.read() == (0, 0.0, 0, "")  # before any write: all zeros, no call


def _enter_and_leave(path: str, seconds: float) -> None:
    stamp = Stamp(path)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(500):
            stamp.enter("update")
            stamp.leave()


def test_a_busy_child_never_looks_hung(tmp_path):
    # the runner's watchdog reading (conformance/runner/isolated.py, ChildRunner._wait) against a child
    # entering and leaving calls as fast as it can: the torn stamp showed ~1.5 false hangs per
    # 1,000 readings on a loaded machine
    path = str(tmp_path / "stamp")
    parent = Stamp(path, create=True)
    child = multiprocessing.get_context("spawn").Process(target=_enter_and_leave, args=(path, 1.5))
    child.start()
    false_hangs = readings = 0
    while child.is_alive():
        calls, started, _, call = parent.read()
        false_hangs += bool(call and time.monotonic() - started > 1.0)
        readings += 1
    child.join()
    assert readings and not false_hangs
    assert CALLS.index("update") and _STAMP.size == 32


def test_one_torn_reading_does_not_kill_a_healthy_child():
    # the watchdog takes a hang only when a second reading shows the same call still on: a stamp
    # read mid-write (or on a host without x86's store order) is never read the same way twice
    from conformance.generation.v0 import sample_traces, traces
    from conformance.runner.isolated import ChildRunner

    runner = ChildRunner("reference")
    runner.start()

    class OnceTorn:
        def __init__(self, stamp):
            self.stamp, self.torn, self.reads = stamp, 0, 0

        def read(self):
            calls, started, step, call = self.stamp.read()
            self.reads += 1
            if self.torn < 3 and self.reads % 2:  # one reading in two: a call "started" at 0.0, as a torn one shows
                self.torn += 1
                return calls, 0.0, step, "update"
            return calls, started, step, call

        def __getattr__(self, name):
            return getattr(self.stamp, name)

    try:
        runner._stamp = OnceTorn(runner._stamp)
        for trace in sample_traces(traces(max_requests=4), 3, 1):
            summary = runner.run(trace, ["BLK-001"])
            assert not summary.problems, summary.problems
        assert runner._stamp.torn == 3 and runner.starts == 1
    finally:
        runner.close()
