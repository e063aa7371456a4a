"""Issue 15 part 6: every malformed input is refused with exit 2 and one line naming the field.

The corpus is `tests/bad_inputs/cases.py` (its files are rendered in ``tests/bad_inputs/files``):
malformed files run against ``simulate``, ``replay`` and ``check-config``, special paths
(``/dev/zero``, a folder, a FIFO, a file past the size cap, ...) against the same three, and
argument vectors against all four commands, ``conform`` included. For each run:

- exit code 2 (argparse's own errors included);
- stderr is exactly one line, ``kvsched: error: ...``, that contains the case's ``names`` (the
  field or flag), and no traceback;
- stdout is empty, and nothing was written: the working folder stays empty (``conform``'s
  default ``--out`` is relative to it) and the fixtures stay as they were;
- it takes seconds, not minutes (a bound of `HANG_S` per run catches a hang, not a slowdown).

Runs are in process (`conformance.commands.cli.main`) for speed; `test_sample_in_a_real_process` runs a
sample through ``python -m conformance`` to check what a shell sees, a non-UTF-8 argv included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.commands.cli import main
from tests.bad_inputs.cases import (
    ARGV_CASES,
    FILE_CASES,
    FILES,
    SPECIAL_FILES,
    SPECIAL_NAMES,
    ArgvCase,
    render,
    valid_trace,
)

HANG_S = 30.0
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fixtures(tmp_path: Path) -> dict[str, str]:
    """The placeholders of the corpus, made fresh for each test."""
    base = tmp_path / "fixtures"
    base.mkdir()
    (base / "a_file").write_text("not a folder\n")
    (base / "a_dir").mkdir()
    (base / "valid.json").write_bytes(valid_trace())
    os.mkfifo(base / "a_fifo")
    with open(base / "big.json", "wb") as f:  # sparse: 17 MiB on paper, nothing on disk
        f.truncate(17 << 20)
    return {"{file}": str(base / "a_file"), "{dir}": str(base / "a_dir"), "{valid}": str(base / "valid.json"),
            "{fifo}": str(base / "a_fifo"), "{big}": str(base / "big.json"), "{missing}": str(base / "missing.json"),
            "{bad}": str(FILES), "{base}": str(base)}


def _fill(arg: str, fixtures: dict[str, str]) -> str:
    for key, value in fixtures.items():
        arg = arg.replace(key, value)
    return arg


def _snapshot(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.lstat().st_size for p in folder.rglob("*")}


class Refusals:
    """Runs argv in process and records every way a run falls short of a clean refusal."""

    def __init__(self, fixtures: dict[str, str], cwd: Path, capsys) -> None:
        self.fixtures, self.cwd, self.capsys = fixtures, cwd, capsys
        self.before = _snapshot(Path(fixtures["{base}"]))
        self.problems: list[str] = []
        self.runs = 0
        self.slowest = (0.0, "")

    def run(self, label: str, argv: list[str], names: str | tuple[str, ...]) -> None:
        start = time.monotonic()
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own errors exit through parser.exit
            code = exc.code
        except BaseException as exc:  # noqa: BLE001 - the point is to see it
            code = f"raised {type(exc).__name__}: {exc}"
        took = time.monotonic() - start
        self.runs += 1
        self.slowest = max(self.slowest, (took, label))
        out, err = self.capsys.readouterr()
        lines = err.splitlines()
        why = []
        if code != 2:
            why.append(f"exit {code!r}")
        if out:
            why.append(f"stdout {out[:200]!r}")
        if len(lines) != 1 or not lines[0].startswith("kvsched: error: "):
            why.append(f"stderr is not one error line: {err[:300]!r}")
        elif any(name not in lines[0] for name in ([names] if isinstance(names, str) else names)):
            why.append(f"does not name {names!r}: {lines[0][:300]!r}")
        if "Traceback" in err:
            why.append("traceback")
        if took > HANG_S:
            why.append(f"took {took:.1f} s")
        if any(self.cwd.iterdir()):
            why.append(f"wrote {sorted(p.name for p in self.cwd.iterdir())}")
            for p in self.cwd.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        if _snapshot(Path(self.fixtures["{base}"])) != self.before:
            why.append("changed the fixtures")
        if why:
            self.problems.append(f"{label}: {'; '.join(why)}")


@pytest.fixture
def refusals(fixtures, tmp_path, monkeypatch, capsys) -> Refusals:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    capsys.readouterr()
    return Refusals(fixtures, cwd, capsys)


def _argv_for_file(command: str, path: str) -> list[str]:
    return {"simulate": ["simulate", "--workload", path], "replay": ["replay", path],
            "check-config": ["check-config", "--config", path]}[command]


def test_the_corpus_is_large_and_its_files_are_current():
    on_disk = {p.name: p.read_bytes() for p in FILES.glob("*.json")}
    assert on_disk == render(), "run: python3 tests/bad_inputs/cases.py"
    runs = sum(len(c.commands) for c in FILE_CASES) + 3 * len(SPECIAL_FILES) + sum(map(len, ARGV_CASES.values()))
    inputs = len(FILE_CASES) + len(SPECIAL_FILES) + sum(map(len, ARGV_CASES.values()))
    assert inputs >= 120 and runs >= 400, (inputs, runs)
    assert len({c.id for c in FILE_CASES}) == len(FILE_CASES)


def test_the_base_trace_is_valid(fixtures, refusals):
    """Every file case is one change away from this trace, so the change is what is refused."""
    for command in ("simulate", "replay", "check-config"):
        code = main(_argv_for_file(command, fixtures["{valid}"]) + (["--json"] if command != "check-config" else []))
        assert code in (0, 1), command
    refusals.capsys.readouterr()


def test_malformed_files(refusals):
    for case in FILE_CASES:
        for command in case.commands:
            refusals.run(f"{command} {case.id}", _argv_for_file(command, str(FILES / f"{case.id}.json")),
                         case.names_for(command))
    assert not refusals.problems, "\n".join(refusals.problems)
    print(f"{refusals.runs} runs, slowest {refusals.slowest[0]:.2f} s ({refusals.slowest[1]})")


def test_special_paths(refusals, fixtures):
    for case_id, path, names in SPECIAL_FILES:
        for command in ("simulate", "replay", "check-config"):
            filled = _fill(path, fixtures)
            refusals.run(f"{command} {case_id}", _argv_for_file(command, filled), (names, SPECIAL_NAMES[command]))
    assert not refusals.problems, "\n".join(refusals.problems)


@pytest.mark.parametrize("command", sorted(ARGV_CASES))
def test_argument_vectors(command, refusals, fixtures):
    for case in ARGV_CASES[command]:
        refusals.run(f"{case.id}", [_fill(a, fixtures) for a in case.argv], case.names)
    assert not refusals.problems, "\n".join(refusals.problems)
    print(f"{command}: {refusals.runs} runs, slowest {refusals.slowest[0]:.2f} s ({refusals.slowest[1]})")


def _sample() -> list[tuple[str, list[str], str]]:
    files = {c.id: c for c in FILE_CASES}
    picks = [("replay", "max_steps_1e9"), ("simulate", "latin1_text"), ("check-config", "nested_lists_20000"),
             ("replay", "digits_5000_max_steps"), ("simulate", "nan_watermark"), ("check-config", "num_gpu_blocks_1e12")]
    sample = [(f"{cmd} {cid}", _argv_for_file(cmd, str(FILES / f"{cid}.json")), files[cid].names_for(cmd))
              for cmd, cid in picks]
    argv_picks = {("conform", "adapter_unknown"), ("conform", "adapter_no_module"), ("conform", "timeout_nan"),
                  ("conform", "out_under_a_file"), ("replay", "html_is_a_directory"), ("check-config", "watermark_inf")}
    sample += [(f"{cmd} {c.id}", list(c.argv), c.names) for cmd, cases in ARGV_CASES.items() for c in cases
               if (cmd, c.id) in argv_picks]
    return sample


def test_sample_in_a_real_process(fixtures, tmp_path):
    """What a shell sees: exit 2, one stderr line, no traceback, empty stdout, nothing written."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    sample: list[tuple[str, list, str]] = list(_sample())
    # a file name that is not UTF-8 reaches Python as surrogates and must still print as one line
    sample.append(("replay non-utf8 name", ["replay", os.fsencode(fixtures["{base}"]) + b"/caf\xe9.json"], "no such file"))
    problems = []
    for label, argv, names in sample:
        argv = [a if isinstance(a, bytes) else _fill(a, fixtures) for a in argv]
        proc = subprocess.run([sys.executable, "-m", "conformance", *argv], cwd=cwd, env=env, capture_output=True,
                              timeout=120)
        err = proc.stderr.decode(errors="replace")
        lines = err.splitlines()
        if proc.returncode != 2 or proc.stdout or len(lines) != 1 or names not in err or "Traceback" in err:
            problems.append(f"{label}: exit {proc.returncode}, stdout {proc.stdout[:100]!r}, stderr {err[:300]!r}")
    assert not any(cwd.iterdir()), sorted(p.name for p in cwd.iterdir())
    assert not problems, "\n".join(problems)


def test_output_paths_are_checked_before_the_run(refusals, fixtures):
    """A good run whose report could not be written is refused before the adapter even loads:
    no --out folder, no banner, at once."""
    case = ArgvCase("late_json", ("conform", "--adapter", "reference", "--max-examples", "1000000", "--json",
                                  "{file}/report.json"), "--json")
    refusals.run(case.id, [_fill(a, fixtures) for a in case.argv], case.names)
    assert not refusals.problems, refusals.problems
    assert refusals.slowest[0] < 5.0  # refused before any of the million traces


def test_output_while_loading_reaches_the_log_once_out_exists(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(FILES.parent))
    out = tmp_path / "out"
    code = main(["conform", "--adapter", "loud_adapter:make", "--max-examples", "2", "--seed", "1", "--quiet",
                 "--out", str(out)])
    assert code == 0
    assert "LOUD" not in capsys.readouterr().out  # the adapter's output never mixes into the report
    assert "LOUD: loading the adapter" in (out / "adapter-output.log").read_text()


def test_the_catch_all_prints_one_line_for_a_bug_and_for_an_os_error(monkeypatch, capsys):
    """Input no check foresaw still gives one line: an OSError is input (exit 2), anything else a
    kvsched bug (exit 3), neither with a traceback unless KVSCHED_TRACEBACK is set."""
    import conformance.commands.simulate as simulate

    def broken(args):
        raise KeyError("a bug\nover two lines")

    def unwritable(args):
        raise PermissionError(13, "Permission denied", "/some/report.json")

    monkeypatch.delenv("KVSCHED_TRACEBACK", raising=False)
    for handler, code, text in ((broken, 3, "internal error in simulate: KeyError"),
                                (unwritable, 2, "/some/report.json: Permission denied")):
        monkeypatch.setattr(simulate, "run", handler)
        assert main(["simulate"]) == code
        out, err = capsys.readouterr()
        assert not out and len(err.splitlines()) == 1 and text in err and "Traceback" not in err, err
    monkeypatch.setenv("KVSCHED_TRACEBACK", "1")
    monkeypatch.setattr(simulate, "run", broken)
    with pytest.raises(KeyError):
        main(["simulate"])


def test_the_json_limits_are_where_they_say(tmp_path):
    """Just inside each limit is read; one past it is refused (so the limits are the ones named)."""
    from spec.errors import InputError
    from spec.json_input import MAX_BYTES, MAX_DEPTH, MAX_INT_DIGITS, parse_json, read_json

    assert parse_json("[" * MAX_DEPTH + "]" * MAX_DEPTH, "x") is not None
    assert parse_json("9" * MAX_INT_DIGITS, "x") == int("9" * MAX_INT_DIGITS)
    assert parse_json("1e308", "x") == 1e308
    for text, says in (("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nested"),
                       ("9" * (MAX_INT_DIGITS + 1), f"{MAX_INT_DIGITS + 1} digits"),
                       ("1e309", "out of range"), ("NaN", "NaN"), ("[Infinity]", "Infinity")):
        with pytest.raises(InputError, match=says):
            parse_json(text, "x")
    exact = tmp_path / "exact.json"
    exact.write_bytes(b"[" + b" " * (MAX_BYTES - 2) + b"]")
    assert read_json(exact) == []
    exact.write_bytes(b"[" + b" " * (MAX_BYTES - 1) + b"]")
    with pytest.raises(InputError, match="more than"):
        read_json(exact)
