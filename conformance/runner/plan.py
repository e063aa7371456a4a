"""One conformance run, described once: what `conformance.runner.fuzz.fuzz` is asked to do.

A command (``kvsched conform``, the pytest plugin, the museum) turns its arguments into one
`RunPlan`, checks it, and hands it to the runner; the runner never reads an
``argparse.Namespace`` or a list of loose keyword arguments. What is not a description of the run
but a live object of the caller's (a progress callback, a stop condition, a strategy only the
caller's process has, a shared example database) stays a keyword argument of ``fuzz``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from conformance.flows.profiles import Profile
from conformance.runner.expectations import Expectations


@dataclass(frozen=True)
class RunPlan:
    """What to search, for how long, where the findings go.

    ``max_examples`` and ``time_budget`` bound the search (whichever ends first); ``seed`` makes
    it repeatable; ``timeout`` is the per-call limit on the adapter; ``workers`` adapter processes
    search at once (each its own seeded search, the budget split between them); ``adapter_spec``
    is how to load the adapter again (traces and replay commands carry it; a runner's own spec
    when None); ``expectations`` are the engine's known failures and skipped checks."""

    profile: Profile
    out_dir: Path
    max_examples: int = 100
    time_budget: float | None = None
    seed: int = 0
    timeout: float | None = 10.0  # None: no per-call limit (an in-process reference the caller trusts)
    workers: int = 1
    adapter_spec: str | None = None
    expectations: Expectations = field(default_factory=Expectations)

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
