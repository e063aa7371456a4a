"""What a run reached: lifecycle edges taken, and for each invariant how many steps had
something for it to check (a swap for the swap maps, a fork for copy-on-write, ...).

An invariant that passed but was never exercised is not evidence; the report shows these so a
user sees what the run did not reach.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from spec.lifecycle import coverage as lifecycle_coverage
from spec.observation import StepRecord
from spec.status import PreemptionMode

Exercised = Callable[[StepRecord], bool]


def _preempted(mode: PreemptionMode | None = None) -> Exercised:
    return lambda r: any(mode in (None, p.mode) for p in r.output.preempted)


_BY_FAMILY: dict[str, Exercised] = {
    "COW": lambda r: bool(r.output.copies),
    "ADM": lambda r: any(s.is_prefill for s in r.output.scheduled),
    "BUD": lambda r: bool(r.output.scheduled),
    "REQ": lambda r: bool(r.finished) or bool(r.output.preempted),
    "OUT": lambda r: bool(r.output.scheduled),
    "LIV": lambda r: True,
}
def _encoder_held(r: StepRecord) -> bool:
    """Some encoder output is held after the step (the ENC-* invariants have a holder to check)."""
    return any(e.users for e in (r.after.encoder_cache or {}).values())


_BY_ID: dict[str, Exercised] = {
    # Issue 32 (spec/invariants/encoder.py): steps with encoder work or held encoder outputs; for LoRA,
    # a step whose reasons say max_loras bound (a request passed over for its adapter).
    "ENC-001": lambda r: bool(r.output.encoder_inputs),
    "ENC-002": lambda r: bool(r.after.encoder_cache) or bool(r.output.encoder_inputs),
    "ENC-003": _encoder_held,
    "ENC-004": lambda r: bool(r.output.encoder_inputs) or _encoder_held(r),
    "ENC-005": lambda r: not r.output.scheduled and bool(r.after.encoder_cache),
    "LORA-001": lambda r: any(x.kind == "wait_lora_slots" for x in r.output.reasons),
    "PAU-001": lambda r: r.before.pause_state not in (None, "unpaused"),
    "BLK-002": lambda r: bool(r.output.swap_out or r.output.swap_in),
    "BLK-004": lambda r: bool(r.output.swap_out),
    "RES-002": lambda r: bool(r.output.swap_out or (r.before.swapped or ())),
    "RES-003": _preempted(PreemptionMode.RECOMPUTE),
    "CAP-003": _preempted(PreemptionMode.RECOMPUTE),
    "LEN-001": lambda r: any(f.status.value == "FINISHED_LENGTH_CAPPED" for f in r.finished),
    # An over-long prompt offered: ignored by the scheduler, or refused at the door (vLLM V1's host).
    "LEN-002": lambda r: bool(r.output.ignored or r.refused),
    "LEN-003": lambda r: bool(r.output.ignored or r.refused),
    "REQ-005": lambda r: any(f.status.value == "FINISHED_STOPPED" for f in r.finished),
    "SWP-001": lambda r: bool(r.output.swap_out),
    "SWP-002": lambda r: bool(r.output.swap_in),
    "SWP-003": lambda r: bool(r.output.swap_out),
    "OUT-002": _preempted(),
    "REQ-004": _preempted(),
    "POL-001": lambda r: len(r.before.waiting or ()) > 1,
    "POL-002": lambda r: bool(r.before.swapped),
    "POL-003": _preempted(),
    "POL-004": _preempted(PreemptionMode.RECOMPUTE),
    "POL-005": lambda r: any(s.is_prefill for s in r.output.scheduled) and bool(r.before.running),
    "LIV-003": lambda r: bool(r.before.waiting) and not r.before.running and not r.before.swapped,
}


def exercised(invariant_id: str) -> Exercised:
    family = invariant_id.split("-")[0]
    return _BY_ID.get(invariant_id) or _BY_FAMILY.get(family) or (lambda r: True)


class Coverage:
    def __init__(self, invariant_ids: Iterable[str]) -> None:
        self.ids = list(invariant_ids)
        self.steps: Counter[str] = Counter()
        self.edges: Counter[tuple[str, str, str]] = Counter()
        self._tests = {i: exercised(i) for i in self.ids}

    def add(self, records: list[StepRecord]) -> None:
        for record in records:
            for i, test in self._tests.items():
                if test(record):
                    self.steps[i] += 1
        for edge, n in lifecycle_coverage(records).items():
            self.edges[edge] += n

    def add_counts(self, steps: Counter[str], edges: Counter[tuple[str, str, str]]) -> None:
        """Add what a run counted elsewhere (an isolated adapter's process: `TraceSummary`)."""
        self.steps.update({i: n for i, n in steps.items() if i in self._tests})
        self.edges.update(edges)

    def unreached_edges(self) -> list[tuple[str, str, str]]:
        return [e for e in lifecycle_coverage([]) if not self.edges[e]]

    def to_dict(self) -> dict[str, object]:
        return {
            "invariant_steps": {i: self.steps[i] for i in self.ids},
            "lifecycle_edges": [{"from": a, "to": b, "action": c, "count": self.edges[(a, b, c)]}
                                for (a, b, c) in lifecycle_coverage([])],
        }
