"""Which blocks of a pool changed since it was last observed: bookkeeping for delta snapshots only.

A snapshot of a large pool is cheap to check when it names the blocks whose reference count or
free-list entries changed since the snapshot before (`spec.observation.Snapshot.gpu_block_changes`);
the block checks then read those blocks instead of the whole pool (`spec.invariants._views.pool_facts`).
The pools record the changed blocks here, *in the containers themselves*: a list of reference
counts that logs every block written and a free list that logs every block entering or leaving it
(and keeps how many times it names each block). Any code that writes them is seen, a mutant's
override of a pool method included; a change the log missed would hide a violation from
incremental checking (tests/test_incremental_check.py holds the deltas to whole snapshots).

Not scheduling state: the policy never reads the log (STYLE.md, "keep state that exists only for
checking or speed apart from policy state"). A write the containers cannot attribute to blocks
(a slice, a sort, a reassignment) marks the log ``whole``: the next snapshot is checked whole.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from copy import deepcopy


class ChangeLog:
    """The blocks written since the last `take` (or ``whole``: unknown, check everything)."""

    __slots__ = ("blocks", "whole")

    def __init__(self) -> None:
        self.blocks: set[int] = set()
        self.whole = True  # nothing was observed yet

    def take(self, free: _FreeEntries) -> dict[int, int] | None:
        """Changed block -> how many times ``free`` names it now; None when unknown. Resets."""
        if self.whole:
            changes = None
            free.recount()
        else:
            counts = free.counts
            changes = {b: counts.get(b, 0) for b in self.blocks}
        self.blocks = set()
        self.whole = False
        return changes


def _logs_whole(base: type, name: str):
    """``base.name`` marking the log whole: a write the container cannot attribute to blocks."""
    def method(self, *args, **kwargs):
        self.log.whole = True
        return getattr(base, name)(self, *args, **kwargs)

    method.__name__ = name
    return method


def _copied(container, fill, memo: dict):  # type: ignore[no-untyped-def]
    """A deep copy of a logged container whose log is the copy of its log (``memo`` makes the
    pool's copy and its containers' share one), so a copied scheduler (the proof tie tests copy
    one per action) keeps logging."""
    new = type(container).__new__(type(container))
    fill(new, container)
    new.log = deepcopy(container.log, memo)
    if hasattr(container, "counts"):
        new.counts = dict(container.counts)
    return new


class LoggedCounts(list):
    """Per-block reference counts that log each block written (``counts[b] += 1`` included)."""

    __slots__ = ("log",)

    def __init__(self, size: int, log: ChangeLog) -> None:
        super().__init__([0] * size)
        self.log = log

    def __deepcopy__(self, memo: dict) -> LoggedCounts:
        return _copied(self, list.extend, memo)

    def __setitem__(self, index, value) -> None:  # type: ignore[no-untyped-def]
        if isinstance(index, int):
            self.log.blocks.add(index if index >= 0 else index + len(self))
        else:
            self.log.whole = True
        list.__setitem__(self, index, value)



class _FreeEntries:
    """Shared by the free containers: how many times the list names each block, and the log."""

    counts: dict[int, int]
    log: ChangeLog

    def recount(self) -> None:
        """Count the entries afresh (after a write the log could not follow)."""
        counts: dict[int, int] = {}
        for block in self:  # type: ignore[attr-defined]
            counts[block] = counts.get(block, 0) + 1
        self.counts = counts

    def _enter(self, block: int) -> None:
        self.counts[block] = self.counts.get(block, 0) + 1
        self.log.blocks.add(block)

    def _leave(self, block: int) -> None:
        left = self.counts[block] - 1
        if left:
            self.counts[block] = left
        else:
            del self.counts[block]
        self.log.blocks.add(block)


class LoggedFreeQueue(_FreeEntries, deque):
    """A free queue (vLLM V1 / nano-vllm order, `reference_impl.prefix_cache`) that logs each block
    entering or leaving it."""

    def __init__(self, blocks: Iterable[int], log: ChangeLog) -> None:
        super().__init__(blocks)
        self.log = log
        self.recount()

    def __deepcopy__(self, memo: dict) -> LoggedFreeQueue:
        return _copied(self, deque.extend, memo)

    def append(self, block: int) -> None:
        self._enter(block)
        deque.append(self, block)

    def appendleft(self, block: int) -> None:
        self._enter(block)
        deque.appendleft(self, block)

    def extend(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self.append(block)

    def extendleft(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self.appendleft(block)

    def pop(self) -> int:
        block = deque.pop(self)
        self._leave(block)
        return block

    def popleft(self) -> int:
        block = deque.popleft(self)
        self._leave(block)
        return block

    def remove(self, block: int) -> None:
        deque.remove(self, block)
        self._leave(block)



class LoggedSortedFree(_FreeEntries, list):
    """The V0 pool's free ids kept sorted highest first (the next block handed out, the lowest,
    pops off the end): `insert` (what `bisect.insort` calls on a list subclass) and `pop` log the
    block, and the observed free list is the list reversed, not sorted again each snapshot."""

    def __init__(self, blocks: Iterable[int], log: ChangeLog) -> None:
        super().__init__(sorted(blocks, reverse=True))
        self.log = log
        self.recount()

    def __deepcopy__(self, memo: dict) -> LoggedSortedFree:
        return _copied(self, list.extend, memo)

    def insert(self, index: int, block: int) -> None:  # type: ignore[override]
        self._enter(block)
        list.insert(self, index, block)

    def pop(self, index: int = -1) -> int:  # type: ignore[override]
        block = list.pop(self, index)
        self._leave(block)
        return block

    def remove(self, block: int) -> None:
        list.remove(self, block)
        self._leave(block)



def changed_blocks(counts: object, free: object, log: ChangeLog) -> dict[int, int] | None:
    """`ChangeLog.take` for a pool whose ``counts`` and ``free`` are still the logged containers
    of ``log`` (None, check whole, if anything replaced them)."""
    if not (isinstance(counts, LoggedCounts) and isinstance(free, _FreeEntries)
            and counts.log is log and free.log is log):
        return None
    return log.take(free)


# The writes a container cannot attribute to blocks (a slice, a sort, growing the counts): each
# marks the log whole, so the next snapshot is checked whole.
for _cls, _base, _names in (
    (LoggedCounts, list, ("__delitem__", "__iadd__", "__imul__", "append", "extend", "insert", "pop", "remove",
                          "clear", "sort", "reverse")),
    (LoggedFreeQueue, deque, ("__setitem__", "__delitem__", "__iadd__", "__imul__", "insert", "clear", "rotate",
                              "reverse")),
    (LoggedSortedFree, list, ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "clear",
                              "sort", "reverse")),
):
    for _name in _names:
        setattr(_cls, _name, _logs_whole(_base, _name))
