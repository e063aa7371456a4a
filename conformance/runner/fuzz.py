"""The fuzz driver: Hypothesis generates traces, every step is checked, every failure is kept.

1. Saved failures first. Every trace already in ``<out>/counterexamples/`` and ``<out>/found/``
   that was found with this adapter and profile is run again before anything new is generated,
   so a rerun with the same ``--out`` finds what an earlier (perhaps interrupted) run found;
   then those of a shared example database (``--redis``, `conformance.runner.example_db`), which any
   run of this adapter spec and profile, on any machine, fed.
2. Search. Hypothesis draws up to ``max_examples`` traces (never more: the count is of traces
   run, and Hypothesis' own shrinking is off). Each runs whole: a violation does not end its
   trace, so every invariant a trace breaks is seen, each at its own first step
   (`conformance.runner.driver`). The first failing trace of each problem is written to
   ``<out>/found/<ID>.json`` and ``<out>/counterexamples/<ID>.json`` (and the shared database)
   the moment it is seen, before any shrinking; a smaller one found later replaces it in
   ``counterexamples/``.
3. Shrink. Each problem's smallest trace is shrunk again for that problem alone
   (`conformance.runner.shrink`) and written over ``<out>/counterexamples/<ID>.json``, with an HTML
   view beside it; in the shared database it takes the place of the unshrunk ones.

Ctrl-C (and SIGTERM, which ``kvsched conform`` turns into the same) stops the search: what was
found is already on disk, and the result says ``interrupted``. Expected failures
(`conformance.runner.expectations`) are found, shrunk and saved like any other; the report sets them
apart.

The adapter is reached through a runner: `conformance.runner.isolated.ChildRunner` (its own process;
what ``kvsched conform`` and the pytest plugin use) or `conformance.runner.isolated.LocalRunner` (this
process; pass a plain ``make_adapter`` callable).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from conformance.runner.coverage import Coverage
from conformance.runner.example_db import SharedExamples
from conformance.runner.isolated import LocalRunner
from conformance.runner.plan import RunPlan
from conformance.runner.shrink import shrink, size
from conformance.runner.summary import TraceSummary
from spec.domain import ConfigDomain
from spec.errors import InputError
from spec.trace import Trace


@dataclass
class Finding:
    problem: str  # an invariant ID, LOCKSTEP, or FAULT-<kind>
    message: str
    trace: object  # spec.trace.Trace
    steps: int  # steps in the trace up to and including the failing one
    path: Path | None = None
    html: Path | None = None
    location: str | None = None  # FAULT-*: the adapter's file:line, where known
    shrunk: bool = True
    # Why the trace could not be written to ``path`` (``--out`` gone, replaced by a file, a link
    # planted in it): the finding stands all the same, and the command prints the trace instead.
    unsaved: str | None = None
    flaky: bool = False  # did not fail again alone in a fresh process (`_flaky_finding`)


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
    adapter_spec: str | None = None  # how to load the adapter again (for replay commands)
    expected: dict[str, str] = field(default_factory=dict)  # problem -> reason (from --expect)
    skipped: dict[str, str] = field(default_factory=dict)  # id -> reason (--skip, --expect)
    expectations_file: str | None = None  # where ``expected`` and ``skipped`` were read from
    replayed: int = 0  # saved traces run again before the search
    interrupted: bool = False
    stopped_early: str | None = None  # why the search ended before its budget, if it did
    reservation: dict[str, Any] | None = None  # what the adapter declares it reserves (CAP-006), as reported
    # Parts of the profile that did not run on this adapter, each with why (the report says so):
    # a run is never silently weaker than the profile it names.
    not_run: dict[str, str] = field(default_factory=dict)

    @property
    def unexpected(self) -> dict[str, Finding]:
        """Findings the expectations do not list: these make a run fail."""
        return {p: f for p, f in self.findings.items() if p not in self.expected}

    @property
    def expected_found(self) -> dict[str, Finding]:
        """Findings the expectations list: known deviations, seen again."""
        return {p: f for p, f in self.findings.items() if p in self.expected}


# Faults that end the adapter's process: each costs a process start (and a hang a whole timeout).
FATAL = frozenset({"FAULT-hang", "FAULT-exit", "FAULT-crash", "FAULT-memory", "FAULT-output", "FAULT-signal"})
FATAL_REPEATS = 5  # after this many traces ended by the same one, the search stops (and says why)


class _Stop(Exception):
    """Ends the search: the example or time budget is spent, or ``stop_when`` said so."""


def _runner_for(make_adapter: Any, timeout: float) -> Any:
    return make_adapter if hasattr(make_adapter, "run") else LocalRunner(make_adapter, timeout)


def fuzz(
    make_adapter: Callable[[], Any] | Any,
    plan: RunPlan,
    *,
    strategy: st.SearchStrategy | None = None,
    on_example: Callable[[FuzzResult], None] | None = None,
    stop_when: Callable[[frozenset[str]], bool] | None = None,
    shared: SharedExamples | None = None,
    shrink_only: Callable[[str], bool] | None = None,
) -> FuzzResult:
    """Search for traces that break ``profile``'s invariants on the adapter, then shrink each problem.

    ``plan`` says what to search (`conformance.runner.plan.RunPlan`). ``make_adapter`` is a runner (`conformance.runner.isolated.ChildRunner`) or a callable returning an
    adapter, run in this process. ``stop_when(problems)``, if given, ends the search early once
    it returns true for the set of problems found so far (the bug museum stops at an exhibit's
    expected invariant). A runner with its own process draws the traces there, in seeded batches
    (`conformance.runner.workers`); ``workers`` > 1 runs that many copies of it, each its own search
    (ignored for an in-process runner or a caller's ``strategy``, which only this process has).
    ``shared`` is an example database beside ``out_dir`` (`conformance.runner.example_db`): replayed
    first, fed every failure found. Hypothesis' own shrinking is always off (each problem is shrunk on
    its own afterwards). ``shrink_only(problem)``, if given, says which problems are shrunk; the others
    keep the trace they were found with, marked unshrunk (the bug museum shrinks only an exhibit's
    expected invariants: shrinking a liveness problem costs a whole trace per try). A shrink try
    checks only the invariant it shrinks (a predicate never reads another's verdict:
    tests/test_incremental_check.py shows it on every mutant); the shrunk trace's final run, in a
    fresh process, checks the whole profile.
    """
    profile, out_dir, max_examples, time_budget = plan.profile, plan.out_dir, plan.max_examples, plan.time_budget
    seed_value, timeout, workers, adapter_spec = plan.seed, plan.timeout, plan.workers, plan.adapter_spec
    expectations = plan.expectations
    # Absolute from here on (the adapter's process may change its folder; `spec.safe_write` needs
    # a path whose folders were resolved before anything the adapter does).
    out_dir = Path(out_dir).resolve()
    unsaved: dict[str, str] = {}  # problem -> why its trace could not be written
    runner = _runner_for(make_adapter, timeout)
    info = runner.info or runner.start()
    domain = _domain_of(runner)
    if adapter_spec is None and isinstance(getattr(runner, "spec", None), str):
        adapter_spec = runner.spec
    if adapter_spec is not None:  # loadable from any folder: traces and replay commands carry it
        from conformance.runner.adapter import canonical_spec

        adapter_spec = canonical_spec(adapter_spec)
    drawn_by_runner = strategy is None and hasattr(runner, "search")  # the child draws from the same strategy
    if strategy is None:
        strategy = _strategy_for(runner)
    lockstep = profile.lockstep and profile.name in info.profiles and "LOCKSTEP" not in expectations.skip
    result = FuzzResult(info.name, profile.name, seed_value, lockstep=lockstep, adapter_spec=adapter_spec,
                        expected=dict(expectations.expected), skipped=dict(expectations.skip),
                        expectations_file=expectations.source,
                        reservation=_declared_reservation(runner, info))
    if profile.lockstep and not lockstep and "LOCKSTEP" not in expectations.skip:
        result.not_run["LOCKSTEP"] = lockstep_not_run(profile.name, info.name, info.profiles)
    invariants = [inv.id for inv in profile.invariants() if inv.id not in expectations.skip]
    result.coverage = Coverage(invariants)
    # problem -> (how small its trace is, then (worker, index) to break ties the same way every run)
    best: dict[str, tuple[tuple[Any, ...], Trace, TraceSummary]] = {}
    reference = profile.reference if lockstep else None
    started = time.monotonic()
    deadline = started + time_budget if time_budget else None
    runners = [runner, *(_more_runners(runner, workers - 1) if drawn_by_runner else [])]
    fatal: Counter[str] = Counter()

    def relabeled(summary: TraceSummary) -> TraceSummary:
        # A fault the expectations place elsewhere is a new finding under its own id.
        summary.problems = expectations.relabel(summary.problems)
        return summary

    def run_on(on: Any, trace: Trace, *, alone: bool = False, **kw: Any) -> TraceSummary:
        if "stop_on" in kw:  # the runner knows the fault's kind, not where the expectations place it
            kw["stop_on"] = kw["stop_on"].split("@")[0]
        # ``alone``: a shrink try reads one problem's step; an invariant's is the same checked
        # alone (a predicate reads the record and the context, never another's verdict), so the
        # try checks only it. A fault or a divergence is the driver's, and keeps the whole set.
        checked = [kw["stop_on"]] if alone and kw.get("stop_on") in invariants else invariants
        return relabeled(on.run(trace, checked, lockstep=lockstep, reference=reference, **kw))

    def record(trace: Trace, summary: TraceSummary, order: tuple[int, int]) -> None:
        for problem in sorted(summary.problems):
            key = (size(trace, summary.problems[problem].step), order)
            if problem not in best or key < best[problem][0]:
                first = problem not in best
                best[problem] = (key, trace, summary)
                saved = _save_unshrunk(trace, result, problem, summary, out_dir, first, unsaved)
                if shared is not None:
                    shared.found(problem, saved)

    def searched(trace: Trace, summary: TraceSummary, order: tuple[int, int]) -> None:
        summary = relabeled(summary)
        for problem in {p.split("@")[0] for p in summary.problem_ids} & FATAL:
            fatal[problem] += 1
            if fatal[problem] >= FATAL_REPEATS:
                result.stopped_early = (f"{problem} ended {FATAL_REPEATS} traces: the adapter's process keeps dying, "
                                        "so the search stopped there")
        result.examples += 1
        result.steps_checked += summary.steps
        result.active = summary.active or result.active
        result.not_applicable = summary.not_applicable or result.not_applicable
        result.coverage.add_counts(summary.exercised, summary.edges)
        result.reservation = widest_reservation(result.reservation, summary.reservation)
        record(trace, summary, order)
        if on_example:
            on_example(result)

    def stop() -> bool:
        return (result.examples >= max_examples or result.stopped_early is not None
                or (deadline is not None and time.monotonic() > deadline)
                or (stop_when is not None and stop_when(frozenset(best))))

    try:
        result.replayed = _replay_saved(out_dir, result, lambda t: run_on(runner, t), record,
                                        shared.traces() if shared is not None else ())
        if drawn_by_runner:
            from conformance.runner.workers import search

            def run_batch(on: Any, seed_batch: int, count: int, should_stop: Callable[[], bool], start: int = 0):
                return on.search(seed_batch, count, invariants, lockstep=lockstep, reference=reference,
                                 should_stop=should_stop, start=start)

            search(runners, strategy, seed_value, max_examples, run_batch, searched, stop)
        else:  # a strategy only this process has (an in-process adapter's, or the caller's)
            _search(strategy, seed_value, max_examples, stop, lambda t: run_on(runner, t), searched, best)
    except KeyboardInterrupt:
        result.interrupted = True
    try:
        if not result.interrupted:
            from conformance.runner.workers import each_on_a_runner

            def shrink_one(on: Any, item: tuple[str, tuple[Any, Trace, TraceSummary]]) -> Finding:
                problem, (_, trace, summary) = item
                finding = _shrunk_finding(problem, trace, summary, lambda t, **kw: run_on(on, t, **kw), result,
                                          out_dir, domain, unsaved)
                if shared is not None:
                    shared.shrunk(problem, finding.trace)
                return finding

            up = [on for on in runners if getattr(on, "info", None) is not None]  # a halted search may leave one unstarted
            chosen = sorted(item for item in best.items() if shrink_only is None or shrink_only(item[0]))
            for finding in each_on_a_runner(up or runners[:1], chosen, shrink_one):
                result.findings[finding.problem] = finding
    except KeyboardInterrupt:
        result.interrupted = True
    for problem, (_, trace, summary) in sorted(best.items()):
        if problem not in result.findings:  # interrupted or not chosen: the unshrunk trace, already on disk
            found = summary.problems[problem]
            result.findings[problem] = Finding(problem, found.message, trace, found.step + 1,
                                               out_dir / "counterexamples" / _file_name(problem), None, found.location,
                                               shrunk=False, unsaved=unsaved.get(problem))
    result.seconds = time.monotonic() - started
    for extra in runners[1:]:
        extra.close()
    if runner is not make_adapter:
        runner.close()
    return result


def lockstep_not_run(profile: str, adapter: str, claims: Iterable[str]) -> str:
    """Why profile ``profile``'s lockstep part does not run on ``adapter``: the reference is stepped
    beside an adapter only when it claims the profile (it then promises the reference's exact
    decisions); the profile's invariants are checked all the same."""
    return (f"profile {profile} steps the reference in lockstep, but {adapter} does not claim {profile} (it claims "
            f"{', '.join(claims) or 'nothing'}), so it cannot be put in lockstep: only the profile's invariants were "
            "checked")


def widest_reservation(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The wider of two declared reservations (as dicts): a scheduler whose reservation depends on
    the config (a speculative one's k, a pipelined one's depth) declares one per trace, and the
    report names the widest any trace was checked with."""
    if a is None or b is None:
        return a if b is None else b
    return {"lookahead_tokens": max(int(a.get("lookahead_tokens", 0)), int(b.get("lookahead_tokens", 0))),
            "whole_request": bool(a.get("whole_request")) or bool(b.get("whole_request"))}


def _declared_reservation(runner: Any, info: Any) -> dict[str, Any] | None:
    adapter = getattr(runner, "adapter", None)
    if adapter is not None and getattr(adapter, "reservation", None) is not None:
        from dataclasses import asdict

        return asdict(adapter.reservation)
    return getattr(info, "reservation", None)


def _more_runners(runner: Any, n: int) -> list[Any]:
    """``n`` more runners of the same adapter, not started yet: each worker's thread starts its
    own (`conformance.runner.workers.search`), so the first worker searches while the others start and
    a slow start delays only its own worker. Only a runner that can clone itself (a child
    process) gives any."""
    if n <= 0 or not hasattr(runner, "clone"):
        return []
    return [runner.clone(i + 1) for i in range(n)]


def _strategy_for(runner: Any) -> st.SearchStrategy:
    """The traces this adapter accepts: its own strategy when it runs in this process, else what
    the runner's side knows of it (a built-in's or a target's, or its declared config domain)."""
    from conformance.runner.adapter import adapter_strategy, traces_for

    adapter = getattr(runner, "adapter", None)
    if adapter is not None:
        return adapter_strategy(adapter)
    return traces_for(getattr(runner, "spec", ""), runner.info.domain)


def _domain_of(runner: Any) -> ConfigDomain | None:
    """The config domain the adapter declared, which shrinking must not leave."""
    adapter = getattr(runner, "adapter", None)
    if adapter is not None:  # in this process: a declared domain, else whatever trace_strategy draws
        from conformance.runner.adapter import adapter_domain

        return adapter_domain(adapter) if getattr(adapter, "domain", None) is not None else None
    domain = getattr(runner.info, "domain", None)
    return ConfigDomain.from_dict(domain) if domain is not None else None


def _search(strategy, seed_value, max_examples, stop, run, searched, best) -> None:
    """One Hypothesis search (generation only) over ``strategy``, every trace run whole."""
    index = 0

    @settings(
        max_examples=max_examples, database=None, deadline=None, suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet, phases=(Phase.generate,),
    )
    @seed(seed_value)
    @given(strategy)
    def search(trace: Trace) -> None:
        nonlocal index
        if stop():
            raise _Stop
        searched(trace, run(trace), (0, index))
        index += 1
        if stop():
            raise _Stop

    try:
        search()
    except _Stop:
        pass
    except KeyboardInterrupt:
        raise
    except Exception as err:  # noqa: BLE001 - a failure inside Hypothesis itself; findings are already on disk
        if isinstance(err, InputError):
            raise
        if not best:
            raise RuntimeError(f"the fuzz run stopped unexpectedly: {type(err).__name__}: {err}") from err


def _file_name(problem: str) -> str:
    """``problem``'s file name: a relabeled fault's location (``FAULT-raised@path/x.py:12``) made safe."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", problem) + ".json"


def _saved_in(out_dir: Path) -> Iterator[Trace]:
    for folder in ("counterexamples", "found"):
        for path in sorted((out_dir / folder).glob("*.json")):
            try:
                yield Trace.load(path)
            except (InputError, OSError, ValueError):
                continue  # not a trace of ours (or damaged): the search goes on without it


def _replay_saved(out_dir: Path, result: FuzzResult, run, record, shared: Iterable[Trace] = ()) -> int:
    """Run again the traces an earlier run with this adapter and profile saved under ``out_dir``,
    then those of the shared database (``shared``) not among them."""
    seen: set[str] = set()
    replayed = 0
    for trace in itertools.chain(_saved_in(out_dir), shared):
        meta = trace.meta
        if meta.get("adapter") != result.adapter or meta.get("profile") != result.profile:
            continue
        key = trace.to_json()
        if key in seen:
            continue
        seen.add(key)
        record(trace, run(trace), (-1, replayed))
        replayed += 1
    return replayed


def _meta(trace: Trace, result: FuzzResult, problem: str, message: str, steps: int, shrunk: bool,
          location: str | None) -> Trace:
    meta = {**dict(trace.meta), "adapter": result.adapter, "profile": result.profile, "problem": problem,
            "message": message, "steps": steps, "shrunk": shrunk}
    if result.adapter_spec:
        meta["adapter_spec"] = result.adapter_spec
    if location:
        meta["location"] = location
    return dataclasses.replace(trace, meta=meta)


def _save_unshrunk(trace: Trace, result: FuzzResult, problem: str, summary: TraceSummary, out_dir: Path,
                   first: bool, unsaved: dict[str, str]) -> Trace:
    found = summary.problems[problem]
    saved = _meta(trace, result, problem, found.message, found.step + 1, False, found.location)
    if first:
        _save(saved, out_dir / "found" / _file_name(problem), problem, unsaved)  # the first failing trace, as found
    _save(saved, out_dir / "counterexamples" / _file_name(problem), problem, unsaved)  # replaced by the shrunk one
    return saved


def _save(trace: Trace, path: Path, problem: str, unsaved: dict[str, str]) -> None:
    """Write ``trace`` to ``path`` in ``--out`` through no link; a write that fails is noted in
    ``unsaved`` (the finding is still reported, its trace printed by the command) instead of
    ending the run. A later write that succeeds clears the note."""
    try:
        trace.save(path, no_links=True)
    except OSError as err:
        unsaved[problem] = f"{path}: {err.strerror or err}"
    else:
        unsaved.pop(problem, None)


def _shrunk_finding(problem: str, trace: Trace, summary: TraceSummary, run, result: FuzzResult,
                    out_dir: Path, domain: ConfigDomain | None = None, unsaved: dict[str, str] | None = None) -> Finding:
    def failing(candidate: Trace) -> int | None:
        return run(candidate, stop_on=problem, alone=True).step_of(problem)

    # A fatal fault costs a process start (a hang a whole timeout) per try: a small budget.
    tries, seconds = (10, 15.0) if problem.split("@")[0] in FATAL else (400, 30.0)
    try:
        small, step = shrink(trace, failing, budget=tries, seconds=seconds, domain=domain)
    except ValueError:  # flaky: no longer fails alone; keep what was seen
        small, step = trace, summary.problems[problem].step
    path = out_dir / "counterexamples" / _file_name(problem)
    unsaved = {} if unsaved is None else unsaved
    # Checked again in a fresh process (no history), as Hypothesis checks a failure again: a fault
    # that needed what ran before (the 40th call of a process) is not passed off as this trace's.
    final = run(small, html=path.with_suffix(".html"), fresh=True)
    if problem not in final.problems and small is not trace:
        # once more before the shrunk trace is given up: a fatal fault's own process start can be
        # disturbed by the machine (seen once in CI: a 3-step memory fault that showed in the
        # shrink and in the original trace, not in the final check)
        final = run(small, html=path.with_suffix(".html"), fresh=True)
    shrunk = True
    if problem not in final.problems and small is not trace:
        final, small, step, shrunk = run(trace, html=path.with_suffix(".html"), fresh=True), trace, \
            summary.problems[problem].step, False
    if problem not in final.problems:
        return _flaky_finding(problem, trace, summary, result, path, unsaved)
    found = final.problems[problem]
    saved = _meta(small, result, problem, found.message, step + 1, shrunk, found.location)
    _save(saved, path, problem, unsaved)
    return Finding(problem, found.message, saved, step + 1, path, Path(final.html) if final.html else None,
                   found.location, shrunk=shrunk, unsaved=unsaved.get(problem))


def _flaky_finding(problem: str, trace: Trace, summary: TraceSummary, result: FuzzResult, path: Path,
                   unsaved: dict[str, str]) -> Finding:
    """A problem that did not come again when its traces ran alone in a fresh process: flaky, in
    Hypothesis' sense (it depends on something besides the trace: what ran before, time, chance).
    Still a finding; its trace is the one it was found with, unshrunk, marked ``flaky``."""
    found = summary.problems[problem]
    message = (f"{found.message} (flaky: its trace did not fail again alone in a fresh process, so it depends on "
               "what ran before it or on chance; the trace it was found with is kept, unshrunk)")
    saved = _meta(trace, result, problem, message, found.step + 1, False, found.location)
    saved = dataclasses.replace(saved, meta={**saved.meta, "flaky": True})
    _save(saved, path, problem, unsaved)
    return Finding(problem, message, saved, found.step + 1, path, None, found.location, shrunk=False,
                   unsaved=unsaved.get(problem), flaky=True)
