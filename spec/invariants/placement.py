"""Where things are: which device a sequence's blocks live on, and which queue a request is in."""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._evaluation import RequestAt, SeqAt
from spec.invariants._views import finished_among, freed_by_their_last_step, tables
from spec.invariants.connector import held_by_transfer
from spec.invariants.triggers import finished, finished_holders_at_start, known_or_queued, running, swapped, waiting
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import AFTER_SCHEDULE, OUTCOME, REQUEST, SEQUENCE, CheckContext, invariant


def _residency(seq: SeqAt, device: str | None) -> Iterator[str]:
    v = seq.view
    if device is None and v.blocks:
        yield f"{seq.where}: {seq.id} is {v.status.value} but holds {v.device} blocks {list(v.blocks)}"
    elif device is not None and (v.device != device or not v.blocks):
        yield f"{seq.where}: {seq.id} is {v.status.value} but its blocks are {list(v.blocks or ())} on {v.device}"


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
    reads=("status", "blocks", "device"), about=SEQUENCE, when=running,
)
def running_on_gpu(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    if not seq.view.blocks and seq.where == AFTER_SCHEDULE and seq.id in freed_by_their_last_step(ctx, rec):
        return
    yield from _residency(seq, "gpu")


@invariant(
    "RES-002", "safety",
    "A swapped sequence holds at least one block, and all its blocks are CPU blocks.",
    """Seed 000 §3.2 (CacheEngine moves KV between GPU and CPU) and seed 003 §1 (swapped:
    'temporarily moved out for lack of resources'): a swapped sequence keeps its KV, on CPU only,
    so its GPU blocks are free for others.""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"), about=SEQUENCE, when=swapped,
)
def swapped_on_cpu(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    yield from _residency(seq, "cpu")


@invariant(
    "RES-003", "safety",
    "A waiting sequence holds no block.",
    """vLLM allocates a prompt's blocks when it is admitted, all at once, and a recompute victim
    gives back all of its blocks (vLLM PR #10013 fixed a recompute that kept a second table). A
    streaming session keeps its KV while it waits for and then with its next input (vLLM 0.33.0
    kv_holding_waiting, scheduler.py:2709-2715): a session's sequences are not checked here, and
    SES-003 says when a session must give its KV back.""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device", "request_id"), about=SEQUENCE, when=waiting,
)
def waiting_holds_nothing(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    yield from _residency(seq, None)


@invariant(
    "RES-004", "policy",
    "A finished sequence holds no block.",
    """Seed 000 §3.3 step 6: blocks of terminated sequences are released after each iteration;
    anything a finished sequence keeps is leaked for good (SGLang #18701: aborting a retracted
    request leaked its KV). Policy, not safety: freeing in the very step that finishes (or
    aborts) a sequence is vLLM's timing; a scheduler that frees finished requests lazily, at
    its next schedule(), is correct. Safety keeps the bound (RES-005).""",
    (C.STATUSES, C.BLOCK_TABLES),
    reads=("status", "blocks", "device"), about=SEQUENCE, when=finished,
)
def finished_holds_nothing(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    yield from _residency(seq, None)


@invariant(
    "QUE-001", "safety",
    """Queue partition: each unfinished request is in exactly one of waiting, running and swapped,
    once; finished and unknown requests are in none.""",
    """Seed 003 §1 names the three queues and moves requests between them; a request in two
    queues is scheduled twice, one in none is lost (TensorRT-LLM #9931: a request paused twice).""",
    (C.QUEUES, C.STATUSES),
    about=REQUEST, when=known_or_queued,
)
def queue_partition(ctx: CheckContext, rec: StepRecord, req: RequestAt) -> Iterator[str]:
    label, rid, status, where = req.where, req.id, req.status, list(req.queues)
    if status is None:
        yield f"{label}: unknown request {rid} in {where}"
    elif status.is_finished and where:
        yield f"{label}: {rid} is {status.value} yet in {where}"
    elif not status.is_finished and len(where) != 1:
        yield f"{label}: {rid} is unfinished and in {len(where)} queues {where}"


@invariant(
    "QUE-002", "safety",
    "A request's status names the queue it is in (WAITING in waiting, RUNNING in running, SWAPPED in swapped), and so do its live sequences'.",
    """Seed 003 §1 keeps the status on the request ('WAITING/RUNNING/SWAPPED'); vLLM derives its
    decisions from sequence statuses (get_seqs(status=RUNNING)), so a status that disagrees with
    the queue makes it skip or double-count sequences.""",
    (C.QUEUES, C.STATUSES),
    about=REQUEST, when=known_or_queued,
)
def status_matches_queue(ctx: CheckContext, rec: StepRecord, req: RequestAt) -> Iterator[str]:
    label, rid, status = req.where, req.id, req.status
    for name in req.queues:
        if status is None or status.queue != name:
            yield f"{label}: {rid} is in {name} with status {status.value if status else None}"
    if status is None or status.is_finished or req.snap.seqs is None:
        return
    for v in req.views():
        if not v.status.is_finished and v.status is not status:
            yield f"{label}: sequence {v.seq_id} is {v.status.value} in a {status.value} request"


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
    about=OUTCOME, when=finished_holders_at_start,
)
def finished_freed_by_next_step(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    before, after = rec.before.seqs, rec.after.seqs
    assert before is not None and after is not None
    held = held_by_transfer(rec.before, rec.after)  # a KV connector's transfer holds them (KVC-007)
    holders = tables(rec.after, "gpu").keys() | tables(rec.after, "cpu").keys()
    for sid in sorted(finished_among(rec.before, holders)):
        old, new = before[sid], after[sid]
        if new.request_id not in held:
            yield f"{sid} was {old.status.value} when the step began and still holds {new.device} blocks {list(new.blocks)}"
