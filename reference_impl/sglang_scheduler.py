"""The reference scheduler for SGLang's flow (SGLang 0.5.23, ``sglang/srt/managers/``), readable.

Page size 1: a spec block is one KV slot (SGLang's slot id minus one; its slot 0 is a padding
slot never handed out). The KV pool is a FIFO free list (``TokenToKVPoolAllocator``,
mem_cache/allocator/token.py:42-75: allocation takes the front, a free appends to the back) beside
a radix cache of finished and running prefixes (`reference_impl.radix_cache`). One call of
`schedule()` is what ``Scheduler.get_next_batch_to_run`` does without a TP worker (the
``sglang`` target's host replays the same glue, conformance/targets/hosts/sglang_host.py):

1. The last prefill batch, less its finished requests, joins the running batch at its tail;
   finished requests leave the running batch (scheduler.py:3894-4035). Either shrink clears
   the running batch's ``batch_is_full``.
2. A new prefill batch, unless (with no chunked request) the batch is full or nothing waits
   (``_get_new_batch_prefill_raw``, scheduler.py:4079-4457). Seats: ``max_num_seqs`` less the
   running requests. The waiting queue is ordered by the policy (``SchedulePolicy.calc_priority``, schedule_policy.py:213-283):
   ``fcfs`` keeps arrival order (retracted requests re-enter at the tail); ``lpm`` sorts it, for
   good and stably, by the longest cached prefix first, after deprioritising a request whose
   prefix the waiting requests ahead of it share by 32 tokens or more (in-batch prefix caching,
   schedule_policy.py:336-388); with more than 128 waiting, lpm falls back to fcfs. Under fcfs
   every 32nd pass touches the waiting prefixes in the cache, tail first, so that LRU evicts in
   reverse admission order (``_touch_waiting_prefixes``, 285-305). Then each waiting request in
   that order (``PrefillAdder.add_one_req``, schedule_policy.py:1395-1580): its prompt (with any
   tokens generated before a retraction) is matched in the radix cache, never the last token
   (``_compute_max_prefix_len``); it is admitted when its prefill, its remaining
   ``max_new_tokens`` and one page are fewer than the KV slots left: free plus evictable (with
   its own prefix locked) less what the running and admitted requests reserve, each its
   remaining ``max_new_tokens`` times the new-token ratio for the running ones, the whole
   ``max_new_tokens`` for the ones admitted in this pass, a retracted one's included
   (``PrefillBudget.check_prefill``, mem_cache/prefill_budget.py:114-130;
   ``_get_running_request_total_token_offset``; ``_select_prefill_admission``,
   schedule_policy.py:1638). A request that does not fit stops admission
   and marks the batch full (when something was admitted or runs); after the first admission a
   prefill of at least the input budget left (``max_num_batched_tokens``) stops it too. The
   step's prefill batch allocates its slots in batch order (``alloc_for_extend``), evicting
   least-recently-used unlocked leaves of the radix cache for the shortfall. With chunked prefill
   (``chunked_prefill_size``, here the token budget as ``max_prefill_tokens`` is) a prompt longer
   than the chunk budget left is admitted for that much (``_select_prefill_admission``, reserving
   none of its output) and becomes the chunked request: admission stops, the request stays out of
   the running batch, its chunk goes into the radix cache at the next step (``stash_chunked_request``,
   scheduler.py:3911-3919) and its next chunk comes first in every prefill pass
   (``add_chunked_req``, schedule_policy.py:1195-1275, as much as the chunk budget and the slots
   left allow) until the prompt is done; only then does it sample and join the running batch.
3. Otherwise a decode of the whole running batch (``update_running_batch``, scheduler.py:
   4459-4545), one slot per request. When the free and evictable slots cannot give each one
   (``check_decode_mem``, schedule_batch.py:3432-3449), requests are retracted
   (``retract_decode``, 3451-3535): ordered by (generated tokens, then the shorter prompt)
   descending, popped from the end (fewest generated first; among equals the longest prompt,
   then the latest in the batch), at least one and until the rest fit, never the last one. A
   retracted request frees its row's slots outside the radix cache, unlocks its prefix, goes to
   the waiting tail keeping its generated tokens (they are prefilled again), and the cache is
   asked for ``20`` slots per request left (``release_req``, 2360-2395). The new-token ratio is
   then re-estimated from the requests left (``estimate_new_token_ratio_after_retract``:
   ``(generated + 20 per request) / (max_new_tokens + 1)``, at most 1); a decode without
   retraction decays it by ``(0.7 - 0.098) / 600`` down to ``0.098``
   (``NewTokenRatioTracker``; SGLANG_INIT_NEW_TOKEN_RATIO 0.7, _MIN_NEW_TOKEN_RATIO_FACTOR 0.14,
   _NEW_TOKEN_RATIO_DECAY_STEPS 600, environ.py:646-649). The retraction order keeps the
   running batch in that order from then on.

`update()` appends one token to every request of the step's batch (the trace's stop decision is
SGLang's EOS), finishes it on EOS or at ``max_new_tokens`` (``Req.update_finish_state``),
and then, for a finished request, inserts its computed tokens into the radix cache and frees its
row (``release_kv_cache`` with checkpoint), or, after a prefill, inserts its prefilled tokens
and moves its lock to the new node (``checkpoint_kv_cache``); a slot whose tokens were cached
already by another request is freed, the request's row then points at the cached one
(``RadixCache._insert_cache`` / ``checkpoint``, radix_cache.py:450-543).

The doors (``Scheduler.handle_generate_request`` and ``validate_input_length``; the TP worker's
``max_req_len``, tp_worker.py:568-572, with a context length of ``max_model_len + 2``):
``max_req_len = min(max_model_len + 1, num_gpu_blocks - 1)``; a prompt of ``max_req_len - 5``
tokens or more is refused, reported as ignored by the next schedule; ``max_new_tokens`` is clipped
to ``max_req_len - prompt - 1``. So no request outgrows ``max_model_len``, and on small pools
SGLang's limits are stricter than the spec's.

Where this differs from the engine: SGLang reads ``time.monotonic()`` for LRU times, here a
logical clock (`reference_impl.radix_cache`); an abort (the host has none) finishes the request
at once, freeing its row without caching it; the other policies (lof, dfs-weight, random,
priority), mixed chunks and page sizes above 1 are not modelled; sampled tokens are the ``sglang`` host's
(`sampled_token`), since SGLang's radix cache keys on them. LoRA (``max_loras`` as SGLang's
``max_loras_per_batch``): a waiting request whose adapter would be one more than ``max_loras``
among the running batch's, the staged chunk's and the ones taken before it is passed over
(``can_schedule_lora_req``, scheduler.py:4186-4277); SGLang's base model takes one of the slots,
so the spec's adapter 0 does here too (LORA-001 does not count it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from reference_impl.radix_cache import Node, RadixCache, common_prefix
from spec import observation
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import Capability, SeqView, Snapshot
from spec.reasons import Reason
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, Request, ScheduledSeq, SchedulerOutput, StepOutcome, seq_id

# SGLang's defaults (environ.py:646-650, schedule_policy.py:105-140)
INIT_NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20
CLIP_MAX_NEW_TOKENS = 4096
IN_BATCH_PREFIX_CHECK = 32  # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
IN_BATCH_PREFIX_DEPRIORITIZE = 32  # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
WAITING_PREFIX_REFRESH_INTERVAL = 32
EOS = 2  # the host's end-of-sequence id: the trace's stop decision

CAPABILITIES = frozenset({Capability.OUTPUT, Capability.STATUSES, Capability.QUEUES, Capability.BLOCK_TABLES,
                          Capability.FREE_COUNTS, Capability.FREE_LISTS, Capability.SEQ_LENGTHS,
                          Capability.COMPUTED_TOKENS, Capability.SGLANG_FLOW, Capability.LORA})


def sampled_token(request_id: str, position: int) -> int:
    """The token the ``sglang`` host samples at ``position`` (hosts/kvsched_host.py: ``token_ids``):
    distinct per request and never below 16 (never EOS)."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return base + (position * 104_729) % 900_000


def door_limits(config: SchedulerConfig) -> tuple[int, int]:
    """SGLang's ``(max_req_len, max_req_input_len)`` for ``config`` (tp_worker.py:568-572)."""
    max_req_len = min(config.max_model_len + 1, config.num_gpu_blocks - 1)
    return max_req_len, max_req_len - 5


@dataclass(eq=False)
class SglangRequest:
    """One request as SGLang's ``Req`` keeps it (page size 1)."""

    request: Request
    origin: list[int]  # origin_input_ids
    max_new: int  # sampling_params.max_new_tokens after the door's clip
    output: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    row: list[int] = field(default_factory=list)  # req_to_token row: slot per computed token
    committed: int = 0  # kv.kv_committed_len
    prefix_len: int = 0
    protected: int = 0  # kv.cache_protected_len: the row's leading slots the radix cache owns
    last_node: Node | None = None
    lock: Node | None = None
    extend_end: int = 0
    matched: int = 0  # num_matched_prefix_tokens (lpm's sort key)
    retracted: bool = False
    middle_chunks: int = 0  # inflight_middle_chunks: scheduled chunks whose outcome samples nothing

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def fill(self) -> list[int]:
        return self.origin + self.output

    @property
    def key(self) -> list:
        """``fill`` as the radix cache keys it: an adapter's tokens are namespaced by its id (``Req.extra_key``
        gets the ``lora_id``, schedule_batch.py:1164-1170; ``RadixKey.child_key``, radix_cache.py:222-240), so
        requests of different adapters never share cached slots."""
        lora = self.request.lora_id
        return self.fill if not lora else [(lora, token) for token in self.fill]

    @property
    def finished(self) -> bool:
        return self.status.is_finished


class SglangScheduler:
    """SGLang's scheduling flow, readable. Implements `spec.protocol.SchedulerLike`."""

    capabilities = CAPABILITIES
    retraction_sign = 1  # _get_decode_retraction_order's key direction (a mutant turns it around)

    def __init__(self, config: SchedulerConfig) -> None:
        for name, ok, why in (
            ("block_size", config.block_size == 1, "page size 1: a block is one KV slot"),
            ("num_cpu_blocks", config.num_cpu_blocks == 0, "SGLang has no CPU swap pool"),
            ("preemption_mode", config.preemption_mode == "recompute", "SGLang retracts (recompute)"),
            ("policy", config.policy in ("fcfs", "lpm"), "the fcfs and lpm policies are modelled"),
        ):
            if not ok:
                raise InputError(f"config.{name}", f"{why}; got {getattr(config, name)!r}")
        self.max_req_len, self.max_req_input_len = door_limits(config)
        if self.max_req_len <= 0:
            raise InputError("config.num_gpu_blocks", "SGLang asserts 'Memory pool size is too small' below 2 slots")
        self.config = config
        # chunked_prefill_size (and max_prefill_tokens): the spec's token budget
        self.chunk_size: int | None = config.max_num_batched_tokens if config.enable_chunked_prefill else None
        self.chunked: SglangRequest | None = None  # the request mid chunked prefill (``Scheduler.chunked_req``)
        self.free: list[int] = list(range(config.num_gpu_blocks))
        self.cache = RadixCache(self.free.extend)
        self.requests: dict[str, SglangRequest] = {}
        self.waiting: list[SglangRequest] = []
        self.running: list[SglangRequest] = []  # the running batch, in batch order
        self.batch_is_full = False
        self.ratio = INIT_NEW_TOKEN_RATIO
        self._refresh_calls = 0
        self._refused: list[str] = []  # refused at the door, reported by the next schedule
        self._ignored: list[Finished] = []
        self._batch: list[SglangRequest] = []  # this step's batch
        self._batch_is_prefill = False
        self._last_extend: list[SglangRequest] | None = None
        self._pending: dict[int, int] = {}  # id(request) -> tokens this step computes, until its outcome
        self._step = 0
        self.num_preemptions_total = 0
        self._last_snapshot: Snapshot | None = None

    # ---------------------------------------------------------------- client side
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.n != 1:
            raise InputError(f"request {request.request_id!r}.n", f"SGLang samples one sequence, got {request.n}")
        origin = list(request.prompt_tokens) if request.prompt_tokens is not None else [
            sampled_token(request.request_id, k) for k in range(request.prompt_len)]
        max_new = max(0, min(request.max_tokens, self.max_req_len - len(origin) - 1))
        tracked = SglangRequest(request, origin, max_new)
        self.requests[request.request_id] = tracked
        if len(origin) >= self.max_req_input_len:
            self._refused.append(request.request_id)
        else:
            self.waiting.append(tracked)

    def abort_request(self, request_id: str) -> Finished | None:
        tracked = self.requests.get(request_id)
        if tracked is None or tracked.finished:
            return None
        if tracked is self.chunked:
            self.chunked = None
        if request_id in self._refused:
            self._refused.remove(request_id)
        elif tracked in self.waiting:
            self.waiting.remove(tracked)
        else:
            self._release(tracked, cache_it=False)
            for batch in (self.running, self._batch, self._last_extend or []):
                if tracked in batch:
                    batch.remove(tracked)
        tracked.status = Status.FINISHED_ABORTED
        return Finished(request_id, Status.FINISHED_ABORTED, Reason.of("finished_aborted", request_id))

    # ---------------------------------------------------------------- schedule
    def schedule(self) -> SchedulerOutput:
        reasons: list[Reason] = []
        ignored = self._report_refused(reasons)
        self._merge_last_extend()
        preempted: list[SglangRequest] = []
        batch = self._new_prefill_batch(reasons)
        self._batch_is_prefill = bool(batch)
        if not batch and self.running:
            batch = self._decode_batch(preempted, reasons)
        self._batch = batch
        self._last_extend = batch if self._batch_is_prefill else None
        # SGLang commits a step's KV length when it allocates (prepare_for_extend / _for_decode);
        # until the outcome, a snapshot shows the tokens computed before the step
        self._pending = {id(r): (r.extend_end - r.prefix_len if self._batch_is_prefill else 1) for r in batch}
        output = SchedulerOutput(
            step=self._step,
            scheduled=tuple(ScheduledSeq(seq_id(r.request_id, 0), r.request_id,
                                         r.extend_end - r.prefix_len if self._batch_is_prefill else 1,
                                         self._batch_is_prefill) for r in batch),
            preempted=tuple(Preempted(r.request_id, PreemptionMode.RECOMPUTE) for r in preempted),
            ignored=tuple(ignored),
            reasons=tuple(reasons),
        )
        self._step += 1
        return output

    def _report_refused(self, reasons: list[Reason]) -> list[str]:
        refused, self._refused = self._refused, []
        for rid in refused:
            tracked = self.requests[rid]
            tracked.status = Status.FINISHED_IGNORED
            reason = Reason.of("ignored_input_limit", rid, tokens=len(tracked.origin), limit=self.max_req_input_len)
            reasons.append(reason)
            self._ignored.append(Finished(rid, Status.FINISHED_IGNORED, reason))
        return refused

    def _merge_last_extend(self) -> None:
        """Step 1: the chunked request's chunk goes into the radix cache (``stash_chunked_request``)
        and it stays out of the running batch; the last prefill batch joins the running batch;
        finished requests leave it."""
        chunked = self.chunked
        if chunked is not None and chunked.extend_end > chunked.prefix_len:
            self._checkpoint(chunked, chunked.extend_end)
            chunked.prefix_len = chunked.extend_end
        last = self._last_extend
        if last is not None:
            kept = [r for r in last if not r.finished and r is not chunked]
            if len(kept) < len(last):
                self.batch_is_full = False
            if kept:
                if not self.running:
                    self.running, self.batch_is_full = kept, False  # the last batch becomes the running one
                else:
                    self.running.extend(kept)
        self._last_extend = None
        kept = [r for r in self.running if not r.finished]
        if len(kept) < len(self.running):
            self.batch_is_full = False
        self.running = kept

    # ---------------------------------------------------------------- prefill
    def _new_prefill_batch(self, reasons: list[Reason]) -> list[SglangRequest]:
        """Step 2 (``_get_new_batch_prefill_raw`` with ``PrefillAdder``)."""
        if not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return []
        # ``get_num_allocatable_reqs``: seats left, and request rows left (each running request holds
        # one; so does the chunked one, which is counted among the admitted when it holds its row)
        allocatable = self.config.max_num_seqs - len(self.running)
        if allocatable <= 0 and self.chunked is None:
            self.batch_is_full = True
            return []
        self._order_waiting()
        adder = _Adder(self, self.ratio)
        if self.chunked is not None:  # its next chunk first (scheduler.py:4176-4184)
            self.chunked = adder.add_chunked(self.chunked, reasons)
        loras = self._running_loras(adder) if self.config.max_loras else None
        for tracked in self.waiting:
            if adder.state() == "other":
                break
            if loras is not None and not self._lora_fits(tracked, loras, reasons):
                continue
            if len(adder.admitted) >= allocatable:
                self.batch_is_full = True
                reasons.append(Reason.of("wait_seats", tracked.request_id, running=len(self.running),
                                         limit=self.config.max_num_seqs))
                break
            self._match(tracked)
            result = adder.add(tracked, reasons)
            if loras is not None:  # scheduler.py:4276-4277: whether or not the adder took it
                loras.add(tracked.request.lora_id)
            if result != "continue":
                if result == "no_token":
                    self.batch_is_full = bool(adder.admitted) or bool(self.running)
                break
        if not adder.admitted:
            return []
        chosen = set(map(id, adder.admitted))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        if adder.new_chunked is not None:
            self.chunked = adder.new_chunked
        if self.chunked is not None:
            self.chunked.middle_chunks += 1
        self._allocate_extend(adder.admitted)
        return adder.admitted

    def _running_loras(self, adder: _Adder) -> set[int]:
        """The adapters a LoRA pass starts from (scheduler.py:4186-4191): the running batch's and the
        staged chunk's (the request carried over mid-prefill, sgl-project/sglang #25865; PR #23179)."""
        return {r.request.lora_id for r in self.running if not r.finished} | {r.request.lora_id for r in adder.admitted}

    def _lora_fits(self, tracked: SglangRequest, loras: set[int], reasons: list[Reason]) -> bool:
        """``can_schedule_lora_req`` (scheduler.py:4416-4443, ``validate_lora_batch`` lora_manager.py:427-436):
        its adapter is in use already, or one more still fits ``max_loras``. The base model (adapter 0)
        counts as one, as SGLang's ``None`` does."""
        lora = tracked.request.lora_id
        if lora in loras or len(loras | {lora}) <= self.config.max_loras:
            return True
        reasons.append(Reason.of("wait_lora_slots", tracked.request_id, loras=len(loras), limit=self.config.max_loras))
        return False

    def _order_waiting(self) -> None:
        """``SchedulePolicy.calc_priority`` (schedule_policy.py:213-283)."""
        if self.config.policy == "lpm" and len(self.waiting) <= WAITING_QUEUE_PREFIX_MATCH_MAX:
            deprioritized = self._lpm_matches()
            self.waiting.sort(key=lambda r: float("inf") if id(r) in deprioritized else -r.matched)
            return
        # fcfs (or lpm over a long queue): ``_touch_waiting_prefixes`` every 32nd pass
        refresh = self._refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if refresh:
            for tracked in reversed(self.waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.cache.touch(tracked.key)

    def _lpm_matches(self) -> set[int]:
        """``_compute_prefix_matches`` (schedule_policy.py:336-388): each waiting request's cached
        prefix (all its tokens may match here); a request whose short cached prefix the waiting
        requests before it share by 32 tokens or more is deprioritised."""
        deprioritized: set[int] = set()
        seen: list[list] = []  # the simulated waiting-queue tree's keys
        for tracked in self.waiting:
            fill = tracked.key
            slots, node = self.cache.match(fill)
            tracked.prefix_len, tracked.last_node = len(slots), node
            tracked.matched = min(len(slots), max(len(fill) - 1, 0))
            if tracked.prefix_len <= IN_BATCH_PREFIX_CHECK:
                shared = max((common_prefix(key, fill) for key in seen), default=0)
                if shared >= IN_BATCH_PREFIX_DEPRIORITIZE:
                    deprioritized.add(id(tracked))
                else:
                    seen.append(fill)
        return deprioritized

    def _match(self, tracked: SglangRequest) -> None:
        """``Req.init_next_round_input``: match all but the last token."""
        fill = tracked.key
        slots, node = self.cache.match(fill[:max(len(fill) - 1, 0)])
        tracked.prefix_len, tracked.last_node, tracked.protected = len(slots), node, len(slots)
        tracked.matched = len(slots)

    def _allocate_extend(self, batch: list[SglangRequest]) -> None:
        """``alloc_for_extend``: each row is its cached prefix and fresh slots, in batch order."""
        prefixes = [r.row[:r.prefix_len] if r.row else  # a chunked request keeps its row between chunks
                    self.cache.path_slots(r.last_node)[:r.prefix_len] if r.last_node else [] for r in batch]
        total = sum(r.extend_end - r.prefix_len for r in batch)
        fresh = self._alloc(total)
        at = 0
        for tracked, prefix in zip(batch, prefixes, strict=True):
            n = tracked.extend_end - tracked.prefix_len
            tracked.row = prefix + fresh[at:at + n]
            at += n
            tracked.committed = tracked.extend_end
            tracked.status = Status.RUNNING
            tracked.retracted = False

    def _alloc(self, n: int) -> list[int]:
        """``alloc_token_slots``: evict the shortfall, then take the free list's front."""
        self._evict_for(n)
        if n > len(self.free):
            raise RuntimeError(f"Out of memory: {n} slots asked, {len(self.free)} free")
        taken, self.free[:n] = self.free[:n], []
        return taken

    def _evict_for(self, n: int) -> None:
        """``evict_to_free_tokens``: evict the radix cache's shortfall below ``n`` free slots."""
        if n - len(self.free) > 0:
            self.cache.evict(n - len(self.free))

    # ---------------------------------------------------------------- decode
    def _decode_batch(self, preempted: list[SglangRequest], reasons: list[Reason]) -> list[SglangRequest]:
        """Step 3 (``update_running_batch``): retract on KV exhaustion, then one slot each."""
        initial = len(self.running)
        if not self._decode_fits(self.running):
            sign = self.retraction_sign
            order = sorted(range(len(self.running)), reverse=True,
                           key=lambda i: (sign * len(self.running[i].output), -sign * len(self.running[i].origin)))
            first = True
            while first or not self._decode_fits([self.running[i] for i in order]):
                if len(order) == 1:
                    break
                first = False
                victim = self.running[order.pop()]
                reasons.append(Reason.of("retracted", victim.request_id, need=len(order) + 1, free=len(self.free)))
                self._release(victim, cache_it=False)
                self._evict_for(len(order) * RETRACT_DECODE_STEPS)
                self._reset_for_retract(victim)
                preempted.append(victim)
            if not self._decode_fits([self.running[i] for i in order]):
                raise RuntimeError("retract_decode: out of memory even after retracting all other requests")
            self.running = [self.running[i] for i in order]
            generated = sum(len(r.output) for r in self.running)
            budget = sum(r.max_new for r in self.running)
            self.ratio = min(1.0, (generated + RETRACT_DECODE_STEPS * len(self.running)) / (budget + 1))
            self.waiting.extend(preempted)
            self.num_preemptions_total += len(preempted)
        else:
            self.ratio = max(self.ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
        if len(self.running) < initial:
            self.batch_is_full = False
        slots = self._alloc(len(self.running))
        for tracked, slot in zip(self.running, slots, strict=True):
            tracked.row.append(slot)
            tracked.committed += 1
            reasons.append(Reason.of("decode", tracked.request_id, tokens=1, new_blocks=1, copies=0))
        return list(self.running)

    def _decode_fits(self, batch: Sequence[SglangRequest]) -> bool:
        """``check_decode_mem``: one slot per request, after evicting for them."""
        self._evict_for(len(batch))
        return len(self.free) >= len(batch)

    def _reset_for_retract(self, tracked: SglangRequest) -> None:
        tracked.prefix_len = tracked.protected = tracked.extend_end = tracked.matched = 0
        tracked.last_node = None
        tracked.retracted = True
        tracked.status = Status.WAITING

    # ---------------------------------------------------------------- radix cache and rows
    def _checkpoint(self, tracked: SglangRequest, up_to: int) -> None:
        """``RadixCache.checkpoint`` (radix_cache.py:510-543): insert the first ``up_to`` tokens,
        free this row's duplicates of what was cached, point the row at the cached slots and
        move the lock to the new last node."""
        tokens = tracked.key[:up_to]
        in_tree = self.cache.insert(tokens, tracked.row[:up_to])
        self.free.extend(tracked.row[tracked.protected:in_tree])
        slots, node = self.cache.match(tokens)
        tracked.row[tracked.protected:len(slots)] = slots[tracked.protected:]
        tracked.protected = len(slots)
        self.cache.unlock(tracked.lock)
        tracked.lock = self.cache.lock(node)
        tracked.last_node = node

    def _release(self, tracked: SglangRequest, *, cache_it: bool) -> None:
        """``release_kv_cache``: (with ``cache_it``) checkpoint the computed tokens, free the
        row's slots the cache does not own, unlock, give the row back."""
        if cache_it:
            self._checkpoint(tracked, tracked.committed)
        self.free.extend(tracked.row[tracked.protected:tracked.committed])
        self.cache.unlock(tracked.lock)
        tracked.lock = None
        tracked.row = []
        tracked.committed = 0

    # ---------------------------------------------------------------- outcome
    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished, self._ignored = self._ignored, []
        batch, self._batch = self._batch, []
        self._pending = {}
        for tracked in batch:
            if tracked.finished or tracked.retracted:
                continue
            if tracked.middle_chunks > 0:  # a chunk short of the prompt's end: nothing sampled
                tracked.middle_chunks -= 1
                continue
            sid = seq_id(tracked.request_id, 0)
            stop = sid in outcome.stopped
            tracked.output.append(EOS if stop else sampled_token(tracked.request_id, len(tracked.fill)))
            if stop or len(tracked.output) >= tracked.max_new:
                status = Status.FINISHED_STOPPED if stop else Status.FINISHED_LENGTH_CAPPED
                self._release(tracked, cache_it=True)
                tracked.status = status
                kind = "finished_stopped" if stop else "finished_length_capped"
                finished.append(Finished(tracked.request_id, status, Reason.of(
                    kind, tracked.request_id, max_tokens=tracked.request.max_tokens,
                    max_model_len=self.config.max_model_len)))
            elif self._batch_is_prefill:
                self._checkpoint(tracked, tracked.extend_end)
                tracked.prefix_len = tracked.extend_end
        return finished

    # ---------------------------------------------------------------- observation
    def snapshot(self) -> Snapshot:
        """The ``sglang`` host's observations: statuses, queues (waiting in queue order with the
        refused requests last; running in arrival order), rows as block tables, the free list."""
        base = self._last_snapshot if observation.INCREMENTAL else None
        statuses = {rid: r.status for rid, r in self.requests.items()}
        seqs: dict[str, SeqView] = {}
        changed: set[str] = set()
        for rid, r in self.requests.items():
            sid = seq_id(rid, 0)
            running = r.status is Status.RUNNING
            blocks = tuple(r.row) if running else ()
            computed = r.committed - self._pending.get(id(r), 0) if running else 0
            view = SeqView(sid, rid, r.status, len(r.origin) + len(r.output), computed, blocks,
                           "gpu" if blocks else None)
            old = base.seqs.get(sid) if base is not None and base.seqs is not None else None
            if old is not None and old == view:
                view = old
            else:
                changed.add(sid)
            seqs[sid] = view
        waiting = tuple(r.request_id for r in self.waiting) + tuple(self._refused)
        running_ids = tuple(rid for rid, s in statuses.items() if s is Status.RUNNING)
        snap = Snapshot(
            statuses=statuses, seqs=seqs, waiting=waiting, running=running_ids, swapped=(),
            gpu_free=len(self.free), cpu_free=0, gpu_free_ids=tuple(self.free), cpu_free_ids=(),
            base=base,
            changed_seqs=frozenset(changed) if base is not None else None,
            changed_requests=frozenset(rid for rid, s in statuses.items()
                                       if base.statuses is None or base.statuses.get(rid) is not s)
            if base is not None else None,
        )
        self._last_snapshot = snap
        return snap

    def metrics(self) -> dict[str, int]:
        statuses = [r.status for r in self.requests.values()]
        return {"num_running": statuses.count(Status.RUNNING), "num_waiting": statuses.count(Status.WAITING),
                "num_preemptions_total": self.num_preemptions_total, "gpu_free_blocks": len(self.free)}


class _Adder:
    """One pass of ``PrefillAdder`` (schedule_policy.py:607-1580) at page size 1, no chunking."""

    def __init__(self, scheduler: SglangScheduler, ratio: float) -> None:
        self.s = scheduler
        self.ratio = ratio
        self.admitted: list[SglangRequest] = []
        # ``_get_running_request_total_token_offset``: each running request's remaining output
        self.total_offset: float = sum(min(r.max_new - len(r.output), CLIP_MAX_NEW_TOKENS) * ratio
                                       for r in scheduler.running)
        self.current_offset = 0
        self.rem_input = scheduler.config.max_num_batched_tokens
        self.rem_chunk = scheduler.chunk_size
        self.new_chunked: SglangRequest | None = None

    def _available(self) -> int:
        return len(self.s.free) + self.s.cache.evictable_size

    def state(self) -> str:
        """``budget_state``: "no_token", "other" or "continue"."""
        if not (self._available() - self.total_offset > 0 and self._available() - self.current_offset > 0):
            return "no_token"
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return "other"
        return "continue"

    def add(self, tracked: SglangRequest, reasons: list[Reason]) -> str:
        """``add_one_req``: admit ``tracked`` or say why not ("no_token", "other")."""
        max_new = min(max(tracked.max_new - len(tracked.output), 0), CLIP_MAX_NEW_TOKENS)
        extend = len(tracked.fill) - tracked.prefix_len
        total = extend + max_new + 1
        cache = self.s.cache
        pin = cache.lock(tracked.last_node) if tracked.last_node is not None else None  # ``_lock_node``
        try:
            left = self._available() - self.total_offset
            if not total < left:
                reasons.append(Reason.of("wait_reserved_tokens", tracked.request_id, tokens=total,
                                         left=int(left), ratio=f"{self.ratio:.4f}"))
                return "no_token"
            if self.rem_chunk is None and self.admitted and extend >= self.rem_input:
                reasons.append(Reason.of("wait_input_budget", tracked.request_id, tokens=extend, left=self.rem_input))
                return "other"
            # the reservation is the whole max_new_tokens, also for a retracted request that has generated
            # some of them (``_select_prefill_admission``, schedule_policy.py:1638), though the check above
            # counted only what is left; a first chunk reserves none (1646-1670)
            reserve = min(tracked.max_new, CLIP_MAX_NEW_TOKENS)
            if self.rem_chunk is not None and extend > self.rem_chunk:
                if self.rem_chunk <= 0:
                    return "other"
                extend, reserve = self.rem_chunk, 0
                self.new_chunked = tracked
            tracked.extend_end = tracked.prefix_len + extend
            tracked.lock = cache.lock(tracked.last_node) if tracked.last_node is not None else None
            self.admitted.append(tracked)
            self._charge(extend, reserve)
            reasons.append(Reason.of("prefill_chunk", tracked.request_id, tokens=extend,
                                     remaining=len(tracked.fill) - tracked.prefix_len, cached=tracked.prefix_len))
        finally:
            if pin is not None:
                cache.unlock(pin)
        return self.state()

    def _charge(self, extend: int, reserve: int) -> None:
        """``_update_prefill_budget`` at page size 1."""
        self.total_offset += extend + 1 + reserve
        self.current_offset += extend + 1
        self.rem_input -= extend
        if self.rem_chunk is not None:
            self.rem_chunk -= extend

    def add_chunked(self, tracked: SglangRequest, reasons: list[Reason]) -> SglangRequest | None:
        """``add_chunked_req`` (schedule_policy.py:1195-1275): the chunked request's next chunk, as
        much as the chunk budget and the slots left allow (the whole budget when none are left, so
        that it progresses); returns it while its prompt is not done."""
        left = min(self.rem_chunk or 0, int(self._available() - self.total_offset))
        room = left if left > 0 else (self.rem_chunk or 0)
        rest = len(tracked.fill) - tracked.prefix_len
        extend = min(rest, room)
        tracked.extend_end = tracked.prefix_len + extend
        self.admitted.append(tracked)
        self._charge(extend, 0 if rest > room else min(tracked.max_new, CLIP_MAX_NEW_TOKENS))
        reasons.append(Reason.of("prefill_chunk", tracked.request_id, tokens=extend, remaining=rest,
                                 cached=tracked.prefix_len))
        return tracked if rest > room else None
