"""Check that what an adapter returned has the shape the spec defines, before anything reads it.

A malformed observation is the adapter's fault, reported as such with the step; it must never
crash the runner or be mistaken for an invariant violation. "Shape" is the whole answer: every
field's exact type (a subclass could run the adapter's code inside a check), its range
(``SchedulerOutput.step`` is the step asked for), and its size, bounded by the trace's config
(`Bounds`) before any check walks it, so that an answer with a million entries is refused in
the time it takes to read its length.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, ge, is_not
from typing import Any

from conformance.runner.guard import AdapterFault
from spec.observation import Capability, InFlightView, SeqView, Snapshot, base_token_prefix, with_delta
from spec.reasons import Reason
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput

_SEQ_ID, _REQUEST_ID, _NUM_TOKENS = attrgetter("seq_id"), attrgetter("request_id"), attrgetter("num_tokens")
_IS_PREFILL, _NUM_DRAFTS = attrgetter("is_prefill"), attrgetter("num_drafts")
_KIND, _NUMBERS = attrgetter("kind"), attrgetter("numbers")


def _fail(call: str, message: str) -> AdapterFault:
    return AdapterFault("malformed", call, message)


@dataclass(frozen=True)
class Bounds:
    """How large an answer about one trace can be, with room to spare: no correct scheduler, nor
    any bug worth reporting as a violation, comes near. ``entries``: the length of any list or
    mapping (sequences, blocks, queue entries, map pairs); ``tokens``: a sequence's token ids."""

    entries: int = 1 << 62
    tokens: int = 1 << 62

    @classmethod
    def of(cls, trace: Any) -> Bounds:
        """Four times what the trace could ever hold (every sequence of every request, every
        block of both pools; the longest sequence the config allows), plus a constant."""
        cfg = trace.config
        seqs = sum(arrival.request.n for arrival in trace.arrivals)
        entries = 4 * (seqs + cfg.num_gpu_blocks + cfg.num_cpu_blocks) + 64
        longest = max((a.request.prompt_len + a.request.max_tokens for a in trace.arrivals), default=0)
        tokens = 4 * (max(cfg.max_model_len, longest) + cfg.num_speculative_tokens) + 64
        return cls(entries, tokens)


UNBOUNDED = Bounds()


def _too_many(name: str, value: Any, bound: int) -> str | None:
    """Whether ``value`` (a container) is past ``bound``, said as a message; read before its entries."""
    try:
        n = len(value)
    except TypeError:
        return None  # not a container: the type checks say so
    return f"{name} has {n} entries, more than the {bound} any scheduler could report for this trace" \
        if n > bound else None


def check_output(value: Any, step: int, bounds: Bounds = UNBOUNDED) -> SchedulerOutput:
    if type(value) is not SchedulerOutput:
        raise _fail("schedule", f"returned {type(value).__name__}, expected SchedulerOutput")
    if type(value.step) is not int or value.step != step:
        raise _fail("schedule", f"SchedulerOutput.step is {value.step!r}, expected {step} (the step asked for)")
    for name in _OUTPUT_LISTS:
        problem = _too_many(f"SchedulerOutput.{name}", getattr(value, name), bounds.entries)
        if problem:
            raise _fail("schedule", problem)
    try:
        return _check_output(value)
    except (TypeError, AttributeError, ValueError) as err:  # a field of the wrong kind (None, a number, ...)
        raise _fail("schedule", f"malformed SchedulerOutput ({type(err).__name__}: {err})") from None


_OUTPUT_LISTS = ("scheduled", "preempted", "swapped_in", "swap_out", "swap_in", "copies", "ignored", "reasons")


def _check_output(value: SchedulerOutput) -> SchedulerOutput:
    for name in _OUTPUT_LISTS:
        if type(getattr(value, name)) not in (tuple, list):
            raise _fail("schedule", f"SchedulerOutput.{name} is {type(getattr(value, name)).__name__}, expected a tuple")
    scheduled = value.scheduled
    # Fast path (types checked a whole column at a time, at C speed; each count column read once);
    # the loop below names the first bad entry when it fails.
    if not scheduled or set(map(type, scheduled)) == {ScheduledSeq}:
        tokens = list(map(_NUM_TOKENS, scheduled))
        drafts = list(map(_NUM_DRAFTS, scheduled))
        if (not scheduled or (
                set(map(type, map(_SEQ_ID, scheduled))) == {str}
                and set(map(type, map(_REQUEST_ID, scheduled))) == {str}
                and set(map(type, tokens)) == {int}
                and set(map(type, map(_IS_PREFILL, scheduled))) == {bool}
                and set(map(type, drafts)) == {int}
                and min(tokens) >= 0 and max(tokens) <= _INT64 and min(drafts) >= 0
                and all(map(ge, tokens, drafts)))):  # ints both: ``>=`` is int's own
            scheduled = ()
    for item in scheduled:
        if type(item) is not ScheduledSeq or type(item.seq_id) is not str or type(item.request_id) is not str:
            raise _fail("schedule", f"scheduled entry {_shown(item)} is not a ScheduledSeq of strings")
        if type(item.num_tokens) is not int or not 0 <= item.num_tokens <= _INT64:
            raise _fail("schedule", f"{item.seq_id} has token count {_shown(item.num_tokens)}")
        if type(item.is_prefill) is not bool:
            raise _fail("schedule", f"{item.seq_id} has is_prefill {_shown(item.is_prefill)}, expected True or False")
        if type(item.num_drafts) is not int or not 0 <= item.num_drafts <= item.num_tokens:
            raise _fail("schedule", f"{item.seq_id} has num_drafts {_shown(item.num_drafts)}, expected an int in "
                                    f"[0, num_tokens {item.num_tokens}]")
    for p in value.preempted:
        if type(p) is not Preempted or type(p.request_id) is not str or type(p.mode) is not PreemptionMode:
            raise _fail("schedule", f"preempted entry {_shown(p)} is not a Preempted with a PreemptionMode")
    for name in ("swap_out", "swap_in", "copies"):
        for pair in getattr(value, name):
            if not (type(pair) is tuple and len(pair) == 2 and all(type(b) is int and _is_int(b) for b in pair)):
                raise _fail("schedule", f"{name} entry {_shown(pair)} is not a pair of block ids")
    for rid in (*value.ignored, *value.swapped_in):
        if type(rid) is not str:
            raise _fail("schedule", f"request id {_shown(rid)} is not a string")
    reasons = value.reasons
    if not reasons or (set(map(type, reasons)) == {Reason} and set(map(type, map(_KIND, reasons))) == {str}
                       and set(map(type, map(_REQUEST_ID, reasons))) == {str}
                       and set(map(type, map(_NUMBERS, reasons))) == {tuple}):
        reasons = ()  # fast path, as for the scheduled entries: the loop names the first bad one
    for reason in reasons:
        if type(reason) is not Reason or type(reason.kind) is not str or type(reason.request_id) is not str \
                or type(reason.numbers) is not tuple:
            raise _fail("schedule", f"reason {_shown(reason)} is not a spec.reasons.Reason")
    return value


def _shown(value: Any) -> str:
    """``repr(value)``, short, and never the adapter's own code failing in the message: a value
    of an unexpected type may have a ``__repr__`` that raises or never ends."""
    if type(value) in (str, int, bool, float, type(None)):
        text = repr(value)
    else:
        text = f"<{type(value).__name__} object>"
        try:
            if type(value) in (tuple, ScheduledSeq, Preempted, Reason):
                text = repr(value)
        except Exception:  # noqa: BLE001 - a field inside may be anything
            pass
    return text if len(text) <= 200 else text[:180] + f"... ({len(text)} characters)"


# Engines count in machine integers: a number past int64 is not a count but garbage.
_INT64 = 2**63 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value <= _INT64


def check_finished(value: Any, call: str, bounds: Bounds = UNBOUNDED) -> tuple[Finished, ...]:
    if value is None and call in ("abort_request", "add_request"):
        return ()
    items = (value,) if type(value) is Finished else value
    if type(items) not in (tuple, list):
        raise _fail(call, f"returned {type(value).__name__}, expected Finished entries (a list or a tuple)")
    problem = _too_many(f"{call}'s answer", items, bounds.entries)
    if problem:
        raise _fail(call, problem)
    items = tuple(items)
    for f in items:
        if type(f) is not Finished or type(f.request_id) is not str or type(f.status) is not Status \
                or not f.status.is_finished:
            raise _fail(call, f"entry {_shown(f)} is not a Finished with a final status")
    return items


def check_snapshot(value: Any, claimed: frozenset[Capability] = frozenset(),
                   previous: Snapshot | None = None, bounds: Bounds = UNBOUNDED) -> Snapshot:
    """The snapshot, once every field it fills has the type the spec gives it and every field
    a ``claimed`` capability promises is filled (so no predicate can crash on it). A snapshot
    whose ``base`` passed this check before is checked only where it differs from the base: the
    fields that are new objects and the views in ``changed_seqs``. A whole snapshot (no base) is
    first made a delta on ``previous``, the adapter's snapshot just before it, when that passed
    (`spec.observation.with_delta`, a diff at C speed), so checking it costs what changed."""
    if type(value) is not Snapshot:
        raise _fail("snapshot", f"returned {type(value).__name__}, expected Snapshot")
    for capability in claimed:
        for name in _PROMISED.get(capability, ()):
            if getattr(value, name) is None:
                raise _fail("snapshot", f"Snapshot.{name} is None, yet the adapter claims the {capability.value!r} "
                                        f"capability, which needs {', '.join(_PROMISED[capability])} (docs/ADAPTERS.md)")
    if value.__dict__.get(_CHECKED):
        return value
    if value.base is None and previous is not None and previous.__dict__.get(_CHECKED):
        try:
            value = with_delta(value, previous)
        except (TypeError, AttributeError, ValueError):
            pass  # malformed: checked whole below, which names the field
    base = value.base if value.base is not None and value.base.__dict__.get(_CHECKED) else None
    try:
        for name, check in _FIELD_CHECKS:
            part = getattr(value, name)
            if part is None or (base is not None and part is getattr(base, name)):
                continue
            if bounds is not UNBOUNDED and type(part) is not int and len(part) > bounds.entries:  # before any entry is read
                raise _fail("snapshot", _too_many(f"Snapshot.{name}", part, bounds.entries))
            problem = _seqs(part, value, base, bounds) if check is _seqs else check(part, value, base)
            if problem:
                raise _fail("snapshot", f"Snapshot.{name}: {problem}")
    except (TypeError, AttributeError, ValueError) as err:
        raise _fail("snapshot", f"malformed Snapshot ({type(err).__name__}: {err})") from None
    object.__setattr__(value, _CHECKED, True)  # frozen, but this mark is the checker's own
    return value


_CHECKED = "_kvsched_checked"
# The snapshot parts each capability promises (docs/ADAPTERS.md, "what snapshot() fills"). The
# CPU parts are left out: an engine without a CPU pool may leave them None.
_PROMISED: dict[Capability, tuple[str, ...]] = {
    Capability.STATUSES: ("statuses", "seqs"),
    Capability.QUEUES: ("waiting", "running", "swapped"),
    Capability.BLOCK_TABLES: ("seqs",),
    Capability.SEQ_LENGTHS: ("seqs",),
    Capability.REF_COUNTS: ("gpu_ref_counts",),
    Capability.FREE_COUNTS: ("gpu_free",),
    Capability.FREE_LISTS: ("gpu_free_ids",),
    Capability.IN_FLIGHT: ("in_flight",),
    Capability.KV_GROUPS: ("group_tables",),
}


def _ints(values: Any, *, non_negative: bool = False) -> str | None:
    if not isinstance(values, tuple):
        return f"is {type(values).__name__}, expected a tuple of ints"
    if len(values) > _LONG and _plain_int64s(values):
        return f"holds {min(values)}, expected ints >= 0" if non_negative and min(values) < 0 else None
    if values and set(map(type, values)) != {int}:
        bad = next(v for v in values if type(v) is not int)
        return f"holds {bad!r}, expected ints"
    if values and (max(values) > _INT64 or min(values) < -_INT64):
        return f"holds {max(values, key=abs)}, which no engine's counter holds (past int64)"
    if non_negative and values and min(values) < 0:
        return f"holds {min(values)}, expected ints >= 0"
    return None


_LONG = 256  # a pool-sized tuple: checked by `_plain_int64s` (a few C passes) before the type set


def _plain_int64s(values: tuple) -> bool:
    """Whether every entry is an int in int64, in one C pass (packing into an int64 array refuses
    other types and larger ints), four times cheaper than the type set on a pool-sized tuple. An
    int subclass, bool included, passes as the int it is. False: `_ints` says what is wrong."""
    try:
        array("q", values)
    except (TypeError, OverflowError):
        return False
    return True


def _ints_since(values: Any, checked: Any) -> str | None:
    """`_ints` of ``values``, reading only the entries that are not the very objects at the same
    place in ``checked`` (the base snapshot's tuple, which passed): a step changes a few reference
    counts of a large pool, and finding them by identity at C speed costs a fraction of a full
    type scan. Identity, not equality: an entry equal to an int but of another type is read."""
    if not isinstance(values, tuple) or not isinstance(checked, tuple) or len(values) != len(checked):
        return _ints(values)
    return _ints(tuple(map(values.__getitem__, compress(range(len(values)), map(is_not, values, checked)))))


def _block_changes(changes: Any) -> str | None:
    """A pool delta (`Snapshot.gpu_block_changes`): block id -> entries in the free list now."""
    if not isinstance(changes, Mapping):
        return f"is {type(changes).__name__}, expected a mapping of block id to free-list entries"
    for block, entries in changes.items():
        if not _is_int(block) or not _is_int(entries) or entries < 0:
            return f"entry {block!r}: {entries!r} is not a block id with a count >= 0"
    return None


def _kept_tokens(kept: Any) -> str | None:
    """A token delta (`Snapshot.kept_tokens`): sequence id -> leading token ids kept, at C speed."""
    if not isinstance(kept, Mapping):
        return f"is {type(kept).__name__}, expected a mapping of sequence id to a count of token ids"
    if kept and (set(map(type, kept)) != {str} or set(map(type, kept.values())) != {int} or min(kept.values()) < 0):
        bad = next((k, n) for k, n in kept.items() if type(k) is not str or type(n) is not int or n < 0)
        return f"entry {bad[0]!r}: {bad[1]!r} is not a sequence id with a count >= 0"
    return None


def _counts_since(values: Any, checked: Any, changes: Mapping[int, int] | None) -> str | None:
    """Reference counts: with a pool delta on a base that passed, only the changed blocks' counts
    are read (the others are the base's, as the delta says); else `_ints_since`."""
    if changes is None or not isinstance(values, tuple) or not isinstance(checked, tuple) \
            or len(values) != len(checked):
        return _ints_since(values, checked)
    return _ints(tuple(values[b] for b in changes if 0 <= b < len(values)))


def _free_since(values: Any, checked: Any, changes: Mapping[int, int] | None) -> str | None:
    """Free ids: with a pool delta on a base whose free list passed, the list is not read again.
    A relaxation, like the delta itself: the ids it names are ints (`_block_changes`) and every
    other entry is, the delta says, one the base listed. Else `_ints`."""
    if changes is None or checked is None or not isinstance(values, tuple):
        return _ints(values)
    return None


def _strs(values: Any) -> str | None:
    if not isinstance(values, tuple):
        return f"is {type(values).__name__}, expected a tuple of request ids"
    if values and set(map(type, values)) != {str}:
        return f"holds {next(v for v in values if type(v) is not str)!r}, expected request id strings"
    return None


def _count(value: Any) -> str | None:
    return None if _is_int(value) and value >= 0 else f"is {value!r}, expected an int >= 0"


def _statuses(statuses: Any, snap: Snapshot, base: Snapshot | None) -> str | None:
    if not isinstance(statuses, Mapping):
        return f"is {type(statuses).__name__}, expected a mapping of request id to Status"
    changed = snap.changed_requests if base is not None and snap.changed_requests is not None else None
    items = ((rid, statuses.get(rid)) for rid in changed if rid in statuses) if changed is not None else statuses.items()
    for rid, status in items:
        if not isinstance(rid, str) or not isinstance(status, Status):
            return f"entry {rid!r}: {status!r} is not a request id with a Status"
    return None


def _seqs(seqs: Any, snap: Snapshot, base: Snapshot | None, bounds: Bounds = UNBOUNDED) -> str | None:
    if not isinstance(seqs, Mapping):
        return f"is {type(seqs).__name__}, expected a mapping of sequence id to SeqView"
    changed = snap.changed_seqs if base is not None and snap.changed_seqs is not None else None
    items = ((sid, seqs[sid]) for sid in changed if sid in seqs) if changed is not None else seqs.items()
    checked = base.seqs if changed is not None and isinstance(base.seqs, Mapping) else {}
    # The adapter's count of kept token ids, read here as `base_token_prefix` reads it (that call's
    # lookups were a tenth of this check per decode); anything it would not take goes to it.
    given = snap.kept_tokens if changed is not None and isinstance(seqs, dict) and type(snap.kept_tokens) is dict \
        else None
    for sid, view in items:
        if type(view) is SeqView and (
                (view.blocks is not None and len(view.blocks) > bounds.entries)
                or (view.token_ids is not None and len(view.token_ids) > bounds.tokens)):
            return f"{sid!r}: {len(view.blocks or ())} blocks and {len(view.token_ids or ())} token ids, more than " \
                   f"any sequence of this trace could hold ({bounds.entries} blocks, {bounds.tokens} tokens)"
        old = checked.get(sid)
        if old is None or snap.base is not base:
            known = 0
        else:
            found = given.get(sid) if given is not None else None
            tokens = view.token_ids if type(view) is SeqView else None
            known = found if type(found) is int and type(tokens) is tuple and 0 <= found <= len(tokens) \
                else base_token_prefix(snap, sid)
        if _plain_view(view, sid, old, known):
            continue
        problem = _view(view, old, known)
        if problem or not isinstance(sid, str) or sid != view.seq_id:
            return f"{sid!r}: {problem or 'the key is not the view seq_id'}"
    return None


def _plain_view(v: Any, sid: Any, checked: SeqView | None, known: int) -> bool:
    """Whether view ``v`` under key ``sid`` is well formed, decided by exact types only: the
    common case, about three times cheaper than `_view`'s isinstance checks. False means only
    "not decided here": `_view` then says what, if anything, is wrong. Accepts nothing `_view`
    refuses (ints are exactly ``int`` and in int64, subclasses go the slow way)."""
    if type(v) is not SeqView or type(sid) is not str or v.seq_id != sid or type(v.request_id) is not str \
            or type(v.status) is not Status:
        return False
    n, c, blocks, tokens = v.num_tokens, v.num_computed, v.blocks, v.token_ids
    if not (n is None or (type(n) is int and 0 <= n <= _INT64)) or not (c is None or (type(c) is int and 0 <= c <= _INT64)):
        return False
    if blocks is not None and (checked is None or blocks is not checked.blocks) and (type(blocks) is not tuple or _ints(blocks)):
        return False
    if v.device is not None and v.device != "gpu" and v.device != "cpu":
        return False
    if tokens is None:
        return True
    if type(tokens) is not tuple:
        return False
    if known == len(tokens) - 1:  # a decode's one new token
        last = tokens[-1]
        return type(last) is int and -_INT64 <= last <= _INT64
    return not _ints(tokens[known:] if known else tokens)


def _view(v: Any, checked: SeqView | None = None, known: int = 0) -> str | None:
    """What is wrong with view ``v``, or None. ``checked``: the same sequence's view in the base
    snapshot, which passed this check; ``known``: how many leading token ids are that view's
    (`spec.observation.base_token_prefix`), so only the tokens past them are read (a decode adds
    one token to hundreds)."""
    if not isinstance(v, SeqView):
        return f"{v!r} is not a SeqView"
    if not isinstance(v.seq_id, str) or not isinstance(v.request_id, str) or not isinstance(v.status, Status):
        return "seq_id and request_id must be strings and status a Status"
    for name in ("num_tokens", "num_computed"):
        value = getattr(v, name)
        if value is not None and not (_is_int(value) and value >= 0):
            return f"{name} is {value!r}, expected an int >= 0 or None"
    if v.blocks is not None and (checked is None or v.blocks is not checked.blocks) and _ints(v.blocks):
        return f"blocks {_ints(v.blocks)}"
    if v.device not in (None, "gpu", "cpu"):
        return f"device is {v.device!r}, expected 'gpu', 'cpu' or None"
    tokens = v.token_ids
    if known and isinstance(tokens, tuple):
        tokens = tokens[known:]  # the prefix passed in the base snapshot
    if tokens is not None and _ints(tokens):
        return f"token_ids {_ints(tokens)}"
    return None


def _keys(keys: Any, snap: Snapshot, base: Snapshot | None) -> str | None:
    if not isinstance(keys, tuple) or any(k is not None and not isinstance(k, str) for k in keys):
        return "expected a tuple of block keys (strings or None)"
    return None


def _index(index: Any, snap: Snapshot, base: Snapshot | None) -> str | None:
    if not isinstance(index, Mapping):
        return f"is {type(index).__name__}, expected a mapping of key to block ids"
    for key, blocks in index.items():
        if not isinstance(key, str) or _ints(blocks):
            return f"entry {key!r}: {blocks!r} is not a key with a tuple of block ids"
    return None


def _in_flight(counters: Any, snap: Snapshot, base: Snapshot | None) -> str | None:
    # Any int is well formed, a negative one included: that is PIP-003's finding, not a shape error.
    if not isinstance(counters, Mapping):
        return f"is {type(counters).__name__}, expected a mapping of sequence id to InFlightView"
    for sid, view in counters.items():
        if not isinstance(sid, str) or not isinstance(view, InFlightView) or not all(map(_is_int, view)):
            return f"{sid!r}: {view!r} is not an InFlightView of three ints"
    return None


def _group_tables(tables: Any, snap: Snapshot, base: Snapshot | None) -> str | None:
    """Seq id -> a tuple of block tables (KV cache groups 1 .. n-1), each a tuple of ints."""
    if not isinstance(tables, Mapping):
        return f"is {type(tables).__name__}, expected a mapping of seq id to tables"
    for sid, group in tables.items():
        if not isinstance(sid, str) or not isinstance(group, tuple):
            return f"{sid!r}: expected a tuple of tables"
        for table in group:
            problem = _ints(table)
            if problem:
                return f"{sid!r}: a table {problem}"
    return None


_FIELD_CHECKS: tuple[tuple[str, Callable[[Any, Snapshot, Snapshot | None], str | None]], ...] = (
    ("statuses", _statuses),
    ("seqs", _seqs),
    ("waiting", lambda v, s, b: _strs(v)),
    ("running", lambda v, s, b: _strs(v)),
    ("swapped", lambda v, s, b: _strs(v)),
    ("gpu_block_changes", lambda v, s, b: _block_changes(v)),
    ("cpu_block_changes", lambda v, s, b: _block_changes(v)),
    ("kept_tokens", lambda v, s, b: _kept_tokens(v)),
    ("gpu_ref_counts", lambda v, s, b: _counts_since(v, b and b.gpu_ref_counts, b and s.gpu_block_changes)),
    ("cpu_ref_counts", lambda v, s, b: _counts_since(v, b and b.cpu_ref_counts, b and s.cpu_block_changes)),
    ("gpu_free", lambda v, s, b: _count(v)),
    ("cpu_free", lambda v, s, b: _count(v)),
    ("gpu_free_ids", lambda v, s, b: _free_since(v, b and b.gpu_free_ids, b and s.gpu_block_changes)),
    ("cpu_free_ids", lambda v, s, b: _free_since(v, b and b.cpu_free_ids, b and s.cpu_block_changes)),
    ("gpu_block_keys", _keys),
    ("cache_index", _index),
    ("in_flight", _in_flight),
    ("gpu_fenced", lambda v, s, b: _ints(v)),
    ("gpu_cache_holds", lambda v, s, b: _ints(v)),
    ("group_tables", _group_tables),
)
