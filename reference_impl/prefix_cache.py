"""A GPU block pool with a prefix cache: reference counts, content keys, an index, a free queue.

Blocks are shared by content. A *full* block that a request has computed (or is computing this
step) is registered in the index under its chained key (`spec.prefix.block_keys`); a later
request whose prompt starts with the same tokens finds it, holds it (its reference count goes
up) and skips computing those tokens. When the last holder lets go, a cached block is free but
keeps its key and stays findable: a hit on it takes it back off the free queue. It loses its key
(it is *evicted*) only when the allocator hands it out as a fresh block; from then on no lookup
finds it.

The free queue's order is the eviction order, and it is what makes block ids comparable with an
engine (lockstep). Two documented orders:

``"v1"`` (vLLM V1 ``BlockPool``/``FreeKVCacheBlockQueue``): allocation pops from the front. A
request frees its table in reverse (tail blocks first, so they are evicted first); of the blocks
that reach zero references, the unkeyed ones (and every block when caching is off) go to the
front, in that order, to be reused at once, and the keyed ones to the back (least recently used
first out).

``"nano"`` (nano-vllm ``BlockManager``): allocation takes the front; every freed block goes to the
back (FIFO), keyed or not; a table is freed in reverse too. Its index (``hash_to_block_id``) holds
one block per key and each registration overwrites it, so a block registered under a key before
another one is not findable any more: here it loses its key (its KV stays valid for its holders);
when the newest holder is evicted, nano-vllm misses on that key even though an older block still
holds those tokens (found in lockstep, conformance/selftest/campaigns/lockstep_nano.py).

Block ids are 0..N-1. (vLLM V1 reserves its block 0 as a null block and so has one block more than
it can hand out; an adapter passes ``num_gpu_blocks + 1`` and subtracts 1 from its ids.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from reference_impl.pool_log import ChangeLog, LoggedCounts, LoggedFreeQueue, changed_blocks

ORDERS = ("v1", "nano")


class CachingBlockPool:
    def __init__(self, num_blocks: int, *, caching: bool, order: str = "v1") -> None:
        assert order in ORDERS, order
        self.num_blocks = num_blocks
        self.caching = caching
        self.order = order
        self._log = ChangeLog()  # observation only: which blocks changed since the last snapshot
        self.ref_counts = LoggedCounts(num_blocks, self._log)
        self.keys: list[str | None] = [None] * num_blocks
        self.index: dict[str, list[int]] = {}  # key -> blocks registered under it, oldest first
        self._free: deque[int] = LoggedFreeQueue(range(num_blocks), self._log)
        # Observation: counters of changes to the counts / free queue and to the keys / index, so
        # that a snapshot reuses the tuples it built last time when nothing changed (`observed`).
        self.block_changes = 0
        self.key_changes = 0
        self._observed: dict[str, tuple[int, object]] = {}

    # -- observation ------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_ids(self) -> tuple[int, ...]:
        """The free queue, front (next to be handed out) first."""
        return tuple(self._free)

    def changed_blocks(self) -> dict[int, int] | None:
        """For a delta snapshot: each block whose reference count or free-queue entries changed
        since the last call, with how many times the queue names it now (None: unknown)."""
        return changed_blocks(self.ref_counts, self._free, self._log)

    def cache_index(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v) for k, v in self.index.items()}

    def observed(self, part: str) -> object:
        """``part`` ("ref_counts", "free_ids", "keys" or "cache_index") as a fresh immutable
        value, or the very object returned last time when its counter shows no change since:
        building the tuples of a large pool is a snapshot's main fixed cost."""
        changes = self.key_changes if part in ("keys", "cache_index") else self.block_changes
        known = self._observed.get(part)
        if known is not None and known[0] == changes:
            return known[1]
        # ``[:]`` is a plain list: tuple() copies it at once, where it iterates the logged subclass (7x slower).
        value = {"ref_counts": lambda: tuple(self.ref_counts[:]), "free_ids": self.free_ids,
                 "keys": lambda: tuple(self.keys), "cache_index": self.cache_index}[part]()
        self._observed[part] = (changes, value)
        return value

    # -- lookup -------------------------------------------------------------------------------
    def lookup(self, key: str) -> int | None:
        """A block cached under ``key``: vLLM V1 returns the first registered; nano-vllm keeps only
        the last (`register`)."""
        blocks = self.index.get(key)
        if not blocks:
            return None
        return blocks[0] if self.order == "v1" else blocks[-1]

    def is_evictable(self, block: int) -> bool:
        """A cached block nobody holds: a hit on it costs a free block."""
        return self.ref_counts[block] == 0

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, count: int) -> list[int]:
        """``count`` fresh blocks from the front of the free queue; each is evicted first."""
        assert count <= len(self._free), "caller checked the free count"
        fresh = []
        self.block_changes += 1
        self.key_changes += self.caching  # each block is evicted (loses its key) first
        for _ in range(count):
            block = self._free.popleft()
            self._evict(block)
            self.ref_counts[block] = 1
            fresh.append(block)
        return fresh

    def touch(self, block: int) -> None:
        """Hold a cached block found by a lookup (take it off the free queue if nobody held it)."""
        self.block_changes += 1
        if self.ref_counts[block] == 0:
            self._free.remove(block)
        self.ref_counts[block] += 1

    def register(self, block: int, key: str) -> None:
        """Cache ``block`` (full, computed or being computed now) under ``key``."""
        if not self.caching or self.keys[block] == key:
            return
        self.key_changes += 1  # counted here, not in _evict: a subclass may override that
        self._evict(block)
        if self.order == "nano":  # one block per key: the older holders are no longer findable
            for older in self.index.pop(key, []):
                self.keys[older] = None
        self.keys[block] = key
        self.index.setdefault(key, []).append(block)

    def forget(self, block: int) -> None:
        """Drop ``block``'s key, holders unchanged (vLLM ``BlockPool.evict_blocks``: a KV load
        failed to fill it, so nobody may find it by its key)."""
        if self.keys[block] is not None:
            self.key_changes += 1
            self._evict(block)

    def release(self, blocks: Iterable[int]) -> None:
        """Drop one reference per listed block, in the order given (callers pass a table in
        reverse); blocks that reach zero go back to the free queue as `ORDERS` describes."""
        front: list[int] = []
        back: list[int] = []
        self.block_changes += 1
        for block in blocks:
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed twice"
            if self.ref_counts[block] == 0:
                keep_cached = self.caching and self.keys[block] is not None
                (back if keep_cached or self.order == "nano" else front).append(block)
        self._free.extendleft(reversed(front))  # front keeps the given order
        self._free.extend(back)

    def reset_cache(self) -> bool:
        """Forget every key if no block is held, and say whether it did (vLLM 0.33.0
        ``BlockPool.reset_prefix_cache``, v1/core/block_pool.py:870-900: it refuses while any block
        but the null block is in use, else drops the hash map and every block's hash; the free
        queue keeps its order)."""
        if any(self.ref_counts[:]):
            return False
        if self.index:
            self.key_changes += 1
            self.index.clear()
            self.keys[:] = [None] * self.num_blocks
        return True

    def _evict(self, block: int) -> None:
        key = self.keys[block]
        if key is None:
            return
        holders = self.index[key]
        holders.remove(block)
        if not holders:
            del self.index[key]
        self.keys[block] = None
