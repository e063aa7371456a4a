"""Run the museum: the conformance runner against every exhibit.

Each exhibit is fuzzed with `conformance.fuzz.fuzz` under its profile, with a fixed seed and a
bounded number of examples; the search stops as soon as one of the exhibit's expected problems
is found, and each problem found is shrunk to a short trace. An exhibit is *caught* when an
expected problem was found and its shrunk trace has at most `MAX_STEPS` steps.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.adapter import SchedulerAdapter
from conformance.fuzz import Finding, fuzz
from conformance.museum.exhibits import EXHIBITS, Exhibit
from conformance.profiles import get_profile
from reference_impl.scheduler import Scheduler

MAX_STEPS = 10
MAX_EXAMPLES = 300
SEED = 20240609
MUSEUM_VERSION = 1


@dataclass
class ExhibitResult:
    exhibit: Exhibit
    caught_by: str | None  # the expected problem that caught it (the one with the shortest trace)
    steps: int | None  # steps in that problem's shrunk trace
    seconds: float
    examples: int
    problems: dict[str, int] = field(default_factory=dict)  # every problem found -> steps of its shrunk trace
    finding: Finding | None = None

    @property
    def caught(self) -> bool:
        return self.caught_by is not None and self.steps is not None and self.steps <= MAX_STEPS

    def to_dict(self) -> dict[str, Any]:
        e = self.exhibit
        return {
            "id": e.id,
            "title": e.title,
            "source": e.source_label,
            "url": e.url,
            "profile": e.profile,
            "expected": list(e.expected),
            "caught": self.caught,
            "caught_by": self.caught_by,
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "examples": self.examples,
            "problems": dict(sorted(self.problems.items())),
            "counterexample": str(self.finding.path) if self.finding and self.finding.path else None,
        }


def make_adapter(exhibit: Exhibit) -> SchedulerAdapter:
    """The exhibit's mutant behind the standard adapter. It claims no profile, so the runner checks
    invariants only (no lockstep with the reference, which every mutant would fail)."""
    adapter = SchedulerAdapter(f"museum:{exhibit.id}", exhibit.factory, profiles=("museum",))
    adapter.capabilities = Scheduler.capabilities
    return adapter


def run_exhibit(
    exhibit: Exhibit, out_dir: Path, *, max_examples: int = MAX_EXAMPLES, seed: int = SEED
) -> ExhibitResult:
    expected = set(exhibit.expected)
    started = time.monotonic()
    result = fuzz(
        lambda: make_adapter(exhibit),
        get_profile(exhibit.profile),
        max_examples=max_examples,
        seed_value=seed,
        out_dir=out_dir / exhibit.id,
        strategy=exhibit.strategy() if exhibit.strategy else None,
        stop_when=lambda problems: bool(problems & expected),
        hypothesis_shrink=False,
        timeout=None,  # the mutants are in-process Python: no worker thread per call
    )
    seconds = time.monotonic() - started
    problems = {p: f.steps for p, f in result.findings.items()}
    hits = sorted((f.steps, exhibit.expected.index(p), p) for p, f in result.findings.items() if p in expected)
    caught_by = hits[0][2] if hits else None
    return ExhibitResult(
        exhibit, caught_by, hits[0][0] if hits else None, seconds, result.examples, problems,
        result.findings.get(caught_by) if caught_by else None,
    )


def run_museum(
    exhibits: Iterable[Exhibit] = EXHIBITS,
    out_dir: Path | None = None,
    *,
    max_examples: int = MAX_EXAMPLES,
    seed: int = SEED,
    on_result: Callable[[ExhibitResult], None] | None = None,
) -> list[ExhibitResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="kvsched-museum-") as tmp:
        base = out_dir if out_dir is not None else Path(tmp)
        for exhibit in exhibits:
            r = run_exhibit(exhibit, base, max_examples=max_examples, seed=seed)
            if out_dir is None and r.finding is not None:
                r.finding.path = None  # the temporary folder is about to go
                r.finding.html = None
            results.append(r)
            if on_result:
                on_result(r)
    return results


def all_caught(results: Iterable[ExhibitResult]) -> bool:
    return all(r.caught for r in results)


def to_json(results: list[ExhibitResult], seconds: float) -> dict[str, Any]:
    return {
        "version": MUSEUM_VERSION,
        "seed": SEED,
        "max_steps": MAX_STEPS,
        "all_caught": all_caught(results),
        "seconds": round(seconds, 3),
        "exhibits": [r.to_dict() for r in results],
    }
