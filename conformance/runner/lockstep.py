"""Lockstep comparison: the reference and a target take the same trace; their decisions must agree.

Compared per step: the scheduled sequences with token counts and prefill flags (as a set: batch
order is free), the preempted requests with modes, the ignored and swapped-in requests, the
finished requests with statuses, and the sizes of the swap and copy maps (physical block ids
may differ: agreement is up to a renaming of blocks). A request the target refused at the door
(add_request answered FINISHED_IGNORED) counts as ignored in that step: the refusal is the same
decision as the reference's ignore in the step the request arrives, taken one call earlier.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spec.types import Finished, SchedulerOutput


@dataclass(frozen=True)
class Divergence:
    step: int
    field: str
    reference: Any
    target: Any
    reasons: tuple[str, ...]  # why the reference did what it did

    def describe(self) -> str:
        lines = [
            f"step {self.step}: {self.field} differs",
            f"  reference: {self.reference}",
            f"  target:    {self.target}",
        ]
        if self.reasons:
            lines.append("  the reference decided so because:")
            lines.extend(f"    {r}" for r in self.reasons)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "field": self.field, "reference": _jsonable(self.reference),
                "target": _jsonable(self.target), "reasons": list(self.reasons)}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple, list)):
        return sorted((_jsonable(v) for v in value), key=str)
    return value


def decisions(output: SchedulerOutput, finished: tuple[Finished, ...],
              refused: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {
        "scheduled": frozenset((s.seq_id, s.num_tokens, s.is_prefill) for s in output.scheduled),
        "preempted": frozenset((p.request_id, p.mode.value) for p in output.preempted),
        "ignored": frozenset(output.ignored) | refused,
        "swapped_in": frozenset(output.swapped_in),
        "swap_out_blocks": len(output.swap_out),
        "swap_in_blocks": len(output.swap_in),
        "copies": len(output.copies),
        "finished": frozenset((f.request_id, f.status.value) for f in finished),
    }


def compare(
    step: int,
    reference: SchedulerOutput,
    reference_finished: tuple[Finished, ...],
    target: SchedulerOutput,
    target_finished: tuple[Finished, ...],
    target_refused: frozenset[str] = frozenset(),
) -> Divergence | None:
    want, got = decisions(reference, reference_finished), decisions(target, target_finished, target_refused)
    for field, value in want.items():
        if got[field] != value:
            return Divergence(step, field, value, got[field], tuple(r.text() for r in reference.reasons))
    return None
