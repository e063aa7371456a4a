"""A reference that keeps its state after every step, for lockstep campaigns that compare the
engine's state with the reference's and not only their decisions."""

from __future__ import annotations

from typing import Any

from spec.config import SchedulerConfig
from spec.observation import Snapshot


class RecordsSnapshots:
    """Mixin for a reference scheduler class: ``after[k]`` is its snapshot once step k's
    outcome has been applied. Put it first: ``class Recorded(RecordsSnapshots, NanoScheduler)``."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)  # type: ignore[call-arg]
        self.after: list[Snapshot] = []

    def update(self, outcome: Any) -> Any:
        finished = super().update(outcome)  # type: ignore[misc]
        self.after.append(self.snapshot())  # type: ignore[attr-defined]
        return finished
