"""One engine of the V1 twin behind `spec.protocol.SchedulerLike` (the built-in adapter
``gpu-v1`` of the conformance runner): ``make(config)``.

It is a `BatchedV1Scheduler` with E = 1 whose request capacity grows as requests arrive (slots
stay in arrival order; queue orders are keys, so nothing is permuted). Like the twin it leaves
prefix caching out: a config with ``enable_prefix_caching`` is refused with an `InputError`
naming that field, and its trace strategy draws the V1 strategies with caching forced off.
Outputs carry no reasons (the twin does not explain its decisions).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_impl.batched_v1 import RUNNING, WAITING, BatchedV1Scheduler
from gpu_impl.lockstep_v1 import finished_lists_v1, snapshots_v1, step_outputs_v1
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import ALL_CAPABILITIES, Capability, Snapshot
from spec.status import Status
from spec.types import Finished, Request, SchedulerOutput, StepOutcome, seq_id

# Everything the V1 reference exposes except PREFIX_CACHE: the twin leaves prefix caching out.
CAPABILITIES = ALL_CAPABILITIES | {Capability.TOKEN_BUDGET_FLOW}


class GpuV1Scheduler:
    """`SchedulerLike` over one engine of the V1 torch twin."""

    capabilities = CAPABILITIES

    def __init__(self, config: SchedulerConfig, device: str | torch.device | None = "cpu", capacity: int = 8) -> None:
        if config.enable_prefix_caching:
            raise InputError("config.enable_prefix_caching", "the gpu-v1 twin leaves prefix caching out; set it false")
        if config.num_speculative_tokens:  # gpu_impl/batched_v1.py says why
            raise InputError("config.num_speculative_tokens", "the gpu-v1 twin leaves speculative decoding out; set it 0")
        self.config = config
        self.batched = BatchedV1Scheduler([config], max_requests=capacity, device=device)
        self.names: list[str] = []
        self.requests: list[Request] = []

    def add_request(self, request: Request) -> None:
        if request.request_id in self.names:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.n != 1:
            raise InputError(f"request {request.request_id!r}.n", f"must be 1 for the V1 flow, got {request.n}")
        s = self.batched
        slot = len(self.names)
        if slot >= s.R:
            s.grow(max(2 * s.R, slot + 1))
        s.prompt[0, slot] = request.prompt_len
        s.tok[0, slot] = request.prompt_len
        s.maxtok[0, slot] = request.max_tokens
        s.arrival[0, slot] = slot
        s.pkey[0, slot] = request.priority * (1 << 32) + slot
        self.names.append(request.request_id)
        self.requests.append(request)
        idx = torch.tensor([slot], device=s.device)
        s.arrive_idx(torch.zeros_like(idx), idx)

    def abort_request(self, request_id: str) -> Finished | None:
        try:
            slot = self.names.index(request_id)
        except ValueError:
            return None
        s = self.batched
        if int(s.status[0, slot]) not in (WAITING, RUNNING):
            return None
        idx = torch.tensor([slot], device=s.device)
        s.abort_idx(torch.zeros_like(idx), idx, torch.zeros_like(idx))
        return Finished(request_id, Status.FINISHED_ABORTED)

    def schedule(self) -> SchedulerOutput:
        return step_outputs_v1(self.batched.schedule(), [self.names])[0]

    def update(self, outcome: StepOutcome) -> Sequence[Finished]:
        s = self.batched
        stopped = torch.zeros(1, s.R, dtype=torch.bool)
        for slot, rid in enumerate(self.names):
            if seq_id(rid, 0) in outcome.stopped:
                stopped[0, slot] = True
        return finished_lists_v1(s.update(stopped.to(s.device)), [self.names])[0]

    def snapshot(self) -> Snapshot:
        return snapshots_v1(self.batched, [self.names], [self.requests])[0]


def make(config: SchedulerConfig, device: str | torch.device | None = "cpu") -> GpuV1Scheduler:
    """The conformance runner's ``gpu-v1`` adapter: one engine of the V1 torch twin."""
    return GpuV1Scheduler(config, device=device)
