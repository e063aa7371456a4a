"""Checks for command-line values that argparse's ``type=`` cannot make.

argparse turns ``--timeout nan`` into a float and ``--max-examples 10**4000`` into an int without
a word, and it never looks at an output path. Each command calls these at the very top of its
``run()``, before it loads an adapter or spends a second of work, so that:

- a number that is not finite, below its minimum or past any sensible maximum is one
  `InputError` naming the flag (``--timeout: must be a finite number of seconds, got nan``);
- an output path that cannot be written (a directory where a file goes, a file where a folder
  goes, a read-only place) is refused before a long run, not at its end, when the findings
  would be lost.

The output checks write nothing that stays: a missing path is probed by creating and deleting a
temporary file in its nearest existing folder (running as root, `os.access` says yes to
everything, and only a real create sees a read-only mount or ``/proc``). What does not exist yet
is not created here; the command creates it once the run is sure to go ahead.
"""

from __future__ import annotations

import math
import os
import stat
import tempfile
from pathlib import Path

from spec.errors import InputError, shown

DAY_S = 86_400.0


def check_seconds(value: float | None, flag: str, *, maximum: float = 7 * DAY_S) -> float | None:
    """A positive, finite number of seconds no larger than ``maximum`` (None passes through)."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise InputError(flag, f"must be a finite number of seconds, got {value}")
    if value <= 0:
        raise InputError(flag, f"must be > 0 seconds, got {value}")
    if value > maximum:
        raise InputError(flag, f"must be at most {maximum:g} seconds, got {value:g}")
    return value


def check_count(value: int | None, flag: str, *, minimum: int = 1, maximum: int, unit: str = "") -> int | None:
    """An integer in ``[minimum, maximum]`` (None passes through); ``unit`` is said in the message."""
    if value is None:
        return None
    suffix = f" {unit}" if unit else ""
    if value < minimum:
        raise InputError(flag, f"must be >= {minimum}{suffix}, got {shown(value)}")
    if value > maximum:
        raise InputError(flag, f"must be at most {maximum}{suffix}, got {shown(value)}")
    return value


def check_output_file(path: Path | None, flag: str) -> Path | None:
    """``path`` can be written as a file: it is a writable file, or it can be created."""
    if path is None:
        return None
    try:
        info = path.stat()
    except FileNotFoundError:
        _check_can_create(path, flag, "file")
        return path
    except OSError as err:
        raise InputError(flag, f"cannot write {path}: {err.strerror}") from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(flag, f"{path} is a directory, expected a file to write")
    if stat.S_ISREG(info.st_mode):
        try:
            with open(path, "ab"):  # opens for writing without changing a byte
                pass
        except OSError as err:
            raise InputError(flag, f"cannot write {path}: {err.strerror}") from None
    elif not stat.S_ISCHR(info.st_mode):  # /dev/null is a fine place for a report; a FIFO is not
        raise InputError(flag, f"{path} is not a regular file")
    return path


def check_output_dir(path: Path | None, flag: str) -> Path | None:
    """``path`` can hold the run's files: a writable folder, or one that can be created."""
    if path is None:
        return None
    try:
        info = path.stat()
    except FileNotFoundError:
        _check_can_create(path, flag, "folder")
        return path
    except OSError as err:
        raise InputError(flag, f"cannot use {path}: {err.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise InputError(flag, f"{path} is not a folder")
    _probe(path, path, flag)
    return path


def _check_can_create(path: Path, flag: str, what: str) -> None:
    """The nearest existing ancestor of ``path`` is a folder we can create entries in."""
    parent = path.absolute().parent
    while True:
        try:
            info = parent.stat()
            break
        except FileNotFoundError:
            parent = parent.parent
        except OSError as err:
            raise InputError(flag, f"cannot create the {what} {path}: {err.strerror}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise InputError(flag, f"cannot create the {what} {path}: {parent} is a file, not a folder")
    _probe(parent, path, flag)


def _probe(folder: Path, path: Path, flag: str) -> None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise InputError(flag, f"cannot write {path}: {err.strerror or err} (in {folder})") from None


__all__ = ["check_count", "check_output_dir", "check_output_file", "check_seconds"]


MAX_WORKERS = 256


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def parse_workers(value: str | int, flag: str = "--workers") -> int:
    """``N`` (1..256) or ``auto`` (the cores available)."""
    if isinstance(value, int):
        number = value
    elif value.strip().lower() == "auto":
        return available_cores()
    else:
        try:
            number = int(value)
        except ValueError:
            raise InputError(flag, f"must be a whole number or 'auto', got {shown(value)}") from None
    return check_count(number, flag, maximum=MAX_WORKERS) or 1
