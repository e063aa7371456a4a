"""A sequence's block table that knows whether it was written since last observed: bookkeeping
for delta snapshots only.

A snapshot after schedule() looks at every running request, and all a decode step changes in
most of them is nothing (a block is appended once per block_size tokens); copying each table
into a tuple and comparing it with the last one only to find it equal was a third of such a
snapshot. The token-budget references keep each table in a `TableLog`: appends (``append``,
``extend``, ``+=``, which the scheduler calls for every request it schedules, mostly with
nothing) stay the plain list's, at C speed, and show as a longer table; every other write
(``del``, ``pop``, ``table[i] = b``, ``clear``, ...) sets ``written``. While it is unset and the
length is the one the previous view saw, the snapshot builder reuses that view's table; it
clears the flag when it reads the table. A table swapped for another object (``tracked.blocks =
[]``) is not a `TableLog` unless the code builds one, and its snapshot compares the tables as
before.

Not scheduling state: the policy never reads the flag (STYLE.md, "keep state that exists only
for checking or speed apart from policy state").
"""

from __future__ import annotations

from typing import Any


def _writes(name: str):  # type: ignore[no-untyped-def]
    """``list.name`` that marks the table written (any write but an append)."""
    base = getattr(list, name)

    def method(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[no-untyped-def]
        self.written = True
        return base(self, *args, **kwargs)

    method.__name__ = name
    return method


class TableLog(list):
    """A list of block ids with a ``written`` flag, set by every write but an append and cleared
    by the observer (a snapshot builder reads and clears the slot directly): unset, the table is
    what the observer last read plus whatever was appended since. Copy it with ``table[:]``:
    CPython copies only an exact list at C speed."""

    __slots__ = ("written",)

    def __init__(self, blocks: Any = ()) -> None:
        super().__init__(blocks)
        self.written = True  # nothing observed yet

    insert = _writes("insert")
    pop = _writes("pop")
    remove = _writes("remove")
    clear = _writes("clear")
    sort = _writes("sort")
    reverse = _writes("reverse")
    __setitem__ = _writes("__setitem__")
    __delitem__ = _writes("__delitem__")
    __imul__ = _writes("__imul__")
