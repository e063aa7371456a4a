"""Prefix caching: blocks shared by content, found by a chained key, evicted in a known order.

Checked on schedulers that expose the cache (`Capability.PREFIX_CACHE`): each GPU block's key,
the cache index, and each sequence's token ids. Keys are the spec's (`spec.prefix`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from spec.invariants._evaluation import PoolAt
from spec.invariants._views import (
    admitted,
    chained_keys,
    keyed_blocks,
    shared_blocks,
    snapshots,
    tables,
    views_of,
    void_outcomes,
)
from spec.invariants.connector import loaded_by_connector
from spec.invariants.triggers import admits, gpu_pool, keyed, resets_prefix_cache, shares_blocks
from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.rules import POOL, SCHEDULE, STEP, CheckContext, invariant

_NEEDS = (C.PREFIX_CACHE, C.BLOCK_TABLES, C.SEQ_LENGTHS)


def _allowance(scheduled: dict[str, int], label: str, sid: str, num_computed: int, void: frozenset[str]) -> int:
    """Tokens whose KV is computed, or being computed in this step when looking after schedule()
    (``scheduled``: tokens scheduled per sequence in this step), or written by a step whose
    outcome committed nothing (``void``: its last known token, one past the computed tokens)."""
    written = num_computed + (1 if sid in void else 0)
    if label == "after schedule":
        return max(written, num_computed + scheduled.get(sid, 0))
    return written


@invariant(
    "PFX-001", "safety",
    """A cached block's key matches the tokens it holds: a block with a key sits in a table only
    at a full block whose KV is computed (or computed in this step; or, for a sequence whose last
    outcome committed no token, written up to its last known token, one past its computed tokens),
    and its key is the chained key of that sequence's tokens up to the block's end.""",
    """vLLM V1 keys block j by hash(key of block j-1, tokens of block j) and caches a block only
    once its tokens are computed; a key that does not match the content (a stale key on a reused
    block, a key on a partly written block) makes a later lookup return KV of other tokens, which
    the model then attends to silently. An outcome with no token (speculative decoding's empty
    outcome, vllm-project/vllm#42722) rolls the computed tokens back to the last known token but
    one, yet the step's forward pass wrote the last known token's KV (vLLM's runner empties the
    sampled tokens after the forward pass: gpu_model_runner.py:2062-2065, 3462-3505), so the
    block keyed over it when the step was scheduled (kv_cache_manager.py:616-625) holds the KV
    its key names; the recompute writes the same KV again.""",
    (*_NEEDS, C.COMPUTED_TOKENS),
    synchronous=True, about=STEP, when=keyed,
)
def key_matches_tokens(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    bs = ctx.config.block_size
    scheduled: dict[str, int] = {}
    for item in rec.output.scheduled:
        scheduled[item.seq_id] = scheduled.get(item.seq_id, 0) + item.num_tokens
    void = void_outcomes(ctx, rec)
    for label, snap in snapshots(rec):
        keys = snap.gpu_block_keys
        assert keys is not None and snap.seqs is not None
        cached = keyed_blocks(snap)
        if not cached:
            continue  # no block is cached: no key to match
        for sid, table in sorted(tables(snap, "gpu").items()):
            v = snap.seqs[sid]
            if v.token_ids is None or cached.isdisjoint(table):
                continue
            limit = _allowance(scheduled, label, sid, v.num_computed or 0,
                               void.before if label == "after schedule" else void.after)
            expected = chained_keys(snap, sid, bs)[: min(limit, len(v.token_ids)) // bs]
            for j, block in enumerate(v.blocks):
                key = keys[block] if 0 <= block < len(keys) else None
                if key is None:
                    continue
                if j >= len(expected):
                    yield f"{label}: {sid} block {j} (gpu {block}) has key {key} but is not a full computed block"
                elif key != expected[j]:
                    yield f"{label}: {sid} block {j} (gpu {block}) has key {key}, its tokens' key is {expected[j]}"


@invariant(
    "PFX-002", "safety",
    """Two sequences share a block only at the same position and only if their tokens up to the
    end of that block are equal (and that block is full in both).""",
    """Sharing is what a prefix cache is for, and it is sound only for equal prefixes: KV at a
    position depends on every token before it, so a block reused after a different prefix (a
    lookup by the block's own tokens alone, as nano-vllm's stale index entries allow) holds the
    wrong KV for its new holder.""",
    (C.PREFIX_CACHE, C.BLOCK_TABLES),
    about=STEP, when=shares_blocks,
)
def sharing_needs_equal_prefix(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    bs = ctx.config.block_size
    for label, snap in snapshots(rec):
        assert snap.seqs is not None
        shared = shared_blocks(snap, "gpu", ctx.config.num_gpu_blocks)  # None: a block outside the pool, read all
        if shared is not None and not shared:
            continue
        holders: dict[int, list[tuple[str, int, tuple[int, ...] | None]]] = {}
        for sid, table in tables(snap, "gpu").items():
            for j, block in enumerate(table):
                if shared is None or block in shared:
                    holders.setdefault(block, []).append((sid, j, snap.seqs[sid].token_ids))
        for block, held in sorted(holders.items()):
            if len(held) < 2:
                continue
            held.sort(key=lambda h: h[0])  # the same first holder whichever order the tables came in
            sid0, j0, tokens0 = held[0]
            for sid, j, tokens in held[1:]:
                end = (j0 + 1) * bs
                if j != j0:
                    yield f"{label}: gpu block {block} is block {j0} of {sid0} and block {j} of {sid}"
                elif tokens0 is not None and tokens is not None and (
                    len(tokens0) < end or len(tokens) < end or tokens0[:end] != tokens[:end]
                ):
                    yield f"{label}: {sid0} and {sid} share gpu block {block} (block {j}) without equal full prefixes"


@invariant(
    "PFX-003", "safety",
    """The cache index and the blocks' keys agree: a lookup of a key finds only blocks that carry
    that key now, and every block with a key is findable under it; an evicted block is not
    findable.""",
    """vLLM V1 evicts a cached block when it hands it out as a fresh block (_maybe_evict_cached_block
    pops it from cached_block_hash_to_block and resets its hash). An index entry left behind
    returns a block now holding other tokens; a key without an index entry leaks cache capacity.""",
    (C.PREFIX_CACHE,),
    about=POOL, when=gpu_pool,
)
def index_matches_keys(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    label, snap = pool.where, pool.snap
    keys, index = snap.gpu_block_keys, snap.cache_index
    assert keys is not None and index is not None
    for key, blocks in index.items():
        if not blocks:
            yield f"{label}: key {key} is in the index with no block"
        for dupe in [b for b, n in Counter(blocks).items() if n > 1]:
            yield f"{label}: key {key} lists gpu block {dupe} twice"
        for block in blocks:
            if not 0 <= block < len(keys):
                yield f"{label}: key {key} finds gpu block {block}, outside the pool"
            elif keys[block] != key:
                yield f"{label}: a lookup of {key} finds gpu block {block}, whose key is {keys[block]}"
    for block in sorted(keyed_blocks(snap)):
        key = keys[block]
        if block not in index.get(key, ()):
            yield f"{label}: gpu block {block} has key {key} but a lookup cannot find it"


def _cached_free(snap: Snapshot) -> list[int]:
    assert snap.gpu_block_keys is not None and snap.gpu_ref_counts is not None
    refs = snap.gpu_ref_counts
    return [b for b in sorted(keyed_blocks(snap)) if b < len(refs) and refs[b] == 0]


@invariant(
    "PFX-004", "safety",
    """Cached-free blocks (a key, no holder) are counted exactly once: each is on the free list,
    once, and the reported free count is the free list's length.""",
    """vLLM V1 keeps cached blocks that nobody holds in the free queue (they stay findable until
    evicted) and counts them as free; counting them apart as well (free and cached, or free twice)
    makes admission promise blocks that do not exist, counting them as used starves it.""",
    (C.PREFIX_CACHE, C.REF_COUNTS, C.FREE_LISTS, C.FREE_COUNTS),
    about=POOL, when=gpu_pool,
)
def cached_free_counted_once(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    label, snap = pool.where, pool.snap
    assert snap.gpu_free_ids is not None and snap.gpu_free is not None
    if snap.gpu_free != len(snap.gpu_free_ids):
        yield f"{label}: {snap.gpu_free} GPU blocks reported free, the free list holds {len(snap.gpu_free_ids)}"
    cached_free = _cached_free(snap)
    counts = Counter(snap.gpu_free_ids) if cached_free else {}
    for block in cached_free:
        if counts[block] != 1:
            yield f"{label}: cached-free gpu block {block} is on the free list {counts[block]} times"


@invariant(
    "PFX-005", "policy",
    """A cache hit never covers a whole sequence: after schedule(), a request admitted in this step
    has fewer computed tokens than tokens, and its cached part ends on a block boundary.""",
    """vLLM V1 caps a hit at num_tokens - 1 (find_longest_cache_hit with max_cache_hit_length):
    the last token must be computed to get the logits that sample the next one. A full hit
    (nano-vllm) schedules nothing for the request, and it never produces a token. Policy, not
    safety: an engine that also caches the last position's logits may serve a full hit without
    computing anything, and one that shares prefixes at token granularity (a radix tree over
    slots) ends a hit anywhere; a full hit that stalls a request is what liveness (LIV-*)
    catches for every engine.""",
    (C.PREFIX_CACHE, C.MID_STEP, C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.QUEUES),
    about=SCHEDULE, when=admits,
)
def hit_leaves_a_token(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.mid is not None and rec.mid.seqs is not None
    loaded = loaded_by_connector(rec)  # external tokens a KV connector supplied are no cache hit
    for rid in admitted(rec):
        if rid in loaded:
            continue
        for v in views_of(rec.mid, rid):
            if rid in ctx.sessions and v.seq_id in (rec.before.seqs or {}) and rec.before.seqs[v.seq_id].blocks:
                continue  # a streaming session's KV kept in waiting is no cache hit
            if v.status.is_finished or v.num_computed is None or v.num_tokens is None:
                continue
            if v.num_computed >= v.num_tokens:
                yield f"{v.seq_id} admitted with all {v.num_tokens} tokens served by the cache"
            elif v.num_computed % ctx.config.block_size:
                yield f"{v.seq_id} admitted with a cache hit of {v.num_computed} tokens, not whole blocks"


@invariant(
    "PFX-006", "safety",
    """After an engine's reset_prefix_cache answers true, no GPU block keeps a key and the cache
    index is empty (so no later request hits a prompt cached before the reset).""",
    """The reset is the admin call RLHF flows make after a weight update (vLLM V1's
    Scheduler.reset_prefix_cache, v1/core/block_pool.py: BlockPool.reset_prefix_cache), so that no
    KV computed with the old weights is reused: a reset that answers true but keeps a key serves
    stale KV while the caller believes it gone. When a reset may succeed is the engine's choice
    (PFX-007): a design that un-keys blocks still in use and answers true is correct, since a block
    without a key can be hit by no one.""",
    (C.PREFIX_CACHE, C.REF_COUNTS),
    about=STEP, when=resets_prefix_cache,
)
def reset_empties_cache(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    snap = rec.before  # taken after the step's admin calls; a reset moves no reference count
    for op, answer in rec.admin:
        if op == "reset_prefix_cache" and answer:
            keyed = sorted(keyed_blocks(snap))
            if keyed:
                yield f"after a reset that answered true, gpu blocks {keyed[:8]} still carry keys"
            if snap.cache_index:
                yield f"after a reset that answered true, the cache index still holds {len(snap.cache_index)} keys"


@invariant(
    "PFX-007", "policy",
    """reset_prefix_cache answers true exactly when no GPU block is held (vLLM V1's rule).""",
    """vLLM refuses a reset while any block is in use (v1/core/block_pool.py:
    BlockPool.reset_prefix_cache: a running request still reads its cached blocks, and dropping
    their hashes under it would break the hash map's bookkeeping) and performs it on an idle cache.
    Policy, not safety: an engine may as well un-key in-use blocks and succeed (PFX-006 is what
    every correct reset guarantees); but an engine that refuses an idle cache leaves the old
    weights' KV in place for a caller who has no other way to drop it.""",
    (C.PREFIX_CACHE, C.REF_COUNTS),
    about=STEP, when=resets_prefix_cache,
)
def reset_when_idle(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    snap = rec.before
    for op, answer in rec.admin:
        if op != "reset_prefix_cache":
            continue
        assert snap.gpu_ref_counts is not None
        held = [b for b, n in enumerate(snap.gpu_ref_counts) if n]
        if answer and held:
            yield f"reset_prefix_cache answered true while gpu blocks {held[:8]} are held"
        elif not answer and not held:
            yield "reset_prefix_cache refused although no gpu block is held"
