"""The runner <-> adapter-process channel: length-prefixed JSON frames over a pair of pipes, and
a small shared "stamp" through which the adapter's process says which call it is in.

Frames: a 4-byte big-endian length, then that many bytes of UTF-8 JSON. Pipes carry them
instead of the child's stdout so that whatever the adapter prints never mixes with the
protocol (or with the report).

The stamp is a memory-mapped file of 32 bytes, written by the child before and after every
adapter call and read by the parent's watchdog: a call counter, the call's start on the
machine's monotonic clock (the same clock in every process), the step, and which call (0 while
the runner itself is working). Writing it costs well under a microsecond a call; a message per
call would cost a round trip per call, which is what isolation must not cost (BENCHMARKS.md).

The stamp is a seqlock (`Stamp`): a count of writes begun before the fields, and of writes
ended after them. Without it the parent could read a half-written stamp: a child preempted inside
`Stamp.leave` between clearing the start time and clearing the call showed "update, started
at 0.0", a call that had run for the machine's whole uptime, and the watchdog killed it as a
FAULT-hang. On a loaded machine (load 7-13 on 2 cores) that happened once or twice in every
300-trace campaign of the Vidur targets, whose calls are the cheapest and most numerous
(docs/CONFORMANCE.md, vidur FAULT-hang; tests/test_channel.py).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import time
from typing import Any

from spec.protocol import OPTIONAL_CALLS

_LENGTH = struct.Struct(">I")
MAX_FRAME = 64 << 20  # a summary is a few KB; anything near this is a broken peer


class ChannelClosed(Exception):
    """The other end went away (EOF) or sent something that is not a frame."""


def send(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            raise ChannelClosed("end of stream")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd: int) -> dict[str, Any]:
    (length,) = _LENGTH.unpack(read_exact(fd, _LENGTH.size))
    if length > MAX_FRAME:
        raise ChannelClosed(f"frame of {length} bytes")
    try:
        message = json.loads(read_exact(fd, length))
    except ValueError as err:
        raise ChannelClosed(f"not JSON: {err}") from None
    if not isinstance(message, dict):
        raise ChannelClosed("a frame that is not an object")
    return message


# --------------------------------------------------------------------------- the call stamp
# The calls a stamp can name; the optional ones (spec/protocol.py) too, or a trace with an admin call
# (reset_prefix_cache, pause_new, ...) made the stamp raise in the child.
CALLS = ("", "reset", "add_request", "abort_request", "schedule", "update", "snapshot", "load", *OPTIONAL_CALLS)
_BEGUN = struct.Struct("<q")  # writes begun: the first word
_STAMP = struct.Struct("<qdiiq")  # calls started, start time (monotonic), step, call index (0: none), writes ended
_SIZE = _BEGUN.size + _STAMP.size
_ENDED_AT = _SIZE - _BEGUN.size
_READ_TRIES = 100


class Stamp:
    """The shared stamp; the child `enter`s and `leave`s calls, the parent `read`s.

    A seqlock in two stores: the child counts a write as begun, then stores the fields and the
    same count as ended in one ``pack_into`` (which stores in field order); the parent reads in
    the reverse order (ended, the fields, begun), so a reading whose two counts differ overlapped
    a write, and is taken again. No fences: this relies on stores and loads staying in program
    order, as x86 keeps them (an ARM host could still, rarely, read a torn stamp). ``pack_into``
    first zeroes the bytes it packs (CPython's ``s_pack_internal``), so both counts pass through 0
    in every write: a reading whose counts are both 0 while the fields say a call is on caught two
    writes' zeroing, and is taken again too (the stamp before any write is all zeros)."""

    def __init__(self, path: str, create: bool = False) -> None:
        if create:
            with open(path, "wb") as f:
                f.write(b"\0" * _SIZE)
        self._file = open(path, "r+b")  # noqa: SIM115 - kept open with the map
        self._map = mmap.mmap(self._file.fileno(), _SIZE)
        self.calls = 0
        self.step = 0
        self._writes = 0  # the child's: writes begun
        self._last = (0, 0.0, 0, "")  # the parent's: the last whole stamp it read

    def enter(self, call: str) -> None:
        self.calls += 1
        self._writes += 1
        _BEGUN.pack_into(self._map, 0, self._writes)
        _STAMP.pack_into(self._map, _BEGUN.size, self.calls, time.monotonic(), self.step, CALLS.index(call), self._writes)

    def leave(self) -> None:
        self._writes += 1
        _BEGUN.pack_into(self._map, 0, self._writes)
        _STAMP.pack_into(self._map, _BEGUN.size, self.calls, 0.0, self.step, 0, self._writes)

    def read(self) -> tuple[int, float, int, str]:
        """(calls started, start of the current call, step, current call or ""): a whole stamp,
        never a half-written one. While the child is writing, the last whole one read (the child
        is between two states, and either is true for the microsecond a write takes)."""
        for _ in range(_READ_TRIES):
            # in the reverse of the writer's order: ended, the fields, begun
            (ended,) = _BEGUN.unpack_from(self._map, _ENDED_AT)
            calls, started, step, call, _ = _STAMP.unpack_from(self._map, _BEGUN.size)
            (begun,) = _BEGUN.unpack_from(self._map, 0)
            if begun == ended and (begun or (call == 0 and calls == 0)):
                self._last = (calls, started, step, CALLS[call] if 0 <= call < len(CALLS) else "?")
                break
        return self._last

    def close(self) -> None:
        self._map.close()
        self._file.close()
