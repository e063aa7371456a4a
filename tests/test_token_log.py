"""`reference_impl.token_log.TokenLog`: every write below the end lowers the mark, appends do not."""

from __future__ import annotations

import copy

import pytest

from reference_impl.token_log import TokenLog


def _observed_after(write) -> int:  # type: ignore[no-untyped-def]
    tokens = TokenLog(range(10))
    assert tokens.observed() == 0  # nothing was read before
    write(tokens)
    return tokens.observed()


def test_appends_keep_every_token() -> None:
    assert _observed_after(lambda t: t.append(1)) == 10
    assert _observed_after(lambda t: t.extend([1, 2])) == 10
    assert _observed_after(lambda t: t.__iadd__([1])) == 10


@pytest.mark.parametrize("write, kept", [
    (lambda t: t.__setitem__(4, 0), 4),
    (lambda t: t.__setitem__(-1, 0), 9),
    (lambda t: t.__setitem__(slice(2, 5), [0]), 2),
    (lambda t: t.__setitem__(slice(None, None, -1), list(range(10))), 0),
    (lambda t: t.__delitem__(7), 7),
    (lambda t: t.__delitem__(slice(3, None)), 3),
    (lambda t: t.insert(5, 0), 5),
    (lambda t: t.insert(99, 0), 10),
    (lambda t: t.pop(), 9),
    (lambda t: t.pop(1), 1),
    (lambda t: t.remove(6), 0),
    (lambda t: t.clear(), 0),
    (lambda t: t.sort(reverse=True), 0),
    (lambda t: t.reverse(), 0),
    (lambda t: t.__imul__(2), 0),
])
def test_other_writes_lower_the_mark(write, kept) -> None:  # type: ignore[no-untyped-def]
    assert _observed_after(write) == kept


def test_a_copy_keeps_its_mark() -> None:
    tokens = TokenLog([1, 2, 3])
    tokens.observed()
    tokens[0] = 5
    copied = copy.deepcopy(tokens)
    assert type(copied) is TokenLog and copied == [5, 2, 3] and copied.observed() == 0
