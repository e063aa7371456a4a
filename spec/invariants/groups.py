"""Hybrid KV cache groups (spec/kv_groups.py, docs/HYBRID.md): what every group's table must hold.

Group 0's table is ``SeqView.blocks`` and every older invariant reads it as before; BLK-003
counts the entries of every group (``Snapshot.group_tables``) in the one pool. This family
states the rest, each for groups 1 .. n-1 (group 0 is held by BLK, CAP and PFX already):

- safety: a table names only live blocks of the pool (HYB-001); a block holds one group's KV of
  one content (HYB-002); a step reads and writes only real blocks (HYB-003); a prefix hit is
  served by every group, and with an EAGLE drafter leaves its last matched block to be
  recomputed (HYB-006); a cached state is the state after exactly its key's tokens (HYB-007).
- policy (vLLM 0.33.0's): a windowed group frees every block behind its window when it allocates
  (HYB-004; a design that frees late is correct, only wasteful); a state group holds exactly the
  state blocks its mode keeps (HYB-005; a design that keeps more checkpoints is correct).
- liveness: block alignment never starves a prefill (HYB-008).

Every predicate is vacuous for a config without groups besides the full one, and needs the
``kv_groups`` observation, so a one-group engine is not checked by it (not_applicable, never pass).
HYB-003..008 state what one synchronous step reads, writes and frees, from the computed tokens
before it; with outcomes in flight (``pipeline_depth`` > 0) vLLM frees on the processed tokens
while it allocates past the in-flight ones, so they are stated for synchronous steps only.
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import admitted, snapshots
from spec.kv_groups import NULL_BLOCK, KVGroup, cdiv, first_live_block, group_key, hit_positions, live_positions
from spec.observation import Capability as C
from spec.observation import SeqView, Snapshot, StepRecord
from spec.prefix import block_keys
from spec.rules import STEP, CheckContext, invariant
from spec.status import Status


def hybrid(ctx: CheckContext, rec: StepRecord) -> bool:
    """the config has KV cache groups beside group 0"""
    return len(ctx.config.kv_groups) > 1


def hybrid_schedules(ctx: CheckContext, rec: StepRecord) -> bool:
    """the config has KV cache groups beside group 0 and the step schedules a request"""
    return len(ctx.config.kv_groups) > 1 and bool(rec.output.scheduled)


def _extra_tables(ctx: CheckContext, snap: Snapshot, sid: str) -> Iterator[tuple[int, KVGroup, tuple[int, ...]]]:
    """(group index, group, table) for groups 1 .. n-1 of one sequence (empty tables included)."""
    tables = (snap.group_tables or {}).get(sid, ())
    for g, group in enumerate(ctx.config.kv_groups[1:], start=1):
        yield g, group, tables[g - 1] if g - 1 < len(tables) else ()


def _slots_observed(ctx: CheckContext, group: KVGroup) -> bool:
    """Whether a snapshot shows which positions of ``group`` a step reads and writes: always, but
    for a Mamba "align" group with drafts (k > 0). There vLLM keeps k speculative state blocks, the
    worker writes the states after the step's tokens into the 1 + k slots from the running one,
    reads the state of the last accepted draft from the previous step's slot (v1/worker/
    mamba_utils.py:1489-1530) and copies a state that verification carried past a block boundary
    into that boundary's position after the step (:444-487): which slot holds the state after C
    tokens depends on the previous steps' accepted drafts, which no snapshot carries. HYB-003, 005
    and 007 state the layout without drafts; HYB-006 (the hit's state) holds with them."""
    return not (group.kind == "mamba" and group.mode == "align" and ctx.config.num_speculative_tokens)


def _scheduled(ctx: CheckContext, rec: StepRecord) -> Iterator[tuple[SeqView, int, int]]:
    """(view after schedule(), computed C, end E) for each scheduled sequence: the step computes
    tokens C .. E-1 (a prefix hit is in C already)."""
    if not ctx.config.is_hybrid or rec.mid is None or rec.mid.seqs is None:
        return
    for item in rec.output.scheduled:
        view = rec.mid.seqs.get(item.seq_id)
        if view is not None and view.num_computed is not None:
            yield view, view.num_computed, view.num_computed + item.num_tokens


@invariant(
    "HYB-001", "safety",
    """Every real entry of every KV cache group's table names a block of the GPU pool that is not
    free, and a waiting sequence holds a block in no group.""",
    """The groups share one pool (vLLM's KVCacheCoordinator hands every group blocks from one
    BlockPool), so a block freed by one group's eviction while another group's table, or another
    request's, still names it is handed out again under a live reader: the other group's KV is
    overwritten. BLK-005 says it for group 0; this says it for the others, and BLK-003 counts the
    entries of all of them in each block's reference count.""",
    (C.KV_GROUPS, C.FREE_LISTS, C.STATUSES),
    about=STEP, when=hybrid,
)
def group_blocks_live(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if not ctx.config.is_hybrid:
        return
    size = ctx.config.num_gpu_blocks
    for label, snap in snapshots(rec):
        if not snap.group_tables:
            continue
        free = set(snap.gpu_free_ids or ())
        for sid, tables in snap.group_tables.items():
            view = (snap.seqs or {}).get(sid)
            for g, table in enumerate(tables, start=1):
                real = [b for b in table if b != NULL_BLOCK]
                outside = [b for b in real if not 0 <= b < size]
                if outside:
                    yield f"{label}: {sid} group {g} names blocks {outside} outside the pool of {size}"
                freed = sorted(set(real) & free)
                if freed:
                    yield f"{label}: {sid} group {g} names free blocks {freed}"
                if real and view is not None and view.status is Status.WAITING:
                    yield f"{label}: waiting {sid} holds blocks {real} in group {g}"


@invariant(
    "HYB-002", "safety",
    """A block holds one group's KV of one content: no block is named by the tables of two groups
    or twice by one table, and a block with a prefix-cache key at position p of group g's table
    carries group g's key of the sequence's tokens up to the end of block p.""",
    """Groups are different layers: a block of one pool handed to two groups at once holds the KV
    of two layers in one page, and whichever writes last corrupts the other (vLLM keys cached
    blocks by hash and group id, BlockHashWithGroupId, so that a lookup in one group never finds
    another's). A key that is not the content's serves KV of other tokens to every later hit.""",
    (C.KV_GROUPS, C.BLOCK_TABLES, C.PREFIX_CACHE),
    about=STEP, when=hybrid,
)
def one_group_one_content(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if not ctx.config.is_hybrid:
        return
    block_size = ctx.config.block_size
    for label, snap in snapshots(rec):
        if not snap.group_tables or snap.seqs is None:
            continue
        owner: dict[int, tuple[int, str]] = {}
        for sid, view in snap.seqs.items():
            for b in view.blocks or ():
                owner.setdefault(b, (0, sid))
        keys = snap.gpu_block_keys or ()
        for sid, tables in snap.group_tables.items():
            view = snap.seqs.get(sid)
            content = block_keys(list(view.token_ids), block_size) if view is not None and view.token_ids else []
            for g, table in enumerate(tables, start=1):
                real = [b for b in table if b != NULL_BLOCK]
                if len(set(real)) != len(real):
                    yield f"{label}: {sid} group {g} names a block twice: {table}"
                for p, b in enumerate(table):
                    if b == NULL_BLOCK:
                        continue
                    other = owner.setdefault(b, (g, sid))
                    if other[0] != g:
                        yield f"{label}: block {b} is in group {other[0]} of {other[1]} and group {g} of {sid}"
                    key = keys[b] if 0 <= b < len(keys) else None
                    if key is not None and (p >= len(content) or key != group_key(g, content[p])):
                        yield f"{label}: {sid} group {g} position {p} holds block {b} keyed {key!r}, not its content's"


@invariant(
    "HYB-003", "safety",
    """After schedule(), each scheduled sequence holds in every group a real block at each position
    the step reads or writes: its window of the first new token onwards (sliding window), its local
    chunk (chunked local), the state it reads and the state it writes (Mamba).""",
    """Attention reads the KV of every position in the window of each new token and writes the new
    tokens' KV; a Mamba layer reads the state after the computed tokens and writes the state after
    the step. A null block there reads zeros (vLLM's null block) or another request's KV: the
    model computes garbage and nothing raises. Full attention's coverage is CAP-005. A Mamba
    "align" group with drafts is not checked: its slots depend on earlier steps' accepted drafts
    (vLLM's worker, v1/worker/mamba_utils.py:1489-1530), which a snapshot does not show.""",
    (C.KV_GROUPS, C.MID_STEP, C.COMPUTED_TOKENS),
    synchronous=True, planned=False,
    about=STEP, when=hybrid_schedules,
)
def step_blocks_real(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    block_size = ctx.config.block_size
    for view, computed, end in _scheduled(ctx, rec):
        for g, group, table in _extra_tables(ctx, rec.mid, view.seq_id):  # type: ignore[arg-type]
            if not _slots_observed(ctx, group):
                continue
            missing = sorted(p for p in live_positions(group, computed, end, block_size)
                             if p >= len(table) or table[p] == NULL_BLOCK)
            if missing:
                yield (f"{view.seq_id} computes tokens {computed}..{end - 1} but group {g} ({group.kind}) has no "
                       f"block at positions {missing}: {table}")


@invariant(
    "HYB-004", "policy",
    """After schedule(), a scheduled sequence's sliding-window or chunked-local table holds the null
    block exactly at the positions before the first one its first new token reads, and a real block
    at every position from there to the end of the step.""",
    """vLLM 0.33.0 frees out-of-window blocks when it allocates a step's slots
    (KVCacheManager.allocate_slots calls remove_skipped_blocks first, v1/core/kv_cache_manager.py:
    564; SlidingWindowManager.get_num_skipped_tokens), so a windowed layer holds about a window of
    blocks however long the sequence. Policy, not safety: a design that frees late (at the next
    outcome, or when the request finishes) serves the same KV and only holds more blocks (HYB-003
    is the safety half).""",
    (C.KV_GROUPS, C.MID_STEP, C.COMPUTED_TOKENS),
    synchronous=True, planned=False,
    about=STEP, when=hybrid_schedules,
)
def window_frees_behind(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    block_size = ctx.config.block_size
    for view, computed, end in _scheduled(ctx, rec):
        for g, group, table in _extra_tables(ctx, rec.mid, view.seq_id):  # type: ignore[arg-type]
            if group.kind not in ("sliding_window", "chunked_local"):
                continue
            first = first_live_block(group, computed, block_size)
            nulls = [p for p, b in enumerate(table) if b == NULL_BLOCK]
            if nulls != list(range(min(first, len(table)))) or len(table) < cdiv(end, block_size):
                yield (f"{view.seq_id} at {computed} computed: group {g} ({group.kind} {group.window}) should be null "
                       f"exactly below position {first} and real up to {cdiv(end, block_size) - 1}, is {table}")


def _state_positions(group: KVGroup, computed: int, end: int, block_size: int) -> frozenset[int]:
    return live_positions(group, computed, end, block_size)


@invariant(
    "HYB-005", "policy",
    """After schedule(), a scheduled sequence's Mamba table holds real blocks exactly where its mode
    keeps states: one block (none); the state it reads and the state it writes, nothing else
    (align); every position up to the end of the step (all).""",
    """A Mamba layer's state is one fixed-size tensor per request, not KV per token: vLLM keeps one
    (mamba_cache_mode "none": 1 + num_speculative_blocks, MambaSpec.max_memory_usage_bytes) or, in
    "align", frees the state it copied from once the next one is written
    (MambaManager.remove_skipped_blocks, v1/core/single_type_kv_cache_manager.py:1629-1657). Policy:
    a design that keeps more checkpoints for prefix hits is correct, only larger; one that keeps
    fewer than it reads breaks HYB-003. With drafts an "align" group also keeps k speculative
    state blocks (MambaSpec.num_speculative_blocks, :1736-1795) in slots that depend on earlier
    steps' accepted drafts, so it is not checked there (HYB-003's rationale).""",
    (C.KV_GROUPS, C.MID_STEP, C.COMPUTED_TOKENS),
    synchronous=True, planned=False,
    about=STEP, when=hybrid_schedules,
)
def state_blocks_by_mode(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    block_size = ctx.config.block_size
    for view, computed, end in _scheduled(ctx, rec):
        for g, group, table in _extra_tables(ctx, rec.mid, view.seq_id):  # type: ignore[arg-type]
            if group.kind != "mamba" or not _slots_observed(ctx, group):
                continue
            real = frozenset(p for p, b in enumerate(table) if b != NULL_BLOCK)
            want = _state_positions(group, computed, end, block_size)
            if group.mode == "all":
                want = frozenset(range(min(real, default=0), cdiv(end, block_size)))
            if real != want:
                yield (f"{view.seq_id} computes {computed}..{end - 1}: Mamba group {g} ({group.mode}) holds states at "
                       f"{sorted(real)}, its mode keeps {sorted(want)}: {table}")


@invariant(
    "HYB-006", "safety",
    """A prefix hit is served by every group: after schedule(), a request admitted with h computed
    tokens holds, in every group, blocks cached under that group's key of its own tokens at each
    position the group reads to go on from h (its window, its chunk, the state after exactly h);
    and with an EAGLE drafter (drop_eagle_block) the block after the hit was cached too, so that
    the matched block the drafter needs is recomputed, not served.""",
    """A hit skips computing h tokens in every layer at once, so each group must hold what its
    layers read after them; a group that cannot serve h (the window's blocks evicted, no state
    checkpoint at h) gets garbage in place of the KV (vLLM's HybridKVCacheCoordinator steps the
    length down until every group accepts it, v1/core/kv_cache_coordinator.py:806-930). EAGLE/MTP
    drafters read the hidden states of the last matched block and their draft layers' KV there
    depends on the tokens after it, which no block hash covers (SingleTypeKVCacheManager.
    find_longest_cache_hit), so the last matched block must be recomputed: a Mamba finder that
    ignores drop_eagle_block grew the hybrid hit past it and served corrupt output
    (vllm-project/vllm#50630, #53912, #43650).""",
    (C.KV_GROUPS, C.MID_STEP, C.COMPUTED_TOKENS, C.PREFIX_CACHE),
    synchronous=True, planned=False,
    about=STEP, when=hybrid_schedules,
)
def hit_served_by_every_group(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    if not ctx.config.is_hybrid or rec.mid is None or rec.mid.seqs is None:
        return
    block_size = ctx.config.block_size
    keys = rec.mid.gpu_block_keys or ()
    for rid in admitted(rec):
        for view in (v for v in rec.mid.seqs.values() if v.request_id == rid):
            hit = view.num_computed or 0
            if not hit or not view.token_ids:
                continue
            content = block_keys(list(view.token_ids), block_size)
            for g, group, table in _extra_tables(ctx, rec.mid, view.seq_id):
                for p in sorted(hit_positions(group, hit, block_size)):
                    b = table[p] if p < len(table) else NULL_BLOCK
                    key = keys[b] if 0 <= b < len(keys) else None
                    if b == NULL_BLOCK or key != group_key(g, content[p]):
                        yield (f"{rid} was admitted with a hit of {hit} tokens, but group {g} ({group.kind}) holds "
                               f"block {b} keyed {key!r} at position {p}, not its cached KV there")
            if ctx.config.drop_eagle_block:
                after = hit // block_size
                cached = [rec.before.cache_index or {}, rec.mid.cache_index or {}]
                if after >= len(content) or not any(content[after] in index for index in cached):
                    yield (f"{rid} was admitted with a hit of {hit} tokens under drop_eagle_block, but its block "
                           f"{after} was not cached: the hit serves the last matched block instead of recomputing it")


@invariant(
    "HYB-007", "safety",
    """A cached Mamba state is the state after exactly its key's tokens: after schedule(), a keyed
    state block that a scheduled sequence reads at position q while writing elsewhere holds the
    state after its computed tokens, so they are (q + 1) * block_size; one it writes at position w
    holds the state after the step's end, so that is (w + 1) * block_size.""",
    """A state block's key says "the state after these tokens", but a Mamba layer writes the state
    after the chunk's last token into the block of that token. A chunk that ends inside a block,
    or starts inside one and runs past it, leaves a state that is not at the boundary its key
    names, and every later hit on that key resumes from the wrong state (vLLM aligns prefill chunks
    to block boundaries for this, Scheduler._mamba_block_aligned_split; unaligned chunks of
    resumed requests cached wrong states, vllm-project/vllm#33706; #47861 for MTP, #53912). With
    drafts an "align" group's boundary state is copied into its position after verification
    (v1/worker/mamba_utils.py:444-487), after schedule() has keyed it, so it is not checked there
    (HYB-003's rationale).""",
    (C.KV_GROUPS, C.MID_STEP, C.COMPUTED_TOKENS, C.PREFIX_CACHE),
    synchronous=True, planned=False,
    about=STEP, when=hybrid_schedules,
)
def state_at_its_boundary(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    block_size = ctx.config.block_size
    keys = rec.mid.gpu_block_keys or () if rec.mid is not None else ()
    for view, computed, end in _scheduled(ctx, rec):
        for g, group, table in _extra_tables(ctx, rec.mid, view.seq_id):  # type: ignore[arg-type]
            if group.kind != "mamba" or group.mode == "none" or not _slots_observed(ctx, group):
                continue
            write = cdiv(end, block_size) - 1
            read = cdiv(computed, block_size) - 1
            for p, at in ((read, computed), (write, end)):
                if p < 0 or p >= len(table) or (p == read and p == write and at == computed):
                    continue
                b = table[p]
                keyed = b != NULL_BLOCK and 0 <= b < len(keys) and keys[b] is not None
                if keyed and at != (p + 1) * block_size:
                    yield (f"{view.seq_id} computes {computed}..{end - 1}: Mamba group {g} block {b} at position {p} "
                           f"is keyed for the state after {(p + 1) * block_size} tokens but holds the one after {at}")


@invariant(
    "HYB-008", "liveness",
    """With a Mamba "align" group, block alignment never starves a prefill: in a step that preempts
    nothing, a running sequence mid-prefill that is not scheduled had less budget left than one
    block's tokens (or than its remaining tokens).""",
    """Aligning a prefill chunk to block boundaries rounds it down; when something caps the chunk
    below a block on every step (a multimodal item's encoder budget in vllm-project/vllm#40707,
    fixed in #51603 and reported to reproduce after it; a long-prefill threshold below the block
    size), the rounding gives 0 tokens every step, and the request holds its blocks and never runs
    again. vLLM's guard applies the rounding only when a whole block fits a chunk, and a chunk
    starting inside a block stops at its end instead.""",
    (C.KV_GROUPS, C.MID_STEP, C.COMPUTED_TOKENS, C.QUEUES),
    synchronous=True, planned=False,
    about=STEP, when=hybrid_schedules,
)
def alignment_keeps_prefills_going(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    config = ctx.config
    if not any(g.kind == "mamba" and g.mode == "align" for g in config.kv_groups) or rec.output.preempted:
        return
    if rec.mid is None or rec.mid.seqs is None or rec.before.seqs is None:
        return
    left = config.max_num_batched_tokens - rec.output.num_batched_tokens
    scheduled = {item.seq_id for item in rec.output.scheduled}
    for rid in rec.before.running or ():
        for view in (v for v in rec.before.seqs.values() if v.request_id == rid):
            if view.seq_id in scheduled or view.status is not Status.RUNNING or view.num_computed is None:
                continue
            remaining = (view.num_tokens or 0) - view.num_computed
            mid = rec.mid.seqs.get(view.seq_id)
            if remaining > 1 and mid is not None and mid.status is Status.RUNNING \
                    and left >= min(config.block_size, remaining):
                yield (f"{view.seq_id} is mid-prefill ({view.num_computed} of {view.num_tokens} computed) and was given "
                       f"nothing with {left} tokens of budget left")
