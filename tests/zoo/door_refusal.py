"""Refuse an unservable request at add_request instead of ignoring it at a later schedule().

1. add_request returns `Finished(FINISHED_IGNORED)` for a prompt over the prompt limit, a
   request with more sequences than max_num_seqs, or one whose prompt could never fit the GPU
   pool above the watermark; such a request never enters a queue.
2. Everything else is the reference (a recompute victim that has grown past what fits is still
   ignored at schedule(), reported in the output).

Correct: the refusal is the request's one finish, reported in the step it was added (LEN-003).
"""

from __future__ import annotations

from reference_impl.block_manager import AllocStatus
from reference_impl.scheduler import Scheduler
from spec.status import Status
from spec.types import Finished, Request
from zoo._adapter import zoo_adapter


class RefuseAtTheDoor(Scheduler):
    def add_request(self, request: Request) -> Finished | None:
        super().add_request(request)
        group = self.groups[request.request_id]
        if (request.prompt_len > self.config.prompt_limit or request.n > self.config.max_num_seqs
                or self.block_manager.can_allocate(group) is AllocStatus.NEVER):
            self.refuse(group)
            return Finished(request.request_id, Status.FINISHED_IGNORED)
        return None

    def refuse(self, group) -> None:
        self.waiting.remove(group)
        self._finish(group, Status.FINISHED_IGNORED)


class RefusesButKeeps(RefuseAtTheDoor):
    def refuse(self, group) -> None:
        pass  # bug: reported finished, but left waiting


def make():
    return zoo_adapter("zoo-door-refusal", RefuseAtTheDoor)


def make_broken():
    return zoo_adapter("zoo-door-refusal-broken", RefusesButKeeps)
