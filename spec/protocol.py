"""The interface every scheduler under test presents: the reference, the torch twin's engines,
and adapters around third-party schedulers.

It is deliberately the shape of vLLM's own engine loop (add, abort, schedule, feed the outcome
back) plus one optional window onto the state, `snapshot()`, whose parts are governed by
``capabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from spec.observation import Capability, Snapshot
from spec.types import Finished, Request, SchedulerOutput, StepOutcome


@runtime_checkable
class SchedulerLike(Protocol):
    capabilities: frozenset[Capability]

    def add_request(self, request: Request) -> None: ...

    def abort_request(self, request_id: str) -> Finished | None:
        """Abort in any state; ``None`` when the id is unknown or already finished."""
        ...

    def schedule(self) -> SchedulerOutput: ...

    def update(self, outcome: StepOutcome) -> Sequence[Finished]:
        """Feed back the step's outcome; return requests finished in this step (ignored ones too)."""
        ...

    def snapshot(self) -> Snapshot: ...


# Optional calls (issue 21): a scheduler may also have these. The driver uses them only when a
# trace asks for them (`spec.trace.Trace.abort_batches` / ``admin``), and `supports` says whether
# it may:
#
#     abort_requests(request_ids: Sequence[str]) -> Sequence[Finished]
#         One abort call naming many ids (vLLM's EngineCore.abort_requests); unknown and finished
#         ids are skipped; returns the requests it aborted. Without it, the driver aborts the ids one
#         by one in the order given, which is the same thing for the spec.
#     reset_prefix_cache() -> bool
#         Empty the prefix cache's hash map if no block is in use and answer True; otherwise change
#         nothing and answer False (vLLM's Scheduler.reset_prefix_cache(), without
#         reset_running_requests). A trace with this call cannot run on a scheduler without it.
#     pause_new() / pause_all() / resume() -> bool
#         vLLM's Scheduler.set_pause_state: while paused_new no waiting request is admitted, while
#         paused_all nothing is scheduled; resume lifts either. Requests added meanwhile wait and
#         run after the resume (PAU-001; nothing is lost: REQ-002, LIV-002).
OPTIONAL_CALLS = ("abort_requests", "reset_prefix_cache", "pause_new", "pause_all", "resume")


def supports(scheduler: object, call: str) -> bool:
    """Whether ``scheduler`` has the optional ``call``: an adapter that fronts another process says
    so in ``optional_calls`` (a wire host's ``hello``); any other object by having the method."""
    assert call in OPTIONAL_CALLS, call
    declared = getattr(scheduler, "optional_calls", None)
    if declared is not None:
        return call in declared
    return callable(getattr(scheduler, call, None))
