"""A prefix cache that holds its own reference on every block it caches (a radix cache, as
SGLang's): a cached block nobody's table names has reference count 1 and is not free; eviction
drops the cache's reference when the pool needs the block.

The V1 reference seen that way: each keyed block gets one reference more, a cached block with no
other holder leaves the free list, and ``Snapshot.gpu_cache_holds`` lists the holds. Its domain
says ``cache_holds_refs=True``, so BLK-003 counts the cache as a holder outside the SGLang flow.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reference_impl.v1_scheduler import CAPABILITIES, V1Scheduler
from spec.domain import ConfigDomain
from spec.observation import Snapshot
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, chunked_prefill=True, prefix_caching=True,
                      uncached=False, budget_covers_model_len=True, cache_holds_model_len=True, cache_holds_refs=True)


class RadixHolds(V1Scheduler):
    lists_shared_holds = True

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        keys = snap.gpu_block_keys or ()
        cached = [b for b, key in enumerate(keys) if key is not None]
        refs = list(snap.gpu_ref_counts or ())
        for b in cached:
            refs[b] += 1
        free = tuple(b for b in (snap.gpu_free_ids or ()) if keys[b] is None)
        holds = tuple(b for b in cached if self.lists_shared_holds or refs[b] == 1)
        return replace(snap, gpu_ref_counts=tuple(refs), gpu_free_ids=free, gpu_free=len(free), gpu_cache_holds=holds,
                       base=None, changed_seqs=None, changed_requests=None, gpu_block_changes=None,
                       cpu_block_changes=None, kept_tokens=None)


class ForgetsSharedHolds(RadixHolds):
    lists_shared_holds = False  # bug: a cached block a table also names gets the cache's reference unlisted


def traces() -> Any:
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-cache-holds", RadixHolds, capabilities=CAPABILITIES, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-cache-holds-broken", ForgetsSharedHolds, capabilities=CAPABILITIES, domain=DOMAIN)
