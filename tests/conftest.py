"""Hypothesis profiles and the seed line.

Profiles: ``ci`` (bounded so CI stays in budget; the default), ``dev`` (more examples, for a
developer's machine), ``nightly`` (many examples, for scheduled runs). Select one with
``KVSCHED_PROFILE=dev pytest``. Every run prints its Hypothesis seed in the header; rerun a
failure with ``pytest --hypothesis-seed=<seed>``. Failing examples are kept in Hypothesis'
example database (``.hypothesis/``) and replayed first on the next run.
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, Verbosity, settings

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)

settings.register_profile("ci", max_examples=200, stateful_step_count=25, **_COMMON)
settings.register_profile("dev", max_examples=1000, stateful_step_count=40, **_COMMON)
settings.register_profile("nightly", max_examples=20000, stateful_step_count=60, verbosity=Verbosity.normal, **_COMMON)
PROFILE = os.environ.get("KVSCHED_PROFILE", "ci")
settings.load_profile(PROFILE)


def pytest_configure(config):
    if config.getoption("hypothesis_seed", default=None) is None and hasattr(config.option, "hypothesis_seed"):
        config.option.hypothesis_seed = random.randrange(2**32)


def pytest_report_header(config):
    seed = getattr(config.option, "hypothesis_seed", None)
    return f"kvsched: hypothesis profile {PROFILE!r}, seed {seed} (rerun with --hypothesis-seed={seed})"


def examples(n_ci: int) -> int:
    """Scale a test's example count with the profile (ci: n_ci)."""
    scale = {"ci": 1, "dev": 5, "nightly": 100}.get(PROFILE, 1)
    return n_ci * scale
