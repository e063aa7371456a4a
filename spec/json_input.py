"""Reading a user's JSON file without trusting it.

Every JSON file a user hands kvsched (a trace, a config, an expectations file) goes through
`read_json`, so that no file, however made, gets past it as anything but a value or one
`InputError` naming the file. `json.loads(path.read_text())` fails five ways that are not one
line, or not quick:

1. a directory or a missing file: an `OSError` with a traceback;
2. ``/dev/zero`` or a FIFO: ``read_text`` never returns (or fills memory), so the file is read
   in one bounded ``read`` of at most `MAX_BYTES` + 1 bytes, and a longer one is refused;
3. bytes that are not UTF-8: a `UnicodeDecodeError` with the offending byte's offset;
4. deep nesting: a `RecursionError` from the decoder, and even a depth the decoder survives
   makes every later recursive walk fragile, so nesting past `MAX_DEPTH` is refused;
5. numbers JSON does not have or that nobody means: ``NaN`` and ``Infinity`` (Python accepts
   them, the JSON standard does not), ``1e400`` (Python reads it as infinity), and integers past `MAX_INT_DIGITS` digits (Python 3.11
   refuses 4300 digits with a `ValueError`, and printing one in an error message fails again).

The limits are far above any real trace (the largest the fuzzer writes is a few hundred KB and
six levels deep) and far below what hurts.
"""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path
from typing import Any

from spec.errors import InputError

MAX_BYTES = 16 << 20  # 16 MiB
MAX_DEPTH = 32
MAX_INT_DIGITS = 30  # 10**30 is past every limit a field has; the message can still show it


def read_json(path: str | Path, where: str | None = None, max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value in ``path``, or `InputError` at ``where`` (default: the path itself;
    messages never repeat the path, so ``where`` may name the flag too).

    The file is opened once and read with one bounded read, so a device or a FIFO that never
    ends costs at most ``max_bytes`` of memory, never a hang (a FIFO with no writer would block
    in ``open``, so anything that is not a regular file is refused before it is opened).
    """
    path = Path(path)
    where = where or str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(where, "no such file") from None
    except OSError as err:
        raise InputError(where, f"cannot read: {err.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(where, "is a directory, expected a JSON file")
    if not stat.S_ISREG(info.st_mode):
        raise InputError(where, "is not a regular file (a device or a pipe), expected a JSON file")
    if info.st_size > max_bytes:
        raise InputError(where, f"is {info.st_size} bytes, more than the {max_bytes} a JSON input may have")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)  # a file that grew since stat() is caught here
    except OSError as err:
        raise InputError(where, f"cannot read: {err.strerror or err}") from None
    if len(raw) > max_bytes:
        raise InputError(where, f"is more than the {max_bytes} bytes a JSON input may have")
    return parse_json(raw, where)


def parse_json(raw: bytes | str, where: str) -> Any:
    """Decode and parse ``raw`` under the limits above; errors say line and column."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[: err.start].count(b"\n") + 1
            raise InputError(where, f"not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}, line {line})") from None
    else:
        text = raw
    if not text.strip():
        raise InputError(where, "is empty, expected a JSON value")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_int=_bounded_int,
                           parse_float=_finite_float)
    except json.JSONDecodeError as err:
        raise InputError(where, f"not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except RecursionError:
        raise InputError(where, f"nested more than {MAX_DEPTH} levels deep") from None
    except _Refused as err:
        raise InputError(where, str(err)) from None
    depth = nesting_depth(value)
    if depth > MAX_DEPTH:
        raise InputError(where, f"nested {depth} levels deep, more than the {MAX_DEPTH} allowed")
    return value


def nesting_depth(value: Any) -> int:
    """How deep lists and objects nest in ``value`` (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:  # past the limit the answer is already known to be "too deep"
            stack.extend((child, depth + 1) for child in children)
    return deepest


class _Refused(ValueError):
    """A number the parser met that no field accepts; becomes an InputError with the file."""


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number (use a finite number)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf
        raise _Refused(f"the number {text[:40]} is out of range (not a finite float)")
    return value


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"an integer with {len(digits.lstrip('-'))} digits is out of range "
                       f"(at most {MAX_INT_DIGITS} digits)")
    return int(digits)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_INT_DIGITS", "nesting_depth", "parse_json", "read_json"]
