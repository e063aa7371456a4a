"""Blocks: conservation, reference counts, free lists, capacity and copy-on-write."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from spec.invariants._evaluation import PoolAt, SeqAt, ref_counts_match
from spec.invariants._views import entries, entry_counts, free_in_tables, freed_by_their_last_step, pool_facts, tables
from spec.invariants.triggers import (
    copies,
    cpu_pool_in_use,
    gpu_pool,
    holds_blocks,
    pool_in_use,
    running_or_swapped,
    schedules,
    unfinished,
)
from spec.kv_groups import real_entries
from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.rules import AFTER_STEP, POOL, SCHEDULE, SEQUENCE, CheckContext, invariant
from spec.status import Status

_SEED_34 = "Seed 000 §3.4 counts free and allocated blocks of one 10-block pool"


def _conservation(pool: PoolAt) -> Iterator[str]:
    label, device, refs, free, total = pool.where, pool.device, pool.refs, pool.free, pool.size
    if device == "cpu" and not refs and not free:
        return  # no CPU pool at all (empty or None): a scheduler that never swaps has no swap space
    assert refs is not None and free is not None
    if len(refs) != total:
        yield f"{label}: {device} pool reports {len(refs)} blocks, config has {total}"
        return
    facts = pool_facts(pool.snap, device)
    if facts.negative:
        negative = [b for b, r in enumerate(refs) if r < 0]
        yield f"{label}: {device} blocks {negative[:5]} have negative reference counts"
    in_use = sum(1 for r in refs if r > 0) if facts.negative else len(refs) - facts.unreferenced
    if in_use + free != total:
        yield f"{label}: {device} free {free} + in use {in_use} = {free + in_use}, expected {total}"


@invariant(
    "BLK-001", "safety",
    "GPU block conservation: free blocks plus blocks in use equal the GPU pool size, nothing counted twice.",
    f"""{_SEED_34}; a block that is both free and in use (double free) or neither (leak) makes the
    scheduler's admission arithmetic wrong from then on (vLLM's NaiveBlockAllocator keeps a free
    list and reference counts that must agree).""",
    (C.REF_COUNTS, C.FREE_COUNTS),
    about=POOL, when=gpu_pool,
)
def gpu_conservation(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    yield from _conservation(pool)


@invariant(
    "BLK-002", "safety",
    """CPU block conservation: free swap blocks plus swap blocks in use equal the CPU pool size
    (or the scheduler has no CPU pool and reports an empty one).""",
    """The swap space is a second pool with the same bookkeeping (vLLM's CPU allocator); a leak
    there turns into the 'lack of CPU swap space' failure long before the space is really full.
    A scheduler without swap space (it preempts by recompute only, as vLLM V1 and nano-vllm do)
    keeps no such pool, whatever num_cpu_blocks says; it is held to an empty one (no CPU table,
    BLK-004).""",
    (C.REF_COUNTS, C.FREE_COUNTS),
    about=POOL, when=cpu_pool_in_use,
)
def cpu_conservation(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    yield from _conservation(pool)


def _ref_counts(ctx: CheckContext, pool: PoolAt) -> Iterator[str]:
    label, device, snap, refs = pool.where, pool.device, pool.snap, pool.refs
    if refs is None and device == "cpu":
        refs = ()  # no CPU pool: any CPU table points outside it
    assert refs is not None
    expected = entry_counts(snap, device, len(refs))
    fenced = gpu_holds(ctx, snap) if device == "gpu" else None  # holds without a table count too
    grouped = real_entries(snap.group_tables) if device == "gpu" else ()  # KV cache groups 1.. (spec/kv_groups.py)
    holds = (*(fenced or ()), *grouped)
    if holds and expected is not None:
        expected = _with_holds(expected, holds)
    # a group's table changes beside the views the evaluation layer tracks: with groups, compare whole
    if expected is not None and (refs == expected if grouped else ref_counts_match(pool, refs, expected)):
        return  # explained block by block below if not
    counted = entries(snap, device) + Counter(holds)
    for block, ref in enumerate(refs):
        if ref != counted.get(block, 0):
            yield f"{label}: {device} block {block} has ref count {ref} but {counted.get(block, 0)} table entries"
    for block in counted:
        if not 0 <= block < len(refs):
            yield f"{label}: a table points at {device} block {block}, outside the pool"


def gpu_holds(ctx: CheckContext, snap: Snapshot) -> tuple[int, ...] | None:
    """The GPU holds without a block table: a pipelined engine's for in-flight writes
    (`Snapshot.gpu_fenced`), and a radix cache's own (`Snapshot.gpu_cache_holds`) where the
    adapter's domain says its cache holds references (`Capability.CACHE_HOLDS_REFS`)."""
    cached = snap.gpu_cache_holds if C.CACHE_HOLDS_REFS in ctx.claims else None
    if not cached:
        return snap.gpu_fenced
    return (*(snap.gpu_fenced or ()), *cached)


def _with_holds(counts: tuple[int, ...], fenced: tuple[int, ...]) -> tuple[int, ...]:
    held = list(counts)
    for block in fenced:
        if 0 <= block < len(held):
            held[block] += 1
    return tuple(held)


@invariant(
    "BLK-003", "safety",
    """GPU reference counts equal the number of block-table entries that point at each block, in the
    tables of every KV cache group (``Snapshot.group_tables``), plus the holds a pipelined engine
    keeps for in-flight writes (``Snapshot.gpu_fenced``) and those of a prefix cache that holds
    references (``Snapshot.gpu_cache_holds``).""",
    """Parallel sampling forks sequences that share the prompt's blocks (vLLM's
    BlockSpaceManager.fork); freeing a sequence drops one reference per entry. A count above
    the holders leaks the block; below them frees it under a live sequence (the double free of
    vLLM PR #3347). An engine that defers a freed request's blocks until the steps still writing
    them return (vLLM's defer_block_free, PIP-004) holds them without a table, and so does a radix
    cache that keeps a reference on each cached block (SGLang's RadixCache; an adapter outside
    the SGLang flow says so with ``ConfigDomain(cache_holds_refs=True)``).""",
    (C.REF_COUNTS, C.BLOCK_TABLES),
    about=POOL, when=gpu_pool,
)
def gpu_ref_counts(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    yield from _ref_counts(ctx, pool)


@invariant(
    "BLK-004", "safety",
    "CPU reference counts equal the number of block-table entries that point at each swap block.",
    """Swapping a forked group must keep its sharing: each distinct GPU block gets one CPU block
    and the count follows the entries (vLLM's swap maps are per block, not per entry).""",
    (C.REF_COUNTS, C.BLOCK_TABLES),
    about=POOL, when=cpu_pool_in_use,
)
def cpu_ref_counts(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    yield from _ref_counts(ctx, pool)


@invariant(
    "BLK-005", "safety",
    """Free lists are sound: each free block is listed once, is a valid id, and no block table
    points at a free block.""",
    """Seed 000 §3.1: the scheduler must know exactly each block's state (free, allocated, being
    released). A free block that a table still names is a use-after-free: the next admission
    overwrites a live sequence's KV.""",
    (C.FREE_LISTS, C.BLOCK_TABLES),
    about=POOL, when=pool_in_use,
)
def free_lists_sound(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    label, device, snap, total = pool.where, pool.device, pool.snap, pool.size
    free_ids = pool.free_ids
    if free_ids is None and device == "cpu":
        free_ids = ()  # no CPU pool
    assert free_ids is not None
    counts = entry_counts(snap, device, total)
    facts = pool_facts(snap, device)
    if facts.repeated:
        dupes = [b for b, n in Counter(free_ids).items() if n > 1]
        yield f"{label}: {device} free list holds blocks {dupes[:5]} more than once"
    ids_valid = not free_ids or not facts.outside(total)
    if not ids_valid:
        bad = [b for b in free_ids if not 0 <= b < total]
        yield f"{label}: {device} free list holds invalid ids {bad[:5]}"
    if counts is not None and ids_valid:
        held = free_in_tables(snap, device, total)
        if held:
            yield f"{label}: {device} blocks {sorted(held)[:5]} are free yet still in a block table"
        return
    free, used = facts.free(), entries(snap, device)
    if not free.isdisjoint(used):
        both = sorted(free.intersection(used))
        yield f"{label}: {device} blocks {both[:5]} are free yet still in a block table"


@invariant(
    "BLK-006", "safety",
    "No sequence's block table names the same physical block twice.",
    """A block holds one span of block_size consecutive tokens of one logical position (seed 000
    §3.2: the block table maps logical blocks to physical blocks); naming it twice means two
    logical blocks overwrite each other's KV.""",
    (C.BLOCK_TABLES,),
    reads=("blocks",), about=SEQUENCE, when=holds_blocks,
)
def no_repeated_block(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    blocks = seq.view.blocks
    if len(set(blocks)) != len(blocks):
        yield f"{seq.where}: {seq.id} table {list(blocks)} repeats a block"


@invariant(
    "CAP-001", "policy",
    """Between steps, a running or swapped sequence's table has exactly the blocks its computed
    tokens need: ceil(computed / block_size) (with speculative decoding, up to those of its
    tokens plus num_speculative_tokens: rejected drafts keep their slots).""",
    """vLLM allocates a prompt's blocks at admission and one more block only when a decode needs
    a new slot (append_slots); more blocks is a leak that starves admission, fewer means the
    KV of a computed token has nowhere to live. Policy, not safety: *exactly* is vLLM V0's
    timing. A scheduler that takes the next token's block when the token is sampled, or the
    whole prompt + max_tokens at admission, holds more and is correct; safety keeps the range
    (CAP-004: at least; CAP-006: at most what it declares).""",
    (C.BLOCK_TABLES, C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.STATUSES),
    synchronous=True, about=SEQUENCE, when=running_or_swapped, at=(AFTER_STEP,),
)
def capacity_between_steps(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v, bs = seq.view, ctx.config.block_size
    need = -(-(v.num_computed or 0) // bs)
    have = len(v.blocks or ())
    k = ctx.config.num_speculative_tokens  # vLLM frees no block when drafts are rejected
    if have != need and not (k and need <= have <= -(-((v.num_tokens or 0) + k) // bs)):
        yield f"{seq.id} ({v.status.value}) holds {have} blocks for {v.num_computed} computed tokens, needs {need}"


@invariant(
    "CAP-002", "policy",
    """After schedule(), each scheduled sequence's table covers exactly its computed tokens plus
    the tokens scheduled now.""",
    """The model writes the KV of every scheduled token into the slot its table names
    (seed 000 §3.3 step 4 collects each sequence's block_table); a missing block is an
    out-of-bounds write, an extra one a leak. Policy, not safety: *exactly* (one free block
    appended right before the decode that needs it) is vLLM V0's append_slots; a scheduler that
    reserved earlier holds more. Safety keeps the missing-block half (CAP-005) and bounds the
    extra (CAP-006).""",
    (C.MID_STEP, C.BLOCK_TABLES, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    synchronous=True, about=SCHEDULE, when=schedules,
)
def capacity_for_scheduled(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for item, v, need in scheduled_tables(ctx, rec):
        if v is None:
            yield f"{item.seq_id} is scheduled but unknown after schedule()"
        elif len(v.blocks or ()) != need or v.device != "gpu":
            yield (f"{item.seq_id} scheduled for {item.num_tokens} token(s) after {v.num_computed} computed "
                   f"holds {len(v.blocks or ())} {v.device} block(s), needs {need} on gpu")


def scheduled_tables(ctx: CheckContext, rec: StepRecord) -> Iterator[tuple[Any, Any, int]]:
    """Each scheduled sequence, its view after schedule() (None if unknown), and the blocks its
    computed plus scheduled tokens fill (CAP-002 wants exactly these, CAP-005 at least)."""
    assert rec.mid is not None and rec.mid.seqs is not None
    bs = ctx.config.block_size
    for item in rec.output.scheduled:
        v = rec.mid.seqs.get(item.seq_id)
        yield item, v, (-(-((v.num_computed or 0) + item.num_tokens) // bs) if v is not None else 0)


@invariant(
    "CAP-003", "safety",
    """Between steps, a running or swapped sequence has computed at most every token but the one
    just sampled, and a waiting sequence has computed none, unless it is a streaming session's (its
    KV kept between inputs, spec/session.py).""",
    """The token sampled in a step has no KV yet: the next decode computes it, so a computed
    count that reaches the token count claims KV that was never written. Recompute drops all KV
    (vLLM's reset_state_for_recompute); a stale computed count after preemption (nano-vllm
    PR #207) makes the next prefill skip tokens. Relaxed from "exactly all but one" (what vLLM V0
    and V1 show between steps without chunked prefill): a lag of more than one is a scheduler
    that computes later (chunked prefill, a pipelined step), not a safety problem; BUD-004 and
    CHK-004 say how much each step computes.""",
    (C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.STATUSES),
    synchronous=True, about=SEQUENCE, when=unfinished, at=(AFTER_STEP,),
)
def computed_lag(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v = seq.view
    if v.status in (Status.RUNNING, Status.SWAPPED):
        if (v.num_computed or 0) > (v.num_tokens or 0) - 1:
            yield f"{seq.id} ({v.status.value}) has {v.num_tokens} tokens but {v.num_computed} computed"
    elif v.status is Status.WAITING and v.num_computed != 0 and v.request_id not in ctx.sessions:
        yield f"{seq.id} is waiting with {v.num_computed} computed tokens (recompute must reset it)"


@invariant(
    "CAP-004", "safety",
    """Between steps, a running or swapped sequence's table covers its computed tokens: at least
    ceil(computed / block_size) blocks.""",
    """The KV of every computed token lives in the block its table names; a table shorter than
    that has lost KV the next decode attends to (or will write past its end). Engine-neutral half
    of CAP-001: whatever a scheduler reserves early, it never holds less than this.""",
    (C.BLOCK_TABLES, C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.STATUSES),
    about=SEQUENCE, when=running_or_swapped, at=(AFTER_STEP,),
)
def covers_computed(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v = seq.view
    need = -(-(v.num_computed or 0) // ctx.config.block_size)
    if len(v.blocks or ()) < need:
        yield f"{seq.id} ({v.status.value}) holds {len(v.blocks or ())} blocks for {v.num_computed} computed tokens, needs {need}"


@invariant(
    "CAP-005", "safety",
    """After schedule(), each scheduled sequence's table is on the GPU and covers its computed
    tokens plus the tokens scheduled now; except that where the scheduler claims
    ``ordered_steps``, a sequence whose last token this step samples may hold none (its blocks
    freed early, none of them in another sequence's table yet).""",
    """The model writes the KV of every scheduled token into the slot its table names
    (seed 000 §3.3 step 4 collects each sequence's block_table); a missing block is an
    out-of-bounds write. Engine-neutral half of CAP-002: a scheduler may have taken the blocks
    at any earlier time, but they are there when the model runs. The exception (RES-001 says
    why): tokasaurus frees a finishing sequence's blocks in schedule(), after it has built the
    step's tables; the blocks are reused only by a later step, which runs after this one.""",
    (C.MID_STEP, C.BLOCK_TABLES, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=SCHEDULE, when=schedules,
)
def covers_scheduled(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    excused = freed_by_their_last_step(ctx, rec)
    for item, v, need in scheduled_tables(ctx, rec):
        if v is not None and not v.blocks and item.seq_id in excused:
            continue
        if v is None:
            yield f"{item.seq_id} is scheduled but unknown after schedule()"
        elif len(v.blocks or ()) < need or v.device != "gpu":
            yield (f"{item.seq_id} scheduled for {item.num_tokens} token(s) after {v.num_computed} computed "
                   f"holds {len(v.blocks or ())} {v.device} block(s), needs {need} on gpu")


@invariant(
    "CAP-006", "safety",
    """A running or swapped sequence's table holds at most the blocks of its tokens plus what the
    scheduler declares it reserves (adapter.reservation: lookahead slots, or its request's
    prompt + max_tokens), after schedule() and after the step.""",
    """Blocks a sequence holds beyond any use are a leak that starves admission (a spare block
    per decode fills the pool in a few steps). The bound is engine-neutral because the scheduler
    states its own reservation (spec.reservation), so reserving early is allowed and declared,
    and anything past the declaration is found.""",
    (C.BLOCK_TABLES, C.SEQ_LENGTHS, C.STATUSES),
    reads=("blocks", "num_tokens", "request_id", "status"), about=SEQUENCE, when=running_or_swapped,
)
def holds_no_more_than_declared(ctx: CheckContext, rec: StepRecord, seq: SeqAt) -> Iterator[str]:
    v, bs, reservation = seq.view, ctx.config.block_size, ctx.reservation
    if not v.blocks:
        return
    most = -(-reservation.max_tokens_held(v.num_tokens or 0, ctx.requests.get(v.request_id)) // bs)
    if len(v.blocks) > most:
        yield (f"{seq.where}: {seq.id} ({v.status.value}) holds {len(v.blocks)} blocks for {v.num_tokens} tokens, "
               f"at most {most} with {reservation}")


def _same_prefix_holders(rec: StepRecord, block: int, index: int, bs: int) -> bool:
    """Whether every holder of ``block`` holds it at ``index`` after the same tokens (known only
    with the prefix-cache capability): then any of them writes the same KV. nano-vllm keys a
    block by its content, and a later block with that content takes the key over (its index
    holds one block per key), so a block shared after a hit in this step may be written unkeyed."""
    if rec.mid is None or rec.mid.gpu_block_keys is None:
        return False
    end = (index + 1) * bs
    prefixes = set()
    for sid, table in tables(rec.mid, "gpu").items():
        if block in table:
            view = rec.mid.seqs[sid]
            if table.index(block) != index or view.token_ids is None or len(view.token_ids) < end:
                return False
            prefixes.add(view.token_ids[:end])
    return len(prefixes) == 1


def _written_blocks(num_computed: int, num_tokens: int, bs: int) -> range:
    return range(num_computed // bs, (num_computed + num_tokens - 1) // bs + 1)


@invariant(
    "COW-001", "safety",
    """No block whose reference count is above one is written in place: every block a scheduled
    token writes is held once (with a prefix cache: or by holders whose tokens up to it are equal,
    who all need the same KV).""",
    """Forked sequences share the prompt's last, partly filled block; the first to decode must
    copy it (copy-on-write, vLLM's CopyOnWriteTracker) or its token overwrites its siblings' KV.""",
    (C.MID_STEP, C.BLOCK_TABLES, C.REF_COUNTS, C.SEQ_LENGTHS, C.COMPUTED_TOKENS),
    about=SCHEDULE, when=schedules,
)
def copy_on_write(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    mid = rec.mid
    assert mid is not None and mid.seqs is not None and mid.gpu_ref_counts is not None
    bs, seqs, refs = ctx.config.block_size, mid.seqs, mid.gpu_ref_counts
    keys = mid.gpu_block_keys  # prefix caching: a keyed block's content is fixed by its key (PFX-001)
    for item in rec.output.scheduled:
        v = seqs.get(item.seq_id)
        if v is None or not v.blocks:
            continue
        for index in _written_blocks(v.num_computed or 0, item.num_tokens, bs):
            if index < len(v.blocks):
                block = v.blocks[index]
                if keys is not None and keys[block] is not None:
                    continue  # cached in this step by its writer and found by another: same KV either way
                if refs[block] > 1 and not _same_prefix_holders(rec, block, index, bs):
                    yield f"{item.seq_id} writes logical block {index} = gpu block {block}, shared ({refs[block]} refs)"


@invariant(
    "COW-002", "safety",
    """Each copy-on-write (src, dst) copies a block that was in use into a different block that
    afterwards belongs to exactly one scheduled sequence.""",
    """A copy map entry is an instruction to the cache engine (vLLM's blocks_to_copy); a copy
    into a shared or foreign block corrupts another sequence, a copy from a free block copies
    garbage.""",
    (C.MID_STEP, C.BLOCK_TABLES),
    about=SCHEDULE, when=copies,
)
def copy_targets(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None
    if not rec.output.copies:
        return
    before_used = set(entries(rec.before, "gpu")) | {gpu for _, gpu in rec.output.swap_in}
    mid_tables = tables(rec.mid, "gpu")
    scheduled = {s.seq_id for s in rec.output.scheduled}
    for src, dst in rec.output.copies:
        if src == dst:
            yield f"copy {src}->{dst} copies a block onto itself"
        if src not in before_used:
            yield f"copy {src}->{dst}: source block {src} was neither in use before the step nor swapped in"
        holders = sorted(sid for sid, t in mid_tables.items() for b in t if b == dst)
        if len(holders) != 1 or holders[0] not in scheduled:
            yield f"copy {src}->{dst}: destination is held by {holders or 'nobody'}, expected one scheduled sequence"
