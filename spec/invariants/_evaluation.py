"""The evaluation layer: which subjects a step changed, every rule about each, in one pass.

Each invariant states a property of one subject (`spec.rules`: a sequence, a request or a block
pool in one snapshot, or the step's schedule, outcome or whole record) and declares when it has
something to check (its trigger). A predicate never asks what changed; this module does, once per
step for all of them:

1. From the record and the last step every check passed on (`CheckContext.previous`), find the
   *touched* subjects: the sequences whose view may differ from that step's final snapshot in
   the snapshots after schedule() or after the step, and those scheduled now; the requests whose
   status or queue changed, whose sequences moved, that were added or reported finished; the
   pools whose counts, free list, tables or cache keys are not the very objects they were.
   Without a previous step (the first one, the one after a violation, ``KVSCHED_FULL_CHECK=1``)
   every subject is touched.
2. Make each touched sequence one subject per snapshot, once; evaluate each distinct trigger once
   per subject and hand the subjects it holds for to every rule about sequences with that trigger
   (a rule that declares reads within `_views.PLACEMENT` gets only the views whose placement
   moved since the previous step; one that declares reads beyond it, only the views where one
   of those fields differs from the snapshot before: after schedule() a decode's tokens are
   the very tuple they were); then each touched request, then each touched pool.
3. Run the rules about the step on the record, counting those whose trigger held.
4. Count, per rule, the subjects it checked with its trigger holding: what the run *exercised*.
   A rule whose count is zero at the end of a run was vacuous there.

Why this is sound: a rule about one subject passed on it at the previous step, and its verdict
depends on nothing but the subject (and the step's record, for the sequences the step scheduled,
which are always touched); an untouched subject is the very object it was. tests/test_incremental_check.py
holds every verdict to the whole evaluation, on the references and every mutant, and
tests/test_subjects.py holds each step rule's trigger to the rule's findings.

The derived facts the rules share (tables, entry counts, pool facts, keys; `_views`) are carried
forward from snapshot to snapshot there; the facts kept across steps for a rule (the token count a
finished request had, PIP-002) are kept here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from itertools import compress, repeat
from operator import attrgetter, itemgetter, length_hint, ne, not_
from typing import TYPE_CHECKING, NamedTuple

from spec import observation
from spec.invariants._views import (
    PLACEMENT,
    _placement_changed_since,
    changed_requests_between,
    entry_counts,
    equal_where_changed,
    queue_moves,
    queue_set,
    returned_step,
    snapshots,
    views_of,
    void_outcomes,
)
from spec.observation import SeqView, Snapshot, StepRecord
from spec.rules import AFTER_SCHEDULE, AFTER_STEP, POOL, REQUEST, SEQUENCE, STEP_KINDS, Invariant
from spec.session import taken_up_inputs
from spec.status import QUEUES, Status
from spec.types import seq_id

if TYPE_CHECKING:
    from spec.rules import CheckContext


class SeqAt(NamedTuple):
    """One sequence in one snapshot: the subject of a rule about sequences."""

    where: str  # "after schedule" or "after the step"
    id: str
    view: SeqView
    snap: Snapshot


class RequestAt(NamedTuple):
    """One request in one snapshot: its status (None: the scheduler does not know it), the queues
    that name it (a queue that names it twice appears twice), and whether it was added."""

    where: str
    id: str
    status: Status | None
    queues: tuple[str, ...]
    snap: Snapshot
    added: bool
    reported: Status | None  # how it was reported finished before this step (None: it was not)

    def views(self) -> list[SeqView]:
        """Its sequences' views in the snapshot."""
        return views_of(self.snap, self.id)


class PoolAt:
    """One device's block pool in one snapshot (``size``: the config's pool size)."""

    __slots__ = ("where", "device", "snap", "size", "_passed")

    def __init__(self, where: str, device: str, snap: Snapshot, size: int, passed: Snapshot | None) -> None:
        self.where, self.device, self.snap, self.size = where, device, snap, size
        self._passed = passed  # the snapshot the pool rules last passed on (this module's only)

    @property
    def refs(self) -> tuple[int, ...] | None:
        return self.snap.gpu_ref_counts if self.device == "gpu" else self.snap.cpu_ref_counts

    @property
    def free_ids(self) -> tuple[int, ...] | None:
        return self.snap.gpu_free_ids if self.device == "gpu" else self.snap.cpu_free_ids

    @property
    def free(self) -> int | None:
        return self.snap.gpu_free if self.device == "gpu" else self.snap.cpu_free

    @property
    def exists(self) -> bool:
        """Whether the scheduler reports this pool at all (a scheduler without swap space reports
        no CPU pool, or an empty one)."""
        return bool(self.refs or self.free or self.free_ids)


def ref_counts_match(pool: PoolAt, refs: tuple[int, ...], expected: tuple[int, ...]) -> bool:
    """Whether ``refs`` (the pool's reference counts) equal ``expected`` (the table entries per
    block): compared only where the pool or a table changed since the snapshot the same rules
    passed on, else whole at C speed."""
    return refs is expected or equal_where_changed(pool.snap, pool._passed, pool.device, refs, expected) \
        or refs == expected


def _same_pool(snap: Snapshot, older: Snapshot | None, device: str, size: int) -> bool:
    """Whether ``device``'s pool in ``snap`` is the very one it was in ``older``: counts, free
    list, tables and (on the GPU) cache keys and index."""
    if older is None:
        return False
    if device == "gpu":
        same = (snap.gpu_ref_counts is older.gpu_ref_counts and snap.gpu_free_ids is older.gpu_free_ids
                and snap.gpu_free == older.gpu_free and snap.gpu_block_keys is older.gpu_block_keys
                and snap.cache_index is older.cache_index and snap.gpu_fenced is older.gpu_fenced
                and snap.group_tables is older.group_tables)
    else:
        same = (snap.cpu_ref_counts is older.cpu_ref_counts and snap.cpu_free_ids is older.cpu_free_ids
                and snap.cpu_free == older.cpu_free)
    if not same or snap.seqs is None or older.seqs is None:
        return same and snap.seqs is older.seqs
    return entry_counts(snap, device, size) is entry_counts(older, device, size)


def before_is_new(ctx: CheckContext, rec: StepRecord) -> bool:
    """Whether the snapshot before ``rec``'s schedule() is one no passed check has read (it is
    not the final snapshot of the step every check passed on last)."""
    previous = ctx.previous
    return previous is None or rec.before is not previous.after or not observation.INCREMENTAL


def first_unread_token(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> int:
    """The first token position of ``seq`` that a rule reading every token has not read in an
    earlier snapshot it passed: the length of the token ids there when they are a prefix of
    these (compared at C speed), else 0."""
    if not observation.INCREMENTAL:
        return 0
    snap = seq.snap
    base = snap.base
    if base is not None and (base is rec.mid or base is rec.before) and _base_of(ctx, rec) is not None:
        # The usual chain. Where the adapter's delta gives the count (`Snapshot.kept_tokens`), it
        # is read here as `base_token_prefix` reads it (``seq.view`` is the snapshot's own view,
        # which passed the driver's type check), without that function's lookups; else one
        # comparison, shared with every other reader.
        kept = snap.kept_tokens.get(seq.id) if snap.kept_tokens is not None else None
        tokens = seq.view.token_ids
        if type(kept) is int and type(tokens) is tuple and 0 <= kept <= len(tokens):
            return kept
        return observation.base_token_prefix(snap, seq.id)
    older = rec.mid if seq.where == AFTER_STEP and rec.mid is not None else _base_of(ctx, rec)
    if older is None or older.seqs is None:
        return 0
    old = older.seqs.get(seq.id)
    known, tokens = (old.token_ids if old is not None else None), seq.view.token_ids
    if known is not None and tokens is not None and len(known) <= len(tokens) \
            and (known is tokens or tokens[: len(known)] == known):
        return len(known)
    return 0


def finish_length(ctx: CheckContext, seq_id: str) -> int | None:
    """The token count sequence ``seq_id`` had in the step its request was reported finished."""
    return ctx.finish_lengths.get(seq_id)


def _base_of(ctx: CheckContext, rec: StepRecord) -> Snapshot | None:
    """The final snapshot of the last step every check passed on, when it is where this step
    began (None: no subject is known to be unchanged)."""
    previous = ctx.previous
    if previous is None or not observation.INCREMENTAL or previous.after is not rec.before:
        return None
    return previous.after


class _Rule(NamedTuple):
    index: int
    inv: Invariant


class Evaluation:
    """Runs a set of step invariants over one step at a time, by subject (the numbered steps of
    the module docstring), and counts what each exercised (`exercised`)."""

    def __init__(self, checks: Sequence[Invariant]) -> None:
        self.checks = list(checks)
        self.exercised = [0] * len(self.checks)
        # What a rule about the step found in a step where its trigger did not hold (nothing, when
        # the triggers are right; tests/test_subjects.py holds them to it). A rule about one
        # subject is handed only the subjects its trigger holds for: there the trigger is the
        # statement's own precondition ("a running sequence holds GPU blocks").
        self.untriggered: list[tuple[str, str]] = []
        rules = [_Rule(i, inv) for i, inv in enumerate(self.checks)]
        # Rules about sequences, per snapshot, grouped by (trigger, placement only): each trigger is
        # evaluated once per touched view, and the views it holds for go to every rule that has it.
        self._sequence: dict[str, list[tuple[object, bool, list[_Rule]]]] = {}
        for label in (AFTER_SCHEDULE, AFTER_STEP):
            groups: dict[tuple[object, bool], list[_Rule]] = {}
            for r in rules:
                if r.inv.about == SEQUENCE and label in r.inv.at:
                    groups.setdefault((r.inv.when, _read_filter(r.inv)), []).append(r)
            self._sequence[label] = [(when, reads, group) for (when, reads), group in groups.items()]
        self._request = {label: [r for r in rules if r.inv.about == REQUEST and label in r.inv.at]
                         for label in (AFTER_SCHEDULE, AFTER_STEP)}
        self._pool = {label: [r for r in rules if r.inv.about == POOL and label in r.inv.at]
                      for label in (AFTER_SCHEDULE, AFTER_STEP)}
        self._step = [r for r in rules if r.inv.about in STEP_KINDS]
        assert len(self._step) + sum(1 for r in rules if r.inv.about in (SEQUENCE, REQUEST, POOL)) == len(rules), \
            [r.inv.id for r in rules]

    def counts(self) -> dict[str, int]:
        """Invariant id -> subjects checked with its trigger holding, so far."""
        return {inv.id: n for inv, n in zip(self.checks, self.exercised, strict=True)}

    def run(self, ctx: CheckContext, rec: StepRecord, whole: bool = False) -> list[tuple[str, str]]:
        """(invariant id, message) for every violation in ``rec`` (``whole``: every subject,
        whatever the previous step)."""
        base = None if whole else _base_of(ctx, rec)
        returned_step(ctx, rec)  # the outcome each step processes, kept whether or not a rule asks this step
        void_outcomes(ctx, rec)
        found: list[tuple[str, str]] = []
        labelled = [(AFTER_SCHEDULE if snap is rec.mid else AFTER_STEP, snap) for _, snap in snapshots(rec)]
        if any(self._sequence.values()):
            self._sequences(ctx, rec, base, labelled, found)
        if any(self._request.values()):
            self._requests(ctx, rec, base, labelled, found)
        if any(self._pool.values()):
            self._pools(ctx, rec, base, labelled, found)
        counts = self.exercised
        for index, inv in self._step:  # every step: a step rule may keep state across steps
            held = inv.when is None or inv.when(ctx, rec)
            if held:
                counts[index] += 1
            messages = [(inv.id, m) for m in inv.step(ctx, rec)]  # type: ignore[misc]
            found += messages
            if not held:
                self.untriggered += messages
        return found


    # -- 2. sequences ------------------------------------------------------------------------
    def _sequences(self, ctx: CheckContext, rec: StepRecord, base: Snapshot | None,
                   labelled: list[tuple[str, Snapshot]], found: list[tuple[str, str]]) -> None:
        touched, placed = _touched_sequences(rec, base)
        counts = self.exercised
        older = base  # the snapshot before this one in the step's chain (None: check every view whole)
        for label, snap in labelled:
            groups = self._sequence[label]
            if not groups:
                continue
            seqs = snap.seqs
            assert seqs is not None
            # Each touched view becomes one subject, once (in id order when touched is known). The
            # subjects, the placement filter and the triggers below are built and read at C speed
            # (map, compress): a Python loop per subject and snapshot was a tenth of the walk.
            ids = list(seqs) if touched is None else list(filter(seqs.__contains__, touched))
            subjects = list(map(SeqAt, repeat(label), ids, map(seqs.__getitem__, ids), repeat(snap)))
            moved = subjects if placed is None else list(compress(subjects, map(placed.__contains__, ids)))
            pairs = None  # the views and older's, read once for every rule's reads
            for when, reads, rules in groups:
                if reads is None:
                    pool = subjects
                elif reads is PLACEMENT:
                    pool = moved
                else:
                    if pairs is None and older is not None and older.seqs is not None:
                        pairs = _view_pairs(subjects, older)
                    pool = _read_fields_changed(subjects, older, reads, pairs)
                chosen = pool if when is None else list(compress(pool, map(when, repeat(ctx), pool)))  # type: ignore[arg-type]
                if not chosen:
                    continue
                for index, inv in rules:
                    counts[index] += len(chosen)
                    fn, inv_id = inv.step, inv.id
                    for seq in chosen:
                        for message in fn(ctx, rec, seq):  # type: ignore[misc]
                            found.append((inv_id, message))
            older = snap if base is not None else None

    # -- 2. requests -------------------------------------------------------------------------
    def _requests(self, ctx: CheckContext, rec: StepRecord, base: Snapshot | None,
                  labelled: list[tuple[str, Snapshot]], found: list[tuple[str, str]]) -> None:
        touched = _touched_requests(ctx, rec, base)
        counts = self.exercised
        for label, snap in labelled:
            rules = self._request[label]
            if not rules:
                continue
            for req in _requests_in(ctx, snap, label, touched):
                for index, inv in rules:
                    if inv.when is not None and not inv.when(ctx, req):
                        continue
                    counts[index] += 1
                    found += [(inv.id, m) for m in inv.step(ctx, rec, req)]  # type: ignore[misc]

    # -- 2. pools ----------------------------------------------------------------------------
    def _pools(self, ctx: CheckContext, rec: StepRecord, base: Snapshot | None,
               labelled: list[tuple[str, Snapshot]], found: list[tuple[str, str]]) -> None:
        counts = self.exercised
        older = base
        for label, snap in labelled:
            rules = self._pool[label]
            for device, size in (("gpu", ctx.config.num_gpu_blocks), ("cpu", ctx.config.num_cpu_blocks)):
                if not rules or _same_pool(snap, older, device, size):
                    continue
                pool = PoolAt(label, device, snap, size, older)
                for index, inv in rules:
                    if inv.when is not None and not inv.when(ctx, pool):
                        continue
                    counts[index] += 1
                    found += [(inv.id, m) for m in inv.step(ctx, rec, pool)]  # type: ignore[misc]
            older = snap if base is not None else None


def _read_filter(inv: Invariant) -> frozenset[str] | None:
    """How the views handed to a rule about sequences are filtered by its declared reads:
    `PLACEMENT` for reads within it (the views whose placement moved since the previous step, found
    once per step for all such rules), the reads themselves for reads beyond it (the views where
    one of them differs from the snapshot before, `_read_fields_changed`), None for no declaration."""
    if inv.reads is None:
        return None
    return PLACEMENT if inv.reads <= PLACEMENT else inv.reads


def _read_fields_changed(subjects: list[SeqAt], older: Snapshot | None, reads: frozenset[str],
                         pairs: tuple[list[SeqView], list[SeqView]] | None = None) -> list[SeqAt]:
    """The subjects whose view differs in a field of ``reads`` from the same sequence's view in
    ``older`` (the snapshot before, in this step's chain, which every rule passed or was just
    run on), or that ``older`` lacks; all of them when ``older`` is None. Sound for a rule whose
    verdict and trigger read only ``reads`` of the view (tests/test_reads_declared.py): on a view
    equal there it says what it said one snapshot before. Compared at C speed; an unchanged token
    list is the very tuple, so a decode's view after schedule() is a few identity checks.
    ``pairs``: the subjects' views and ``older``'s views of the same sequences (`_view_pairs`),
    when the caller has them for several rules' reads."""
    if older is None or older.seqs is None or not observation.INCREMENTAL:
        return subjects
    new, old = pairs if pairs is not None else _view_pairs(subjects, older)
    fields = _fields_of(reads)
    if "token_ids" not in reads:
        return list(compress(subjects, map(ne, map(fields, new), map(fields, old))))
    # Token lists of different lengths differ: a decode's grown list is told by its length, not by
    # a comparison element by element along hundreds of tokens (O(tokens) per view and step).
    # Only the views whose lists have one length are compared field by field.
    differs = list(map(ne, map(length_hint, map(_TOKENS, new), repeat(-1)),
                       map(length_hint, map(_TOKENS, old), repeat(-1))))
    if not any(differs):  # after schedule(): every list as long as it was (mostly the very tuple)
        return list(compress(subjects, map(ne, map(fields, new), map(fields, old))))
    level = list(compress(range(len(differs)), map(not_, differs)))
    for i in compress(level, map(ne, map(fields, map(new.__getitem__, level)), map(fields, map(old.__getitem__, level)))):
        differs[i] = True
    return list(compress(subjects, differs))


def _view_pairs(subjects: list[SeqAt], older: Snapshot) -> tuple[list[SeqView], list[SeqView]]:
    """The subjects' views, and the same sequences' views in ``older`` (`_ABSENT_VIEW` where it
    lacks one), read once per snapshot for every rule's reads (`_read_fields_changed`)."""
    assert older.seqs is not None
    return (list(map(_VIEW, subjects)),
            list(map(older.seqs.get, map(_ID, subjects), repeat(_ABSENT_VIEW))))


_VIEW, _ID, _SEQ_ID = attrgetter("view"), attrgetter("id"), attrgetter("seq_id")
_TOKENS = attrgetter("token_ids")


@functools.lru_cache(maxsize=32)
def _fields_of(reads: frozenset[str]) -> itemgetter:
    """An itemgetter of ``reads``' positions in a `SeqView`."""
    return itemgetter(*sorted(SeqView._fields.index(f) for f in reads))


# A view for "not in that snapshot": its fields are fresh objects, unequal to any view's.
_ABSENT_VIEW = SeqView(*(object() for _ in SeqView._fields))


def _touched_sequences(rec: StepRecord, base: Snapshot | None) -> tuple[list[str] | None, frozenset[str] | None]:
    """(every sequence that may differ from ``base`` in the record's snapshots, or was scheduled;
    those whose `_views.PLACEMENT` may differ): None where that is unknown (visit every view)."""
    if base is None or not observation.INCREMENTAL:
        return None, None
    changed: set[str] = set()
    placed: set[str] | None = set()
    older = base
    for _, snap in snapshots(rec):
        delta = snap.changed_since(older) if snap.seqs is not None else None
        if delta is None:
            return None, None
        changed |= delta
        moved = _placement_changed_since(snap, older) if placed is not None else None
        placed = None if moved is None else placed | moved  # type: ignore[operator]
        older = snap
    changed.update(map(_SEQ_ID, rec.output.scheduled))
    return sorted(changed), None if placed is None else frozenset(placed)


def _touched_requests(ctx: CheckContext, rec: StepRecord, base: Snapshot | None) -> list[str] | None:
    """The requests whose status, queue or sequences may differ from ``base`` in the record's
    snapshots, and those added or reported finished in this step or the one before (None:
    unknown, visit every request)."""
    if base is None or not observation.INCREMENTAL:
        return None
    touched: set[str] = set()
    older = base
    for _, snap in snapshots(rec):
        statuses = changed_requests_between(snap, older)
        moved = queue_moves(snap, older)
        sequences = _placement_changed_since(snap, older)
        if statuses is None or moved is None or sequences is None or snap.seqs is None:
            return None
        touched |= statuses | moved
        seqs, old_seqs = snap.seqs, older.seqs or {}
        for sid in sequences:
            view = seqs.get(sid) or old_seqs.get(sid)
            if view is not None:
                touched.add(view.request_id)
        older = snap
    # A connector's transfer that starts, ends or is reported changes what a request may hold
    # (REQ-006) with none of its views changing.
    for snap in (base, *(s for _, s in snapshots(rec))):
        touched.update(snap.kv_transfers or ())
        touched.update(snap.kv_reported or ())
    touched.update(r.request_id for r in rec.added)
    touched.update(f.request_id for f in rec.finished)
    if ctx.previous is not None:
        touched.update(f.request_id for f in ctx.previous.finished)
    return sorted(touched)


def _requests_in(ctx: CheckContext, snap: Snapshot, label: str, touched: Iterable[str] | None) -> Iterator[RequestAt]:
    """`RequestAt` of each request in ``touched`` (None: every request the snapshot or the run
    knows) that the snapshot or the run knows."""
    statuses = snap.statuses
    assert statuses is not None
    sets = {name: queue_set(snap, name) for name in QUEUES}
    repeats = any(q.repeats for q in sets.values())
    if touched is None:
        every = dict.fromkeys(statuses)
        for name in QUEUES:
            every.update(dict.fromkeys(snap.queue(name) or ()))
        every.update(dict.fromkeys(ctx.requests))
        touched = every
    members = {name: q.members for name, q in sets.items()}
    for rid in touched:
        status = statuses.get(rid)
        if repeats:
            queues = tuple(name for name in QUEUES for _ in range((snap.queue(name) or ()).count(rid)))
        else:
            queues = tuple(name for name in QUEUES if rid in members[name])
        added = rid in ctx.requests
        if status is None and not queues and not added:
            continue
        yield RequestAt(label, rid, status, queues, snap, added, ctx.finished.get(rid))


def note_session_inputs(ctx: CheckContext, rec: StepRecord) -> None:
    """Keep the encoder inputs of each session whose later inputs carry some, as it takes them up
    (`CheckContext.session_encoder_inputs`; run before the step's checks, which read them). The
    take-up is read from the snapshots, in one of two ways:

    - the session leaves WAITING_FOR_INPUT (for waiting or running; or it is scheduled, and may
      finish in the step): its next arrived input lands where its last sampled token was, at its
      length before the step less one;
    - going on at once after a stop, it is back in waiting grown by at least the input's tokens:
      the input lands at its end.

    Positions follow `spec.session.taken_up_inputs`."""
    statuses_before, statuses_after = rec.before.statuses or {}, rec.after.statuses or {}
    scheduled = {s.request_id for s in rec.output.scheduled}
    for rid in ctx.piece_encoded:
        request, taken = ctx.requests[rid], ctx.inputs_taken.get(rid, 0)
        before, after = (rec.before.seqs or {}).get(seq_id(rid, 0)), (rec.after.seqs or {}).get(seq_id(rid, 0))
        if rid in ctx.finished or before is None or before.num_tokens is None:
            continue
        status = statuses_after.get(rid)
        inputs = list(ctx.encoder_inputs(rid))
        length = before.num_tokens
        went_on = status is not None and not status.is_finished and status is not Status.WAITING_FOR_INPUT
        if statuses_before.get(rid) is Status.WAITING_FOR_INPUT and (went_on or rid in scheduled) \
                and taken < len(request.session) and request.session[taken].step <= rec.step:
            piece = request.session[taken]
            inputs += taken_up_inputs(piece, length - 1)
            length, taken = length - 1 + piece.prompt_len, taken + 1
        if status is Status.WAITING and after is not None and after.num_tokens is not None \
                and taken < len(request.session) and request.session[taken].step <= rec.step \
                and after.num_tokens - length >= request.session[taken].prompt_len:
            piece = request.session[taken]
            inputs += taken_up_inputs(piece, after.num_tokens - piece.prompt_len)
            taken += 1
        if taken != ctx.inputs_taken.get(rid, 0):
            ctx.inputs_taken[rid] = taken
            ctx.session_encoder_inputs[rid] = tuple(inputs)


def note_finish_lengths(ctx: CheckContext, rec: StepRecord) -> None:
    """Keep each sequence's token count in the step its request is reported finished
    (`finish_length`; run after the step's checks)."""
    for done in rec.finished:
        if rec.after.seqs is None:
            return
        for v in views_of(rec.after, done.request_id):
            if v.num_tokens is not None:
                ctx.finish_lengths.setdefault(v.seq_id, v.num_tokens)
