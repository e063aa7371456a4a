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
