"""Run the museum: the conformance runner against every exhibit.

Each exhibit is fuzzed with `conformance.runner.fuzz.fuzz` under its profile, with a fixed seed and a
bounded number of examples; the search stops as soon as one of the exhibit's expected problems
is found, and each problem found is shrunk to a short trace. An exhibit is *caught* when an
expected problem was found, its shrunk trace has at most `MAX_STEPS` steps, and the reference
shows no problem on that trace.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.flows.profiles import get_profile
from conformance.runner.adapter import SchedulerAdapter
from conformance.runner.driver import run_checked
from conformance.runner.fuzz import Finding, fuzz
from conformance.runner.plan import RunPlan
from conformance.selftest.museum.exhibits import EXHIBITS, Exhibit
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
    reference_passes: bool | None = None  # the reference shows no problem on the counterexample

    @property
    def caught(self) -> bool:
        return (
            self.caught_by is not None and self.steps is not None and self.steps <= MAX_STEPS
            and bool(self.reference_passes)
        )

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
            "reference_passes": self.reference_passes,
            "counterexample": str(self.finding.path) if self.finding and self.finding.path else None,
            "trace": self.finding.trace.to_dict() if self.finding else None,  # replayable: kvsched replay
        }


def make_adapter(exhibit: Exhibit) -> SchedulerAdapter:
    """The exhibit's mutant behind the standard adapter. It claims no profile, so the runner checks
    invariants only (no lockstep with the reference, which every mutant would fail)."""
    adapter = SchedulerAdapter(f"museum:{exhibit.id}", exhibit.factory, profiles=("museum",),
                               reservation=exhibit.reservation)
    adapter.capabilities = (exhibit.reference or Scheduler).capabilities  # type: ignore[attr-defined]
    return adapter


def run_exhibit(
    exhibit: Exhibit, out_dir: Path, *, max_examples: int = MAX_EXAMPLES, seed: int = SEED
) -> ExhibitResult:
    expected = set(exhibit.expected)
    started = time.monotonic()
    plan = RunPlan(get_profile(exhibit.profile), out_dir / exhibit.id, max_examples=max_examples, seed=seed, timeout=None)
    result = fuzz(lambda: make_adapter(exhibit), plan, strategy=exhibit.strategy() if exhibit.strategy else None,
                  stop_when=lambda problems: bool(problems & expected), shrink_only=expected.__contains__)
    problems = {p: f.steps for p, f in result.findings.items()}
    hits = sorted((f.steps, exhibit.expected.index(p), p) for p, f in result.findings.items() if p in expected)
    caught_by = hits[0][2] if hits else None
    finding = result.findings.get(caught_by) if caught_by else None
    seconds = time.monotonic() - started
    passes = reference_problems(exhibit, finding.trace) == set() if finding else None
    return ExhibitResult(
        exhibit, caught_by, hits[0][0] if hits else None, seconds, result.examples, problems, finding, passes
    )


def reference_problems(exhibit: Exhibit, trace) -> set[str]:
    """What the runner finds on ``trace`` with the reference scheduler under the exhibit's profile."""
    reference = exhibit.reference or Scheduler
    adapter = SchedulerAdapter("reference", reference, profiles=("museum",), reservation=exhibit.reservation)
    adapter.capabilities = reference.capabilities  # type: ignore[attr-defined]
    return run_checked(adapter, trace, get_profile(exhibit.profile).invariants(), timeout=None).problem_ids


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
