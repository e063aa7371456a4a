"""What one checked trace came to, as plain data that crosses a process boundary.

The adapter runs in a child process (`conformance.runner.isolated`); the parent, which searches and
shrinks, needs only a verdict per trace: every problem it showed with the step it first showed
at, how many steps ran, which invariants applied, and what the trace exercised. A
`TraceSummary` is that verdict, built the same way whether the trace ran in the child or in the
runner's own process (`summarize`), and sent as JSON (`to_dict` / `from_dict`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from conformance.runner.driver import TraceResult

# Every FAULT kind the runner reports (conformance.runner.isolated, conformance.runner.driver, conformance.runner.worker),
# with what happened; the pytest plugin, expectations files and ADAPTERS.md all read this one table.
FAULT_KINDS: dict[str, str] = {
    "raised": "a call raised an exception",
    "hang": "a call did not return within `--timeout` (or its declared `reset_timeout`); the process was killed",
    "malformed": "an answer of the wrong shape: `None` where a sequence or field must be, a wrong type, an absurd number, "
                 "a claimed capability left empty",
    "config-rejected": "`reset()` raised on a trace's config (declare a config domain so that no such config is generated)",
    "exit": "the process, or a wire host, exited: `sys.exit` with any code (0 included), `os._exit`",
    "crash": "the process, or a wire host, was killed by a signal (a segfault, an abort)",
    "memory": "resident memory of the adapter's process tree (every process it started, in any session) passed "
              "`--max-memory`",
    "output": "the adapter printed more than `--max-output` in one trace",
    "signal": "the adapter's process, or a process it started, sent the runner a signal (SIGTERM, SIGINT, ...); "
              "its tree was ended",
    "budget": "checking the adapter's answers to one trace took longer than the checks' budget (answers too large "
              "or too many to check)",
    "checker": "kvsched's own checks crashed on this trace (a kvsched bug, not the adapter's: reported under category kvsched)",
}


@dataclass(frozen=True)
class Problem:
    """One thing a trace showed: an invariant ID, ``LOCKSTEP`` or ``FAULT-<kind>``."""

    id: str
    step: int  # the step it first showed at (a violation found at the end of the run: the last step)
    message: str
    location: str | None = None  # FAULT-*: the adapter's file:line, where known

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "step": self.step, "message": self.message, "location": self.location}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Problem:
        return cls(str(data["id"]), int(data["step"]), str(data["message"]), data.get("location"))


@dataclass
class TraceSummary:
    steps: int  # steps run (records)
    problems: dict[str, Problem] = field(default_factory=dict)
    active: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    exercised: Counter[str] = field(default_factory=Counter)  # invariant id -> subjects checked with its trigger holding
    edges: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # lifecycle edges taken
    html: str | None = None  # the HTML view written for this run, if one was asked for
    # The reservation the adapter declared for this trace's config (`spec.reservation`, as a dict):
    # how a worker-isolated run tells the runner what a per-config reservation was (CAP-006).
    reservation: dict[str, Any] | None = None

    @property
    def problem_ids(self) -> set[str]:
        return set(self.problems)

    @property
    def failed(self) -> bool:
        return bool(self.problems)

    def step_of(self, problem: str) -> int | None:
        found = self.problems.get(problem)
        return found.step if found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "problems": [p.to_dict() for p in self.problems.values()],
            "active": self.active,
            "not_applicable": self.not_applicable,
            "exercised": dict(self.exercised),
            "edges": [[*edge, n] for edge, n in self.edges.items()],
            "html": self.html,
            **({"reservation": self.reservation} if self.reservation is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TraceSummary:
        problems = [Problem.from_dict(p) for p in data["problems"]]
        return cls(
            int(data["steps"]), {p.id: p for p in problems}, list(data["active"]), list(data["not_applicable"]),
            Counter(data["exercised"]), Counter({(a, b, c): n for a, b, c, n in data["edges"]}), data.get("html"),
            data.get("reservation"),
        )


def summarize(result: TraceResult) -> TraceSummary:
    """The verdict of a run of `conformance.runner.driver.run_checked`: each problem once, at the step
    it first showed (violations found at the end of the run count at the last step), and what each
    invariant exercised (counted by the checker from the invariant's own trigger, `spec.rules`)."""
    from spec.lifecycle import coverage as lifecycle_coverage

    last = max(len(result.records) - 1, 0)
    problems: dict[str, Problem] = {}
    for v in result.violations:
        if v.invariant_id not in problems:
            problems[v.invariant_id] = Problem(v.invariant_id, last if v.step is None else v.step, str(v))
    if result.divergence is not None and "LOCKSTEP" not in problems:
        problems["LOCKSTEP"] = Problem("LOCKSTEP", result.divergence.step, result.divergence.describe())
    if result.fault is not None:
        step = result.fault_step if result.fault_step is not None else last
        problems[f"FAULT-{result.fault.kind}"] = Problem(
            f"FAULT-{result.fault.kind}", step, f"step {step}: {result.fault}", getattr(result.fault, "location", None))
    exercised = Counter({inv_id: n for inv_id, n in result.exercised.items() if n})
    from conformance.runner.coverage import EVENTS

    for name, happened in EVENTS.items():  # the events ride with the counts, under lower-case names
        exercised[name] = sum(1 for record in result.records if happened(record))
    exercised = +exercised  # only what happened
    return TraceSummary(
        len(result.records), problems, [i.id for i in result.active], [i.id for i in result.not_applicable],
        exercised, Counter(lifecycle_coverage(result.records)),
        reservation=None if result.reservation is None else dataclasses.asdict(result.reservation),
    )
