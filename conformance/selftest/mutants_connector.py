"""Mutants of the KV-connector reference (reference_impl/kv_connector.py), one per KVC invariant
and each the shape of a connector bug, most of them upstream ones. A mutant overrides one hook of
`ConnectorScheduler`; tests/test_mutants.py finds, for each, a connector trace on which its
invariant catches it and the reference passes (tests/test_connector_mutants.py pins the three
museum shapes on hand-written traces, each caught within 10 steps).
"""

from __future__ import annotations

from conformance.flows import get_flow
from conformance.generation.connector import failed_block_sharer_traces, pressure_traces
from conformance.selftest.mutant_record import mutant
from reference_impl.kv_connector_scheduler import ConnectorScheduler
from reference_impl.v1_scheduler import TrackedRequest
from spec.status import Status


class SchedulesLoadingRequest(ConnectorScheduler):
    """An asynchronous load treated as landed as soon as the request reaches the head again: it is
    scheduled while the connector still writes its blocks."""

    def _kv_load_pending(self, tracked: TrackedRequest) -> bool:
        transfer = self.connector.transfers.get(tracked.request_id)  # type: ignore[union-attr]
        if transfer is not None and tracked.status is Status.WAITING_FOR_REMOTE_KV:
            tracked.num_computed = transfer.tokens  # bug: the KV has not landed
            self._kv_landed.add(tracked.request_id)
        return False


class SharerKeepsFailedBlock(ConnectorScheduler):
    """vLLM 0.33.0's rule for a request that hit a block in the step its owner's load failed to
    fill: it keeps the block as computed and only redoes that step (scheduler.py:3644-3651)."""

    sharers_keep_failed_blocks = True  # bug: its next chunk attends to the block before it is computed again


class FreesWhileSending(ConnectorScheduler):
    """``request_finished`` asks for a delayed free, and the blocks are freed anyway."""

    def _finish(self, tracked: TrackedRequest, status: Status) -> None:
        super()._finish(tracked, status)
        if tracked.blocks and self.connector is not None and tracked.request_id in self.connector.transfers:
            self._free_blocks(tracked)  # bug: the send still reads them


class CachesLoadingBlocks(ConnectorScheduler):
    """An asynchronous load's blocks are cached under their keys when allocated, before the KV lands."""

    def _kv_allocate(self, tracked: TrackedRequest, tokens: int, hits: list[int], *, reserved: int,
                     cache: bool = True) -> bool:
        return super()._kv_allocate(tracked, tokens, hits, reserved=reserved, cache=True)  # bug: always keyed


class AllocatesPastTheLoad(ConnectorScheduler):
    """An asynchronous load allocates its whole sequence up front (the shape vllm-project/vllm#57104
    fixed the other way round: lookahead slots belong after the load)."""

    def _kv_allocate(self, tracked: TrackedRequest, tokens: int, hits: list[int], *, reserved: int,
                     cache: bool = True) -> bool:
        if not cache:  # the asynchronous load's allocation
            tokens = tracked.num_tokens - len(hits) * self.config.block_size  # bug: past the load
        return super()._kv_allocate(tracked, tokens, hits, reserved=reserved, cache=cache)


class KeepsFailedTokens(ConnectorScheduler):
    """A landed asynchronous load counts all its tokens as computed though some blocks failed."""

    def _kv_truncate_async(self, reported, invalid):  # type: ignore[no-untyped-def]
        super()._kv_truncate_async(reported, invalid)
        for t in reported:
            tracked = self.requests[t.request_id]
            if t.kind == "load" and t.load_async and not tracked.status.is_finished:
                tracked.num_computed = t.tokens  # bug: the failed blocks' tokens too
        return set()


class IgnoresFailPolicy(ConnectorScheduler):
    """``kv_load_failure_policy = "fail"`` is read as recompute: the request is never failed."""

    def _kv_fail(self, tracked: TrackedRequest):  # type: ignore[no-untyped-def]
        return []  # bug: the declared policy says fail


class LeaksAfterTransfer(ConnectorScheduler):
    """The connector reports a finished request's transfer done and its blocks stay held."""

    def _kv_release(self, tracked: TrackedRequest) -> None:
        pass  # bug: never freed


class LoadingTakesASeat(ConnectorScheduler):
    """vllm-project/vllm#53130: requests waiting for their KV count against ``max_num_seqs``, so
    admission stops with the KV cache mostly free."""

    def _kv_seats_taken(self) -> int:
        loading = sum(1 for rid in self._kv_queue if rid in self.connector.transfers)  # type: ignore[union-attr]
        return len(self.running) + loading  # bug: a loading request takes no seat


class LookaheadAfterLoad(ConnectorScheduler):
    """vllm-project/vllm#57104: a request promoted out of WAITING_FOR_REMOTE_KV asks for one block of
    speculative lookahead on top of its whole sequence; under KV pressure the allocation fails every
    step, the scan stops there, and the queues stay as they are for ever."""

    def _kv_whole_need(self, tracked: TrackedRequest, hits: list[int]) -> int:
        need = super()._kv_whole_need(tracked, hits)
        if tracked.status is Status.WAITING_FOR_REMOTE_KV and tracked.num_computed:
            need += 1  # bug: lookahead the pool never has room for once the load holds its blocks
        return need


class HolderBehindHead(ConnectorScheduler):
    """vllm-project/vllm#57841: requests holding loaded KV are not served before the rest; the scan
    stops at a head that needs more blocks than are free while a loaded request behind it, whose
    blocks are what keeps the head out, needs only a few: nothing runs, for ever."""

    def _kv_hold(self, tracked: TrackedRequest, pos: int) -> int:
        self._kv_queue.add(tracked.request_id)
        return pos + 1  # bug: it keeps its place behind whoever arrived first

    def _kv_members(self) -> int:
        return 0  # bug: no KV-holding front


_CONNECTOR = get_flow("connector").mutant_fields()
mutant("connector-schedules-loading-request", "a request is scheduled while its asynchronous KV load is in flight",
       ("KVC-001",), **_CONNECTOR)(SchedulesLoadingRequest)
mutant("connector-frees-while-sending", "a finished request's blocks are freed while its send is in flight",
       ("KVC-002",), **_CONNECTOR)(FreesWhileSending)
mutant("connector-caches-loading-blocks", "an asynchronous load's blocks are cached before the load lands",
       ("KVC-003", "KVC-010"), **_CONNECTOR)(CachesLoadingBlocks)
mutant("connector-allocates-past-the-load", "an asynchronous load allocates its whole sequence up front",
       ("KVC-004",), **_CONNECTOR)(AllocatesPastTheLoad)
mutant("connector-keeps-failed-tokens", "a landed load counts the tokens of its failed blocks as computed",
       ("KVC-005",), **_CONNECTOR)(KeepsFailedTokens)
mutant("connector-ignores-fail-policy", "kv_load_failure_policy fail is read as recompute",
       ("KVC-006",), **_CONNECTOR)(IgnoresFailPolicy)
mutant("connector-leaks-after-transfer", "a finished request's blocks stay held after its transfer is reported done",
       ("KVC-007",), **_CONNECTOR)(LeaksAfterTransfer)
mutant("connector-loading-takes-a-seat", "requests waiting for their KV count against max_num_seqs (vllm-project/vllm#53130)",
       ("KVC-008",), **_CONNECTOR)(LoadingTakesASeat)
mutant("connector-holder-behind-head",
       "requests holding loaded KV wait behind a head that cannot fit (vllm-project/vllm#57841)",
       ("KVC-009", "LIV-003"), **{**_CONNECTOR, "trace_strategy": pressure_traces})(HolderBehindHead)
mutant("connector-lookahead-after-load",
       "a promoted request asks for lookahead past its whole sequence and never fits (vllm-project/vllm#57104)",
       ("KVC-009",), **_CONNECTOR)(LookaheadAfterLoad)
mutant("connector-sharer-keeps-failed-block",
       "a request sharing a block whose load failed keeps it as computed while its owner's recompute is partway",
       ("KVC-011",), **{**_CONNECTOR, "trace_strategy": failed_block_sharer_traces})(SharerKeepsFailedBlock)
