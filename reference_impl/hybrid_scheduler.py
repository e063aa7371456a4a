"""The V1 reference with hybrid KV cache groups (spec/kv_groups.py, docs/HYBRID.md).

`KVGroupsMixin` puts groups 1 .. n-1 beside the V1 reference's own table (group 0, full
attention), all over its one pool, by overriding the hooks where V1 touches blocks. One call of
`schedule()` is V1's (`reference_impl.v1_scheduler`), with these changes:

1. A waiting request's prefix hit is the longest one *every* group can serve
   (`HybridKVCacheCoordinator.find_longest_cache_hit`, v1/core/kv_cache_coordinator.py:806-930:
   its fixed point is the longest length all groups accept, because full attention's hits are
   downward closed): full attention finds its chain; with ``drop_eagle_block`` the chain may
   reach the last token and loses its last block; then the length steps down a block at a time
   until every other group finds what it reads there (a sliding window's window, a Mamba group's
   state after exactly that many tokens).
2. Each allocation first frees what no later token reads (`GroupTables.remove_skipped`), then
   needs the blocks of every group, and takes them all or none (`KVCacheManager.allocate_slots`,
   v1/core/kv_cache_manager.py:548-626); the whole-sequence admission check counts each group
   with vLLM's per-request cap (`GroupTables.admission_cap`).
3. With a Mamba "align" group, a prefill chunk that does not reach the end of the prefill ends on
   a block boundary, at the next boundary if it starts inside a block, never runs past the last
   cacheable boundary, and stops at the shared-prefix junction of its last lookup, floored to a
   block (the prefix full attention had cached beyond the hit, so that the state there is cached
   for the next request: Marconi-style; `Scheduler._mamba_block_aligned_split`,
   v1/core/sched/scheduler.py:546-662); a running request whose chunk rounds to nothing is skipped this step, a waiting head
   stops admission (scheduler.py:891-909, 1351-1355).
4. Freeing a request frees every group's table, group 0 first (`KVCacheCoordinator.free`).

The speculative flow (``num_speculative_tokens`` = k > 0, `reference_impl.specdec_scheduler`)
composes the same way (`HybridSpecDecScheduler`; the pipelined `HybridAsyncScheduler` takes k
as the async reference does): drafts take slots in every group like any token; a rejection rolls
the computed tokens back, so skipped blocks are freed on the tokens the outcomes kept (vLLM frees
on the processed-token basis, kv_cache_manager.py:556-568, "rejected spec tokens can roll it
back"), and blocks are keyed only up to the request's committed tokens in every group
(``num_tokens_to_cache``, kv_cache_manager.py:614-625). A Mamba "align" group keeps k speculative
state blocks past its running state and counts states on the main model's tokens, without EAGLE's
lookahead slots (``MambaSpec.num_speculative_blocks``, `GroupTables._allocate_states`); mode "all"
(which vLLM 0.33.0 does not have) refuses drafts.

With no group besides the full-attention one every hook returns what V1's does, so the flow is
V1's step for step (tests/test_hybrid_reference.py replays the V1 flow's traces to prove it).
Where this differs from vLLM 0.33.0: listed in `reference_impl.kv_groups`.
"""

from __future__ import annotations

import dataclasses

from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.kv_groups import GroupTables
from reference_impl.specdec_scheduler import SpecDecScheduler
from reference_impl.v1_scheduler import CAPABILITIES, EngineWatermarkV1, TrackedRequest, V1Scheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import Capability, Snapshot
from spec.prefix import block_keys
from spec.reasons import Reason

HYBRID_CAPABILITIES = CAPABILITIES | {Capability.KV_GROUPS}


class KVGroupsMixin:
    """The hooks of a token-budget reference (`V1Scheduler` or a subclass) that KV cache groups
    change. Put it first among the bases: ``class X(KVGroupsMixin, V1Scheduler)``."""

    capabilities = HYBRID_CAPABILITIES

    def __init__(self, config: SchedulerConfig) -> None:
        if config.num_speculative_tokens and any(g.kind == "mamba" and g.mode == "all" for g in config.kv_groups):
            raise InputError("config.num_speculative_tokens", "drafts with a Mamba group in mode all are not "
                                                              "modelled (vLLM 0.33.0 has no such mode; docs/HYBRID.md)")
        super().__init__(config)  # type: ignore[call-arg]
        self.kv = GroupTables(config, self.pool)  # type: ignore[attr-defined]
        self._group_hits: dict[str, list[list[int]]] = {}  # a waiting request's hit, per group 1 ..
        self._aligns = any(g.kind == "mamba" and g.mode == "align" for g in config.kv_groups)
        # request id -> the shared-prefix junction of its last prefix lookup (vLLM's
        # Request.shared_prefix_boundary): full attention's hit, where another group's was shorter
        self._junction: dict[str, int] = {}

    # -- the step ----------------------------------------------------------------------------
    def schedule(self):  # type: ignore[no-untyped-def]
        self.kv.new_step()
        self._group_hits = {}
        return super().schedule()  # type: ignore[misc]

    # -- prefix hits -------------------------------------------------------------------------
    def _cache_hits(self, tracked: TrackedRequest) -> list[int]:
        config = self.config  # type: ignore[attr-defined]
        if not config.enable_prefix_caching:
            self._group_hits[tracked.request_id] = [[] for _ in config.kv_groups[1:]]
            return []
        limit = tracked.num_tokens if config.drop_eagle_block else tracked.num_tokens - 1
        chain = []
        for key in block_keys(tracked.tokens, config.block_size, limit=limit):
            block = self.pool.lookup(key)  # type: ignore[attr-defined]
            if block is None:
                break
            chain.append(block)
        longest = len(chain) - 1 if config.drop_eagle_block and chain else len(chain)
        for n in range(longest, -1, -1):
            tables = self.kv.hit_tables(tracked.tokens, n * config.block_size)
            if tables is not None:
                self._group_hits[tracked.request_id] = tables
                # KVCacheManager.get_computed_blocks (kv_cache_manager.py:320-326): the hit plus the
                # prefix full attention has cached and another group not, when there is one
                self._junction[tracked.request_id] = longest * config.block_size if longest > n else 0
                return chain[:n]
        raise AssertionError("a hit of 0 tokens is served by every group")

    def _hits_of(self, tracked: TrackedRequest) -> list[list[int]] | None:
        return self._group_hits.get(tracked.request_id) if not self.kv.holds(tracked.request_id) else None

    # -- blocks --------------------------------------------------------------------------------
    def _blocks_needed(self, tracked: TrackedRequest, tokens: int, hits: list[int] = (),  # type: ignore[assignment]
                       lookahead: bool = True) -> int:
        computed = tracked.num_computed + len(hits) * self.config.block_size  # type: ignore[attr-defined]
        upto = self._slot_tokens(computed + tokens) if lookahead else computed + tokens  # type: ignore[attr-defined]
        return super()._blocks_needed(tracked, tokens, hits, lookahead) + self.kv.blocks_needed(  # type: ignore[misc]
            tracked.request_id, upto, computed, self._hits_of(tracked), main=computed + tokens)

    def _whole_sequence_fits(self, tracked: TrackedRequest, hits: list[int]) -> bool:
        config = self.config  # type: ignore[attr-defined]
        computed = len(hits) * config.block_size
        need = V1Scheduler._blocks_needed(self, tracked, tracked.num_tokens - computed, hits,  # type: ignore[arg-type]
                                          lookahead=False)
        need += self.kv.blocks_needed(tracked.request_id, min(tracked.num_tokens, config.max_model_len), computed,
                                      self._hits_of(tracked), whole=True)
        return need + self._admission_watermark() <= self.pool.num_free  # type: ignore[attr-defined]

    def _ignore_if_stuck(self, tracked: TrackedRequest, need: int, reasons: list[Reason], ignored: list[str]) -> bool:
        """A cache hit can cost a Mamba "align" group one block more than none (the hit's state,
        taken off the free queue, and a fresh one: kv_groups.py `blocks_needed`), so a head that
        `_ignore_if_infeasible` let pass may still need more than the whole pool above the
        watermark. With nothing running, nothing in flight and every block free, the cache and so
        the hit stay as they are: the head would wait forever (LIV-001, LIV-003). It is ignored."""
        config = self.config  # type: ignore[attr-defined]
        capacity = config.num_gpu_blocks - self._admission_watermark()  # type: ignore[attr-defined]
        idle = not self.running and not getattr(self, "in_flight", None) \
            and self.pool.num_free == config.num_gpu_blocks  # type: ignore[attr-defined]
        if not idle or need <= capacity:
            return False
        reasons.append(Reason.of("ignored_never_fits", tracked.request_id, blocks=need, capacity=capacity))
        self._ignore(tracked, reasons[-1], ignored)  # type: ignore[attr-defined]
        return True

    def _blocks_for_whole(self, tracked: TrackedRequest) -> int:
        """Every group's admission count for the whole sequence, without a hit."""
        config = self.config  # type: ignore[attr-defined]
        whole = config.blocks_for(tracked.num_tokens)
        for group in config.kv_groups[1:]:
            if group.kind in ("sliding_window", "chunked_local"):
                whole += min(config.blocks_for(tracked.num_tokens), self.kv.admission_cap(group))
            elif group.kind == "mamba":  # "align": its state and k speculative ones (MambaSpec.num_speculative_blocks)
                whole += {"all": config.blocks_for(tracked.num_tokens),
                          "align": 1 + config.num_speculative_tokens}.get(group.mode, 1)
        return whole

    def _allocate(self, tracked: TrackedRequest, tokens: int, *, hits: list[int], watermark: bool) -> bool:
        """`V1Scheduler._allocate` over every group, in allocate_slots' order: free the skipped
        blocks (even if the allocation then fails), check, take the hits of every group, then the
        fresh blocks of every group, then key what this step completes."""
        config = self.config  # type: ignore[attr-defined]
        rid = tracked.request_id
        computed = tracked.num_computed + len(hits) * config.block_size
        group_hits = self._hits_of(tracked)
        self.kv.remove_skipped(rid, self._processed(tracked, computed))
        need = self._blocks_needed(tracked, tokens, hits)
        if need + (self._admission_watermark() if watermark else 0) > self.pool.num_free:  # type: ignore[attr-defined]
            return False
        for block in hits:
            self.pool.touch(block)  # type: ignore[attr-defined]
        tracked.blocks.extend(hits)
        if hits:
            tracked.num_computed = computed
            tracked.num_keyed = len(hits)
        if group_hits is not None:
            self.kv.add_hits(rid, group_hits)
        slots = self._slot_tokens(computed + tokens)  # type: ignore[attr-defined]
        fresh = config.blocks_for(slots) - len(tracked.blocks)
        tracked.blocks.extend(self.pool.allocate(max(fresh, 0)))  # type: ignore[attr-defined]
        self.kv.allocate(rid, slots, main=computed + tokens)
        self._cache_full_blocks(tracked, computed + tokens)  # type: ignore[attr-defined]
        return True

    def _processed(self, tracked: TrackedRequest, computed: int) -> int:
        """The computed tokens whose steps have returned: what skipped blocks are freed on (vLLM
        frees on ``total_computed_tokens - num_in_flight_tokens``, kv_cache_manager.py:556-568,
        since in-flight steps still read the window). All of them in a synchronous flow."""
        return computed

    def _cache_full_blocks(self, tracked: TrackedRequest, upto: int) -> None:
        super()._cache_full_blocks(tracked, upto)  # type: ignore[misc]
        self.kv.cache(tracked.request_id, tracked.tokens, upto)

    def _free_blocks(self, tracked: TrackedRequest) -> None:
        super()._free_blocks(tracked)  # type: ignore[misc]
        self.kv.free(tracked.request_id)

    # -- chunks ----------------------------------------------------------------------------------
    def _long_prefill_threshold(self) -> int:
        self._threshold: int = super()._long_prefill_threshold()  # type: ignore[misc]
        return self._threshold  # this step's (V1's schedule() asks once, first)

    def _admission_tokens(self, tracked: TrackedRequest, tokens: int, computed: int,
                          running_loop: tuple[TrackedRequest, ...], budget: int) -> int | None:
        """V1's, except that with a Mamba "align" group a one-token admission padded to 1 + k
        that the long-prefill threshold or the aligned split would cut is not padded: vLLM caps
        the padded count at the threshold (scheduler.py:1332-1333), splits it, and drops a padding
        that is no longer 1 + k, "drop the padding instead of shortening it" (scheduler.py:
        1359-1370; without an "align" group the cut padding fails vLLM's assertion at :1579)."""
        padded = super()._admission_tokens(tracked, tokens, computed, running_loop, budget)  # type: ignore[misc]
        if padded is None or padded == tokens or not self._aligns:
            return padded
        chunk = min(padded, self._threshold) if self._threshold > 0 else padded
        return padded if self._aligned_chunk(tracked, computed, chunk) == padded else tokens

    def _running_chunk(self, tracked: TrackedRequest, budget: int, threshold: int) -> int:
        tokens = super()._running_chunk(tracked, budget, threshold)  # type: ignore[misc]
        return self._aligned_chunk(tracked, tracked.num_computed, tokens)

    def _aligned_chunk(self, tracked: TrackedRequest, computed: int, tokens: int) -> int:
        """vLLM's `_mamba_block_aligned_split` (scheduler.py:546-662, without partial hits,
        checkpoint blocks or junctions): a chunk that stops before the prefill ends stops on a
        block boundary, unless no whole block fits a prefill chunk; one that starts inside a block
        stops at its end; none runs past the last boundary whose state can be cached."""
        if not self._aligns or tokens <= 0:
            return tokens
        config = self.config  # type: ignore[attr-defined]
        block_size = config.block_size
        start, end = computed, computed + tokens
        prefill_end = max(tracked.request.prompt_len, tracked.num_tokens - 1)
        if start >= prefill_end:
            return tokens
        if config.drop_eagle_block:
            last_cache = max(tracked.num_tokens // block_size * block_size - block_size, 0)
        else:
            last_cache = max((tracked.num_tokens - 1) // block_size * block_size, 0)
        if end < prefill_end:
            max_prefill = config.max_num_batched_tokens
            if config.long_prefill_token_threshold > 0:
                max_prefill = min(max_prefill, config.long_prefill_token_threshold)
            aligned = end // block_size * block_size
            if aligned > start or block_size <= max_prefill:
                end = aligned
        junction = self._junction.get(tracked.request_id, 0)
        floored = start + (junction - start) // block_size * block_size  # a sub-block junction is not cacheable
        stops = ((start // block_size + 1) * block_size if start % block_size else 0, last_cache,
                 floored if start < junction < end else 0)
        end = min((s for s in stops if start < s < end), default=end)
        return max(end - start, 0)

    # -- observation -----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        snap = super().snapshot()  # type: ignore[misc]
        requests = self.requests  # type: ignore[attr-defined]
        seq_of = {rid: requests[rid].seq_id for rid in self.kv.tables}
        snap = dataclasses.replace(snap, group_tables=self.kv.observed(seq_of))
        self._last_snapshot = snap
        return snap


class HybridV1Scheduler(KVGroupsMixin, V1Scheduler):
    """vLLM V1's flow over hybrid KV cache groups. Implements `spec.protocol.SchedulerLike`."""


class EngineHybridV1(KVGroupsMixin, EngineWatermarkV1):
    """The hybrid reference with vLLM 0.33.0's own watermark rule, for lockstep against the engine."""


class HybridSpecDecScheduler(KVGroupsMixin, SpecDecScheduler):
    """The speculative-decoding flow (k > 0 from the config) over hybrid KV cache groups."""


class HybridAsyncScheduler(KVGroupsMixin, AsyncV1Scheduler):
    """The pipelined reference (`reference_impl.async_scheduler`) over hybrid KV cache groups:
    skipped blocks are freed on the tokens of the steps that returned (`_processed`), and a
    preempted request whose stale steps are in flight waits, as in the async reference."""

    capabilities = AsyncV1Scheduler.capabilities | {Capability.KV_GROUPS}

    def _processed(self, tracked: TrackedRequest, computed: int) -> int:
        return max(computed - self.counters[tracked.request_id].num_in_flight, 0)

    def _whole_sequence_fits(self, tracked: TrackedRequest, hits: list[int]) -> bool:
        if self.counters[tracked.request_id].num_stale:
            return False
        return super()._whole_sequence_fits(tracked, hits)
