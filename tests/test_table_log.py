"""`reference_impl.table_log.TableLog`: every write but an append sets the flag; appends show as
length, and reads do neither."""

from __future__ import annotations

import copy

import pytest

from reference_impl.table_log import TableLog


@pytest.mark.parametrize("write", [
    lambda t: t.insert(0, 9),
    lambda t: t.pop(), lambda t: t.remove(2), lambda t: t.clear(), lambda t: t.sort(reverse=True),
    lambda t: t.reverse(), lambda t: t.__setitem__(0, 9), lambda t: t.__delitem__(0), lambda t: t.__imul__(2),
])
def test_every_write_sets_the_flag(write) -> None:  # type: ignore[no-untyped-def]
    table = TableLog([1, 2, 3])
    assert table.written  # nothing observed yet
    table.written = False
    write(table)
    assert table.written


def test_appends_show_as_length_only() -> None:
    table = TableLog([1, 2, 3])
    table.written = False
    table.append(4)
    table.extend([5])
    table += [6]
    assert not table.written and len(table) == 6 and table[:3] == [1, 2, 3]


def test_reads_leave_it_alone() -> None:
    table = TableLog([1, 2, 3])
    table.written = False
    assert (table[:], len(table), list(reversed(table)), table[0], 2 in table) == ([1, 2, 3], 3, [3, 2, 1], 1, True)
    assert not table.written and type(table[:]) is list


def test_a_copy_is_a_table_log() -> None:
    copied = copy.deepcopy(TableLog([4, 5]))
    assert type(copied) is TableLog and copied == [4, 5] and copied.written
