"""vLLM's own tests as a judge of a mutant: ``tests/v1/core`` from the 0.33.0 sdist, on CPU.

The baseline runs every test file once on the unmutated package, with `mutation_coverage`
recording which lines of the mutable files each test runs. Usable tests are those that pass
there; a file that does not collect (it needs a server, a GPU or a package the target venv does
not have) is recorded with the reason and left out. A mutant then runs only the usable tests
that run its line (all of them when the line runs at import, except a default argument: the
tests that call its function), fastest first by their baseline time, stopping at the first failure.

Verdicts: ``killed`` (a test failed) with a ``kind`` (`failure_kind`: ``oracle`` when the failing
frame is the test's own assertion, ``crash`` when the exception was raised inside vLLM, ``timeout``
for a hang), ``survived`` (all selected tests passed, or none runs the
line: ``not_reached`` says which), ``timeout`` (one test ran past `TEST_SECONDS`: a hang),
``survived-budget`` (the judge's time cap ended the run with no failure), ``crash-at-import``
(collection failed: the mutated module does not import).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from conformance.selftest.mutation.descriptors import FILES
from conformance.selftest.mutation.forks import ForkServer, read_cpu

# Files left out before running: they need what this CPU-only machine does not have.
SKIP_FILES = {
    "tests/v1/core/prefix_cache/test_hybrid_prefix_cache_hit_rate.py":
        "imports tests.utils.RemoteOpenAIServer (anthropic, an OpenAI server and a model)",
}
# One test past this is a hang (`mutation_coverage.MutantTimeout`); the slowest usable test of
# tests/v1/core takes a few seconds here, unmutated.
TEST_SECONDS = 30
PYTEST_FLAGS = ["--noconftest", "-p", "no:cacheprovider", "-q", "-o", "addopts=", "-W", "ignore"]


class PytestJudge:
    def __init__(self, server: ForkServer, sdist: Path, work: Path) -> None:
        self.server, self.sdist, self.work = server, sdist, work
        work.mkdir(parents=True, exist_ok=True)

    def _run(self, args: list[str], overlay: dict[str, str], seconds: float, log: Path,
             env: dict[str, str] | None = None, cpu_file: Path | None = None) -> tuple[int | None, float]:
        started = time.monotonic()
        command = self.server.command("pytest", ["pytest", *PYTEST_FLAGS, *args], overlay=overlay,
                                      cwd=str(self.sdist), env=env, cpu_file=cpu_file)
        with open(log, "w") as out:
            proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                rc: int | None = proc.wait(timeout=seconds)
            except subprocess.TimeoutExpired:
                proc.terminate()  # the client kills its child first
                proc.wait(timeout=30)
                rc = None
        return rc, time.monotonic() - started

    def test_files(self) -> list[str]:
        files = sorted(str(p.relative_to(self.sdist)) for p in (self.sdist / "tests/v1/core").rglob("test_*.py"))
        return [f for f in files if f not in SKIP_FILES]

    def baseline(self, seconds: float = 3600.0, files: list[str] | None = None, tag: str = "baseline") -> dict[str, Any]:
        """Run ``files`` (default: every usable test file) unmutated, with line coverage per test."""
        usable = files if files is not None else self.test_files()
        out = self.work / f"{tag}-coverage.json"
        log = self.work / f"{tag}.log"
        cpu_file = self.work / f"{tag}.cpu"
        cpu_file.unlink(missing_ok=True)
        rc, took = self._run(["--continue-on-collection-errors", "-p", "mutation_coverage", *usable], {}, seconds, log,
                             env={"MUTATION_COVERAGE_FILES": ",".join(FILES), "MUTATION_COVERAGE_OUT": str(out)},
                             cpu_file=cpu_file)
        data = json.loads(out.read_text())
        outcomes: dict[str, str] = data["outcomes"]
        unusable = dict(SKIP_FILES)
        text = log.read_text(errors="replace")
        for nodeid, outcome in outcomes.items():
            if outcome == "collection-error":
                reason = _collection_reason(text, nodeid)
                unusable[nodeid] = f"does not collect: {reason}"
        passing = sorted(t for t, o in outcomes.items() if o == "passed" and "::" in t)
        failing = sorted(t for t, o in outcomes.items() if o not in ("passed", "skipped", "collection-error"))
        skipped = sorted(t for t, o in outcomes.items() if o == "skipped")
        per_file: dict[str, dict[str, int]] = {}
        for t, o in outcomes.items():
            if "::" in t:
                counts = per_file.setdefault(t.split("::")[0], {})
                counts[o] = counts.get(o, 0) + 1
        return {"rc": rc, "seconds": round(took, 1), "cpu_seconds": read_cpu(cpu_file), "files": per_file,
                "unusable": unusable,
                "passing": passing, "failing_unmutated": failing, "skipped": skipped,
                "durations": durations(data, passing),
                "lines": {t: data["lines"].get(t, {}) for t in [*passing, "<import>"]}}

    def durations_of(self, tag: str = "baseline") -> dict[str, float] | None:
        """The per-test times the baseline run ``tag`` recorded (for a baseline kept from before
        they were stored), or None when its coverage file is gone."""
        out = self.work / f"{tag}-coverage.json"
        if not out.exists():
            return None
        data = json.loads(out.read_text())
        return durations(data, [t for t, o in data["outcomes"].items() if o == "passed" and "::" in t])

    def select(self, baseline: dict[str, Any], mutant: dict[str, Any], source: str | None = None) -> list[str]:
        """The usable tests that run the mutant's line, fastest first (their baseline times: with
        ``-x`` a killed mutant stops at its first failure, so the cheap tests should go first).

        A line that runs at import selects every test, except a default argument of a function's
        signature (``def f(x=0)``: Python evaluates it when the ``def`` runs, at import): that value
        is seen only by a call to ``f``, so the tests that run ``f``'s body are the ones that run
        it (``source`` is the unmutated file, to find ``f``)."""
        lines = range(mutant["line"], mutant["end_line"] + 1)
        ran = baseline["lines"]
        if any(n in ran.get("<import>", {}).get(mutant["file"], ()) for n in lines):
            body = default_argument_body(source, mutant["line"], mutant["end_line"]) if source else None
            if body is None:
                return fastest_first(list(baseline["passing"]), baseline)
            lines = body
        return fastest_first([t for t in baseline["passing"]
                              if any(n in ran.get(t, {}).get(mutant["file"], ()) for n in lines)], baseline)

    def judge(self, mutant_id: str, overlay: dict[str, str], tests: list[str], seconds: float) -> dict[str, Any]:
        if not tests:
            return {"verdict": "survived", "not_reached": True, "tests": 0, "seconds": 0.0}
        args_file = self.work / f"{mutant_id}.args"
        args_file.write_text("\n".join(tests) + "\n")
        log = self.work / f"{mutant_id}.log"
        cpu_file = self.work / f"{mutant_id}.cpu"
        cpu_file.unlink(missing_ok=True)
        # ``-p no:randomly`` is not needed (not installed); pytest keeps the argument order, which is
        # `select`'s fastest-first order.
        rc, took = self._run(["-x", "-p", "mutation_coverage", f"@{args_file}"], overlay, seconds, log,
                             env={"MUTATION_TEST_TIMEOUT": str(TEST_SECONDS)}, cpu_file=cpu_file)
        text = log.read_text(errors="replace")
        tail = text.strip().splitlines()[-3:]
        verdict = ("survived-budget" if rc is None else "survived" if rc in (0, 5)
                   else "timeout" if rc == 1 and "MutantTimeout" in text else "killed" if rc == 1
                   else "crash-at-import" if rc == 2 else f"error-rc{rc}")
        out: dict[str, Any] = {"verdict": verdict, "rc": rc, "tests": len(tests), "seconds": round(took, 1),
                               "cpu_seconds": read_cpu(cpu_file), "tail": [line[:200] for line in tail]}
        failed = re.findall(r"^FAILED (\S+)", text, re.M)
        if failed:
            out["failed"] = failed[:3]
        if verdict in ("killed", "timeout"):
            out["kind"] = "timeout" if verdict == "timeout" else failure_kind(text)
        return out


def durations(coverage: dict[str, Any], tests: list[str]) -> dict[str, float]:
    """Each test's baseline time (setup, call and teardown), from `mutation_coverage`'s output."""
    times = coverage.get("durations", {})
    return {t: round(float(times.get(t, 0.0)), 2) for t in tests}


def fastest_first(tests: list[str], baseline: dict[str, Any]) -> list[str]:
    """``tests`` by their baseline time, fastest first (ties: by name; unknown times last)."""
    times = baseline.get("durations") or {}
    return sorted(tests, key=lambda t: (times.get(t, float("inf")), t))


def default_argument_body(source: str, line: int, end_line: int) -> range | None:
    """The lines of the body of the function whose signature's default arguments hold lines
    ``line..end_line`` of ``source``, or None when they are not (only) in such a default."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        defaults = [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
        if any(d.lineno <= line and end_line <= (d.end_lineno or d.lineno) for d in defaults):
            return range(node.body[0].lineno, (node.end_lineno or node.body[-1].lineno) + 1)
    return None


def failure_kind(log: str) -> str:
    """``oracle`` or ``crash`` for a pytest log with one failure: where the exception was raised,
    from the last ``path:line: Error`` line of its traceback (pytest's long format ends each
    traceback so). A frame in the test files (``tests/...``) is the test's own check; one in vLLM
    is an exception inside the engine."""
    body = log.split("short test summary info", 1)[0]
    frames = re.findall(r"^(\S+\.py):\d+: \w+", body, re.M)
    if not frames:
        return "crash"
    return "oracle" if frames[-1].startswith(("tests/", "./tests/")) or "/tests/" in frames[-1] else "crash"


def _collection_reason(text: str, nodeid: str) -> str:
    """The first exception line of the collection error of ``nodeid`` in pytest's log."""
    block = text.split(f"ERROR collecting {nodeid}", 1)[-1].split("\n_____", 1)[0]
    errors = [ln[1:].strip() for ln in block.splitlines() if ln.startswith("E ")]
    named = [e for e in errors if "Error" in e or "not found" in e]
    return (named or errors or ["collection error"])[0][:200]
