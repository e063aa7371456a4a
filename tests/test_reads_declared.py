"""Each invariant's `reads` declaration covers every `SeqView` field its predicate can read.

The incremental readers hand a predicate with declared reads only the views where one of those
fields changed since it last passed (spec.invariants._views.fresh_views), so a predicate that
read an undeclared field could miss a change there. Read from the source: every attribute named
like a SeqView field in the predicate and in the module-level functions of its module it calls
(transitively) counts as read, whatever object it is read on (an over-approximation), and a
predicate with declared reads may not reach a view's fields another way (``getattr`` with a
computed name, ``_asdict``, ``_fields``). The verdicts themselves are held equal to checking every
view on every mutant and the references' traces by tests/test_incremental_check.py.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap

import pytest

from spec.catalogue import catalogue
from spec.observation import SeqView

_FIELDS = frozenset(SeqView._fields)
_INDIRECT = {"_asdict", "_fields", "_replace"}


def _reachable_reads(fn) -> tuple[set[str], list[str]]:  # type: ignore[no-untyped-def]
    """(SeqView field names read, indirect accesses found) in ``fn`` and the functions of its
    module it calls by name, transitively."""
    module = sys.modules[fn.__module__]
    seen: set[str] = set()
    fields: set[str] = set()
    indirect: list[str] = []
    todo = [fn]
    while todo:
        f = todo.pop()
        if f.__name__ in seen:
            continue
        seen.add(f.__name__)
        tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if node.attr in _FIELDS:
                    fields.add(node.attr)
                elif node.attr in _INDIRECT:
                    indirect.append(f"{f.__name__}: .{node.attr}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if name == "getattr" and not (len(node.args) > 1 and isinstance(node.args[1], ast.Constant)):
                    indirect.append(f"{f.__name__}: getattr with a computed name")
                elif name == "getattr" and node.args[1].value in _FIELDS:
                    fields.add(node.args[1].value)
                target = getattr(module, name, None)
                if inspect.isfunction(target) and target.__module__ == module.__name__:
                    todo.append(target)
    return fields, indirect


DECLARED = [inv for inv in catalogue() if inv.reads is not None]


def test_some_invariants_declare_reads() -> None:
    assert {"RES-001", "RES-002", "RES-003", "RES-004", "BLK-006"} <= {inv.id for inv in DECLARED}


@pytest.mark.parametrize("inv", DECLARED, ids=lambda inv: inv.id)
def test_declared_reads_cover_the_source(inv) -> None:  # type: ignore[no-untyped-def]
    fn = inv.step or inv.end or inv.failure
    fields, indirect = _reachable_reads(fn)
    if inv.when is not None:  # the trigger chooses the views it is handed: it reads them too
        more, more_indirect = _reachable_reads(inv.when)
        fields, indirect = fields | more, indirect + more_indirect
    assert not indirect, f"{inv.id} reaches view fields indirectly: {indirect}"
    assert fields <= inv.reads, f"{inv.id} reads {sorted(fields - inv.reads)} but declares only {sorted(inv.reads)}"


def test_the_source_check_sees_an_undeclared_read() -> None:
    """The check above is not vacuous: a predicate reading num_tokens through a helper is caught."""

    def helper(view):  # type: ignore[no-untyped-def]
        return view.num_tokens

    def predicate(ctx, rec):  # type: ignore[no-untyped-def]
        for v in rec:
            if v.status and helper(v):
                yield "x"

    module = sys.modules[__name__]
    module.helper = helper  # type: ignore[attr-defined]  # module-level, as the predicates' helpers are
    try:
        helper.__module__ = predicate.__module__ = __name__
        fields, _ = _reachable_reads(predicate)
    finally:
        delattr(module, "helper")
    assert fields == {"status", "num_tokens"}


def test_an_undeclared_field_change_is_not_handed_on() -> None:
    """What the declaration buys: a view whose declared fields are unchanged is not handed to the
    predicate again; one whose declared field changed is, and so is a new one."""
    from spec.invariants._views import fresh_views
    from spec.observation import Snapshot
    from spec.status import Status

    a = SeqView("r#0", "r", Status.RUNNING, 10, 9, (1,), "gpu")
    b = SeqView("s#0", "s", Status.RUNNING, 20, 19, (2, 3), "gpu")
    old = Snapshot(statuses={"r": Status.RUNNING, "s": Status.RUNNING}, seqs={"r#0": a, "s#0": b})
    a2, b2 = a._replace(num_tokens=11, num_computed=10), b._replace(blocks=(2, 3, 4), num_tokens=21)
    c = SeqView("t#0", "t", Status.RUNNING, 5, 4, (5,), "gpu")
    new = Snapshot(statuses={"r": Status.RUNNING, "s": Status.RUNNING, "t": Status.RUNNING},
                   seqs={"r#0": a2, "s#0": b2, "t#0": c}, base=old, changed_seqs=frozenset({"r#0", "s#0", "t#0"}),
                   changed_requests=frozenset({"t"}))
    assert [sid for sid, _ in fresh_views(new, old)] == ["r#0", "s#0", "t#0"]
    assert [sid for sid, _ in fresh_views(new, old, frozenset({"blocks", "status"}))] == ["s#0", "t#0"]
    # Reads beyond the placement fields (counts a decode changes every step) are not filtered.
    assert [sid for sid, _ in fresh_views(new, old, frozenset({"blocks", "num_tokens"}))] == ["r#0", "s#0", "t#0"]


def test_the_evaluation_layer_hands_on_only_views_whose_declared_reads_changed() -> None:
    """Reads beyond placement are filtered by the evaluation layer against the snapshot before:
    a view whose declared fields are the ones it had there is not handed on; a view with one of
    them changed is, and so is a view that snapshot lacks (and every view without a snapshot)."""
    from spec.invariants._evaluation import SeqAt, _read_fields_changed
    from spec.observation import Snapshot
    from spec.status import Status

    tokens = (1, 2, 3)
    a = SeqView("r#0", "r", Status.RUNNING, 3, 2, (1,), "gpu", tokens)
    old = Snapshot(statuses={"r": Status.RUNNING}, seqs={"r#0": a})
    same_tokens = a._replace(num_computed=3)  # what schedule() changes in a decode: not its tokens
    grown = a._replace(num_tokens=4, token_ids=(*tokens, 4))
    new = SeqView("s#0", "s", Status.RUNNING, 2, 0, (), None, (5, 6))
    subjects = [SeqAt("after the step", v.seq_id, v, old) for v in (same_tokens, new)]
    reads = frozenset({"request_id", "token_ids"})
    assert [s.id for s in _read_fields_changed(subjects, old, reads)] == ["s#0"]
    assert [s.view for s in _read_fields_changed([SeqAt("after the step", "r#0", grown, old)], old, reads)] == [grown]
    assert _read_fields_changed(subjects, None, reads) == subjects
