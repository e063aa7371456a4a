"""Where things are: which device a sequence's blocks live on, and which queue a request is in."""

from __future__ import annotations

from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import (
    changed_between,
    changed_requests_between,
    checked_with_prior,
    finished_holders,
    freed_by_their_last_step,
    fresh_in_snapshots,
    queue_moves,
    queue_set,
    seq_ids_by_request,
)
from spec.invariants.connector import held_by_transfer
from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.status import QUEUES, Status


def _residency(ctx: CheckContext, rec: StepRecord, wanted: Status, device: str | None,
               excused: frozenset[str] = frozenset()) -> Iterator[str]:
    for label, sid, v in fresh_in_snapshots(ctx, rec):
        if v.status is not wanted or (not v.blocks and label == "after schedule" and sid in excused):
            continue
        if device is None and v.blocks:
            yield f"{label}: {sid} is {wanted.value} but holds {v.device} blocks {list(v.blocks)}"
        elif device is not None and (v.device != device or not v.blocks):
            yield f"{label}: {sid} is {wanted.value} but its blocks are {list(v.blocks or ())} on {v.device}"


@invariant(
    "RES-001", "safety",
    """A running sequence holds at least one block, and all its blocks are GPU blocks; except that
    where the scheduler claims ``ordered_steps``, a sequence whose last token this step samples
    may hold none after schedule() (its blocks freed early, none of them in another sequence's
    table yet).""",
    """Seed 003 §1: running requests are the ones being computed, and the model reads their KV
    from GPU memory; a running sequence whose table points at CPU blocks computes on garbage.
    The exception is a correct design, not a loophole (the stranger test, tokasaurus 0.0.4,
    ``schedule_steps``: ``apply_decision`` then ``deallocate``): a scheduler that hands the
    step's block tables to the model before freeing the blocks of a sequence whose last token
    the step samples loses nothing, because the freed blocks go to a later step, which runs after
    this one where steps run in order on one stream. Without that claim (a scheduler whose model
    reads tables after schedule(), like vLLM V0's) an empty running table is a missing KV write.""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"),
)
def running_on_gpu(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    yield from _residency(ctx, rec, Status.RUNNING, "gpu", freed_by_their_last_step(ctx, rec))


@invariant(
    "RES-002", "safety",
    "A swapped sequence holds at least one block, and all its blocks are CPU blocks.",
    """Seed 000 §3.2 (CacheEngine moves KV between GPU and CPU) and seed 003 §1 (swapped:
    'temporarily moved out for lack of resources'): a swapped sequence keeps its KV, on CPU only,
    so its GPU blocks are free for others.""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"),
)
def swapped_on_cpu(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    yield from _residency(ctx, rec, Status.SWAPPED, "cpu")


@invariant(
    "RES-003", "safety",
    "A waiting sequence holds no block.",
    """vLLM allocates a prompt's blocks when it is admitted, all at once, and a recompute victim
    gives back all of its blocks (vLLM PR #10013 fixed a recompute that kept a second table).""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"),
)
def waiting_holds_nothing(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    yield from _residency(ctx, rec, Status.WAITING, None)


@invariant(
    "RES-004", "policy",
    "A finished sequence holds no block.",
    """Seed 000 §3.3 step 6: blocks of terminated sequences are released after each iteration;
    anything a finished sequence keeps is leaked for good (SGLang #18701: aborting a retracted
    request leaked its KV). Policy, not safety: freeing in the very step that finishes (or
    aborts) a sequence is vLLM's timing; a scheduler that frees finished requests lazily, at
    its next schedule(), is correct. Safety keeps the bound (RES-005).""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"),
)
def finished_holds_nothing(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, sid, v in fresh_in_snapshots(ctx, rec):
        if v.status.is_finished and v.blocks:
            yield f"{label}: {sid} is {v.status.value} but holds {v.device} blocks {list(v.blocks)}"


def _moved_or_changed(snap: Snapshot, prior: Snapshot | None) -> set[str] | None:
    """Requests whose status or queue membership may differ from ``prior`` (None: unknown)."""
    moved = queue_moves(snap, prior)
    changed = changed_requests_between(snap, prior) if prior is not None else None
    return None if moved is None or changed is None else moved | changed


def _same_queues(snap: Snapshot, prior: Snapshot | None) -> bool:
    return (prior is not None and snap.statuses is prior.statuses and snap.waiting is prior.waiting
            and snap.running is prior.running and snap.swapped is prior.swapped)


@invariant(
    "QUE-001", "safety",
    """Queue partition: each unfinished request is in exactly one of waiting, running and swapped,
    once; finished and unknown requests are in none.""",
    """Seed 003 §1 names the three queues and moves requests between them; a request in two
    queues is scheduled twice, one in none is lost (TensorRT-LLM #9931: a request paused twice).""",
    (C.QUEUES, C.STATUSES),
)
def queue_partition(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap, prior in checked_with_prior(ctx, rec):
        assert snap.statuses is not None
        if _same_queues(snap, prior):
            continue  # the same queues and statuses this check passed just before
        candidates = _moved_or_changed(snap, prior)
        if candidates is not None:
            sets = {name: queue_set(snap, name) for name in QUEUES}
            if not any(q.repeats for q in sets.values()):
                sets = {name: q.members for name, q in sets.items()}
                for rid in sorted(candidates):
                    where = [name for name in QUEUES if rid in sets[name]]
                    status = snap.statuses.get(rid)
                    if status is None and where:
                        yield f"{label}: unknown request {rid} in {where}"
                    elif status is not None and status.is_finished and where:
                        yield f"{label}: {rid} is {status.value} yet in {where}"
                    elif status is not None and not status.is_finished and len(where) != 1:
                        yield f"{label}: {rid} is unfinished and in {len(where)} queues {where}"
                continue  # every other request is where it was, with the status it had
        seen: dict[str, list[str]] = {}
        for name in QUEUES:
            for rid in snap.queue(name) or ():
                seen.setdefault(rid, []).append(name)
        for rid, status in snap.statuses.items():
            where = seen.pop(rid, [])
            if status.is_finished and where:
                yield f"{label}: {rid} is {status.value} yet in {where}"
            elif not status.is_finished and len(where) != 1:
                yield f"{label}: {rid} is unfinished and in {len(where)} queues {where}"
        for rid, where in seen.items():
            yield f"{label}: unknown request {rid} in {where}"


@invariant(
    "QUE-002", "safety",
    "A request's status names the queue it is in (WAITING in waiting, RUNNING in running, SWAPPED in swapped), and so do its live sequences'.",
    """Seed 003 §1 keeps the status on the request ('WAITING/RUNNING/SWAPPED'); vLLM derives its
    decisions from sequence statuses (get_seqs(status=RUNNING)), so a status that disagrees with
    the queue makes it skip or double-count sequences.""",
    (C.QUEUES, C.STATUSES),
    reads=("request_id", "status"),
)
def status_matches_queue(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap, prior in checked_with_prior(ctx, rec):
        assert snap.statuses is not None and snap.seqs is not None
        if _same_queues(snap, prior) and snap.seqs is prior.seqs:
            continue  # the same queues, statuses and sequences this check passed just before
        candidates = _moved_or_changed(snap, prior)
        changed_seqs = changed_between(snap, prior, ctx.reads) if prior is not None else None
        sets = {name: queue_set(snap, name) for name in QUEUES}
        for name in QUEUES:
            if candidates is None or sets[name].repeats:
                members = snap.queue(name) or ()
            else:  # every other request is where it was, with the status it had
                members = sorted(sets[name].members.intersection(candidates))
            for rid in members:
                if candidates is not None and rid not in candidates:
                    continue
                status = snap.statuses.get(rid)
                if status is None or status.queue != name:
                    yield f"{label}: {rid} is in {name} with status {status.value if status else None}"
        if candidates is None or changed_seqs is None:
            views = list(snap.seqs.items())
        else:  # a sequence whose status and whose request's status are unchanged still agrees
            by_request = seq_ids_by_request(snap)
            sids = set(changed_seqs)
            sids.update(sid for rid in candidates for sid in by_request.get(rid, ()))
            views = [(sid, snap.seqs[sid]) for sid in sorted(sids) if sid in snap.seqs]
        for sid, v in views:
            group = snap.statuses.get(v.request_id)
            if group is not None and not group.is_finished and not v.status.is_finished and v.status is not group:
                yield f"{label}: sequence {sid} is {v.status.value} in a {group.value} request"


@invariant(
    "RES-005", "safety",
    "A sequence that was finished when a step began holds no block when the step ends: a finished request's blocks are free by the end of the next step.",
    """Anything a finished sequence keeps is leaked for good (SGLang #18701: aborting a retracted
    request leaked its KV), and a leak starves admission. Engine-neutral form of RES-004: a
    scheduler may free lazily (at its next schedule()), but one step is all the grace there is.
    An abort the scheduler carries out later is no exception but a later finish: tokasaurus
    answers the client at once and keeps a prefilling sequence (its prompt blocks may be shared)
    until the prefill ends; its request is live until then and finished only once it is let go
    of (docs/ADAPTERS.md), so this statement, QUE-001 and OUT-002 need no relaxing for it.""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"),
)
def finished_freed_by_next_step(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    before, after = rec.before.seqs, rec.after.seqs
    assert before is not None and after is not None
    changed = changed_between(rec.after, rec.before, ctx.reads)
    # Finished when the step began: those that held blocks then, and any whose view changed since.
    candidates = before if changed is None else finished_holders(rec.before) | changed
    held = held_by_transfer(rec.before, rec.after)  # a KV connector's transfer holds them (KVC-007)
    for sid in sorted(candidates):
        old, new = before.get(sid), after.get(sid)
        if old is not None and old.status.is_finished and new is not None and new.blocks and new.request_id not in held:
            yield f"{sid} was {old.status.value} when the step began and still holds {new.device} blocks {list(new.blocks)}"
