"""Mutants of the token-budget references (vLLM V1's and nano-vllm's flows).

Each breaks one rule of `reference_impl.v1_scheduler` or `reference_impl.nano_scheduler` and
names the invariants that catch it. They register into `conformance.selftest.mutants.MUTANTS` with the
reference they break, the traces that reach them (`conformance.generation.v1`), and the profile
whose invariants apply; tests/test_mutants.py searches each pair as it does for the V0 mutants.
"""

from __future__ import annotations

from conformance.flows import get_flow
from conformance.selftest.mutant_record import mutant
from reference_impl.nano_scheduler import NanoScheduler
from reference_impl.prefix_cache import CachingBlockPool
from reference_impl.v1_scheduler import TrackedRequest, V1Scheduler
from spec.config import SchedulerConfig
from spec.prefix import block_keys
from spec.status import Status
from spec.types import ScheduledSeq, SchedulerOutput

# What each flow's mutants register with: its reference, traces and profile (conformance/flows/).
V1 = get_flow("v1").mutant_fields()
NANO = get_flow("nano").mutant_fields()


# ---------------------------------------------------------------------------------- chunked prefill
@mutant("v1-zero-token-admission", "with the budget spent, the waiting head is still admitted, with 0 tokens",
        ("CHK-001",), **V1)
class _ZeroTokenAdmission(V1Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        full = out.num_batched_tokens >= self.config.max_num_batched_tokens
        if not (full and self.waiting and not out.preempted and len(self.running) < self.config.max_num_seqs):
            return out
        head = self.waiting.pop(0)  # bug: admitted although no token of the budget is left
        head.status = Status.RUNNING
        self.running.append(head)
        self._scheduled.append((head, 0))
        return SchedulerOutput(**{**out.__dict__, "scheduled": (*out.scheduled, ScheduledSeq(head.seq_id, head.request_id, 0, True))})


@mutant("v1-decode-two-tokens", "a decode with budget to spare is given two tokens, one past the sequence's end",
        ("CHK-002",), **V1)
class _DecodeTwo(V1Scheduler):
    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        items = []
        for s in out.scheduled:
            tracked = self.requests[s.request_id]
            bump = s.num_tokens == tracked.num_tokens - tracked.num_computed and out.num_batched_tokens < self.config.max_num_batched_tokens
            items.append(type(s)(s.seq_id, s.request_id, s.num_tokens + (1 if bump else 0), s.is_prefill))
        return SchedulerOutput(**{**out.__dict__, "scheduled": tuple(items)})


@mutant("v1-preempt-keeps-computed", "a recompute victim keeps its computed-token count (nano-vllm PR #207)",
        ("CHK-003",), **V1)
class _PreemptKeepsComputed(V1Scheduler):
    def _preempt(self, victim: TrackedRequest) -> None:
        kept = victim.num_computed
        super()._preempt(victim)
        victim.num_computed = kept


@mutant("v1-chunk-counts-as-whole", "a partial prefill chunk advances the computed count to the end of the prompt",
        ("CHK-004",), **V1)
class _ChunkCountsWhole(V1Scheduler):
    def update(self, outcome):
        for tracked, tokens in self._scheduled:
            if tracked.num_computed + tokens < tracked.num_tokens - 1:
                tracked.num_computed = tracked.num_tokens - 1 - tokens  # bug: skips the rest of the prompt
        return super().update(outcome)


@mutant("v1-ignores-long-prefill-threshold", "prefill chunks are not capped at long_prefill_token_threshold",
        ("CHK-005",), **V1)
class _NoThreshold(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.config = SchedulerConfig(**{**config.to_dict(), "long_prefill_token_threshold": 0})


@mutant("v1-ignores-partial-prefill-limit", "admission starts a partial prefill beyond max_num_partial_prefills",
        ("CHK-006",), **V1)
class _NoPartialLimit(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.config = SchedulerConfig(**{**config.to_dict(), "max_num_partial_prefills": 0})


# ---------------------------------------------------------------------------------- prefix cache
class _StaleKeyPool(CachingBlockPool):
    def _evict(self, block: int) -> None:
        key = self.keys[block]
        super()._evict(block)
        if key is not None:
            self.keys[block] = key  # bug: the reused block keeps its old key (though the index forgot it)


class _IndexKeepsEvicted(CachingBlockPool):
    def _evict(self, block: int) -> None:
        self.keys[block] = None  # bug: the index still lists the block under its old key


class _UnchainedKeys(V1Scheduler):
    """Keys of a block's own tokens only, without the prefix before it."""

    def _cache_hits(self, tracked: TrackedRequest) -> list[int]:
        if not self.config.enable_prefix_caching:
            return []
        hits = []
        for key in _own_keys(tracked.tokens, self.config.block_size, tracked.num_tokens - 1):
            block = self.pool.lookup(key)
            if block is None:
                break
            hits.append(block)
        return hits

    def _cache_full_blocks(self, tracked: TrackedRequest, upto: int) -> None:
        if not self.config.enable_prefix_caching:
            return
        keys = _own_keys(tracked.tokens, self.config.block_size, upto)
        for index in range(tracked.num_keyed, len(keys)):
            self.pool.register(tracked.blocks[index], keys[index])
        tracked.num_keyed = max(tracked.num_keyed, len(keys))


def _own_keys(tokens: list[int], bs: int, limit: int) -> list[str]:
    return [block_keys(tokens[i : i + bs], bs)[0] for i in range(0, min(limit, len(tokens)) - bs + 1, bs)]


class _FreeCountsCachedTwice(CachingBlockPool):
    @property
    def num_free(self) -> int:
        return len(self._free) + sum(1 for b in self._free if self.keys[b] is not None)  # bug


def _with_pool(base: type, pool: type) -> type:
    class _Scheduler(base):  # type: ignore[misc,valid-type]
        def __init__(self, config: SchedulerConfig) -> None:
            super().__init__(config)
            self.pool = pool(config.num_gpu_blocks, caching=config.enable_prefix_caching, order=self.pool.order)

    return _Scheduler


mutant("v1-reused-block-keeps-key", "a cached block handed out as a fresh block keeps its old key",
       ("PFX-001", "PFX-003"), **V1)(_with_pool(V1Scheduler, _StaleKeyPool))
mutant("v1-unchained-keys", "blocks are keyed by their own tokens, not by the prefix before them",
       ("PFX-001", "PFX-002"), **V1)(_UnchainedKeys)
mutant("v1-evicted-block-findable", "an evicted block loses its key but stays in the cache index",
       ("PFX-003",), **V1)(_with_pool(V1Scheduler, _IndexKeepsEvicted))
mutant("v1-cached-free-counted-twice", "cached blocks nobody holds are counted free twice",
       ("PFX-004", "BLK-001"), **V1)(_with_pool(V1Scheduler, _FreeCountsCachedTwice))


@mutant("nano-whole-prompt-hit", "a cache hit may cover the whole prompt, leaving nothing to compute (nano-vllm)",
        ("PFX-005", "CHK-001"), **NANO)
class _WholePromptHit(NanoScheduler):
    def _hit_limit(self, tracked: TrackedRequest) -> int:
        return tracked.num_tokens  # bug: the last token's block may hit too


# ---------------------------------------------------------------------------------- scheduling order
@mutant("v1-serves-one-running", "only the head of running is served, the budget left goes to newcomers",
        ("ORD-001",), **V1)
class _ServesOneRunning(V1Scheduler):
    def schedule(self) -> SchedulerOutput:
        head, hidden = self.running[:1], self.running[1:]
        self.running = head  # bug: the other running requests are skipped this step
        try:
            out = super().schedule()
        finally:
            kept = [r for r in self.running if r in head]
            self.running = kept + hidden + [r for r in self.running if r not in head]
        return out


@mutant("v1-admits-after-preemption", "a step that preempted still admits waiting requests (victims wait at the back)",
        ("ORD-002",), **V1)
class _AdmitAfterPreemption(V1Scheduler):
    def _to_waiting(self, tracked: TrackedRequest, *, front: bool) -> None:
        super()._to_waiting(tracked, front=False)

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        if not out.preempted or not self.waiting:
            return out
        budget = self.config.max_num_batched_tokens - out.num_batched_tokens
        scheduled: dict[str, int] = {}
        self._admit(budget, 0, scheduled, [], [])  # bug: admission after a preemption
        extra = tuple(ScheduledSeq(self.requests[r].seq_id, r, n, True) for r, n in scheduled.items())
        self._scheduled += [(self.requests[r], n) for r, n in scheduled.items()]
        return SchedulerOutput(**{**out.__dict__, "scheduled": out.scheduled + extra})


@mutant("v1-victim-from-head", "under FCFS the head of running is preempted instead of the tail", ("ORD-003",), **V1)
class _VictimFromHead(V1Scheduler):
    def _victim(self) -> TrackedRequest:
        if self.config.policy == "priority":
            return super()._victim()
        return self.running[0]


# ---------------------------------------------------------------------------------- admin calls
def _reset_traces():
    """The V1 flow's traces with prefix caching on and ``reset_prefix_cache`` calls (issue 21)."""
    from conformance.generation.v1 import token_configs, token_traces

    configs = token_configs("v1").map(lambda c: SchedulerConfig(**{**c.to_dict(), "enable_prefix_caching": True}))
    return configs.flatmap(lambda c: token_traces("v1", config=c, resets=True, batch_aborts=True))


_RESET = {**V1, "trace_strategy": _reset_traces}


@mutant("v1-reset-refuses-idle-cache", "reset_prefix_cache refuses when no block is held (vLLM 0.33.0 "
        "block_pool.py:882 with `<=` for `!=`: the mutation benchmark's m021)", ("PFX-007",), **_RESET)
class _ResetRefusesIdle(V1Scheduler):
    def reset_prefix_cache(self) -> bool:
        if not any(self.pool.ref_counts[:]):
            return False  # bug: the only case where a reset may succeed
        return super().reset_prefix_cache()


@mutant("v1-reset-keeps-keys", "reset_prefix_cache answers true but keeps the hash map: a later identical "
        "prompt hits KV cached before the reset", ("PFX-006",), **_RESET)
class _ResetKeepsKeys(V1Scheduler):
    def reset_prefix_cache(self) -> bool:
        return not any(self.pool.ref_counts[:])  # bug: the answer without the reset


@mutant("v1-admission-ignores-watermark", "an admission made while requests run does not keep the watermark "
        "free (vLLM V1 keeps it: kv_cache_manager.py:518-525)", ("ADM-004",), **V1)
class _AdmissionIgnoresWatermark(V1Scheduler):
    def _admission_watermark(self) -> int:
        return 0  # bug: the watermark is never kept
