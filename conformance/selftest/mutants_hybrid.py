"""Mutants of the hybrid reference (`reference_impl.hybrid_scheduler`): one per HYB invariant and
one for BLK-003's count over every group, each the shape of an upstream bug or of a plain mistake
in a hybrid KV cache manager, each with the invariant that catches it (tests/test_hybrid_mutants.py
searches for the trace)."""

from __future__ import annotations

from conformance.flows import get_flow
from conformance.generation.hybrid import hybrid_traces
from conformance.selftest.mutant_record import mutant
from reference_impl.hybrid_scheduler import HybridV1Scheduler
from reference_impl.kv_groups import GroupTables
from reference_impl.v1_scheduler import TrackedRequest
from spec.config import SchedulerConfig
from spec.kv_groups import NULL_BLOCK, KVGroup, first_live_block
from spec.prefix import block_keys

_HYBRID = get_flow("hybrid").mutant_fields()


def swa_traces():  # type: ignore[no-untyped-def]
    """Traces of full + sliding window (the window paths)."""
    return hybrid_traces("swa")


def mamba_traces():  # type: ignore[no-untyped-def]
    """Traces of full + Mamba (the state paths)."""
    return hybrid_traces("mamba")


def swa_prefix_traces():  # type: ignore[no-untyped-def]
    """Full + sliding window with prefix caching on (the hit paths)."""
    from dataclasses import replace

    from conformance.generation.hybrid import hybrid_configs
    from conformance.generation.v1 import token_traces

    return hybrid_configs("swa").map(lambda c: replace(c, enable_prefix_caching=True)).flatmap(
        lambda c: token_traces("v1", config=c))


_SWA = {**_HYBRID, "trace_strategy": swa_traces}
_SWA_PREFIX = {**_HYBRID, "trace_strategy": swa_prefix_traces}
_MAMBA = {**_HYBRID, "trace_strategy": mamba_traces}


def _with_tables(tables_class: type[GroupTables]):  # type: ignore[no-untyped-def]
    """A hybrid reference whose group tables are ``tables_class``."""

    class Scheduler(HybridV1Scheduler):
        def __init__(self, config: SchedulerConfig) -> None:
            super().__init__(config)
            self.kv = tables_class(config, self.pool)

    return Scheduler


class _FreeWithoutNull(GroupTables):
    def remove_skipped(self, request_id: str, computed: int) -> None:
        if request_id not in self.tables:
            return
        for (_, group), table in zip(self.extra, self.tables[request_id], strict=True):
            if group.kind != "sliding_window":
                continue
            upto = min(first_live_block(group, computed, self.config.block_size), len(table))
            freed = [b for b in table[:upto] if b != NULL_BLOCK and self.pool.ref_counts[b] > 0]
            if freed:
                self.pool.release(freed)  # bug: released, but the table keeps naming them
            self._released = getattr(self, "_released", set()) | set(freed)

    def free(self, request_id: str) -> None:
        tables = self.tables.pop(request_id, None)
        self.num_keyed.pop(request_id, None)
        for table in tables or ():
            real = [b for b in table if b != NULL_BLOCK and self.pool.ref_counts[b] > 0]
            if real:
                self.pool.release(reversed(real))


@mutant("hybrid-evicted-still-named", "a sliding-window group frees the blocks behind its window but its table "
        "keeps naming them, so another request's allocation reuses a block a table still reads", ("HYB-001",),
        **_SWA)
class EvictedStillNamed(_with_tables(_FreeWithoutNull)):  # type: ignore[misc]
    """A window eviction that releases the blocks to the pool without putting the null block in
    their place: the freed block is handed out again while the table still names it."""


class _OneKeySpace(GroupTables):
    def cache(self, request_id: str, tokens: list[int], upto: int) -> None:
        if not self.config.enable_prefix_caching or request_id not in self.tables:
            return
        keys = block_keys(tokens, self.config.block_size, limit=upto)
        keyed = self.num_keyed[request_id]
        for i, ((_, group), table) in enumerate(zip(self.extra, self.tables[request_id], strict=True)):
            if not group.has_table or (group.kind == "mamba" and group.mode == "none"):
                continue
            for p in range(keyed[i], min(len(keys), len(table))):
                if table[p] != NULL_BLOCK:
                    self.pool.register(table[p], keys[p])  # bug: no group id in the key
            keyed[i] = max(keyed[i], len(keys))


@mutant("hybrid-keys-without-group", "groups cache their blocks under the plain block hash, without the group id, "
        "so one group's lookup can find another group's block", ("HYB-002",), **_SWA)
class KeysWithoutGroup(_with_tables(_OneKeySpace)):  # type: ignore[misc]
    """vLLM keys a cached block by (hash, group id) (BlockHashWithGroupId); without the id, a
    sliding-window or Mamba block and a full-attention block of the same tokens share a key."""


class _WindowOneBlockShort(GroupTables):
    def remove_skipped(self, request_id: str, computed: int) -> None:
        super().remove_skipped(request_id, computed + self.config.block_size)  # bug: one block too far


@mutant("hybrid-window-frees-one-block-early", "the window's skipped-token count is one block off, so the block "
        "holding the first token of the window is freed before the step reads it", ("HYB-003",), **_SWA)
class WindowFreesEarly(_with_tables(_WindowOneBlockShort)):  # type: ignore[misc]
    """An off-by-one in get_num_skipped_tokens (vLLM's is ``computed - window + 1``): the oldest
    block of the window is nulled while the next token still attends to it."""


class _NeverFreesWindow(GroupTables):
    def remove_skipped(self, request_id: str, computed: int) -> None:
        return  # never frees behind the window


@mutant("hybrid-window-never-frees", "a sliding-window group keeps every block until the request finishes "
        "(correct, but holds a whole sequence of blocks: vLLM's policy frees behind the window)", ("HYB-004",),
        **_SWA)
class WindowNeverFrees(_with_tables(_NeverFreesWindow)):  # type: ignore[misc]
    """A correct-but-wasteful design: HYB-004 is policy, so only the hybrid profile flags it."""


class _KeepsOldStates(GroupTables):
    def remove_skipped(self, request_id: str, computed: int) -> None:
        saved = self.groups
        self.groups = tuple(g if g.kind != "mamba" else KVGroup("full") for g in saved)  # mamba skips nothing
        try:
            super().remove_skipped(request_id, computed)
        finally:
            self.groups = saved


@mutant("hybrid-state-kept", "a Mamba align group never frees the state it copied from, so it holds a state "
        "block per block of tokens instead of two", ("HYB-005",), **_MAMBA)
class StateKept(_with_tables(_KeepsOldStates)):  # type: ignore[misc]
    """MambaManager.remove_skipped_blocks skipped: the previous state stays real."""


@mutant("hybrid-hit-from-full-only", "the prefix hit is full attention's longest, not checked against the other "
        "groups, so a group that evicted its window or has no state at that length serves nothing there",
        ("HYB-006",), **_SWA_PREFIX)
class HitFromFullOnly(HybridV1Scheduler):
    """A coordinator that takes full attention's hit for every group (the fixed-point search left
    out): the other groups' tables get whatever they hold at those positions, often nothing."""

    def _cache_hits(self, tracked: TrackedRequest) -> list[int]:
        hits = super()._cache_hits(tracked)
        config = self.config
        chain = []
        for key in block_keys(tracked.tokens, config.block_size, limit=tracked.num_tokens - 1):
            block = self.pool.lookup(key)
            if block is None:
                break
            chain.append(block)
        if len(chain) > len(hits):
            tables = self.kv.hit_tables(tracked.tokens, len(hits) * config.block_size) or []
            # bug: the full chain, the other groups padded with what the shorter hit found
            self._group_hits[tracked.request_id] = [t + [NULL_BLOCK] * (len(chain) - len(hits)) for t in tables]
            return chain
        return hits


@mutant("hybrid-unaligned-chunks", "prefill chunks are not aligned to Mamba block boundaries, so a state block is "
        "cached for its boundary while it holds the state after a chunk that ended inside it "
        "(vllm-project/vllm#33706, #47861)", ("HYB-007",), **_MAMBA)
class UnalignedChunks(HybridV1Scheduler):
    """_mamba_block_aligned_split left out (as it was for resumed requests before #33706)."""

    def _aligned_chunk(self, tracked: TrackedRequest, computed: int, tokens: int) -> int:
        return tokens


@mutant("hybrid-aligned-split-to-zero", "the aligned split floors a chunk shorter than a block to 0 tokens even "
        "when no later step can give it a whole block (vllm-project/vllm#40707)", ("HYB-008",), **_MAMBA)
class AlignedSplitToZero(HybridV1Scheduler):
    """_mamba_block_aligned_split without its guard: ``end = aligned_end`` always, so a chunk the
    long-prefill threshold keeps below one block rounds to nothing on every step."""

    def _aligned_chunk(self, tracked: TrackedRequest, computed: int, tokens: int) -> int:
        if not self._aligns or tokens <= 0:
            return tokens
        block_size = self.config.block_size
        end = computed + tokens
        prefill_end = max(tracked.request.prompt_len, tracked.num_tokens - 1)
        if computed >= prefill_end or end >= prefill_end:
            return tokens
        return max(end // block_size * block_size - computed, 0)  # bug: no guard


class _HitsNotTouched(GroupTables):
    def add_hits(self, request_id: str, hits: list[list[int]] | None) -> None:
        tables = self.of(request_id)
        keyed = self.num_keyed.setdefault(request_id, [0] * len(tables))
        for i, hit in enumerate(hits or ()):
            for block in hit:
                if block != NULL_BLOCK and self.pool.ref_counts[block] > 0:
                    continue  # bug: a block another request holds is shared without a reference
                if block != NULL_BLOCK:
                    self.pool.touch(block)
            tables[i].extend(hit)
            keyed[i] = len(hit)


@mutant("hybrid-shared-hit-not-counted", "a group's prefix hit on a block another request holds takes no "
        "reference, so the block's count misses a holder and is freed under it", ("BLK-003",), **_SWA)
class SharedHitNotCounted(_with_tables(_HitsNotTouched)):  # type: ignore[misc]
    """BLK-003 over every group: a sliding-window or Mamba hit shared without touch()."""



# -- the museum's hybrid exhibits (conformance/selftest/museum/exhibits.py) --------------------------
def eagle_mamba_traces():  # type: ignore[no-untyped-def]
    """Full + Mamba traces under an EAGLE/MTP drafter's block drop (drop_eagle_block)."""
    from dataclasses import replace

    from conformance.generation.hybrid import hybrid_configs
    from conformance.generation.v1 import token_traces

    return hybrid_configs("mamba").filter(lambda c: c.enable_prefix_caching).map(
        lambda c: replace(c, drop_eagle_block=True)).flatmap(lambda c: token_traces("v1", config=c))


_EAGLE = {**_HYBRID, "trace_strategy": eagle_mamba_traces}


@mutant("hybrid-mamba-ignores-eagle-drop", "with an EAGLE drafter the hybrid hit takes full attention's chain "
        "without dropping its last block when a Mamba state is cached there: MambaManager.find_longest_cache_hit "
        "never reads drop_eagle_block (vllm-project/vllm#50630, #43650)", ("HYB-006",), **_EAGLE)
class MambaIgnoresEagleDrop(HybridV1Scheduler):
    """The coordinator gives the Mamba group the EAGLE margin (one block past the candidate) and the
    Mamba finder returns a state there without dropping it, so the reconciled hit is full attention's
    undropped chain (#43650's log: full attention 2k safe tokens, Mamba 3k, the hit 3k)."""

    def _cache_hits(self, tracked: TrackedRequest) -> list[int]:
        hits = super()._cache_hits(tracked)
        config = self.config
        chain = []
        for key in block_keys(tracked.tokens, config.block_size, limit=tracked.num_tokens - 1):
            block = self.pool.lookup(key)
            if block is None:
                break
            chain.append(block)
        if len(chain) == len(hits) + 1:
            tables = self.kv.hit_tables(tracked.tokens, len(chain) * config.block_size)
            if tables is not None:  # bug: the Mamba state at the undropped length is taken
                self._group_hits[tracked.request_id] = tables
                return chain
        return hits


@mutant("hybrid-unaligned-chunks-under-eagle", "under an EAGLE/MTP drafter the Mamba-aligned split is skipped, so "
        "a prefill chunk ends inside a block and its state is cached for the boundary (vllm-project/vllm#53912, "
        "#47861)", ("HYB-007",), **_EAGLE)
class UnalignedChunksUnderEagle(HybridV1Scheduler):
    """#47861's second fix for #43559 / #53912: non-final "align" prefill chunks must end on Mamba
    block boundaries with MTP too; here the split is left out when the drafter drops a block."""

    def _aligned_chunk(self, tracked: TrackedRequest, computed: int, tokens: int) -> int:
        if self.config.drop_eagle_block:
            return tokens  # bug: no alignment on the EAGLE path
        return super()._aligned_chunk(tracked, computed, tokens)


@mutant("hybrid-state-slot-leaks-on-failed-admission", "a waiting request's Mamba state slot is taken (copied from "
        "its prefix hit) before the attention blocks are checked, and not given back when admission then fails "
        "(sgl-project/sglang#16067)", ("BLK-003",), **_MAMBA)
class StateSlotLeaks(HybridV1Scheduler):
    """SGLang's match_prefix copies the matched Mamba state into a fresh slot (COW); when add_one_req
    then fails for lack of KV (NO_TOKEN), the slot stayed allocated and nobody held it. Here the
    state slot is taken when the admission check fails and never given back."""

    def _whole_sequence_fits(self, tracked: TrackedRequest, hits: list[int]) -> bool:
        fits = super()._whole_sequence_fits(tracked, hits)
        mamba = any(g.kind == "mamba" for g in self.config.kv_groups)
        if not fits and mamba and tracked.status.name == "WAITING" and self.pool.num_free:
            self.pool.allocate(1)  # bug: the state slot taken for the failed admission is never given back
        return fits
