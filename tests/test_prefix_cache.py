"""The prefix-cache block pool: keys, hits, eviction order (vLLM V1's and nano-vllm's)."""

from __future__ import annotations

from reference_impl.prefix_cache import CachingBlockPool
from spec.prefix import block_key, block_keys


def test_keys_are_chained_over_the_prefix():
    a = block_keys([1, 2, 3, 4], 2)
    b = block_keys([9, 9, 3, 4], 2)
    assert len(a) == 2 and a[0] != b[0]
    assert a[1] != b[1], "equal block tokens after different prefixes must not share a key"
    assert a[1] == block_key(a[0], [3, 4])
    assert block_keys([1, 2, 3], 2) == a[:1], "a partly filled block has no key"


def test_v1_free_order_unkeyed_to_front_keyed_to_back():
    pool = CachingBlockPool(5, caching=True, order="v1")
    table = pool.allocate(3)
    assert table == [0, 1, 2] and pool.free_ids() == (3, 4)
    pool.register(0, "k0")
    pool.register(1, "k1")
    pool.release(reversed(table))  # a request frees its table tail first
    # block 2 (no key) is reused first; cached blocks go to the back, tail (1) before head (0)
    assert pool.free_ids() == (2, 3, 4, 1, 0)
    assert pool.num_free == 5 and pool.lookup("k0") == 0, "a cached-free block stays findable"


def test_v1_eviction_forgets_the_key():
    pool = CachingBlockPool(2, caching=True, order="v1")
    [a, b] = pool.allocate(2)
    pool.register(a, "ka")
    pool.release([b, a])
    assert pool.free_ids() == (b, a)
    fresh = pool.allocate(2)  # b first, then a: a is evicted
    assert fresh == [b, a]
    assert pool.keys[a] is None and pool.lookup("ka") is None and pool.cache_index() == {}


def test_hit_on_a_cached_free_block_takes_it_off_the_free_queue():
    pool = CachingBlockPool(3, caching=True, order="v1")
    [a] = pool.allocate(1)
    pool.register(a, "ka")
    pool.release([a])
    assert a in pool.free_ids()
    pool.touch(pool.lookup("ka"))
    assert a not in pool.free_ids() and pool.ref_counts[a] == 1
    pool.touch(a)
    assert pool.ref_counts[a] == 2


def test_caching_off_frees_everything_to_the_front():
    pool = CachingBlockPool(4, caching=False, order="v1")
    table = pool.allocate(2)
    pool.register(table[0], "k")  # ignored with caching off
    pool.release(reversed(table))
    assert pool.free_ids() == (1, 0, 2, 3) and pool.cache_index() == {}


def test_nano_free_order_is_fifo():
    pool = CachingBlockPool(4, caching=True, order="nano")
    table = pool.allocate(2)
    pool.register(table[0], "k")
    pool.release(reversed(table))
    assert pool.free_ids() == (2, 3, 1, 0)


def test_duplicate_keys_lookup_order():
    # V1 keeps every holder and finds the first; nano-vllm's hash_to_block_id keeps one block per
    # key (the last registered), so the older holder is no longer findable and loses its key.
    for order, index, want in (("v1", (0, 1), 0), ("nano", (1,), 1)):
        pool = CachingBlockPool(2, caching=True, order=order)
        pool.allocate(2)
        pool.register(0, "k")
        pool.register(1, "k")
        assert pool.cache_index() == {"k": index} and pool.lookup("k") == want


def test_nano_misses_once_the_last_holder_of_a_key_is_evicted():
    # nano-vllm (block_manager.py: BlockManager.allocate) looks up hash_to_block_id[h], which names the
    # last block registered under h; once that block is handed out fresh, h misses, although an
    # older block registered under h still holds its tokens (lockstep: docs/traces/lockstep-nano).
    pool = CachingBlockPool(3, caching=True, order="nano")
    pool.allocate(2)
    pool.register(0, "k")
    pool.register(1, "k")
    pool.release([1])
    assert pool.allocate(2) == [2, 1]  # block 1 is evicted
    assert pool.lookup("k") is None and pool.keys[0] is None
