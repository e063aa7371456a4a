"""Request and sequence statuses, and the queue each unfinished status lives in.

The names follow vLLM V0's ``SequenceStatus`` so a reader of vLLM recognises them.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SWAPPED = "SWAPPED"
    FINISHED_STOPPED = "FINISHED_STOPPED"
    FINISHED_LENGTH_CAPPED = "FINISHED_LENGTH_CAPPED"
    FINISHED_ABORTED = "FINISHED_ABORTED"
    FINISHED_IGNORED = "FINISHED_IGNORED"

    @property
    def is_finished(self) -> bool:
        return self.value.startswith("FINISHED_")

    @property
    def queue(self) -> str | None:
        """The queue that holds a request in this status (``None`` once finished)."""
        return _QUEUE_OF.get(self)


_QUEUE_OF = {Status.WAITING: "waiting", Status.RUNNING: "running", Status.SWAPPED: "swapped"}

QUEUES: tuple[str, ...] = ("waiting", "running", "swapped")
FINISHED_STATUSES: tuple[Status, ...] = tuple(s for s in Status if s.is_finished)


class PreemptionMode(StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"
