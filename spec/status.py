"""Request and sequence statuses, and the queue each unfinished status lives in.

The names follow vLLM V0's ``SequenceStatus`` so a reader of vLLM recognises them.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    WAITING = "WAITING"
    RUNNING = "RUNNING"
    SWAPPED = "SWAPPED"
    # KV connectors (spec/connector.py, docs/CONNECTORS.md): waiting, holding the blocks a
    # connector loads external KV into (vLLM's WAITING_FOR_REMOTE_KVS), or loaded into and not yet
    # admitted. Lives in the waiting queue; only a config with ``kv_connector`` reaches it.
    WAITING_FOR_REMOTE_KV = "WAITING_FOR_REMOTE_KV"
    FINISHED_STOPPED = "FINISHED_STOPPED"
    FINISHED_LENGTH_CAPPED = "FINISHED_LENGTH_CAPPED"
    FINISHED_ABORTED = "FINISHED_ABORTED"
    FINISHED_IGNORED = "FINISHED_IGNORED"
    # A KV load failed under ``kv_load_failure_policy = "fail"`` (vLLM's FINISHED_ERROR).
    FINISHED_ERROR = "FINISHED_ERROR"
    # A structured-output request whose grammar is still compiling (vLLM 0.33.0
    # WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR): in the waiting queue, passed over until it is ready.
    WAITING_FOR_GRAMMAR = "WAITING_FOR_GRAMMAR"
    # A streaming-input session whose generation for its inputs so far is done and whose next input
    # has not arrived (vLLM 0.33.0 WAITING_FOR_STREAMING_REQ; spec/session.py): in the waiting
    # queue, passed over, and holding its KV blocks, until the input comes.
    WAITING_FOR_INPUT = "WAITING_FOR_INPUT"

    # Read on every check of every step: plain attributes, set once below, not properties.
    is_finished: bool
    queue: str | None  # the queue that holds a request in this status (None once finished)


_QUEUE_OF = {Status.WAITING: "waiting", Status.RUNNING: "running", Status.SWAPPED: "swapped",
             Status.WAITING_FOR_REMOTE_KV: "waiting",
             Status.WAITING_FOR_GRAMMAR: "waiting", Status.WAITING_FOR_INPUT: "waiting"}

for _status in Status:
    _status.is_finished = _status.value.startswith("FINISHED_")
    _status.queue = _QUEUE_OF.get(_status)

QUEUES: tuple[str, ...] = ("waiting", "running", "swapped")
FINISHED_STATUSES: tuple[Status, ...] = tuple(s for s in Status if s.is_finished)


class PreemptionMode(StrEnum):
    RECOMPUTE = "recompute"
    SWAP = "swap"
