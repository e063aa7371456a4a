"""KV connectors: external KV loaded into a request's blocks, and blocks held for a finished
request's send (spec/connector.py, docs/CONNECTORS.md).

Each predicate reads the connector's record (``Snapshot.kv_transfers``: transfers in flight;
``Snapshot.kv_reported``: those the step's outcome reported done), which the environment keeps
beside the scheduler: the connector is not the code under test, so what it says it is doing is
the truth the scheduler is checked against. A scheduler run without a connector shows neither
part and the family does not apply (capability ``kv_transfers``).

The helpers at the end (`load_failed`, `held_by_transfer`, `loading`) are what the families that
predate connectors read to leave a connector's own moves alone: a step whose load failed computes
nothing (CHK-004, REQ-004), a finished request's blocks stay while its transfer is in flight
(RES-005, REQ-006), a request waiting for its load does not block admission (POL-001, LIV-003).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from spec.connector import TransferView
from spec.invariants._views import admitted
from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.rules import OUTCOME, SCHEDULE, STEP, CheckContext, invariant
from spec.status import Status


def _snapshots(rec: StepRecord) -> Iterator[tuple[str, Snapshot]]:
    yield "before the step", rec.before
    if rec.mid is not None:
        yield "after schedule", rec.mid
    yield "after the step", rec.after


def _transfers(snap: Snapshot | None) -> Mapping[str, TransferView]:
    return (snap.kv_transfers if snap is not None else None) or {}


def _async_loads(snap: Snapshot | None) -> list[str]:
    return [rid for rid, t in _transfers(snap).items() if t.kind == "load" and t.load_async]


# -- triggers (spec/invariants/triggers.py's kind, kept beside the family they belong to) --------
def loads_at_start(ctx: CheckContext, rec: StepRecord) -> bool:
    """an asynchronous KV load is in flight when the step begins"""
    return bool(_async_loads(rec.before))


def transfers_in_flight(ctx: CheckContext, rec: StepRecord) -> bool:
    """a KV connector transfer is in flight before, during or after the step"""
    return any(_transfers(snap) for _, snap in _snapshots(rec))


def loads_in_flight(ctx: CheckContext, rec: StepRecord) -> bool:
    """an asynchronous KV load is in flight before, during or after the step"""
    return any(_async_loads(snap) for _, snap in _snapshots(rec))


def reports_failed_load(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step's outcome reports a KV load with failed blocks"""
    return any(t.kind == "load" and t.failed for t in (rec.after.kv_reported or {}).values())


def failed_blocks_not_recomputed(ctx: CheckContext, rec: StepRecord) -> bool:
    """a block a failed load left invalid is not yet computed again when the step begins"""
    return bool(ctx.flow_state.get("KVC-011"))


def fails_or_errors(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step's outcome reports a failed KV load, or finishes a request with an error"""
    return reports_failed_load(ctx, rec) or any(f.status is Status.FINISHED_ERROR for f in rec.finished)


def reported_last_step(ctx: CheckContext, rec: StepRecord) -> bool:
    """the previous step's outcome reported a connector transfer done"""
    return bool(ctx.flow_state.get("KVC-007"))


def loads_beside_waiting(ctx: CheckContext, rec: StepRecord) -> bool:
    """an asynchronous KV load is in flight when the step begins, beside a waiting request without one"""
    loads = _async_loads(rec.before)
    return bool(loads) and any(rid not in loads for rid in rec.before.waiting or ())


def idle_with_landed_load(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request whose KV load landed waits while nothing runs, no transfer is in flight and no
    block is held back for an in-flight step"""
    landed = ctx.flow_state.get("KVC-009") or {}
    before = rec.before
    return bool(landed) and not before.running and not _transfers(before) and not before.gpu_fenced \
        and any(rid in landed for rid in before.waiting or ())


@invariant(
    "KVC-001", "safety",
    """A request whose asynchronous KV load is in flight when a step begins is not scheduled in that
    step: none of its tokens is computed on top of KV that has not landed.""",
    """vLLM keeps such a request in WAITING_FOR_REMOTE_KVS and skips it until the worker reports
    the load in ``finished_recving`` (scheduler.py:3519-3530). Scheduling it earlier runs attention
    over blocks the transfer is still writing: every correct design waits, whatever it does
    meanwhile (so this is safety). The loaded tokens count as computed only from then on.""",
    (C.KV_TRANSFERS,),
    about=SCHEDULE, when=loads_at_start,
)
def loading_not_scheduled(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    loading = {rid for rid, t in _transfers(rec.before).items() if t.kind == "load" and t.load_async}
    for item in rec.output.scheduled:
        if item.request_id in loading:
            yield f"{item.request_id} is scheduled for {item.num_tokens} token(s) while its KV load is in flight"


@invariant(
    "KVC-002", "safety",
    """A block a connector transfer in flight uses (a load writes it, a send reads it) is not free,
    and no other request's table holds it except through a prefix hit on its key.""",
    """The transfer is not ordered with the scheduler's steps: a block freed or handed to another
    request while a load writes it or a send reads it is overwritten under the transfer (vLLM
    keeps a finished request's blocks while ``request_finished`` asks for a delayed free, and a
    WAITING_FOR_REMOTE_KVS request's blocks until the load reports, scheduler.py:2997-3005,
    3556-3582). A prefix hit on a cached block only reads it: a send's blocks, or a synchronous
    load's, which lands before the step's forward pass (vLLM caches them at allocation); an
    asynchronous load's blocks have no key until it lands (KVC-003).""",
    (C.KV_TRANSFERS, C.BLOCK_TABLES, C.FREE_LISTS),
    about=STEP, when=transfers_in_flight,
)
def transfer_blocks_held(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap in _snapshots(rec):
        transfers = _transfers(snap)
        if not transfers:
            continue
        free = set(snap.gpu_free_ids or ())
        keys = snap.gpu_block_keys
        owners: dict[int, set[str]] = {}
        for v in (snap.seqs or {}).values():
            for block in v.blocks or ():
                owners.setdefault(block, set()).add(v.request_id)
        for rid, t in transfers.items():
            for block in t.blocks:
                if block in free:
                    yield f"{label}: block {block} is free while {rid}'s {t.kind} is in flight"
                shared = sorted(owners.get(block, set()) - {rid})
                keyed = keys is not None and block < len(keys) and keys[block] is not None
                if shared and not keyed:
                    yield f"{label}: block {block} of {rid}'s {t.kind} in flight is in the table of {shared}"


@invariant(
    "KVC-003", "policy",
    """A block an asynchronous load writes is not findable in the prefix cache while the load is in
    flight: it has no key.""",
    """So no other request finds it by its key and reads KV that has not landed (vLLM allocates an
    asynchronous load with ``delay_cache_blocks`` and caches the blocks only once the load reports,
    in ``_update_waiting_for_remote_kv``, scheduler.py:1436-1449, 3467-3505). Policy, not safety: a design that
    keys the blocks early and makes a request that hits them wait for the load is correct; what
    every design owes is KVC-010, nobody computes over them.""",
    (C.KV_TRANSFERS, C.PREFIX_CACHE),
    about=STEP, when=loads_in_flight,
)
def loading_blocks_unkeyed(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap in _snapshots(rec):
        keys = snap.gpu_block_keys
        if keys is None:
            continue
        for rid, t in _transfers(snap).items():
            if t.kind == "load" and t.load_async:
                keyed = [b for b in t.blocks if b < len(keys) and keys[b] is not None]
                if keyed:
                    yield f"{label}: {rid}'s load in flight writes blocks {keyed}, already cached under a key"


@invariant(
    "KVC-010", "safety",
    """No request is scheduled in a step while its table holds a block that another request's
    asynchronous load, in flight when the step begins, is still writing.""",
    """It would compute over KV that has not landed. KVC-001 says so of the loading request itself;
    this rule says it of everyone else, whatever the prefix cache does: a design may make a loading
    block findable early (KVC-003, vLLM's policy, is not to) only if a request that hits it waits
    for the load, as vLLM's own loader waits (scheduler.py:3519-3530).""",
    (C.KV_TRANSFERS, C.BLOCK_TABLES),
    about=SCHEDULE, when=loads_at_start,
)
def nobody_computes_over_a_load(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    writer = {block: rid for rid, t in _transfers(rec.before).items() if t.kind == "load" and t.load_async
              for block in t.blocks}
    tables = (rec.mid if rec.mid is not None else rec.after).seqs or {}
    for item in rec.output.scheduled:
        view = tables.get(item.seq_id)
        blocks = (view.blocks or ()) if view is not None else ()
        over = sorted(b for b in blocks if b in writer and writer[b] != item.request_id)
        if over:
            yield (f"{item.request_id} is scheduled with block(s) {over} in its table while {writer[over[0]]}'s "
                   "KV load still writes them")


@invariant(
    "KVC-011", "safety",
    """No chunk attends to a position of a block that a failed load left invalid before some chunk
    has computed that position again: a scheduled chunk of a request whose table holds such a block
    starts at or before the block's first position not yet computed again. A block is invalid from
    the outcome that reports its load failed; the chunks of a step compute its positions again in
    order from its first, before any chunk of the step attends (each layer writes a step's KV,
    then reads it), and a later load that fills it writes it whole. A chunk of a request whose
    step the outcome voids (it holds a block whose load failed in that step) computes nothing.""",
    """The failed block holds garbage until it is computed again (KVC-005 keeps its owner from
    counting it), and a chunk computed over garbage is wrong output and wrong KV, cached for
    whoever hits it after. Two ways vLLM 0.33.0 lets another request read it: a request that hit
    the block in the step its owner loaded it keeps it as computed and only redoes that step
    (``_update_requests_with_invalid_blocks``, scheduler.py:3644-3651, 3671-3680), and under the
    ``recompute`` policy the block stays findable in the prefix cache (:3755-3760), so a request
    that arrives while the owner's recompute is partway hits it (vllm-project/vllm#49250's wrong
    output). Safety: a correct design cuts every holder back to the failed block (the sharers then
    compute the same tokens beside the owner, as COW-001 allows) and keeps the block out of the
    cache until it is computed again. Found by the hunt
    conformance/selftest/campaigns/failed_block_readers.py (docs/CONNECTORS.md section 8).""",
    (C.KV_TRANSFERS, C.BLOCK_TABLES, C.COMPUTED_TOKENS, C.MID_STEP),
    synchronous=True, planned=False,
    about=STEP, when=failed_blocks_not_recomputed,
)
def failed_block_not_read(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    invalid = ctx.flow_state.setdefault("KVC-011", {})  # block -> its leading positions computed again
    bs = ctx.config.block_size
    reported = [t for t in (rec.after.kv_reported or {}).values() if t.kind == "load"]
    for t in reported:  # a load that fills a block writes it whole (a synchronous one before the step's chunks)
        for block in t.blocks:
            if block not in t.failed:
                invalid.pop(block, None)
    if invalid:
        planned = rec.mid if rec.mid is not None else rec.before
        void = load_failed(rec)  # a step over a block whose load failed in it computes nothing (it is redone)
        chunks = []
        for item in rec.output.scheduled:
            if item.request_id in void:
                continue
            view = (planned.seqs or {}).get(item.seq_id)
            if view is not None and view.num_computed is not None and view.blocks:
                chunks.append((item.seq_id, view.blocks, view.num_computed, view.num_computed + item.num_tokens))
        for _, blocks, start, end in chunks:  # what the step's chunks compute again ...
            for index, block in enumerate(blocks):
                if block in invalid and start <= index * bs + invalid[block] < end:
                    invalid[block] = min(bs, end - index * bs)
        for block in [b for b, n in invalid.items() if n == bs]:
            del invalid[block]  # computed again whole
        for sid, blocks, start, _ in chunks:  # ... before any of them attends
            for index, block in enumerate(blocks):
                if block in invalid and index * bs + invalid[block] < min(start, (index + 1) * bs):
                    yield (f"{sid}'s chunk from position {start} attends to block {block} (table index {index}) "
                           f"from position {index * bs + invalid[block]}, which a failed load left invalid and "
                           "nothing has computed again")
    for t in reported:
        for block in t.failed:
            invalid[block] = 0


@invariant(
    "KVC-004", "policy",
    """A request whose asynchronous load is in flight holds exactly its prefix hit and its load's
    blocks: its table covers the load's tokens and ends with the load's blocks.""",
    """vLLM allocates nothing past the external tokens before the load lands: no slot for the
    first token to compute and no speculative lookahead (``limit_lookahead_tokens``,
    scheduler.py:1400-1405, the fix of vllm-project/vllm#57104, whose promoted request then
    needed its lookahead blocks under KV pressure). Policy: a design that reserves the whole
    sequence up front while loading is correct and only holds more.""",
    (C.KV_TRANSFERS, C.BLOCK_TABLES),
    about=STEP, when=loads_in_flight,
)
def loading_holds_its_load(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    bs = ctx.config.block_size
    for label, snap in _snapshots(rec):
        for rid, t in _transfers(snap).items():
            if t.kind != "load" or not t.load_async:
                continue
            for v in (snap.seqs or {}).values():
                if v.request_id != rid or v.status.is_finished:
                    continue
                table = tuple(v.blocks or ())
                need = -(-t.tokens // bs)
                if len(table) != need or table[len(table) - len(t.blocks):] != t.blocks:
                    yield (f"{label}: {v.seq_id} holds {len(table)} blocks {list(table)} while loading {t.tokens} "
                           f"tokens into {list(t.blocks)}: expected {need}, ending with the load's")


@invariant(
    "KVC-005", "safety",
    """Once a load's failure is reported, its request counts no token of a failed block as
    computed: after the step, its computed tokens end at or before its first failed block (or it
    has finished).""",
    """The failed blocks hold garbage (vLLM's ``invalid_block_ids``): counting their tokens as
    computed would sample from them. vLLM truncates ``num_computed_tokens`` at the first failed
    block (``_update_requests_with_invalid_blocks``, scheduler.py:3584-3686) and recomputes from
    there, or fails the request. Every correct design does one of the two.""",
    (C.KV_TRANSFERS, C.BLOCK_TABLES, C.COMPUTED_TOKENS),
    about=OUTCOME, when=reports_failed_load,
)
def failed_load_not_computed(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    bs = ctx.config.block_size
    for rid, t in (rec.after.kv_reported or {}).items():
        if t.kind != "load" or not t.failed:
            continue
        for v in (rec.after.seqs or {}).values():
            if v.request_id != rid or v.status.is_finished or v.num_computed is None:
                continue
            table = list(v.blocks or ())
            first = min((table.index(b) for b in t.failed if b in table), default=None)
            if first is not None and v.num_computed > first * bs:
                yield (f"{v.seq_id} counts {v.num_computed} tokens as computed after its load failed at block "
                       f"{table[first]} (table index {first}): at most {first * bs}")


@invariant(
    "KVC-006", "safety",
    """A load failure is handled as the configured ``kv_load_failure_policy`` says: under ``fail``
    its request finishes as FINISHED_ERROR in the step that reports the failure; under
    ``recompute`` it does not; and no request finishes with an error without a reported failure.""",
    """The policy is a declared setting, like a budget: a disaggregated deployment sets ``fail``
    to retry the request elsewhere, and recomputing it instead breaks that contract; a request
    failed for nothing loses its output (vLLM ``update_from_output``, scheduler.py:2557-2575).""",
    (C.KV_TRANSFERS, C.STATUSES),
    about=OUTCOME, when=fails_or_errors,
)
def failure_follows_policy(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    failed = {rid for rid, t in (rec.after.kv_reported or {}).items() if t.kind == "load" and t.failed}
    errored = {f.request_id for f in rec.finished if f.status is Status.FINISHED_ERROR}
    fails = ctx.config.kv_load_failure_policy == "fail"
    for rid in sorted(failed):
        if rid in ctx.finished:
            continue
        if fails and rid not in errored:
            yield f"{rid}'s load failed under kv_load_failure_policy fail, yet it did not finish as FINISHED_ERROR"
        if not fails and rid in errored:
            yield f"{rid}'s load failed under kv_load_failure_policy recompute, yet it finished as FINISHED_ERROR"
    for rid in sorted(errored - failed - load_failed(rec)):
        yield f"{rid} finished as FINISHED_ERROR though no load failure touching it was reported"


@invariant(
    "KVC-007", "safety",
    """A finished request whose connector transfer was reported done holds no block by the end of
    the next step: an abort during a load, and a delayed free for a send, leak nothing once the
    connector reports.""",
    """vLLM frees a finished request's blocks when ``finished_recving`` or ``finished_sending``
    names it (``_update_from_kv_xfer_finished``, scheduler.py:3556-3582); a request whose report
    is lost or ignored holds its blocks for good. One step of grace, as RES-005 gives any finish.""",
    (C.KV_TRANSFERS, C.STATUSES, C.BLOCK_TABLES),
    about=STEP, when=reported_last_step,
)
def reported_transfer_freed(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    pending = ctx.flow_state.setdefault("KVC-007", {})
    for rid in sorted(pending):
        if rid in _transfers(rec.after):
            continue
        for v in (rec.after.seqs or {}).values():
            if v.request_id == rid and v.status.is_finished and v.blocks:
                yield (f"{v.seq_id} ({v.status.value}) still holds blocks {list(v.blocks)} a step after the "
                       f"connector reported its {pending[rid]} done")
    pending.clear()
    for rid, t in (rec.after.kv_reported or {}).items():
        pending[rid] = t.kind


@invariant(
    "KVC-008", "liveness",
    """A request waiting for its KV load takes no seat and blocks nobody: in a step that admits
    nothing while a load is in flight, fewer than ``max_num_seqs`` requests run and budget is left,
    the first waiting request without a load in flight does not fit (its whole sequence needs more
    of the free blocks the step's schedule left than those the loads in flight and the running
    prefills do not still need, with speculative decoding each of them and the request one
    speculative step more).""",
    """A load can take long; a scheduler that counts loading requests against ``max_num_seqs``
    (vllm-project/vllm#53130: admission stops for good once running plus deferred requests reach
    it, with the KV cache mostly free) or stops its scan at them starves requests that fit. The
    bound counts the request's whole sequence beyond its table (a prefix hit can only lower it),
    against the blocks left once the step's running requests have theirs (with pipelined steps a
    running request's next token may open a block: its in-flight token holds the last slot).
    What a design may hold back for the prefills in flight (vLLM's reservation against load
    deadlocks) is theirs to finish, and with speculative decoding one speculative step (1 + k
    tokens) each and one for the head: vLLM 0.33.0 counts 1 + num_spec_tokens + lookahead tokens
    in every in-flight prefill's remaining blocks and adds its own step's to an async load's
    reservation (``_request_remaining_blocks``, scheduler.py:3404-3421; ``_spec_decode_step_blocks``,
    :372-380, 1421-1431).""",
    (C.KV_TRANSFERS, C.QUEUES, C.BLOCK_TABLES, C.SEQ_LENGTHS, C.FREE_COUNTS),
    about=SCHEDULE, when=loads_beside_waiting,
)
def loading_blocks_nobody(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    before = rec.before
    loads = {rid for rid, t in _transfers(before).items() if t.kind == "load" and t.load_async}
    if not loads or not before.waiting or before.gpu_free is None:
        return
    waiting = [rid for rid in before.waiting if rid not in loads]
    taken = set(admitted_or_loading(rec)) | set(rec.output.ignored)
    if not waiting or taken & set(before.waiting) or rec.output.preempted:
        return
    running = len(before.running or ())
    left = ctx.config.max_num_batched_tokens - sum(s.num_tokens for s in rec.output.scheduled)
    if running >= ctx.config.max_num_seqs or left <= 0:
        return
    head = waiting[0]
    views = [v for v in (before.seqs or {}).values() if v.request_id == head]
    if not views or views[0].num_tokens is None:
        return
    v = views[0]
    computed = v.num_computed or 0
    tokens = v.num_tokens - computed
    if not ctx.config.enable_chunked_prefill and tokens > left:
        return
    need = _remaining_blocks(ctx, v)
    # What the loads in flight and the running prefills still need may be held back for them (vLLM
    # reserves it so that loads cannot deadlock, scheduler.py:1420-1430): a design may keep it.
    prefills = [w for w in (before.seqs or {}).values()
                if not w.status.is_finished and (w.request_id in loads or (
                    w.status is Status.RUNNING and (w.num_computed or 0) < (w.num_tokens or 0)))]
    reserved = sum(_remaining_blocks(ctx, w) for w in prefills)
    k = ctx.config.num_speculative_tokens
    if k:  # and, with drafts, each one's next speculative step and the head's own (vLLM does too)
        reserved += ctx.config.blocks_for(1 + k) * (len(prefills) + 1)
    watermark = ctx.config.watermark_blocks  # a design may keep it for every admission (the spec's rule)
    free = before.gpu_free - _opened_by_schedule(rec)
    if need + reserved + watermark <= free:
        yield (f"{head} needs {need} of {free} free blocks ({reserved} reserved for prefills in flight) "
               f"with {running} of {ctx.config.max_num_seqs} "
               f"seats taken and {left} tokens of budget left, yet nothing was admitted while {sorted(loads)} load")


def _opened_by_schedule(rec: StepRecord) -> int:
    """Blocks the step's schedule added to the tables of the sequences it schedules: read mid-step,
    else after the step (where a sequence that finished in it may show none)."""
    later = rec.mid if rec.mid is not None and rec.mid.seqs is not None else rec.after
    before, after = rec.before.seqs or {}, later.seqs or {}
    opened = 0
    for item in rec.output.scheduled:
        was, now = before.get(item.seq_id), after.get(item.seq_id)
        if was is not None and now is not None and now.device == "gpu":
            opened += max(len(now.blocks or ()) - len(was.blocks or ()), 0)
    return opened


def _remaining_blocks(ctx: CheckContext, v) -> int:  # type: ignore[no-untyped-def]
    """Blocks a sequence's whole sequence needs beyond its table (a prefix hit can only lower it)."""
    return max(ctx.config.blocks_for(min(v.num_tokens or 0, ctx.config.max_model_len)) - len(v.blocks or ()), 0)


@invariant(
    "KVC-009", "liveness",
    """A request whose KV load was reported done makes progress: a step that begins with nothing
    running, no transfer in flight, no block held back for an in-flight step and a request whose
    load landed waiting admits, ignores or finishes some request, or starts a load.""",
    """A landed load is KV the request holds and nobody else can use, and with nothing running and
    nothing in flight no later step frees anything: a scheduler that serves nobody then never
    will (vllm-project/vllm#57104: the promoted request's allocation, which asked for its
    speculative lookahead only after the load, fails, and the queues stay as they are for ever).
    Blocks a pipelined engine holds back while a step in flight still writes them
    (``Snapshot.gpu_fenced``; vLLM's ``defer_block_free`` with a consumer connector,
    vllm/v1/core/sched/scheduler.py:189-195) come back when that step returns, as LIV-003 allows.""",
    (C.KV_TRANSFERS, C.QUEUES),
    about=STEP, when=idle_with_landed_load,
)
def landed_load_progresses(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    landed = ctx.flow_state.setdefault("KVC-009", {})
    before = rec.before
    if landed and not before.running and not _transfers(before) and not before.gpu_fenced:
        waiting = [rid for rid in before.waiting or () if rid in landed]
        if waiting and not (admitted_or_loading(rec) or rec.output.ignored or rec.finished):
            yield (f"engine idle with {waiting} waiting, whose loads landed (in step {landed[waiting[0]]} first), "
                   "yet nothing was admitted, ignored or finished and no load started")
    scheduled = {s.request_id for s in rec.output.scheduled}
    for rid in list(landed):
        if rid in scheduled or rid in ctx.finished:
            del landed[rid]
    for rid, t in (rec.after.kv_reported or {}).items():
        if t.kind == "load" and t.load_async and rid not in ctx.finished:
            landed[rid] = rec.step


# ---------------------------------------------------------------- what the other families read
def load_failed(rec: StepRecord) -> frozenset[str]:
    """Requests holding a block whose load the step's outcome reported failed (their step computed
    nothing: vLLM skips them in ``update_from_output``)."""
    reported = rec.after.kv_reported
    if not reported:  # no connector reported this step (every step without one): nothing to build
        return frozenset()
    failed = {b for t in reported.values() if t.kind == "load" for b in t.failed}
    if not failed:
        return frozenset()
    snap = rec.mid if rec.mid is not None else rec.after
    return frozenset(v.request_id for v in (snap.seqs or {}).values() if failed & set(v.blocks or ()))


def held_by_transfer(*snaps: Snapshot | None) -> frozenset[str]:
    """Requests with a connector transfer in flight in any of ``snaps`` (their blocks stay held)."""
    return frozenset(rid for snap in snaps for rid in _transfers(snap))


def loading(*snaps: Snapshot | None) -> frozenset[str]:
    """Requests with an asynchronous load in flight in any of ``snaps``."""
    return frozenset(rid for snap in snaps for rid, t in _transfers(snap).items() if t.kind == "load" and t.load_async)


def loaded_by_connector(rec: StepRecord) -> frozenset[str]:
    """Requests whose computed tokens at admission include a connector's: a load started in the
    step (a synchronous one counts at once), or one that landed before it (computed tokens held
    in waiting)."""
    landed = {v.request_id for v in (rec.before.seqs or {}).values()
              if v.status is Status.WAITING_FOR_REMOTE_KV and v.num_computed}
    return held_by_transfer(rec.mid) | landed


def admitted_or_loading(rec: StepRecord) -> list[str]:
    """Requests the step took out of waiting: admitted (scheduled as a prefill) or started on an
    asynchronous load."""
    before = set(rec.before.waiting or ())
    return admitted(rec) + [rid for rid in loading(rec.mid) if rid in before and rid not in loading(rec.before)]
