"""Small readers over snapshots shared by the predicates.

Incremental checking lives here. A predicate states its rule over whole snapshots; these
readers let it look only at what can have changed. Derived views (tables, entry counts, the
running count, the per-request index, the requests in each status) are carried forward from the
previous snapshot through its delta (`Snapshot.base`, `changed_seqs`, `changed_requests`);
`fresh_*` hand a check of one view at a time only the views that changed since the last
snapshot it passed (`CheckContext.previous`); `checked_with_prior`, `queue_moves` and
`changed_*_between` let a check skip what is identical to what it passed; `entry_counts` gives
the table entries per block as a tuple, compared with reference counts at C speed; `pool_facts`
reads the reference counts and free list once per snapshot for every block check, and carries
them (like `free_in_tables`) through the blocks a pool names as changed
(`Snapshot.gpu_block_changes`), so a large pool costs what changed; `fresh_tokens_in_snapshots`
hands a check of every token only the tokens it has not read;
`chained_keys`, `keyed_blocks` and `changed_items` let the prefix-cache checks extend keys and
read only keyed or changed blocks; `views_of` finds a request's views without a scan;
`queue_set` and `shared_blocks` are carried while a queue, or every table, stands still;
`returned_step` carries each scheduled step until its outcome is processed (``pipeline_depth``
steps later), so a predicate about an outcome reads the step it belongs to, and `void_outcomes`
the sequences whose last outcome committed nothing (PFX-001's and SPD-007's one-slot allowance). A check that
declares the view fields it reads (`Invariant.reads`, set on `CheckContext.reads` while it runs)
within `PLACEMENT` is handed only the views whose placement changed (`placement_changes`, once
per snapshot). An
adapter that gives no delta has its whole snapshots diffed into one by the driver
(`spec.observation.with_delta`, at C speed), so the same shortcuts apply; the verdicts are those
of checking everything (`KVSCHED_FULL_CHECK=1` forces that path; tests/test_incremental_check.py
compares them, on the references, every mutant, and diffed whole snapshots).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import compress, filterfalse, repeat
from operator import and_, attrgetter, is_, is_not, itemgetter, ne, truth
from typing import TYPE_CHECKING, NamedTuple

from spec import observation
from spec.observation import SeqView, Snapshot, StepRecord
from spec.prefix import ROOT, block_key
from spec.speculative import NO_DECISION, DraftDecision
from spec.status import PreemptionMode, Status
from spec.types import ScheduledSeq, request_of

if TYPE_CHECKING:
    from spec.rules import CheckContext

# Several predicates read the same derived views of one snapshot; each is computed once and kept
# on the snapshot itself (in its instance dict, outside the dataclass fields, so equality and
# repr do not see it) for as long as a later snapshot may carry it forward; `forget` drops it.
_CACHE = "_derived_views"


def _memo(snap: Snapshot, kind: str, device: object, build):
    cache = snap.__dict__.get(_CACHE)
    if cache is None:
        cache = snap.__dict__[_CACHE] = {}
    key = (kind, device)
    value = cache.get(key, _MISSING)
    if value is _MISSING:
        value = cache[key] = build()
    return value


def _kept(snap: Snapshot, kind: str, device: object) -> object:
    """The derived view already kept on ``snap``, or `_MISSING`. Readers ask this first so that
    the common case (another check built it this step) costs two dict lookups, not a closure."""
    cache = snap.__dict__.get(_CACHE)
    return _MISSING if cache is None else cache.get((kind, device), _MISSING)


_MISSING = object()


def forget(snap: Snapshot | None) -> None:
    """Drop the derived views kept on ``snap`` (the checker calls it once a snapshot can no longer
    be a base or a prior, so a long run does not keep one entry count per step)."""
    if snap is not None:
        snap.__dict__.pop(_CACHE, None)
        snap.__dict__.pop(observation.TOKEN_PREFIX_MEMO, None)


_DELTA_DEPTH = 4  # how far back along `Snapshot.base` a derived view is carried forward


def _incremental(snap: Snapshot) -> bool:
    return observation.INCREMENTAL and snap.seqs is not None


def _cached(snap: Snapshot, kind: str, device: object) -> object | None:
    cache = snap.__dict__.get(_CACHE)
    return None if cache is None else cache.get((kind, device))


def _delta_base(snap: Snapshot, kind: str, device: str, depth: int, part: str = "changed_seqs"):
    """The base snapshot's derived view when it can be carried forward through the delta
    (``part``: ``changed_seqs`` or ``changed_requests``), else None (build it whole)."""
    base = snap.base
    if not _incremental(snap) or base is None or getattr(snap, part) is None or base.seqs is None:
        return None
    value = _cached(base, kind, device)
    if value is None and depth < _DELTA_DEPTH:
        value = _DERIVED[kind](base, device, depth + 1)
    return value


def _moved(snap: Snapshot, device: str) -> list[str]:
    """The sequences of ``snap.changed_seqs`` whose table on ``device`` may differ between
    ``snap.base`` and ``snap``: new or gone there, or on ``device`` in either and moved between
    devices or holding another table object. One loop, no call per sequence (every snapshot asks
    it of every changed view, per device)."""
    old_seqs, seqs = snap.base.seqs, snap.seqs
    out = []
    for sid in snap.changed_seqs:
        old, new = old_seqs.get(sid), seqs.get(sid)
        if old is None or new is None or ((old.device == device or new.device == device)
                                         and (old.device != new.device or old.blocks is not new.blocks)):
            out.append(sid)
    return out


def tables(snap: Snapshot, device: str, _depth: int = 0) -> dict[str, tuple[int, ...]]:
    """Sequence id -> block table, for sequences whose table is on ``device``.

    Built from the base snapshot's tables and the changed sequences when the adapter gives a
    delta (`Snapshot.base`), else from every view."""
    kept = _kept(snap, "tables", device)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    assert snap.seqs is not None

    def build() -> dict[str, tuple[int, ...]]:
        seqs = snap.seqs
        prior = _delta_base(snap, "tables", device, _depth)
        if prior is None:
            return {sid: v.blocks for sid, v in seqs.items() if v.device == device and v.blocks}
        touched = _moved(snap, device)
        if not touched:
            return prior  # no table on this device changed: the same object, so checks can skip
        out = dict(prior)
        for sid in touched:
            view = seqs.get(sid)
            if view is not None and view.device == device and view.blocks:
                out[sid] = view.blocks
            else:
                out.pop(sid, None)
        return out

    return _memo(snap, "tables", device, build)


def entries(snap: Snapshot, device: str, _depth: int = 0) -> Counter[int]:
    """How many table entries point at each block of ``device`` (blocks with none are absent)."""
    kept = _kept(snap, "entries", device)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]

    def build() -> Counter[int]:
        prior = _delta_base(snap, "entries", device, _depth)
        if prior is None:
            counts: Counter[int] = Counter()
            for blocks in tables(snap, device, _DELTA_DEPTH).values():
                counts.update(blocks)
            return counts
        touched = _moved(snap, device)
        if not touched:
            return prior  # no table on this device changed: the same object, so checks can skip
        counts = Counter(prior)
        base_seqs, seqs = snap.base.seqs, snap.seqs
        for sid in touched:
            old = base_seqs.get(sid)
            if old is not None and old.device == device and old.blocks:
                for block in old.blocks:
                    left = counts[block] - 1
                    if left:
                        counts[block] = left
                    else:
                        del counts[block]
            new = seqs.get(sid)
            if new is not None and new.device == device and new.blocks:
                counts.update(new.blocks)
        return counts

    return _memo(snap, "entries", device, build)


def entry_counts(snap: Snapshot, device: str, size: int, _depth: int = 0) -> tuple[int, ...] | None:
    """Per block of the ``size``-block pool on ``device``, how many table entries name it; None
    when a table names a block outside the pool. A tuple as long as the pool, so that a check
    compares it with the adapter's reference counts (or reads it at free ids) at C speed.

    Carried forward through the delta: only tables that moved since the base are applied."""
    kept = _kept(snap, "entry_counts", (device, size))
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    return _memo(snap, "entry_counts", (device, size), lambda: _build_entry_counts(snap, device, size, _depth))


def _build_entry_counts(snap: Snapshot, device: str, size: int, depth: int) -> tuple[int, ...] | None:
    assert snap.seqs is not None
    prior = _delta_base(snap, "entry_counts", (device, size), depth)  # type: ignore[arg-type]
    if prior is None:
        whole = [0] * size
        for view in snap.seqs.values():
            if view.device == device and view.blocks:
                for block in view.blocks:
                    if not 0 <= block < size:
                        return None
                    whole[block] += 1
        value = tuple(whole)
        _memo(snap, "entry_list", (device, size), lambda: (value, whole))
        return value
    counts: list[int] | None = None
    touched: set[int] = set()  # the blocks whose entries may have changed (`free_in_tables` reads them)
    old_seqs, seqs = snap.base.seqs, snap.seqs
    for sid in snap.changed_seqs:
        old, new = old_seqs.get(sid), seqs.get(sid)
        old_blocks = old.blocks if old is not None and old.device == device else None
        new_blocks = new.blocks if new is not None and new.device == device else None
        if old_blocks is new_blocks:
            continue
        if counts is None:
            counts = _counts_to_change(snap.base, (device, size), prior)
        if old_blocks and new_blocks and len(new_blocks) >= len(old_blocks) \
                and new_blocks[: len(old_blocks)] == old_blocks:
            # A table that grew (a decode past a block's end, a chunk) keeps its blocks: only the
            # new ones gain an entry, and only they are noted as changed (at C speed, not a walk
            # of the whole table twice and of every block `free_in_tables` then reads again).
            grown = new_blocks[len(old_blocks):]
            for block in grown:
                if not 0 <= block < size:
                    return None
                counts[block] += 1
            touched.update(grown)
            continue
        for block in old_blocks or ():  # base's blocks, in the pool (its counts were built)
            counts[block] -= 1
        for block in new_blocks or ():
            if not 0 <= block < size:
                return None
            counts[block] += 1
        touched.update(old_blocks or ())
        touched.update(new_blocks or ())
    _memo(snap, "entry_changes", (device, size), lambda: touched)
    if counts is None:  # no table moved: the same object, and the base's working list goes on with it
        held = _held_counts(snap.base, (device, size), prior)
        if held is not None:
            _memo(snap, "entry_list", (device, size), lambda: (prior, held))
        return prior
    value = tuple(counts)
    _memo(snap, "entry_list", (device, size), lambda: (value, counts))
    return value


def _held_counts(base: Snapshot, key: tuple[str, int], prior: tuple[int, ...]) -> list[int] | None:
    """The list the base's own build of ``prior`` left, taken from it (None: none is left). It
    is ours alone and holds exactly ``prior`` while the base's memo names it beside that very
    tuple. It is handed on once: a second snapshot built on the same base copies."""
    cache = base.__dict__.get(_CACHE)
    held = cache.pop(("entry_list", key), None) if cache is not None else None
    return held[1] if held is not None and held[0] is prior else None


def _counts_to_change(base: Snapshot, key: tuple[str, int], prior: tuple[int, ...]) -> list[int]:
    """A list of ``prior``'s counts to apply a delta to. The list the base's build left is taken
    (`_held_counts`), else ``prior`` is copied. So a pool-sized array is copied once per snapshot
    (into the tuple the checks read), not twice. The tuple is what the checks compare; the list
    never leaves this module."""
    held = _held_counts(base, key, prior)
    return held if held is not None else list(prior)


def shared_blocks(snap: Snapshot, device: str, size: int) -> frozenset[int] | None:
    """The blocks of ``device`` that two or more table entries name (None: a table names a block
    outside the ``size``-block pool). Carried forward through the blocks whose entries changed
    (`entry_counts` notes them), so a check of shared blocks costs nothing where nothing is
    shared, the common case without prefix caching or forks."""
    kept = _kept(snap, "shared", (device, size))
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    counts = entry_counts(snap, device, size)

    def build() -> frozenset[int] | None:
        if counts is None:
            return None
        base = snap.base if _incremental(snap) else None
        prior = _kept(base, "shared", (device, size)) if base is not None else _MISSING
        if prior is _MISSING and base is not None and base.base is not None \
                and _kept(base.base, "shared", (device, size)) is not _MISSING:
            prior = shared_blocks(base, device, size)  # a snapshot no check of shared blocks reads
        touched = _kept(snap, "entry_changes", (device, size))
        if prior is _MISSING or prior is None or touched is _MISSING or touched is None:
            return frozenset(compress(range(size), map((1).__lt__, counts)))  # at C speed
        if counts is _kept(base, "entry_counts", (device, size)):
            return prior  # no table moved
        out: set[int] | None = None
        for block in touched:  # type: ignore[union-attr]
            now = counts[block] > 1
            if now != (block in prior):  # type: ignore[operator]
                out = set(prior) if out is None else out  # type: ignore[arg-type]
                (out.add if now else out.discard)(block)
        return prior if out is None else frozenset(out)  # type: ignore[return-value]

    return _memo(snap, "shared", (device, size), build)


def running_seq_count(snap: Snapshot, _unused: str = "", _depth: int = 0) -> int:
    """How many sequences are RUNNING."""
    kept = _kept(snap, "running", "")
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]

    def build() -> int:
        prior = _delta_base(snap, "running", "", _depth)
        if prior is None:
            return sum(1 for v in snap.seqs.values() if v.status is Status.RUNNING)
        old_seqs, seqs = snap.base.seqs, snap.seqs
        count = prior
        for sid in snap.changed_seqs:
            old, new = old_seqs.get(sid), seqs.get(sid)
            count += (new is not None and new.status is Status.RUNNING) - (old is not None and old.status is Status.RUNNING)
        return count

    return _memo(snap, "running", "", build)


def seq_ids_by_request(snap: Snapshot, _unused: str = "", _depth: int = 0) -> dict[str, tuple[str, ...]]:
    """Request id -> the ids of its sequences, in the snapshot's order."""
    kept = _kept(snap, "by_request", "")
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]

    def build() -> dict[str, tuple[str, ...]]:
        prior = _delta_base(snap, "by_request", "", _depth)
        seqs = snap.seqs
        # Which changed views are new, and whether one is gone, read at C speed.
        new = [] if prior is None else list(filterfalse(snap.base.seqs.__contains__, snap.changed_seqs))
        if prior is None or not all(map(seqs.__contains__, snap.changed_seqs)):
            out: dict[str, list[str]] = {}
            for sid, v in seqs.items():
                out.setdefault(v.request_id, []).append(sid)
            return {rid: tuple(sids) for rid, sids in out.items()}
        if not new:
            return prior
        out2 = dict(prior)
        for sid in sorted(new):
            rid = seqs[sid].request_id
            out2[rid] = (*out2.get(rid, ()), sid)
        return out2

    return _memo(snap, "by_request", "", build)


def with_status(snap: Snapshot, status: Status, _depth: int = 0) -> frozenset[str]:
    """The requests whose status is ``status``."""
    kept = _kept(snap, "status", status)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]

    def build() -> frozenset[str]:
        prior = _delta_base(snap, "status", status, _depth, part="changed_requests")
        statuses = snap.statuses
        assert statuses is not None
        if prior is None or snap.base.statuses is None:
            return frozenset(rid for rid, st in statuses.items() if st is status)
        if not snap.changed_requests:
            return prior
        out = set(prior)
        for rid in snap.changed_requests:
            if statuses.get(rid) is status:
                out.add(rid)
            else:
                out.discard(rid)
        return frozenset(out)

    return _memo(snap, "status", status, build)


def changed_requests_between(snap: Snapshot, older: Snapshot | None) -> frozenset[str] | None:
    """Requests whose status may differ between ``older`` and ``snap`` (None: check all)."""
    return snap.changed_since(older, "changed_requests") if _incremental(snap) else None


class QueueSet(NamedTuple):
    """One queue's members as a set, and whether the queue names one of them twice."""

    members: frozenset[str]
    repeats: bool


def queue_set(snap: Snapshot, name: str) -> QueueSet:
    """`QueueSet` of queue ``name`` (absent: empty). The base snapshot's own object when the queue
    is the very tuple it was there (a step that admits nobody leaves the waiting queue, the size
    of the backlog, untouched), so queue checks and `queue_moves` read the backlog only when it
    changed."""
    kept = _kept(snap, "queue", name)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    queue = snap.queue(name) or ()
    base = snap.base if observation.INCREMENTAL else None
    if base is not None and base.queue(name) is queue:
        prior = _kept(base, "queue", name)
        if prior is _MISSING and base.base is not None:
            prior = queue_set(base, name)  # carried along the chain while the tuple stands still
        if prior is not _MISSING:
            return _memo(snap, "queue", name, lambda: prior)
    members = frozenset(queue)
    value = QueueSet(members, len(members) != len(queue))
    return _memo(snap, "queue", name, lambda: value)


def queue_moves(snap: Snapshot, older: Snapshot | None) -> set[str] | None:
    """Requests that entered or left some queue between ``older`` and ``snap`` (None: unknown)."""
    if older is None or not _incremental(snap):
        return None
    moved: set[str] = set()
    for name in ("waiting", "running", "swapped"):
        new, old = snap.queue(name), older.queue(name)
        if new is old:
            continue
        if new is None or old is None:
            return None
        moved |= queue_set(snap, name).members.symmetric_difference(queue_set(older, name).members)
    return moved


def changed_between(snap: Snapshot, older: Snapshot, reads: frozenset[str] | None = None) -> frozenset[str] | None:
    """`Snapshot.changed_since`, or None (check all) when incremental checking is off. With
    ``reads`` (the caller's `Invariant.reads`) within `PLACEMENT`, only the sequences new, gone,
    or differing from their view in ``older`` there."""
    if _filtered(reads) and _incremental(snap):
        return _placement_changed_since(snap, older)
    return snap.changed_since(older) if _incremental(snap) else None


def _placement_changed_since(snap: Snapshot, older: Snapshot | None) -> frozenset[str] | None:
    """The sequences whose `PLACEMENT` may differ between ``older`` and ``snap``: the union of
    `placement_changes` along the ``base`` chain (a view whose placement is equal at every hop is
    equal at both ends), None when the chain does not reach ``older``."""
    if older is None:
        return None
    out: set[str] = set()
    hop: Snapshot | None = snap
    for _ in range(_DELTA_DEPTH * 2):
        if hop is older:
            return frozenset(out)
        moved = placement_changes(hop) if hop is not None else None
        if moved is None:
            return None
        out |= moved
        hop = hop.base  # type: ignore[union-attr]
    return None


def placement_changes(snap: Snapshot) -> frozenset[str] | None:
    """The sequences in ``snap.changed_seqs`` whose `PLACEMENT` differs from their view in
    ``snap.base`` (or that are new or gone there); None without a delta. Once per snapshot,
    shared by every reader that filters on placement (a decode's views differ in counts only)."""
    kept = _kept(snap, "placed", None)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    base, changed = snap.base, snap.changed_seqs
    if base is None or changed is None or base.seqs is None or snap.seqs is None:
        value = None
    else:
        sids = list(changed)
        value = frozenset(compress(sids, _differ(sids, snap.seqs, base.seqs)))
    return _memo(snap, "placed", None, lambda: value)


# A sentinel view for "not in that snapshot": its fields are fresh objects, unequal to any view's.
_ABSENT = SeqView(*(object() for _ in SeqView._fields))
# Where a view is and what it is, without its counts: what a decode leaves alone for
# block_size - 1 steps in block_size. Declared reads within it are filtered on all of it, so one
# comparison per snapshot serves every such check (a filter per declaration cost more than the
# checks it spared); reads beyond it (counts, tokens, which a decode changes every step) are not
# filtered at all.
PLACEMENT = frozenset({"seq_id", "request_id", "status", "blocks", "device"})
_PLACEMENT_OF = itemgetter(*(SeqView._fields.index(f) for f in sorted(PLACEMENT, key=SeqView._fields.index)))


def _filtered(reads: frozenset[str] | None) -> bool:
    return reads is not None and reads <= PLACEMENT


def _differ(sids: list[str], new: Mapping[str, SeqView], old: Mapping[str, SeqView]) -> Iterator[bool]:
    """Per id in ``sids``, whether its views in ``new`` and ``old`` differ in `PLACEMENT` (or one
    is absent), compared at C speed: an unchanged table is the same tuple, so the comparison of a
    decode's view is a few identity checks."""
    get = _PLACEMENT_OF
    return map(ne, map(get, map(new.get, sids, repeat(_ABSENT))), map(get, map(old.get, sids, repeat(_ABSENT))))


def fresh_views(snap: Snapshot, prior: Snapshot | None, reads: frozenset[str] | None = None) -> list[tuple[str, SeqView]]:
    """The views a check of one view at a time must look at in ``snap``: those changed since
    ``prior`` (a snapshot the same check already passed), or all when that is unknown. In id
    order, so messages come out the same either way. With ``reads`` (the check's
    `Invariant.reads`) within `PLACEMENT`, only those that differ from their view in ``prior``
    there: the check passed on that view, and its verdict depends on nothing else of it."""
    if _filtered(reads) and prior is not None and _incremental(snap) and prior.seqs is not None:
        kept = _kept(snap, "fresh_placed", id(prior))
        if kept is not _MISSING and kept[0] is prior:  # type: ignore[index]
            return kept[1]  # type: ignore[index]
        moved = _placement_changed_since(snap, prior)
        if moved is not None:
            seqs = snap.seqs
            chosen = [(sid, seqs[sid]) for sid in sorted(moved) if sid in seqs]
            _memo(snap, "fresh_placed", id(prior), lambda: (prior, chosen))
            return chosen
    kept = _kept(snap, "fresh", id(prior))
    if kept is not _MISSING and kept[0] is prior:  # type: ignore[index]
        return kept[1]  # type: ignore[index]
    assert snap.seqs is not None

    def build() -> tuple[Snapshot | None, list[tuple[str, SeqView]]]:
        changed = snap.changed_since(prior) if _incremental(snap) else None
        if changed is None:
            return prior, list(snap.seqs.items())
        seqs = snap.seqs
        return prior, [(sid, seqs[sid]) for sid in sorted(changed) if sid in seqs]

    # Several checks ask for the same pair; keyed by the prior's id, kept with the prior itself.
    kept_prior, views = _memo(snap, "fresh", id(prior), build)
    return views if kept_prior is prior else build()[1]


def fresh_in_snapshots(ctx: CheckContext, record: StepRecord) -> list[tuple[str, str, SeqView]]:
    """(label, seq id, view) over `snapshots` of the record, skipping views the same check has
    already seen unchanged: mid against the previous step's final snapshot, final against mid.
    A list built once per step (and per `PLACEMENT` filtering) and shared by every check that
    asks: a dozen checks walk it, and a generator resumed per view per check cost more than
    several of their bodies."""
    prior = ctx.previous.after if ctx.previous is not None else None
    placed = _filtered(ctx.reads)
    key = (id(prior), placed, id(record.mid))
    kept = _kept(record.after, "in_snapshots", key)
    if kept is not _MISSING and kept[0] is prior and kept[1] is record.mid:  # type: ignore[index]
        return kept[2]  # type: ignore[index]
    out: list[tuple[str, str, SeqView]] = []
    first = prior
    for label, snap in snapshots(record):
        out += [(label, sid, view) for sid, view in fresh_views(snap, first, ctx.reads)]
        first = snap
    if _incremental(record.after):
        record.after.__dict__.setdefault(_CACHE, {})[("in_snapshots", key)] = (prior, record.mid, out)
    return out


def fresh_tokens_in_snapshots(ctx: CheckContext, record: StepRecord) -> Iterator[tuple[str, str, SeqView, int]]:
    """As `fresh_in_snapshots`, with the first token position the same check has not read in that
    view yet: the length of the token ids it passed before when they are a prefix of these
    (compared at C speed; identical entries compare by identity), else 0. A decode appends one
    token to hundreds, so a check of every token reads only the new ones."""
    prior = ctx.previous.after if ctx.previous is not None else None
    for label, snap in snapshots(record):
        seen = prior.seqs if prior is not None and prior.seqs is not None and _incremental(snap) else None
        from_base = seen is not None and snap.base is prior  # the usual chain: one shared comparison
        for sid, view in fresh_views(snap, prior, ctx.reads):
            first = 0
            if from_base:
                first = observation.base_token_prefix(snap, sid)
            elif seen is not None:
                old = seen.get(sid)
                known = old.token_ids if old is not None else None
                tokens = view.token_ids
                if known is not None and tokens is not None and len(known) <= len(tokens) \
                        and (known is tokens or tokens[: len(known)] == known):
                    first = len(known)
            yield label, sid, view, first
        prior = snap


def checked_with_prior(ctx: CheckContext, record: StepRecord) -> Iterator[tuple[str, Snapshot, Snapshot | None]]:
    """(label, snapshot, prior) over `snapshots` of the record, where ``prior`` is the snapshot
    the same check passed just before (None: unknown). A check whose inputs in ``snapshot`` are
    the very objects they were in ``prior`` has nothing new to look at."""
    prior = ctx.previous.after if ctx.previous is not None and observation.INCREMENTAL else None
    for label, snap in snapshots(record):
        yield label, snap, prior
        prior = snap if observation.INCREMENTAL else None


def fresh_after(ctx: CheckContext, record: StepRecord) -> list[tuple[str, SeqView]]:
    """The final snapshot's views changed since the previous step's final snapshot."""
    return fresh_views(record.after, ctx.previous.after if ctx.previous is not None else None, ctx.reads)


def fresh_mid(ctx: CheckContext, record: StepRecord) -> list[tuple[str, SeqView]]:
    """The mid-step snapshot's views changed since the previous step's mid-step snapshot."""
    assert record.mid is not None
    prior = ctx.previous.mid if ctx.previous is not None else None
    return fresh_views(record.mid, prior, ctx.reads)


def snapshots(record: StepRecord) -> list[tuple[str, Snapshot]]:
    """The record's state snapshots that carry data: after schedule (when observed) and after the step."""
    found = [("after schedule", record.mid)] if record.mid is not None else []
    return found + [("after the step", record.after)]


def admitted(record: StepRecord) -> list[str]:
    """Requests that were waiting before the step and got a prefill in it."""
    waiting = queue_set(record.before, "waiting").members  # kept from the step before: no read of the backlog
    seen: dict[str, None] = {}
    for item in record.output.scheduled:
        if item.is_prefill and item.request_id in waiting:
            seen.setdefault(item.request_id, None)
    return list(seen)


def finished_among(snap: Snapshot, seq_ids: Iterable[str]) -> list[str]:
    """The sequences of ``seq_ids`` whose view in ``snap`` is finished (those it lacks are not),
    in the order given. Read at C speed: a check asks it of every block holder, every step."""
    ids = list(seq_ids)
    views = map((snap.seqs or {}).get, ids, repeat(_UNSEEN))
    return list(compress(ids, map(_IS_FINISHED, views)))


_IS_FINISHED = attrgetter("status.is_finished")
_BLOCKS, _STATUS = attrgetter("blocks"), attrgetter("status")
_SEQ_ID, _REQUEST_ID = attrgetter("seq_id"), attrgetter("request_id")
_NUM_TOKENS, _NUM_DRAFTS, _IS_PREFILL = attrgetter("num_tokens"), attrgetter("num_drafts"), attrgetter("is_prefill")
# Stands for a sequence a snapshot lacks: not finished there.
_UNSEEN = SeqView("", "", Status.WAITING, None, None, None, None)


def finished_holders(snap: Snapshot, _device: object = None, _depth: int = 0) -> frozenset[str]:
    """The sequences that are finished and still hold blocks in ``snap`` (a scheduler that frees
    lazily has some between steps). Carried forward through the delta like `tables`."""
    kept = _kept(snap, "finished_holders", None)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    assert snap.seqs is not None

    def build() -> frozenset[str]:
        seqs = snap.seqs
        prior = _delta_base(snap, "finished_holders", None, _depth)  # type: ignore[arg-type]
        if prior is None:
            return frozenset(sid for sid, v in seqs.items() if v.blocks and v.status.is_finished)
        if not snap.changed_seqs:
            return prior
        # The changed views are read at C speed: the others keep their answer; a changed one
        # holds if it is there, holds blocks and is finished.
        changed = list(snap.changed_seqs)
        views = list(map(seqs.get, changed, repeat(_UNSEEN)))
        holding = compress(changed, map(and_, map(truth, map(_BLOCKS, views)), map(_IS_FINISHED, views)))
        return frozenset(prior.difference(changed).union(holding))

    return _memo(snap, "finished_holders", None, build)


def waiting_holders(snap: Snapshot, _device: object = None, _depth: int = 0) -> frozenset[str]:
    """The sequences that are waiting and hold blocks in ``snap`` (none, where admission is all or
    nothing and recompute frees everything). Carried forward through the delta like `tables`."""
    kept = _kept(snap, "waiting_holders", None)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    assert snap.seqs is not None

    def build() -> frozenset[str]:
        seqs = snap.seqs
        prior = _delta_base(snap, "waiting_holders", None, _depth)  # type: ignore[arg-type]
        if prior is None:
            return frozenset(sid for sid, v in seqs.items() if v.blocks and v.status is Status.WAITING)
        if not snap.changed_seqs:
            return prior
        changed = list(snap.changed_seqs)  # read at C speed, as `finished_holders` reads them
        views = list(map(seqs.get, changed, repeat(_UNSEEN)))
        holding = compress(changed, map(and_, map(truth, map(_BLOCKS, views)),
                                        map(is_, map(_STATUS, views), repeat(Status.WAITING))))
        return frozenset(prior.difference(changed).union(holding))

    return _memo(snap, "waiting_holders", None, build)


_DERIVED = {
    "finished_holders": finished_holders,
    "waiting_holders": waiting_holders,
    "entry_counts": lambda snap, key, depth: entry_counts(snap, key[0], key[1], depth),
    "tables": tables,
    "entries": entries,
    "running": running_seq_count,
    "by_request": seq_ids_by_request,
    "status": with_status,
}


def changed_items(new: tuple | None, old: tuple | None) -> list[int] | None:
    """Indices where two per-block tuples (keys, reference counts) differ, found at C speed; None
    when they cannot be compared (one is missing or their lengths differ: check all)."""
    if new is old:
        return []
    if new is None or old is None or len(new) != len(old):
        return None
    return list(compress(range(len(new)), map(ne, new, old)))


def chained_keys(snap: Snapshot, sid: str, block_size: int) -> list[str]:
    """`spec.prefix.block_keys` of sequence ``sid``'s token ids in ``snap`` (every full block).

    A sequence's tokens only grow, so its keys are extended from the last ones computed for it:
    the memo (sequence id -> (token ids, keys)) is handed from each snapshot to the next along
    `Snapshot.base`, and an entry is reused only as far as its token ids are a prefix of the
    view's (compared at C speed), so a reused key is always the key of these very tokens."""
    memo = _kept(snap, "keys", block_size)
    if memo is _MISSING:
        base = snap.base
        inherited = _kept(base, "keys", block_size) if base is not None and observation.INCREMENTAL else _MISSING
        memo = _memo(snap, "keys", block_size, lambda: {} if inherited is _MISSING else inherited)
    tokens = snap.seqs[sid].token_ids
    assert tokens is not None
    full = len(tokens) // block_size
    known = memo.get(sid)  # type: ignore[union-attr]
    if known is not None:
        old_tokens, keys = known
        if old_tokens is tokens:
            return keys
        reuse = min(len(keys), full)
        if reuse and old_tokens[: reuse * block_size] != tokens[: reuse * block_size]:
            reuse = 0
        keys = keys[:reuse]
    else:
        keys = []
    parent = keys[-1] if keys else ROOT
    for j in range(len(keys), full):
        parent = block_key(parent, tokens[j * block_size : (j + 1) * block_size])
        keys.append(parent)
    memo[sid] = (tokens, keys)  # type: ignore[index]
    return keys


def keyed_blocks(snap: Snapshot) -> frozenset[int]:
    """The GPU blocks that carry a prefix-cache key in ``snap``. Carried forward from the base
    snapshot through the blocks whose key changed (`changed_items`, at C speed), so a check can
    pass over a table none of whose blocks is keyed without reading the keys."""
    kept = _kept(snap, "keyed", None)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    keys = snap.gpu_block_keys
    assert keys is not None
    base = snap.base if observation.INCREMENTAL else None
    prior = _kept(base, "keyed", None) if base is not None else _MISSING
    changed = changed_items(keys, base.gpu_block_keys) if prior is not _MISSING else None
    if changed is None:
        value = frozenset(compress(range(len(keys)), map(is_not, keys, repeat(None))))
    elif not changed:
        value = prior  # type: ignore[assignment]
    else:
        out = set(prior)  # type: ignore[arg-type]
        for block in changed:
            if keys[block] is None:
                out.discard(block)
            else:
                out.add(block)
        value = frozenset(out)
    return _memo(snap, "keyed", None, lambda: value)


def views_of(snap: Snapshot, request_id: str) -> list[SeqView]:
    """`Snapshot.seqs_of` through the carried-forward per-request index (`seq_ids_by_request`):
    a step that admits a thousand requests asks this a thousand times, and a scan of every view
    each time is quadratic in the batch."""
    assert snap.seqs is not None
    seqs = snap.seqs
    return [seqs[sid] for sid in seq_ids_by_request(snap).get(request_id, ())]


class FreeEntries:
    """How many times a snapshot's free list names each block: the base snapshot's answer plus the
    blocks changed since (`Snapshot.gpu_block_changes`), so that carrying it forward costs what
    changed, not the pool. A chain longer than `_ENTRY_LAYERS` is cut by folding the parent's
    layers into the root's dict *in place* (a copy of a pool-sized dict every few snapshots was the
    largest cost left at 4096 requests). The parent still answers for its own snapshot (a block
    in none of its layers keeps its root entry), but the layers below it no longer do for theirs:
    only the current snapshots and their bases are asked (the checker reads the current step's;
    `forget` drops the facts of older ones), never a grandparent."""

    __slots__ = ("parent", "counts", "depth")

    def __init__(self, counts: dict[int, int], parent: FreeEntries | None = None) -> None:
        if parent is not None and parent.depth >= _ENTRY_LAYERS:
            layers, root = [], parent
            while root.parent is not None:
                layers.append(root.counts)
                root = root.parent
            folded = root.counts
            for layer in reversed(layers):  # oldest first, so newer entries win
                folded.update(layer)
            parent = FreeEntries(folded)  # the parent's answers, as one dict
        self.parent, self.counts = parent, counts
        self.depth = 0 if parent is None else parent.depth + 1

    def count(self, block: int) -> int:
        layer: FreeEntries | None = self
        while layer is not None:
            found = layer.counts.get(block)
            if found is not None:
                return found
            layer = layer.parent
        return 0

    def flat(self) -> dict[int, int]:
        """Block -> entries (zeros included where a layer says so), as one dict."""
        if self.parent is None:
            return self.counts
        return {**self.parent.flat(), **self.counts}

    def blocks(self) -> set[int]:
        """The free blocks (each once)."""
        flat = self.flat()
        return set(compress(flat, flat.values()))  # at C speed: the blocks named at least once


class PoolFacts(NamedTuple):
    """What the block checks read of one device's reference counts and free list, shared by
    BLK-001, BLK-005 and STR-001 (each read the whole pool on its own before): built in one pass
    each at C speed, or carried forward from the base snapshot's through the blocks that changed
    (`Snapshot.gpu_block_changes`)."""

    entries: FreeEntries  # how many times the free list names each block
    free_count: int  # distinct free blocks
    repeated: frozenset[int]  # blocks the free list names more than once
    low: int  # every free id is >= low (exactly the lowest when built whole)
    high: int  # every free id is <= high (exactly the highest when built whole)
    unreferenced: int  # blocks whose reference count is 0
    negative: frozenset[int]  # blocks whose reference count is below 0
    referenced_free: frozenset[int]  # free blocks whose reference count is not 0 (in the pool)

    def free(self) -> set[int]:
        """The free ids as a set (for messages and the slow paths)."""
        return self.entries.blocks()

    def outside(self, size: int) -> bool:
        """Whether some free id is outside ``range(size)``."""
        if self.low >= 0 and self.high < size:
            return False
        return any(not 0 <= b < size for b in self.free())


_ENTRY_LAYERS = 12  # free-list entry layers kept before folding (`FreeEntries`): more than a checker reads back


def pool_facts(snap: Snapshot, device: str) -> PoolFacts:
    """`PoolFacts` of ``device`` in ``snap`` (an absent CPU pool reads as empty): the base
    snapshot's when both its counts and its free list are the very objects of ``snap``, carried
    through the changed blocks when the adapter names them, else built whole."""
    kept = _kept(snap, "pool", device)
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    refs = (snap.gpu_ref_counts if device == "gpu" else snap.cpu_ref_counts) or ()
    free_ids = (snap.gpu_free_ids if device == "gpu" else snap.cpu_free_ids) or ()
    base = snap.base if observation.INCREMENTAL else None
    facts = None
    if base is not None:
        base_refs = (base.gpu_ref_counts if device == "gpu" else base.cpu_ref_counts) or ()
        base_free = (base.gpu_free_ids if device == "gpu" else base.cpu_free_ids) or ()
        prior = _kept(base, "pool", device)
        if prior is _MISSING and base.base is not None and _kept(base.base, "pool", device) is not _MISSING:
            prior = pool_facts(base, device)  # a snapshot no block check reads (before schedule())
        if prior is not _MISSING:
            if refs is base_refs and free_ids is base_free:
                facts = prior
            else:
                changes = snap.gpu_block_changes if device == "gpu" else snap.cpu_block_changes
                if changes is not None:
                    facts = _carried_pool_facts(prior, changes, refs, base_refs, len(free_ids) - len(base_free))
    if facts is None:
        facts = _whole_pool_facts(refs, free_ids)
    return _memo(snap, "pool", device, lambda: facts)


def _whole_pool_facts(refs: tuple[int, ...], free_ids: tuple[int, ...]) -> PoolFacts:
    counts = dict.fromkeys(free_ids, 1)
    repeated: frozenset[int] = frozenset()
    if len(counts) != len(free_ids):
        many = Counter(free_ids)
        counts = dict(many)
        repeated = frozenset(b for b, n in many.items() if n > 1)
    size = len(refs)
    low, high = min(counts, default=0), max(counts, default=0)
    if 0 <= low and high < size:
        referenced = frozenset(compress(counts, map(refs.__getitem__, counts)))  # at C speed
    else:
        referenced = frozenset(b for b in counts if 0 <= b < size and refs[b])
    return PoolFacts(
        entries=FreeEntries(counts),
        free_count=len(counts),
        repeated=repeated,
        low=low,
        high=high,
        unreferenced=refs.count(0),
        negative=frozenset(b for b, r in enumerate(refs) if r < 0) if refs and min(refs) < 0 else frozenset(),
        referenced_free=referenced,
    )


def _carried_pool_facts(prior: PoolFacts, changes, refs, base_refs, grown: int) -> PoolFacts | None:  # type: ignore[no-untyped-def]
    """``prior`` moved forward through ``changes`` (block -> free entries now); None (build whole)
    when the delta does not fit the snapshot (another pool size, a block id outside the counts, a
    free list whose length the entries do not explain)."""
    size = len(refs)
    if size != len(base_refs):
        return None
    entries, free_count, unreferenced = prior.entries, prior.free_count, prior.unreferenced
    repeated = negative = referenced = None
    low, high = prior.low, prior.high
    for block, now in changes.items():
        if not 0 <= block < size or now < 0:
            return None
        was = entries.count(block)
        grown -= now - was
        free_count += (now > 0) - (was > 0)
        if now > 0:
            low, high = min(low, block), max(high, block)
        if (now > 1) != (block in prior.repeated):
            repeated = set(prior.repeated) if repeated is None else repeated
            (repeated.add if now > 1 else repeated.discard)(block)
        ref, old_ref = refs[block], base_refs[block]
        unreferenced += (ref == 0) - (old_ref == 0)
        if (ref < 0) != (block in prior.negative):
            negative = set(prior.negative) if negative is None else negative
            (negative.add if ref < 0 else negative.discard)(block)
        if (now > 0 and ref != 0) != (block in prior.referenced_free):
            referenced = set(prior.referenced_free) if referenced is None else referenced
            (referenced.add if now > 0 and ref != 0 else referenced.discard)(block)
    if grown:
        return None  # the free list's length is not what the changed entries say
    return PoolFacts(
        entries=FreeEntries(dict(changes), entries) if changes else entries,
        free_count=free_count,
        repeated=prior.repeated if repeated is None else frozenset(repeated),
        low=low,
        high=high,
        unreferenced=unreferenced,
        negative=prior.negative if negative is None else frozenset(negative),
        referenced_free=prior.referenced_free if referenced is None else frozenset(referenced),
    )


def free_in_tables(snap: Snapshot, device: str, size: int) -> frozenset[int] | None:
    """The free blocks of ``device`` that some block table names (`entry_counts` over the free
    list), or None when a table names a block outside the ``size``-block pool. Carried forward
    from the base snapshot's through the blocks whose free entries or table entries changed."""
    kept = _kept(snap, "free_held", (device, size))
    if kept is not _MISSING:
        return kept  # type: ignore[return-value]
    counts = entry_counts(snap, device, size)
    facts = pool_facts(snap, device)

    def build() -> frozenset[int] | None:
        if counts is None:
            return None
        base = snap.base if observation.INCREMENTAL else None
        prior = _kept(base, "free_held", (device, size)) if base is not None else _MISSING
        if prior is _MISSING and base is not None and base.base is not None \
                and _kept(base.base, "free_held", (device, size)) is not _MISSING:
            prior = free_in_tables(base, device, size)  # a snapshot no block check reads
        pool_changed = _pool_changed(snap, device)
        table_changed = _kept(snap, "entry_changes", (device, size))
        if prior is _MISSING or prior is None or pool_changed is None or table_changed is _MISSING \
                or table_changed is None:
            free = facts.free()
            if not facts.outside(size):
                return frozenset(compress(free, map(counts.__getitem__, free)))  # at C speed
            return frozenset(b for b in free if 0 <= b < size and counts[b])
        out: set[int] | None = None
        entries = facts.entries
        for block in (*pool_changed, *table_changed):
            held = 0 <= block < size and entries.count(block) > 0 and counts[block] > 0
            if held != (block in prior):  # type: ignore[operator]
                out = set(prior) if out is None else out  # type: ignore[arg-type]
                (out.add if held else out.discard)(block)
        return prior if out is None else frozenset(out)  # type: ignore[return-value]

    return _memo(snap, "free_held", (device, size), build)


def _pool_changed(snap: Snapshot, device: str) -> Iterable[int] | None:
    """The blocks whose count or free entries may differ from the base's: none when the pool's
    tuples are the base's own objects, the adapter's delta otherwise (None: unknown)."""
    base = snap.base
    if base is None:
        return None
    if device == "gpu":
        if snap.gpu_ref_counts is base.gpu_ref_counts and snap.gpu_free_ids is base.gpu_free_ids:
            return ()
        return snap.gpu_block_changes
    if snap.cpu_ref_counts is base.cpu_ref_counts and snap.cpu_free_ids is base.cpu_free_ids:
        return ()
    return snap.cpu_block_changes


def equal_where_changed(snap: Snapshot, prior: Snapshot | None, device: str, refs: tuple[int, ...],
                        expected: tuple[int, ...]) -> bool:
    """Whether ``refs`` equals ``expected`` (a snapshot's reference counts and its entry counts),
    known by reading only the blocks that changed since ``prior``: ``prior`` is ``snap``'s base,
    where the same check found them equal, and a block neither the pool's delta nor a moved table
    names has both values it had there. False when that is not known (compare them whole), and
    wherever a pipelined engine's holds (`Snapshot.gpu_fenced`) add to the expected counts."""
    if prior is None or snap.base is not prior or not observation.INCREMENTAL:
        return False
    if device == "gpu" and (snap.gpu_fenced or prior.gpu_fenced or snap.gpu_cache_holds or prior.gpu_cache_holds):
        return False
    old_refs = (prior.gpu_ref_counts if device == "gpu" else prior.cpu_ref_counts) or ()
    size = len(refs)
    if len(old_refs) != size or len(expected) != size:
        return False
    pool = _pool_changed(snap, device)
    tables = _kept(snap, "entry_changes", (device, size))
    if pool is None or tables is _MISSING or tables is None:
        return False
    for block in (*pool, *tables):  # type: ignore[misc]
        if not 0 <= block < size or refs[block] != expected[block]:
            return False
    return True


# ------------------------------------------------------------------ the outcome a step processes
class ReturnedStep(NamedTuple):
    """What the checker remembers of a scheduled step until its outcome is processed, ``pipeline_depth``
    steps later (in the same step at depth 0): the sequences it scheduled, the trace's speculative
    decisions and stops for it, and the requests that left the running set since it was scheduled
    (preempted, aborted or finished: its outcome for them is stale or dropped)."""

    step: int
    scheduled: Mapping[str, ScheduledSeq]  # by sequence id
    decisions: Mapping[str, DraftDecision]
    stopped: frozenset[str]
    left: frozenset[str] = frozenset()  # request ids

    def decision(self, seq_id: str) -> DraftDecision:
        return self.decisions.get(seq_id, NO_DECISION)

    def live(self) -> Iterator[ScheduledSeq]:
        """Its scheduled sequences whose request was running throughout (the outcome applies to them)."""
        return (item for item in self.scheduled.values() if item.request_id not in self.left)


_RETURNED = "_returned"  # flow_state key shared by every predicate that reads `returned_step`


def returned_step(ctx: CheckContext, record: StepRecord) -> ReturnedStep | None:
    """The step whose outcome ``record``'s update processed: ``record`` itself at depth 0, the step
    ``pipeline_depth`` earlier otherwise (steps return in order, one per step: vLLM's batch queue);
    None while the pipeline fills. Every predicate that reads it must call it in every step (the
    first call of a step queues that step), before any early return; later calls in the same step
    return the same answer. A request counts as having left since a step if a later step (or this
    one's schedule) preempted or aborted it, or an earlier outcome finished it."""
    state = ctx.flow_state.setdefault(_RETURNED, {})
    if state.get("step") == record.step:
        return state["returned"]
    pending: deque[tuple[ReturnedStep, set[str]]] = state.setdefault("pending", deque())
    scheduled = record.output.scheduled  # by sequence id, read at C speed (the last entry where one is named twice)
    pending.append((ReturnedStep(record.step, dict(zip(map(_SEQ_ID, scheduled), scheduled, strict=True)),
                                 record.drafts, record.stopped), set()))
    moved = {p.request_id for p in record.output.preempted} | set(record.aborted)
    for _, left in pending:
        left |= moved  # before this step's outcome is processed
    returned = None
    if len(pending) > ctx.config.pipeline_depth:
        step, left = pending.popleft()
        returned = step._replace(left=frozenset(left.intersection(map(_REQUEST_ID, step.scheduled.values()))))
    finished = set(map(_REQUEST_ID, record.finished))
    for _, left in pending:
        left |= finished  # the steps still in flight return to a finished request
    state["step"], state["returned"] = record.step, returned
    return returned


def freed_by_their_last_step(ctx: CheckContext, record: StepRecord) -> frozenset[str]:
    """Scheduled sequences whose blocks a scheduler that claims ``ordered_steps`` may already have
    freed after schedule(): this step samples their last token (they finish in it),
    and none of the blocks this step writes for them (those of the positions it computes; without
    computed counts, every block they gave up) is in the table of a sequence that did not hold it
    before the step. A prefix hit on a full block they gave up is no hand-over: its content is
    fixed and this step does not write it. Why this is safe (tokasaurus frees them in ``schedule_steps`` before the step runs):
    a step that reuses those blocks is scheduled later, so it runs after this one on the same
    stream, and this step's writes land first. Reuse in the same step would be two writers in one
    forward pass, so it keeps the strict reading."""
    if observation.Capability.ORDERED_STEPS not in ctx.claims or record.mid is None or record.mid.seqs is None:
        return frozenset()
    kept = ctx.flow_state.setdefault("_freed_by_their_last_step", {})
    if kept.get("record") is not record:  # once per step: rules about sequences ask once per view
        kept["record"], kept["freed"] = record, _freed_by_their_last_step(ctx, record)
    return kept["freed"]


def _freed_by_their_last_step(ctx: CheckContext, record: StepRecord) -> frozenset[str]:
    mid, after = record.mid.seqs, record.after.seqs or {}
    last = {s.seq_id: s.num_tokens for s in record.output.scheduled
            if (v := after.get(s.seq_id)) is not None and v.status.is_finished}
    if not last:
        return frozenset()
    holders: dict[int, set[str]] = {}
    for sid, table in tables(record.mid, "gpu").items():
        for b in table:
            holders.setdefault(b, set()).add(sid)
    held = tables(record.before, "gpu")  # GPU blocks only: a CPU id names another block
    excused = set()
    bs = ctx.config.block_size
    for sid, count in last.items():
        now = mid.get(sid)
        if now is None:
            continue
        old = held.get(sid, ())
        given_up = set(old) - set(now.blocks or () if now.device == "gpu" else ())
        if now.num_computed is not None:  # the blocks of the positions this step computes
            given_up &= set(old[now.num_computed // bs:(now.num_computed + count - 1) // bs + 1])
        if all(b in held.get(h, ()) for b in given_up for h in holders.get(b, ())):
            excused.add(sid)
    return frozenset(excused)


def drops_unseen_tokens(ctx: CheckContext, record: StepRecord, old: SeqView, new: SeqView, grow: int = 0) -> bool:
    """Whether ``new`` is what an engine that claims ``output_at_finish`` may make of ``old`` when
    this step preempts its request by recompute: the prompt kept, generated tokens dropped from
    the end (it regenerates them; no client saw them, as the engine answers only at the finish),
    at most ``grow`` tokens sampled on top. tokasaurus' bump restarts a completion this way."""
    if observation.Capability.OUTPUT_AT_FINISH not in ctx.claims:
        return False
    rid = new.request_id
    if not any(p.request_id == rid and p.mode is PreemptionMode.RECOMPUTE for p in record.output.preempted):
        return False
    request = ctx.requests.get(rid)
    if request is None or old.num_tokens is None or new.num_tokens is None:
        return False
    if not request.prompt_len <= new.num_tokens <= old.num_tokens + grow:
        return False
    kept = min(new.num_tokens, old.num_tokens)
    return old.token_ids is None or new.token_ids is None or new.token_ids[:kept] == old.token_ids[:kept]


class VoidOutcomes(NamedTuple):
    """The sequences whose last processed outcome committed no token (`void_outcomes`): before
    this step's update (what the snapshot after schedule() reads) and after it."""

    before: frozenset[str]
    after: frozenset[str]


_VOID = "_void_outcomes"  # flow_state key of `void_outcomes`


_NO_VOID = VoidOutcomes(frozenset(), frozenset())


def void_outcomes(ctx: CheckContext, record: StepRecord) -> VoidOutcomes:
    """The sequences whose last processed outcome was empty (``DraftDecision.empty``: the model
    returned no token, vllm-project/vllm#42722's output) after sampling them: they sit at their
    last known token with computed tokens rolled back to ``num_tokens - 1``, yet that step's
    forward pass wrote the last known token's KV (vLLM's runner empties a request's sampled
    tokens after the forward pass, gpu_model_runner.py:2062-2065 and 3462-3505), so a block
    keyed over it holds that token's KV: PFX-001 and SPD-007 allow one position past the
    computed tokens for these. A sequence leaves the set at its next processed outcome or when
    its request is preempted, aborted or finished. Synchronous steps only (``pipeline_depth``
    0): with outcomes in flight the set is empty (the generator draws no empty outcome with
    prefix caching there). Every predicate that reads it must call it in every step, like
    `returned_step` (which it calls)."""
    if not ctx.config.num_speculative_tokens:  # only a speculative config reads the drafts' empty outcomes
        return _NO_VOID
    state = ctx.flow_state.setdefault(_VOID, {})
    if state.get("step") == record.step:
        return state["void"]
    returned = returned_step(ctx, record)
    before = frozenset(state.get("after", frozenset()))
    gone = ({p.request_id for p in record.output.preempted} | set(record.aborted)
            | {f.request_id for f in record.finished})
    after = {sid for sid in before if request_of(sid) not in gone}
    if returned is not None and not ctx.config.pipeline_depth:
        seqs = record.before.seqs or {}
        for item in returned.live():
            after.discard(item.seq_id)
            old = seqs.get(item.seq_id)
            if (returned.decision(item.seq_id).empty and old is not None and old.num_computed is not None
                    and old.num_tokens is not None and old.num_computed + item.num_tokens >= old.num_tokens):
                after.add(item.seq_id)  # it sampled (its prompt was complete) and got nothing
        after -= {sid for sid in after if request_of(sid) in gone}
    void = VoidOutcomes(before, frozenset(after))
    state["step"], state["void"], state["after"] = record.step, void, void.after
    return void


class StepFacts(NamedTuple):
    """What several rules about one sequence or request read of the step's record, built once per
    step (`step_facts`)."""

    scheduled: Mapping[str, ScheduledSeq]  # by sequence id (the last entry where one is named twice)
    tokens: Mapping[str, int]  # tokens scheduled per sequence id (summed)
    drafts: Mapping[str, int]  # draft tokens scheduled per sequence id, where any
    prefilled: frozenset[str]  # requests with a prefill scheduled
    added: frozenset[str]  # requests added in the step
    finished: frozenset[str]  # requests reported finished in the step
    voided: frozenset[str]  # scheduled sequences whose outcome committed nothing (``DraftDecision.empty``)


_FACTS = "_step_facts"


def step_facts(record: StepRecord) -> StepFacts:
    """`StepFacts` of ``record``, kept on the record itself (outside its fields, like the derived
    views of a snapshot)."""
    kept = record.__dict__.get(_FACTS)
    if kept is not None:
        return kept
    items = record.output.scheduled
    ids = list(map(_SEQ_ID, items))
    scheduled: dict[str, ScheduledSeq] = dict(zip(ids, items, strict=True))
    tokens: dict[str, int]
    if len(scheduled) == len(ids):  # each sequence named once (OUT-001): read at C speed
        tokens = dict(zip(ids, map(_NUM_TOKENS, items), strict=True))
    else:
        tokens = {}
        for item in items:
            tokens[item.seq_id] = tokens.get(item.seq_id, 0) + item.num_tokens
    drafts: dict[str, int] = {}
    for item in compress(items, map(_NUM_DRAFTS, items)):
        drafts[item.seq_id] = item.num_drafts
    facts = StepFacts(
        scheduled, tokens, drafts,
        frozenset(compress(map(_REQUEST_ID, items), map(_IS_PREFILL, items))),
        frozenset(r.request_id for r in record.added),
        frozenset(f.request_id for f in record.finished),
        frozenset(sid for sid, d in record.drafts.items() if d.empty and sid in scheduled),
    )
    record.__dict__[_FACTS] = facts
    return facts
