"""The fuzz driver: Hypothesis generates traces, every step is checked, every failure is kept.

Nothing is lost: Hypothesis keeps failing examples in its example database under the output
folder, and the first failing trace of each problem is written to disk the moment it is seen
(``<out>/found/<ID>.json``), before any shrinking. When the search ends, each problem's
smallest trace is shrunk again for that problem alone and written to
``<out>/counterexamples/<ID>.json`` (with an HTML view beside it when available).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, assume, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from conformance.adapter import Adapter
from conformance.coverage import Coverage
from conformance.driver import TraceResult, run_checked
from conformance.generate import traces
from conformance.profiles import Profile
from conformance.shrink import shrink, size


@dataclass
class Finding:
    problem: str  # an invariant ID, LOCKSTEP, or FAULT-<kind>
    message: str
    trace: object  # spec.trace.Trace
    steps: int  # steps in the trace up to and including the failing one
    path: Path | None = None
    html: Path | None = None


@dataclass
class FuzzResult:
    adapter: str
    profile: str
    seed: int
    examples: int = 0
    steps_checked: int = 0
    seconds: float = 0.0
    findings: dict[str, Finding] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    coverage: Coverage | None = None
    lockstep: bool = False


class _Failed(Exception):
    pass


def _message(result: TraceResult, problem: str) -> str:
    if problem == "LOCKSTEP" and result.divergence:
        return result.divergence.describe()
    if problem.startswith("FAULT-") and result.fault:
        return f"step {result.fault_step}: {result.fault}"
    for v in result.violations:
        if v.invariant_id == problem:
            return str(v)
    return problem


def _failing_step(result: TraceResult) -> int:
    step = result.failure_step
    return step if step is not None else max(len(result.records) - 1, 0)


def fuzz(
    make_adapter: Callable[[], Adapter],
    profile: Profile,
    *,
    max_examples: int = 100,
    time_budget: float | None = None,
    seed_value: int = 0,
    out_dir: Path,
    timeout: float = 10.0,
    strategy: st.SearchStrategy | None = None,
    on_example: Callable[[FuzzResult], None] | None = None,
    stop_when: Callable[[frozenset[str]], bool] | None = None,
    hypothesis_shrink: bool = True,
) -> FuzzResult:
    """Search for traces that break ``profile``'s invariants on the adapter, then shrink each problem.

    ``stop_when(problems)``, if given, ends the search early once it returns true for the set of
    problems found so far (the bug museum stops at an exhibit's expected invariant).
    ``hypothesis_shrink=False`` skips Hypothesis's own shrinking of each failing example; the
    per-problem shrink below still runs (the museum uses it to stay fast).
    """
    adapter = make_adapter()
    if strategy is None and hasattr(adapter, "trace_strategy"):
        strategy = adapter.trace_strategy()  # an adapter may narrow the configs its engine accepts
    lockstep = profile.lockstep and profile.name in getattr(adapter, "profiles", ())
    fuzz_result = FuzzResult(adapter.name, profile.name, seed_value, lockstep=lockstep)
    invariants = profile.invariants()
    fuzz_result.coverage = Coverage([inv.id for inv in invariants])
    found_dir = out_dir / "found"
    best: dict[str, tuple[tuple[int, ...], object, str]] = {}
    state = {"adapter": adapter}
    started = time.monotonic()
    deadline = started + time_budget if time_budget else None

    def run_one(trace) -> TraceResult:
        result = run_checked(state["adapter"], trace, invariants, timeout=timeout, lockstep=lockstep,
                             reference_factory=profile.make_reference)
        if result.fault is not None and result.fault.kind == "hang":
            state["adapter"] = make_adapter()  # a hung adapter is abandoned, never reused
        return result

    def search_round(round_seed: int, examples: int, known: frozenset[str]) -> bool:
        """One Hypothesis search that fails (and shrinks) on a problem not in ``known``."""

        @settings(
            max_examples=examples,
            database=DirectoryBasedExampleDatabase(str(out_dir / "hypothesis")),
            deadline=None,
            suppress_health_check=list(HealthCheck),
            verbosity=Verbosity.quiet,
            report_multiple_bugs=False,
            **({} if hypothesis_shrink else {"phases": (Phase.explicit, Phase.reuse, Phase.generate)}),
        )
        @seed(round_seed)
        @given(strategy if strategy is not None else traces())
        def search(trace) -> None:
            if deadline is not None and time.monotonic() > deadline:
                assume(False)  # out of time: let Hypothesis wind down quickly
            result = run_one(trace)
            fuzz_result.examples += 1
            fuzz_result.steps_checked += len(result.records)
            fuzz_result.active = [i.id for i in result.active] or fuzz_result.active
            fuzz_result.not_applicable = [i.id for i in result.not_applicable] or fuzz_result.not_applicable
            fuzz_result.coverage.add(result.records)
            for problem in sorted(result.problem_ids):
                key = size(trace, _failing_step(result))
                if problem not in best or key < best[problem][0]:
                    best[problem] = (key, trace, _message(result, problem))
                    trace.save(found_dir / f"{problem}.json")  # on disk before any shrinking
            if on_example:
                on_example(fuzz_result)
            new = result.problem_ids - known
            if new:
                raise _Failed(", ".join(sorted(new)))

        try:
            search()
        except _Failed:
            return True
        except Exception as err:  # noqa: BLE001 - Hypothesis may wrap failures; findings are already recorded
            if not best:
                raise RuntimeError(f"the fuzz run stopped unexpectedly: {type(err).__name__}: {err}") from err
            return True
        return False

    # Hypothesis stops at the first failure; keep searching, past the problems already found,
    # until the example or time budget is spent, so one bug does not hide the others.
    for round_index in range(64):
        remaining = max_examples - fuzz_result.examples
        if remaining <= 0 or (deadline is not None and time.monotonic() > deadline):
            break
        if stop_when is not None and stop_when(frozenset(best)):
            break
        if not search_round(seed_value + round_index, remaining, frozenset(best)):
            break

    for problem, (_, trace, message) in sorted(best.items()):
        def failing(candidate, problem=problem):
            result = run_one(candidate)
            return _failing_step(result) if problem in result.problem_ids else None

        # A hang costs a whole timeout per try: shrink those with a small budget.
        tries = 25 if problem == "FAULT-hang" else 400
        try:
            small, step = shrink(trace, failing, budget=tries)
        except ValueError:  # flaky: no longer fails alone; keep what was seen
            small, step = trace, _failing_step(run_one(trace))
        final = run_one(small)
        finding = Finding(problem, _message(final, problem) if problem in final.problem_ids else message, small, step + 1)
        meta = {**dict(small.meta), "adapter": adapter.name, "profile": profile.name, "problem": problem,
                "message": finding.message, "steps": finding.steps}
        small = type(small)(small.config, small.arrivals, small.aborts, small.stops, small.max_steps, meta)
        finding.trace = small
        finding.path = small.save(out_dir / "counterexamples" / f"{problem}.json")
        finding.html = _write_html(finding.path.with_suffix(".html"), small, final)
        fuzz_result.findings[problem] = finding
    fuzz_result.seconds = time.monotonic() - started
    return fuzz_result


def _write_html(path: Path, trace, result: TraceResult) -> Path | None:
    try:
        from conformance.html_view import write_html
    except ImportError:
        return None
    try:
        write_html(path, trace, result.records, result.violations)
    except Exception:  # noqa: BLE001 - the page is a convenience; the JSON trace is the evidence
        return None
    return path
