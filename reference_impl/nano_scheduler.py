"""The reference scheduler for nano-vllm's flow (``nanovllm/engine/scheduler.py``, ``block_manager.py``).

nano-vllm is the smallest engine of the vLLM kind: one token budget, a prefix cache that is
always on in the engine (here: when ``enable_prefix_caching`` is set), recompute-only preemption,
and no chunked prefill. One call of `schedule()` is:

1. Prefill first. Waiting requests, head first, while fewer than ``max_num_seqs`` requests run:
   the head is admitted if its *whole* token count (cache hits included, as nano-vllm counts)
   fits the budget left and the free blocks can hold all of its blocks above the watermark;
   otherwise admission stops (FCFS). Admission looks the prompt up in the prefix cache (whole
   blocks, never the last token) and computes only the rest. If anything was admitted, the step
   is prefill only.
2. Otherwise decode. Running requests, head first, up to ``max_num_seqs``: each needs a new block
   only when the token it computes starts one. While none is free, the running tail is preempted
   (recompute), or the request itself when it is the last. Decoded requests go back to the front
   of running in order.

The free queue is FIFO (`reference_impl.prefix_cache`, order ``"nano"``): allocation takes the
front, freed blocks go to the back, a table is freed in reverse. A block is cached under its
chained key once it is full: at admission for the prompt's full blocks, during decode when the
token computed fills the last block. Preempted requests re-enter waiting at the front.

Where the spec (and so this reference) differs from the engine, documented in docs/TODAY.md:
``max_num_seqs`` bounds the running requests (the engine counts only the requests admitted in
the same step, so running can exceed it); a cache hit never covers the whole prompt (the engine
can match every block and schedule a prefill of zero tokens); a block is allocated when the
token computed starts one (the engine's ``len % block_size == 1`` test never fires for a block
size of 1); a request stops at ``max_model_len`` and on the trace's stop decisions; an over-long
prompt is ignored (the engine would wait forever); a step that can only preempt returns that
preemption (the engine asserts it scheduled something); the engine's index keeps stale entries
and checks a hit by comparing the block's own tokens, which can hand out a block computed after
a different prefix; here an evicted block leaves the index.
"""

from __future__ import annotations

from reference_impl.v1_scheduler import TrackedRequest, TrackedScheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.prefix import block_keys
from spec.reasons import Reason
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, Request, ScheduledSeq, SchedulerOutput


class NanoScheduler(TrackedScheduler):
    """nano-vllm's scheduling flow, readable. Implements `spec.protocol.SchedulerLike`.
    FCFS only, so a recompute victim re-enters waiting at the front (`TrackedScheduler._preempt`)."""

    free_order = "nano"

    def __init__(self, config: SchedulerConfig) -> None:
        if config.policy != "fcfs":
            raise InputError("config.policy", f"nano-vllm schedules FCFS only, got {config.policy!r}")
        if config.enable_chunked_prefill:
            raise InputError("config.enable_chunked_prefill", "nano-vllm has no chunked prefill")
        super().__init__(config)

    # ---------------------------------------------------------------- client side
    def add_request(self, request: Request) -> None:
        self.waiting.append(self._track(request))

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        reasons: list[Reason] = []
        ignored: list[str] = []
        scheduled = self._schedule_prefills(reasons, ignored)
        preempted: list[TrackedRequest] = []
        if not scheduled:
            scheduled = self._schedule_decodes(preempted, reasons)
        self._scheduled = scheduled
        output = SchedulerOutput(
            step=self._step,
            scheduled=tuple(ScheduledSeq(t.seq_id, t.request_id, n, t.in_prefill) for t, n in scheduled),
            preempted=tuple(Preempted(v.request_id, PreemptionMode.RECOMPUTE) for v in preempted),
            ignored=tuple(ignored),
            reasons=tuple(reasons),
        )
        self._step += 1
        return output

    def _schedule_prefills(self, reasons: list[Reason], ignored: list[str]) -> list[tuple[TrackedRequest, int]]:
        config = self.config
        scheduled: list[tuple[TrackedRequest, int]] = []
        batched = 0
        while self.waiting:
            tracked = self.waiting[0]
            if self._ignore_if_infeasible(tracked, reasons, ignored):
                continue
            if len(self.running) >= config.max_num_seqs:
                reasons.append(Reason.of("wait_seats", tracked.request_id, running=len(self.running),
                                         limit=config.max_num_seqs))
                break
            if batched + tracked.num_tokens > config.max_num_batched_tokens:
                reasons.append(Reason.of("wait_token_budget", tracked.request_id, tokens=tracked.num_tokens,
                                         left=config.max_num_batched_tokens - batched))
                break
            need = config.blocks_for(tracked.num_tokens)
            if self.pool.num_free - need < config.watermark_blocks:
                reasons.append(Reason.of("wait_blocks", tracked.request_id, blocks=need, free=self.pool.num_free))
                break
            cached = self._allocate_prompt(tracked)
            tokens = tracked.num_tokens - cached
            self.waiting.pop(0)
            tracked.status = Status.RUNNING
            tracked.in_prefill = True
            self.running.append(tracked)
            scheduled.append((tracked, tokens))
            batched += tracked.num_tokens - cached
            reasons.append(Reason.of("prefill_chunk", tracked.request_id, tokens=tokens,
                                     remaining=tracked.num_tokens, cached=cached))
        return scheduled

    def _schedule_decodes(
        self, preempted: list[TrackedRequest], reasons: list[Reason]
    ) -> list[tuple[TrackedRequest, int]]:
        scheduled: list[TrackedRequest] = []
        while self.running and len(scheduled) < self.config.max_num_seqs:
            tracked = self.running.pop(0)
            while self._needs_block(tracked) and self.pool.num_free == 0:
                victim = self.running.pop() if self.running else tracked
                self._preempt(victim)
                preempted.append(victim)
                reasons.append(Reason.of("preempted_recompute", victim.request_id, needed_by=tracked.request_id,
                                         need=1, free=0))
                if victim is tracked:
                    break
            else:
                self._append_slot(tracked)
                scheduled.append(tracked)
                reasons.append(Reason.of("decode", tracked.request_id, tokens=1, new_blocks=0, copies=0))
        self.running[:0] = scheduled
        return [(t, 1) for t in scheduled]

    def _ignore_if_infeasible(self, tracked: TrackedRequest, reasons: list[Reason], ignored: list[str]) -> bool:
        config = self.config
        capacity = config.num_gpu_blocks - config.watermark_blocks
        if tracked.request.prompt_len > config.prompt_limit:
            reasons.append(Reason.of("ignored_too_long", tracked.request_id, tokens=tracked.request.prompt_len,
                                     limit=config.prompt_limit))
        elif config.blocks_for(tracked.num_tokens) > capacity or tracked.num_tokens > config.max_num_batched_tokens:
            reasons.append(Reason.of("ignored_never_fits", tracked.request_id,
                                     blocks=config.blocks_for(tracked.num_tokens), capacity=capacity))
        else:
            return False
        self.waiting.remove(tracked)
        self._finish(tracked, Status.FINISHED_IGNORED)
        ignored.append(tracked.request_id)
        self._ignored.append(Finished(tracked.request_id, Status.FINISHED_IGNORED, reasons[-1]))
        return True

    # ---------------------------------------------------------------- blocks
    def _allocate_prompt(self, tracked: TrackedRequest) -> int:
        """Every block of the request's tokens: cached ones found by key while the chain holds
        (never the block of the last token), fresh ones after; full blocks get cached. Returns the
        tokens served by the cache."""
        bs = self.config.block_size
        keys = block_keys(tracked.tokens, bs)
        hits: list[int] = []
        if self.config.enable_prefix_caching:
            for index, key in enumerate(block_keys(tracked.tokens, bs, limit=self._hit_limit(tracked))):
                block = self._lookup(tracked, index, key)
                if block is None:
                    break
                hits.append(block)
        for block in hits:
            self.pool.touch(block)
        fresh = self.pool.allocate(self.config.blocks_for(tracked.num_tokens) - len(hits))
        tracked.blocks = hits + fresh
        for index, key in enumerate(keys):
            self._register(tracked, index, key)
        tracked.num_keyed = len(keys)
        tracked.num_computed = len(hits) * bs
        return tracked.num_computed

    def _needs_block(self, tracked: TrackedRequest) -> bool:
        """The token computed now (position ``num_computed``) starts a new block."""
        return tracked.num_computed // self.config.block_size == len(tracked.blocks)

    def _append_slot(self, tracked: TrackedRequest) -> None:
        bs = self.config.block_size
        if self._needs_block(tracked):
            tracked.blocks.extend(self.pool.allocate(1))
        if (tracked.num_computed + 1) % bs == 0:  # the token computed fills its block
            keys = block_keys(tracked.tokens, bs, limit=tracked.num_computed + 1)
            self.pool.register(tracked.blocks[len(keys) - 1], keys[-1])
            tracked.num_keyed = len(keys)

    # The three places where nano-vllm itself decides otherwise, as hooks (its deviations are
    # modelled by overriding them: conformance/selftest/campaigns/lockstep_nano.py, conformance/selftest/mutants_v1.py).
    def _hit_limit(self, tracked: TrackedRequest) -> int:
        """How many leading tokens a cache hit may cover: all but the last (CHK-001, PFX-005)."""
        return tracked.num_tokens - 1

    def _lookup(self, tracked: TrackedRequest, index: int, key: str) -> int | None:
        """The cached block for the prompt's block ``index``, whose chained key is ``key``."""
        return self.pool.lookup(key)

    def _register(self, tracked: TrackedRequest, index: int, key: str) -> None:
        """Cache the request's full block ``index`` under ``key``."""
        self.pool.register(tracked.blocks[index], key)
