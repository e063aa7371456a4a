"""A pytest plugin (``-p mutation_coverage``) that records, per test, the lines it runs in the
mutable vLLM files; loaded in the fork server's child, in the target venv (no kvsched imports).

Why: vLLM's ``tests/v1/core`` takes minutes on this machine; a mutant only needs the tests that
run its line (mutmut selects tests the same way). The tracer is installed per test and traces
only frames whose file ends with one of ``$MUTATION_COVERAGE_FILES`` (comma-separated), so the
rest of vLLM and torch run at full speed. The map ``{test id: {file: [lines]}}`` is written as
JSON to ``$MUTATION_COVERAGE_OUT`` at the end of the session, with each test's outcome and time.
With ``$MUTATION_TEST_TIMEOUT`` (seconds) each test fails with `MutantTimeout` past it (SIGALRM).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import pytest

_FILES = tuple(f for f in os.environ.get("MUTATION_COVERAGE_FILES", "").split(",") if f)
_lines: dict[str, set[int]] = {}
_by_test: dict[str, dict[str, list[int]]] = {}
_outcomes: dict[str, str] = {}
_durations: dict[str, float] = {}


def _local(frame, event, _arg):  # noqa: ANN001 - sys.settrace's signature
    if event == "line":
        _lines.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
    return _local


def _global(frame, _event, _arg):  # noqa: ANN001
    name = frame.f_code.co_filename
    if name.endswith(_FILES):
        _lines.setdefault(name, set()).add(frame.f_lineno)
        return _local
    return None


def _short(path: str) -> str:
    for f in _FILES:
        if path.endswith(f):
            return f
    return path


_TEST_SECONDS = int(os.environ.get("MUTATION_TEST_TIMEOUT", "0"))


class MutantTimeout(Exception):
    """A test ran past ``$MUTATION_TEST_TIMEOUT`` seconds: the mutant hangs (no unmutated test
    of tests/v1/core comes near it)."""


def _alarm(_signum, _frame):  # noqa: ANN001
    raise MutantTimeout(f"mutation test timeout after {_TEST_SECONDS} s")


def pytest_configure(config):  # noqa: ANN001
    """Trace from the start: the mutable modules are imported while tests are collected, and a
    mutant on an import-time line (a default, a class attribute) concerns every test."""
    if _FILES:
        sys.settrace(_global)
    if _TEST_SECONDS:
        signal.signal(signal.SIGALRM, _alarm)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ANN001
    if _TEST_SECONDS:
        signal.alarm(_TEST_SECONDS)
    if not _FILES:
        try:
            yield
        finally:
            signal.alarm(0)
        return
    if "<import>" not in _by_test:
        _by_test["<import>"] = {_short(f): sorted(ls) for f, ls in _lines.items()}
    _lines.clear()
    sys.settrace(_global)
    threading.settrace(_global)
    try:
        yield
    finally:
        signal.alarm(0)
        sys.settrace(None)
        threading.settrace(None)
        _by_test[item.nodeid] = {_short(f): sorted(ls) for f, ls in _lines.items()}


def pytest_runtest_logreport(report):  # noqa: ANN001
    _durations[report.nodeid] = round(_durations.get(report.nodeid, 0.0) + report.duration, 3)
    if report.when == "call" or report.outcome != "passed":
        if _outcomes.get(report.nodeid) in (None, "passed"):
            _outcomes[report.nodeid] = report.outcome


def pytest_collectreport(report):  # noqa: ANN001
    if report.failed:
        _outcomes[report.nodeid] = "collection-error"


def pytest_sessionfinish(session, exitstatus):  # noqa: ANN001
    out = os.environ.get("MUTATION_COVERAGE_OUT")
    if out:
        with open(out, "w") as handle:
            json.dump({"version": 1, "exitstatus": int(exitstatus), "outcomes": _outcomes, "durations": _durations,
                       "lines": _by_test}, handle)
