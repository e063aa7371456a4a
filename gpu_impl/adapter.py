"""One engine of the batched twin behind `spec.protocol.SchedulerLike` (the built-in adapter
``gpu`` of the conformance runner): ``make(config)``.

It is a `BatchedScheduler` with E = 1 whose request capacity grows as requests arrive. Slots
are kept in policy-key order: a request that arrives with a more urgent key than some
existing ones (priority policy) is inserted by permuting the slots. Outputs are
`spec.types.SchedulerOutput` without reasons (the twin does not explain its decisions);
snapshots expose every capability.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_impl.batched import SWAPPED, WAITING, BatchedScheduler
from gpu_impl.materialize import finished_lists, snapshots, step_outputs
from spec.config import SchedulerConfig
from spec.observation import ALL_CAPABILITIES, Snapshot
from spec.status import Status
from spec.types import Finished, Request, SchedulerOutput, StepOutcome


class GpuScheduler:
    """`SchedulerLike` over one engine of the torch twin."""

    capabilities = ALL_CAPABILITIES

    def __init__(self, config: SchedulerConfig, device: str | torch.device | None = "cpu", capacity: int = 8) -> None:
        self.config = config
        self.batched = BatchedScheduler([config], max_requests=capacity, max_n=1, device=device)
        self.names: list[str] = []
        self._arrivals = 0

    def _key(self, slot: int) -> tuple[int, int]:
        s = self.batched
        prio = int(s.prio[0, slot]) if self.config.policy == "priority" else 0
        return (prio, int(s.arrival[0, slot]))

    def add_request(self, request: Request) -> None:
        if request.request_id in self.names:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        s = self.batched
        used = len(self.names)
        if used >= s.R or request.n > s.N:
            s.grow(max(s.R, 2 * used, used + 1), max(s.N, request.n))
        slot = used
        for name, value in (("prompt", request.prompt_len), ("maxtok", request.max_tokens), ("n", request.n),
                            ("prio", request.priority), ("arrival", self._arrivals), ("tok", request.prompt_len)):
            getattr(s, name)[0, slot] = value
        s.forked[0, slot] = request.n == 1
        self._arrivals += 1
        self.names.append(request.request_id)
        mask = torch.zeros(1, s.R, dtype=torch.bool, device=s.device)
        mask[0, slot] = True
        s.arrive(mask)
        order = sorted(range(used + 1), key=self._key)
        if order != list(range(used + 1)):
            perm = torch.arange(s.R, device=s.device)
            perm[: used + 1] = torch.tensor(order, device=s.device)
            s.permute_requests(perm[None, :])
            last = s._last
            if last is not None:  # between schedule() and update(): keep the step's view aligned
                for f in ("kind", "ntok", "start", "preempt", "ignored"):
                    setattr(last, f, getattr(last, f).gather(1, perm[None, :]))
                last.seqs = last.seqs.gather(1, perm[None, :, None].expand_as(last.seqs))
            self.names = [self.names[i] for i in order]

    def abort_request(self, request_id: str) -> Finished | None:
        try:
            slot = self.names.index(request_id)
        except ValueError:
            return None
        s = self.batched
        code = int(s.status[0, slot])
        if not (WAITING <= code <= SWAPPED):
            return None
        mask = torch.zeros(1, s.R, dtype=torch.bool, device=s.device)
        mask[0, slot] = True
        s.abort(mask)
        return Finished(request_id, Status.FINISHED_ABORTED)

    def schedule(self) -> SchedulerOutput:
        out = self.batched.schedule()
        return step_outputs(out, [self.names])[0]

    def update(self, outcome: StepOutcome) -> Sequence[Finished]:
        s = self.batched
        stopped = torch.zeros(1, s.R, s.N, dtype=torch.bool)
        index = {rid: i for i, rid in enumerate(self.names)}
        for sid in outcome.stopped:
            rid, _, j = sid.rpartition("#")
            if rid in index and j.isdigit() and int(j) < s.N:
                stopped[0, index[rid], int(j)] = True
        upd = s.update(stopped.to(s.device))
        return finished_lists(upd, [self.names])[0]

    def snapshot(self) -> Snapshot:
        return snapshots(self.batched, [self.names])[0]


def make(config: SchedulerConfig, device: str | torch.device | None = "cpu") -> GpuScheduler:
    """The conformance runner's ``gpu`` adapter: one engine of the torch twin."""
    return GpuScheduler(config, device=device)
