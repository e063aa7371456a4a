"""What a run reached: lifecycle edges taken, and for each invariant how many subjects it
checked with its trigger holding (a swap for the swap maps, a fork for copy-on-write, a draft
for the speculative family, a running sequence for residency, ...).

The counts come from the invariants' own declarations (`spec.rules`: ``about`` and ``when``),
counted by the checker as it runs (`spec.invariants._evaluation`), not from a table kept here.
An invariant that passed but was never exercised is not evidence: the report calls it
``vacuous``, apart from ``pass``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from spec.lifecycle import coverage as lifecycle_coverage


class Coverage:
    def __init__(self, invariant_ids: Iterable[str]) -> None:
        self.ids = list(invariant_ids)
        self.steps: Counter[str] = Counter()  # invariant id -> subjects checked with its trigger holding
        self.edges: Counter[tuple[str, str, str]] = Counter()

    def add_counts(self, steps: Counter[str], edges: Counter[tuple[str, str, str]]) -> None:
        """Add what one trace counted (`conformance.runner.summary.TraceSummary`)."""
        known = set(self.ids)
        self.steps.update({i: n for i, n in steps.items() if i in known})
        self.edges.update(edges)

    def vacuous(self, invariant_id: str) -> bool:
        """Whether the invariant's trigger never held in the run."""
        return not self.steps[invariant_id]

    def unreached_edges(self) -> list[tuple[str, str, str]]:
        return [e for e in lifecycle_coverage([]) if not self.edges[e]]

    def to_dict(self) -> dict[str, object]:
        return {
            "invariant_steps": {i: self.steps[i] for i in self.ids},
            "lifecycle_edges": [{"from": a, "to": b, "action": c, "count": self.edges[(a, b, c)]}
                                for (a, b, c) in lifecycle_coverage([])],
        }
