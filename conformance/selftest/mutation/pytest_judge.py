"""vLLM's own tests as a judge of a mutant: ``tests/v1/core`` from the 0.33.0 sdist, on CPU.

The baseline runs every test file once on the unmutated package, with `mutation_coverage`
recording which lines of the mutable files each test runs. Usable tests are those that pass
there; a file that does not collect (it needs a server, a GPU or a package the target venv does
not have) is recorded with the reason and left out. A mutant then runs only the usable tests
that run its line (all of them when the line runs at import), stopping at the first failure.

Verdicts: ``killed`` (a test failed) with a ``kind`` (`failure_kind`: ``oracle`` when the failing
frame is the test's own assertion, ``crash`` when the exception was raised inside vLLM, ``timeout``
for a hang), ``survived`` (all selected tests passed, or none runs the
line: ``not_reached`` says which), ``timeout`` (one test ran past `TEST_SECONDS`: a hang),
``survived-budget`` (the judge's time cap ended the run with no failure), ``crash-at-import``
(collection failed: the mutated module does not import).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

from conformance.selftest.mutation.descriptors import FILES
from conformance.selftest.mutation.forks import ForkServer

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
             env: dict[str, str] | None = None) -> tuple[int | None, float]:
        started = time.monotonic()
        command = self.server.command("pytest", ["pytest", *PYTEST_FLAGS, *args], overlay=overlay,
                                      cwd=str(self.sdist), env=env)
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
        rc, took = self._run(["--continue-on-collection-errors", "-p", "mutation_coverage", *usable], {}, seconds, log,
                             env={"MUTATION_COVERAGE_FILES": ",".join(FILES), "MUTATION_COVERAGE_OUT": str(out)})
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
        return {"rc": rc, "seconds": round(took, 1), "files": per_file, "unusable": unusable,
                "passing": passing, "failing_unmutated": failing, "skipped": skipped,
                "lines": {t: data["lines"].get(t, {}) for t in [*passing, "<import>"]}}

    def select(self, baseline: dict[str, Any], mutant: dict[str, Any]) -> list[str]:
        """The usable tests that run the mutant's line (every one of them for an import-time line)."""
        lines = range(mutant["line"], mutant["end_line"] + 1)
        if any(n in baseline["lines"].get("<import>", {}).get(mutant["file"], ()) for n in lines):
            return list(baseline["passing"])
        return [t for t in baseline["passing"]
                if any(n in baseline["lines"].get(t, {}).get(mutant["file"], ()) for n in lines)]

    def judge(self, mutant_id: str, overlay: dict[str, str], tests: list[str], seconds: float) -> dict[str, Any]:
        if not tests:
            return {"verdict": "survived", "not_reached": True, "tests": 0, "seconds": 0.0}
        args_file = self.work / f"{mutant_id}.args"
        args_file.write_text("\n".join(tests) + "\n")
        log = self.work / f"{mutant_id}.log"
        rc, took = self._run(["-x", "-p", "mutation_coverage", f"@{args_file}"], overlay, seconds, log,
                             env={"MUTATION_TEST_TIMEOUT": str(TEST_SECONDS)})
        text = log.read_text(errors="replace")
        tail = text.strip().splitlines()[-3:]
        verdict = ("survived-budget" if rc is None else "survived" if rc in (0, 5)
                   else "timeout" if rc == 1 and "MutantTimeout" in text else "killed" if rc == 1
                   else "crash-at-import" if rc == 2 else f"error-rc{rc}")
        out: dict[str, Any] = {"verdict": verdict, "rc": rc, "tests": len(tests), "seconds": round(took, 1),
                               "tail": [line[:200] for line in tail]}
        failed = re.findall(r"^FAILED (\S+)", text, re.M)
        if failed:
            out["failed"] = failed[:3]
        if verdict in ("killed", "timeout"):
            out["kind"] = "timeout" if verdict == "timeout" else failure_kind(text)
        return out


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
