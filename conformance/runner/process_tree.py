"""The adapter's process tree: every process its child started, in any session, found and ended.

An adapter may start processes of its own (an engine's workers, a wire host, a helper), and one
started in its own session (``setsid``, a double fork) is out of reach of the process group the
runner kills. So that the tree is the runner's, three things hold together (Linux; elsewhere the
group kill is all there is):

1. The adapter's process is a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``, set by
   `conformance.runner.worker`): a process orphaned anywhere below it is re-parented to it, not to
   init, so every descendant stays in its tree while it lives, whatever session it is in.
2. The runner reads the tree from ``/proc/<pid>/task/<tid>/children`` (`descendants`), each time
   it looks at memory (every 50 ms): ``--max-memory`` counts the whole tree's resident memory,
   and the processes seen are remembered with their start times (`Tree`), for when the adapter's
   process dies first and its orphans go to init.
3. Ending the tree (`Tree.end`) stops every process first (``SIGSTOP``, repeated until no new
   one appears, so nothing forks meanwhile), then kills them all (``SIGKILL``); a remembered
   process is killed only if its start time is still the one seen (a pid is reused, a start time
   is not).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of every orphan below it (Linux); False where it cannot."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children(pid: int) -> list[int]:
    """``pid``'s child processes (every thread's), from /proc; [] when it is gone or unreadable."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return found


_HAS_CHILDREN_FILES = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children_by_scan() -> dict[int, list[int]]:
    """Parent -> children of every process, from one pass over /proc (a few ms for a hundred
    processes: used only where the kernel has no children files)."""
    out: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if name.isdigit():
            parent = parent_of(int(name))
            if parent is not None:
                out.setdefault(parent, []).append(int(name))
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    out: list[int] = []
    seen = {pid}
    frontier = [pid]
    scanned = None if _HAS_CHILDREN_FILES else _children_by_scan()
    while frontier:
        nxt = []
        for parent in frontier:
            for child in (children(parent) if scanned is None else scanned.get(parent, ())):
                if child not in seen:
                    seen.add(child)
                    out.append(child)
                    nxt.append(child)
        frontier = nxt
    return out


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None  # field 22: starttime


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None  # field 4: ppid


def session_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[3]) if fields and len(fields) > 3 else None  # field 6: session


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: it only waits to be reaped)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def resident_mb(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total * _PAGE >> 20


def in_tree_of(pid: int, roots: Iterable[int]) -> int | None:
    """The root among ``roots`` whose tree ``pid`` is in (itself, an ancestor, or its session), or None."""
    roots = set(roots)
    if pid in roots:
        return pid
    session = session_of(pid)
    if session in roots:
        return session
    seen = set()
    current: int | None = pid
    while current and current > 1 and current not in seen:
        seen.add(current)
        current = parent_of(current)
        if current in roots:
            return current
    return None


# Seconds between two walks of the tree where they cost a scan of /proc; between walks, the
# memory look reads the processes the last walk found.
SCAN_PERIOD = 0.0 if _HAS_CHILDREN_FILES else 0.5


@dataclass
class Tree:
    """One adapter process's tree as the runner last saw it: pid -> start time."""

    root: int
    seen: dict[int, int | None] = field(default_factory=dict)
    current: list[int] = field(default_factory=list)
    walked_at: float = float("-inf")

    def look(self, now: float | None = None) -> list[int]:
        """The processes in the tree (the root included), remembered for `end`: walked again when
        ``now`` (a monotonic reading) is `SCAN_PERIOD` past the last walk, or always without it."""
        if now is not None and now - self.walked_at < SCAN_PERIOD:
            return self.current
        self.walked_at = now if now is not None else self.walked_at
        self.current = [self.root, *descendants(self.root)]
        for pid in self.current:
            if pid not in self.seen:
                self.seen[pid] = start_time(pid)
        return self.current

    def end(self) -> None:
        """Stop, then kill, every process of the tree, those seen earlier included."""
        stopped: set[int] = set()
        for _ in range(100):  # a tree that forks as fast as it is stopped still ends: each round stops more
            current = [p for p in self.look() if p not in stopped]
            for pid in self.seen:
                if pid not in stopped and pid not in current and self._same(pid):
                    current.append(pid)  # orphaned to init when the root died: still ours
            if not current:
                break
            for pid in current:
                _signal(pid, signal.SIGSTOP)
                stopped.add(pid)
        for pid in stopped:
            _signal(pid, signal.SIGKILL)

    def _same(self, pid: int) -> bool:
        return alive(pid) and start_time(pid) == self.seen.get(pid)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
