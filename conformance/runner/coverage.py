"""What a run reached: lifecycle edges taken, for each invariant how many steps had
something for it to check (a swap for the swap maps, a fork for copy-on-write, ...), and how
many steps had each of a few scheduler events (`EVENTS`: a fork, a copy-on-write, a swap-in) that
a coverage gate can hold a campaign to a rate of (`conformance.targets.reach.Reach.least_steps`).

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
_BY_ID: dict[str, Exercised] = {
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


def _forked(r: StepRecord) -> bool:
    """A sequence past a request's first (``<request>#1`` on) appeared in this step."""
    before, after = r.before.seqs or {}, r.after.seqs or {}
    return any(sid not in before and not sid.endswith("#0") for sid in after)


# Scheduler events counted per step, by lower-case name (never an invariant id's shape).
EVENTS: dict[str, Exercised] = {
    "fork": _forked,
    "copy_on_write": lambda r: bool(r.output.copies),
    "swap_in": lambda r: bool(r.output.swap_in),
}


def step_tests(invariant_ids: Iterable[str]) -> dict[str, Exercised]:
    """What a run counts per step: each invariant's `exercised` test and every event of `EVENTS`
    (the worker and the isolated runner send the counts back in `TraceSummary.exercised`)."""
    return {**{i: exercised(i) for i in invariant_ids}, **EVENTS}


class Coverage:
    def __init__(self, invariant_ids: Iterable[str]) -> None:
        self.ids = list(invariant_ids)
        self.steps: Counter[str] = Counter()
        self.edges: Counter[tuple[str, str, str]] = Counter()
        self.events: Counter[str] = Counter()  # event name (EVENTS) -> steps it happened in
        self._tests = {i: exercised(i) for i in self.ids}

    def add(self, records: list[StepRecord]) -> None:
        for record in records:
            for i, test in self._tests.items():
                if test(record):
                    self.steps[i] += 1
            for name, test in EVENTS.items():
                if test(record):
                    self.events[name] += 1
        for edge, n in lifecycle_coverage(records).items():
            self.edges[edge] += n

    def add_counts(self, steps: Counter[str], edges: Counter[tuple[str, str, str]]) -> None:
        """Add what a run counted elsewhere (an isolated adapter's process: `TraceSummary`)."""
        self.steps.update({i: n for i, n in steps.items() if i in self._tests})
        self.events.update({name: n for name, n in steps.items() if name in EVENTS})
        self.edges.update(edges)

    def unreached_edges(self) -> list[tuple[str, str, str]]:
        return [e for e in lifecycle_coverage([]) if not self.edges[e]]

    def to_dict(self) -> dict[str, object]:
        return {
            "invariant_steps": {i: self.steps[i] for i in self.ids},
            "event_steps": {name: self.events[name] for name in EVENTS},
            "lifecycle_edges": [{"from": a, "to": b, "action": c, "count": self.edges[(a, b, c)]}
                                for (a, b, c) in lifecycle_coverage([])],
        }
