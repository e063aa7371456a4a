"""What a run reached: lifecycle edges taken, for each invariant how many subjects it checked
with its trigger holding (a swap for the swap maps, a fork for copy-on-write, a draft for the
speculative family, a running sequence for residency, ...), and how many steps had each of a few
scheduler events (`EVENTS`: a fork, a copy-on-write, a swap-in) that a coverage gate can hold a
campaign to a rate of (`conformance.targets.reach.Reach.least_steps`).

The counts come from the invariants' own declarations (`spec.rules`: ``about`` and ``when``),
counted by the checker as it runs (`spec.invariants._evaluation`), not from a table kept here.
An invariant that passed but was never exercised is not evidence: the report calls it
``vacuous``, apart from ``pass``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from spec.lifecycle import coverage as lifecycle_coverage
from spec.observation import StepRecord


def _forked(r: StepRecord) -> bool:
    """A sequence past a request's first (``<request>#1`` on) appeared in this step."""
    before, after = r.before.seqs or {}, r.after.seqs or {}
    return any(sid not in before and not sid.endswith("#0") for sid in after)


# Scheduler events counted per step, by lower-case name (never an invariant id's shape).
EVENTS: dict[str, Callable[[StepRecord], bool]] = {
    "fork": _forked,
    "copy_on_write": lambda r: bool(r.output.copies),
    "swap_in": lambda r: bool(r.output.swap_in),
}


class Coverage:
    def __init__(self, invariant_ids: Iterable[str]) -> None:
        self.ids = list(invariant_ids)
        self.steps: Counter[str] = Counter()  # invariant id -> subjects checked with its trigger holding
        self.edges: Counter[tuple[str, str, str]] = Counter()
        self.events: Counter[str] = Counter()  # event name (EVENTS) -> steps it happened in

    def add_counts(self, steps: Counter[str], edges: Counter[tuple[str, str, str]]) -> None:
        """Add what one trace counted (`conformance.runner.summary.TraceSummary`: the invariants'
        subjects and, under their lower-case names, the events)."""
        known = set(self.ids)
        self.steps.update({i: n for i, n in steps.items() if i in known})
        self.events.update({name: n for name, n in steps.items() if name in EVENTS})
        self.edges.update(edges)

    def vacuous(self, invariant_id: str) -> bool:
        """Whether the invariant's trigger never held in the run."""
        return not self.steps[invariant_id]

    def unreached_edges(self) -> list[tuple[str, str, str]]:
        return [e for e in lifecycle_coverage([]) if not self.edges[e]]

    def to_dict(self) -> dict[str, object]:
        return {
            "invariant_steps": {i: self.steps[i] for i in self.ids},
            "event_steps": {name: self.events[name] for name in EVENTS},
            "lifecycle_edges": [{"from": a, "to": b, "action": c, "count": self.edges[(a, b, c)]}
                                for (a, b, c) in lifecycle_coverage([])],
        }
