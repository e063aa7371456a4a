"""Reserve prompt + max_tokens at admission, never preempt.

1. At add_request, refuse (FINISHED_IGNORED) a request with n > 1 (this engine does not fork)
   or one whose whole reservation could never fit the GPU pool.
2. Admission takes, all at once, the blocks of min(prompt + max_tokens, max_model_len) tokens:
   every token the request can ever have. No watermark: nothing will need a block later.
3. Decodes never need a block, so nothing is ever preempted (no priority preemption either).

Correct, and it breaks vLLM V0's exact block counts (CAP-001/002, ADM-001) and has no watermark
(ADM-002): it declares `Reservation(whole_request=True)` and safety's range (CAP-004..006) holds.
"""

from __future__ import annotations

from reference_impl.block_manager import AllocStatus, BlockManager
from reference_impl.scheduler import Scheduler
from reference_impl.sequence import Sequence, SequenceGroup
from spec.config import SchedulerConfig
from spec.reservation import Reservation
from spec.status import Status
from spec.types import Finished, Request
from zoo._adapter import zoo_adapter


class WholeRequestBlocks(BlockManager):
    def reservation_blocks(self, request: Request) -> int:
        return self.config.blocks_for(min(request.prompt_len + request.max_tokens, self.config.max_model_len))

    def blocks_to_allocate(self, group: SequenceGroup) -> int:
        return self.reservation_blocks(group.request)

    def can_allocate(self, group: SequenceGroup) -> AllocStatus:
        need = self.blocks_to_allocate(group)
        if need > self.config.num_gpu_blocks:
            return AllocStatus.NEVER
        return AllocStatus.OK if need <= self.gpu.num_free else AllocStatus.LATER

    def allocate(self, group: SequenceGroup) -> None:
        for seq in group.live_seqs():
            self.gpu_tables[seq.seq_id] = [self.gpu.allocate() for _ in range(self.blocks_to_allocate(group))]

    def can_append_slots(self, group: SequenceGroup) -> bool:
        return True  # the reservation already covers every token the request can have


class ReserveWholeRequest(Scheduler):
    block_manager_class: type[BlockManager] = WholeRequestBlocks

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.block_manager = self.block_manager_class(config)

    def add_request(self, request: Request) -> Finished | None:
        super().add_request(request)
        if request.n > 1 or self.block_manager.reservation_blocks(request) > self.config.num_gpu_blocks:
            group = self.groups[request.request_id]
            self.waiting.remove(group)
            self._finish(group, Status.FINISHED_IGNORED)
            return Finished(request.request_id, Status.FINISHED_IGNORED)
        return None

    def _schedule_priority_preemption(self, budget, step) -> None:
        return  # never preempts: a running request already holds all it will need


class OneBlockShort(WholeRequestBlocks):
    def blocks_to_allocate(self, group: SequenceGroup) -> int:
        return super().blocks_to_allocate(group) - 1  # bug: the reservation misses its last block

    def append_slot(self, seq: Sequence) -> tuple[tuple[int, int], ...]:
        return ()  # and the decode that reaches it writes past the table


class BrokenReserveWholeRequest(ReserveWholeRequest):
    block_manager_class = OneBlockShort


def make():
    return zoo_adapter("zoo-whole-request", ReserveWholeRequest, reservation=Reservation(whole_request=True))


def make_broken():
    return zoo_adapter("zoo-whole-request-broken", BrokenReserveWholeRequest, reservation=Reservation(whole_request=True))
