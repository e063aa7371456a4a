"""The block tables of KV cache groups 1 .. n-1 over the scheduler's one pool (spec/kv_groups.py).

Group 0 (full attention) is the scheduler's own ``TrackedRequest.blocks``; this module keeps the
other groups' tables, one list per group per request, each position a block id or `NULL_BLOCK`.
Each method is one of vLLM 0.33.0's per-group steps (vllm/v1/core/single_type_kv_cache_manager.py),
called by `reference_impl.hybrid_scheduler` in the order `KVCacheManager.allocate_slots` calls
them (v1/core/kv_cache_manager.py:548-626):

1. `remove_skipped`: free the blocks no later token reads (outside a sliding window, before a
   local chunk, a Mamba state already copied forward) and put the null block in their place
   (`remove_skipped_blocks`, `_remove_blocks_in_range`: backwards, each group's freed blocks
   handed back in one call).
2. `blocks_needed`: how many free blocks the step takes in each group
   (`get_num_blocks_to_allocate`; a windowed group counts only positions it has not reached; a
   Mamba "align" group takes one fresh state block at most, 1 + k on its first allocation with k
   drafts; a Mamba hit cached in this very step cannot be used yet: MambaManager returns
   ``num_gpu_blocks + 1``).
3. `add_hits`: a waiting request takes the prefix hit's blocks of every group (`touch`).
4. `allocate`: the fresh blocks, positions past the table (`allocate_new_blocks`; "align" pads the
   positions it skips with the null block and takes one block for the state it writes; with k
   drafts it keeps k speculative state blocks after it and moves a speculative block the table
   has passed to its end, `_allocate_states`).
5. `cache`: key the full blocks up to the tokens computed or being computed now, per group
   (`cache_blocks`; null positions are skipped).

`free` releases a request's tables group by group, each tail first (`KVCacheCoordinator.free`).
Speculative state blocks: with k = ``num_speculative_tokens`` drafts a Mamba "align" group keeps
k blocks past its running state for the drafts' states (vLLM ``MambaSpec.num_speculative_blocks``
= k, model_executor/layers/mamba/abstract.py:84-90; ReplaySSM, which keeps none, refuses "align",
config/vllm.py:3507-3512), and counts its state blocks on the main model's tokens, without EAGLE's
lookahead slots (single_type_kv_cache_manager.py:1731-1745, 1809-1821). A "none" group keeps one
state block with drafts too: the ReplaySSM layout (abstract.py:86-90; without ReplaySSM vLLM keeps
1 + k, :1713-1720, not modelled).

Where this differs from vLLM 0.33.0: no partial (sub-block) hits, no checkpoint blocks, no KV
connector.
"""

from __future__ import annotations

from reference_impl.prefix_cache import CachingBlockPool
from spec.config import SchedulerConfig
from spec.kv_groups import NULL_BLOCK, KVGroup, cdiv, first_live_block, group_key, hit_positions
from spec.prefix import block_keys


class GroupTables:
    def __init__(self, config: SchedulerConfig, pool: CachingBlockPool) -> None:
        self.config = config
        self.pool = pool
        self.groups: tuple[KVGroup, ...] = config.kv_groups
        self.tables: dict[str, list[list[int]]] = {}  # request id -> a table per group 1 .. n-1
        self.num_keyed: dict[str, list[int]] = {}  # request id -> leading positions keyed, per group
        self.keyed_this_step: set[str] = set()  # Mamba keys registered in this step (MambaManager)
        # a Mamba "align" group's speculative state blocks (MambaSpec.num_speculative_blocks)
        self.num_speculative_blocks = config.num_speculative_tokens
        self.allocated: set[str] = set()  # allocated since admission (MambaManager._allocated_block_reqs)

    @property
    def extra(self) -> list[tuple[int, KVGroup]]:
        return [(g, group) for g, group in enumerate(self.groups) if g > 0]

    def of(self, request_id: str) -> list[list[int]]:
        return self.tables.setdefault(request_id, [[] for _ in self.groups[1:]])

    def holds(self, request_id: str) -> bool:
        return request_id in self.tables

    def new_step(self) -> None:
        self.keyed_this_step.clear()

    # -- prefix hits ------------------------------------------------------------------------
    def hit_tables(self, tokens: list[int], hit: int) -> list[list[int]] | None:
        """Each group's table for a prefix hit of ``hit`` tokens (nulls where the group reads
        nothing, cached blocks where it does), or None if some group cannot serve it."""
        block_size = self.config.block_size
        keys = block_keys(tokens, block_size, limit=hit + (block_size if self.config.drop_eagle_block else 0))
        out = []
        for g, group in self.extra:
            table = [NULL_BLOCK] * (hit // block_size) if group.has_table else []
            if group.has_table:
                needed = set(hit_positions(group, hit, block_size))
                if self.config.drop_eagle_block and group.kind == "sliding_window" and hit:
                    needed.add(hit // block_size)  # SWA matches one block more, then drops it
                for p in sorted(needed):
                    block = self.pool.lookup(group_key(g, keys[p])) if p < len(keys) else None
                    if block is None:
                        return None
                    if p < len(table):
                        table[p] = block
            out.append(table)
        return out

    # -- one allocation, in allocate_slots' order -------------------------------------------
    def remove_skipped(self, request_id: str, computed: int) -> None:
        if request_id not in self.tables:
            return
        block_size = self.config.block_size
        for (_, group), table in zip(self.extra, self.tables[request_id], strict=False):
            if group.kind in ("sliding_window", "chunked_local"):
                upto = min(first_live_block(group, computed, block_size), len(table))
                stop_at_null = True
            elif group.kind == "mamba" and group.mode == "align":
                upto = min(max(computed - 1, 0) // block_size, len(table))
                stop_at_null = False  # prefill leaves null gaps between states
            else:
                continue
            freed = []
            for p in range(upto - 1, -1, -1):
                if table[p] == NULL_BLOCK:
                    if stop_at_null:
                        break
                    continue
                freed.append(table[p])
                table[p] = NULL_BLOCK
            if freed:
                self.pool.release(freed)

    def blocks_needed(self, request_id: str, num_tokens: int, computed: int, hits: list[list[int]] | None,
                      *, whole: bool = False, main: int | None = None) -> int:
        """Free blocks the groups take to give the request slots up to ``num_tokens`` tokens, from
        ``computed`` (hits included); ``whole``: vLLM's whole-sequence admission check, where a
        windowed group counts at most its per-request cap (`admission_cap`); ``main``: the tokens
        without EAGLE's lookahead slots (vLLM ``num_tokens_main_model``; default ``num_tokens``), on
        which a Mamba "align" group counts its states."""
        block_size = self.config.block_size
        main = num_tokens if main is None else main
        running = request_id in self.tables
        tables = self.tables.get(request_id) or [[] for _ in self.groups[1:]]
        hits = hits or [[] for _ in self.groups[1:]]
        total = 0
        for (_, group), table, hit in zip(self.extra, tables, hits, strict=False):
            if not group.has_table:
                continue
            evictable = [b for b in hit if b != NULL_BLOCK and self.pool.is_evictable(b)]
            if group.kind == "mamba":
                if hit and self._keyed_now(hit):
                    return self.config.num_gpu_blocks + 1  # not this step (MambaManager)
                if group.mode == "none":
                    total += 0 if table else 1
                    continue
                if group.mode == "align":  # single_type_kv_cache_manager.py:1736-1795
                    k = self.num_speculative_blocks
                    fresh = cdiv(main, block_size) + k - len(hit) - len(table)
                    total += min(fresh, 1 + (0 if request_id in self.allocated else k)) if fresh > 0 else 0
                    total += len(evictable)
                    continue
            required = cdiv(num_tokens, block_size)
            if whole:
                required = min(required, self.admission_cap(group))
            if running:
                total += max(required - len(table), 0)
                continue
            skipped = first_live_block(group, computed, block_size)
            total += max(required - max(skipped, len(hit) + len(table)), 0) + len(evictable)
        return total

    def admission_cap(self, group: KVGroup) -> int:
        """vLLM's per-request cap of a windowed group (``max_admission_blocks_per_request``,
        v1/kv_cache_interface.py:864-945): its window plus the tokens in flight."""
        config, block_size = self.config, self.config.block_size
        in_flight = config.max_num_batched_tokens * (config.pipeline_depth + 1)
        if group.kind == "sliding_window":
            return cdiv(min(group.window - 1 + in_flight, config.max_model_len), block_size) + 1
        if group.kind == "chunked_local":
            return cdiv(min(group.window + in_flight, config.max_model_len), block_size)
        return cdiv(config.max_model_len, block_size)

    def add_hits(self, request_id: str, hits: list[list[int]] | None) -> None:
        tables = self.of(request_id)
        keyed = self.num_keyed.setdefault(request_id, [0] * len(tables))
        for i, hit in enumerate(hits or ()):
            for block in hit:
                if block != NULL_BLOCK:
                    self.pool.touch(block)
            tables[i].extend(hit)
            keyed[i] = len(hit)

    def allocate(self, request_id: str, num_tokens: int, main: int | None = None) -> None:
        """Each group's fresh blocks for slots up to ``num_tokens`` (``main``: the main model's
        tokens, as in `blocks_needed`)."""
        block_size = self.config.block_size
        main = num_tokens if main is None else main
        allocated = request_id in self.allocated
        self.allocated.add(request_id)
        tables = self.of(request_id)
        self.num_keyed.setdefault(request_id, [0] * len(tables))
        for (_, group), table in zip(self.extra, tables, strict=False):
            if not group.has_table:
                continue
            required = cdiv(num_tokens, block_size)
            if group.kind == "mamba" and group.mode == "none":
                if not table:
                    table.extend(self.pool.allocate(1))
            elif group.kind == "mamba" and group.mode == "align":
                self._allocate_states(table, cdiv(main, block_size), allocated)
            elif required > len(table):
                table.extend(self.pool.allocate(required - len(table)))

    def _allocate_states(self, table: list[int], blocks: int, allocated: bool) -> None:
        """A Mamba "align" table's allocation for ``blocks`` blocks of tokens (vLLM
        ``MambaManager.allocate_new_blocks``, single_type_kv_cache_manager.py:1797-1923, without
        partial hits or checkpoint blocks): the running state sits at position ``blocks - 1`` with
        k speculative blocks after it; the positions skipped since the last allocation hold the
        null block, and a speculative block they pass over moves to the table's end
        (``_relocate_speculative_block``, :1925-1934), so the table grows by one fresh block a step
        at most once ``allocated`` (by 1 + k on a request's first allocation)."""
        k = self.num_speculative_blocks
        required = blocks + k
        if required <= len(table):
            return
        previous, skipped = len(table), required - k - 1
        if previous < skipped:
            table.extend([NULL_BLOCK] * (skipped - previous))
        if allocated:
            for p in range(previous - k, previous):
                if p >= skipped:
                    break
                table.append(table[p])
                table[p] = NULL_BLOCK
        fresh = max(required - len(table), 0)
        assert fresh <= 1 + (0 if allocated else k), f"{fresh} fresh state blocks for {table}"
        table.extend(self.pool.allocate(fresh))

    def cache(self, request_id: str, tokens: list[int], upto: int) -> None:
        if not self.config.enable_prefix_caching or request_id not in self.tables:
            return
        keys = block_keys(tokens, self.config.block_size, limit=upto)
        keyed = self.num_keyed[request_id]
        for i, ((g, group), table) in enumerate(zip(self.extra, self.tables[request_id], strict=False)):
            if not group.has_table or (group.kind == "mamba" and group.mode == "none"):
                continue
            for p in range(keyed[i], min(len(keys), len(table))):
                if table[p] != NULL_BLOCK:
                    self.pool.register(table[p], group_key(g, keys[p]))
                    if group.kind == "mamba":
                        self.keyed_this_step.add(group_key(g, keys[p]))
            keyed[i] = max(keyed[i], len(keys))

    def free(self, request_id: str) -> None:
        tables = self.tables.pop(request_id, None)
        self.num_keyed.pop(request_id, None)
        self.allocated.discard(request_id)
        for table in tables or ():
            real = [b for b in table if b != NULL_BLOCK]
            if real:
                self.pool.release(reversed(real))

    # -- observation ------------------------------------------------------------------------
    def observed(self, seq_of: dict[str, str]) -> dict[str, tuple[tuple[int, ...], ...]]:
        """Seq id -> the tables of groups 1 .. n-1 (`Snapshot.group_tables`)."""
        return {seq_of[rid]: tuple(tuple(t) for t in tables) for rid, tables in self.tables.items()
                if any(tables)}

    def _keyed_now(self, hit: list[int]) -> bool:
        last = next((b for b in reversed(hit) if b != NULL_BLOCK), None)
        return last is not None and self.pool.keys[last] in self.keyed_this_step
