"""A sequence's token ids that know how many of them are unchanged since last observed:
bookkeeping for delta snapshots only.

The driver's type check and PIP-001 read every token of a view, and a decode appends one token
to hundreds, so both read only the tokens past the base view's (`spec.observation.base_token_prefix`).
Finding that prefix costs a comparison of the whole token tuple per changed view per snapshot
(about a microsecond at 400 tokens) unless the snapshot says it (`Snapshot.kept_tokens`). The
token-budget references keep each request's tokens in a `TokenLog`: appends (``append``,
``extend``, ``+=``: what a decode and a verified draft run do) cannot change a token already
there and stay the plain list's, at C speed; every other write (``tokens[i] = t``, ``del``,
``insert``, ``pop``, ``remove``, ``sort``, ...) lowers the mark to the first position it may
have changed. Any code that writes the list is seen, a mutant's included; a list swapped for
another object is not a `TokenLog` and its snapshot compares the tokens as before.

Not scheduling state: the policy never reads the mark (STYLE.md, "keep state that exists only for
checking or speed apart from policy state").
"""

from __future__ import annotations

from typing import Any, SupportsIndex


class TokenLog(list):
    """A list of token ids with a low-water mark, ``low``: every position below it holds what it
    held when the observer last set ``low`` to the length (`observed`; a snapshot builder reads
    and sets the slot directly, a method call per request per snapshot being most of its cost).
    Copy it with ``tokens[:]``, not ``tuple(tokens)``: CPython copies only an exact list at C
    speed, a subclass through its iterator (four times slower)."""

    __slots__ = ("low",)

    def __init__(self, tokens: Any = ()) -> None:
        super().__init__(tokens)
        self.low = 0  # nothing observed yet

    def observed(self) -> int:
        """How many leading tokens are unchanged since the last call (0 at the first); the
        caller reads them now, so the mark moves to the end."""
        kept = min(self.low, len(self))
        self.low = len(self)
        return kept

    def _lower(self, position: int) -> None:
        if position < self.low:
            self.low = max(position, 0)

    def _at(self, index: SupportsIndex | slice) -> int:
        """The first position a write at ``index`` may change."""
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            return min(start, stop) if step > 0 else 0
        position = index.__index__()
        return position + len(self) if position < 0 else position

    def __setitem__(self, index, value) -> None:  # type: ignore[no-untyped-def]
        self._lower(self._at(index))
        super().__setitem__(index, value)

    def __delitem__(self, index) -> None:  # type: ignore[no-untyped-def]
        self._lower(self._at(index))
        super().__delitem__(index)

    def insert(self, index: SupportsIndex, value: Any) -> None:
        self._lower(min(self._at(index), len(self)))
        super().insert(index, value)

    def pop(self, index: SupportsIndex = -1) -> Any:
        self._lower(self._at(index))
        return super().pop(index)

    def remove(self, value: Any) -> None:
        self._lower(0)
        super().remove(value)

    def clear(self) -> None:
        self.low = 0
        super().clear()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        self.low = 0
        super().sort(*args, **kwargs)

    def reverse(self) -> None:
        self.low = 0
        super().reverse()

    def __imul__(self, times: SupportsIndex):  # type: ignore[no-untyped-def]
        self.low = 0
        return super().__imul__(times)
