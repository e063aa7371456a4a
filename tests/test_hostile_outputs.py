"""Issue 35, second round: what the runner writes and prints stays its own.

- The 4 file attacks of `tests/hostile_adapters.py` (`FILE_CORPUS`: changing folder, planting links
  in ``--out``, replacing ``--out`` with a file, a fault that needs the process's history) each end
  in their finding, exit 1, with nothing written outside ``--out`` (Hypothesis' storage included)
  and the file planted outside untouched; a finding that cannot be written is printed (stdout,
  and its trace as JSON on stderr); a history-dependent fault is reported flaky, its unshrunk
  trace kept.
- An adapter's message full of escape sequences reaches the terminal escaped.
- A trace that names a file adapter replays nothing without ``--adapter``.
- A profile whose lockstep cannot run on the adapter says so.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conformance.commands.cli import main
from spec.trace import Trace

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
from hostile_adapters import ESCAPES, FILE_CORPUS  # noqa: E402


def _files(root: Path, *, skip: tuple[Path, ...]) -> list[str]:
    """Every file and link under ``root`` outside the ``skip`` folders."""
    found = []
    for folder, dirs, names in os.walk(root):
        here = Path(folder)
        dirs[:] = [d for d in dirs if here / d not in skip]
        found += [str(here / n) for n in names]
        found += [str(here / d) for d in dirs if (here / d).is_symlink()]
    return sorted(found)


@pytest.mark.parametrize("name", FILE_CORPUS)
def test_each_of_the_4_file_attacks_is_reported_with_nothing_written_outside_out(name, tmp_path, monkeypatch, capsys):
    assert len(FILE_CORPUS) == 4
    work, outside = tmp_path / "work", tmp_path / "outside"
    work.mkdir()
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("untouched\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("KVSCHED_TEST_OUT", str(work / "out"))
    monkeypatch.setenv("KVSCHED_TEST_OUTSIDE", str(victim))
    monkeypatch.setenv("KVSCHED_TEST_AWAY", str(tmp_path / "away"))
    examples = "8" if name == "fails_on_call_40" else "3"  # 40 schedule() calls take a few traces
    code = main(["conform", "--adapter", f"hostile_adapters:{name}", "--max-examples", examples, "--seed", "1", "--quiet",
                 "--timeout", "2", "--out", "out", "--json", str(tmp_path / "report.json")])
    captured = capsys.readouterr()
    assert code == 1, captured.out[-2000:] + captured.err[-2000:]
    expected = FILE_CORPUS[name][1]
    assert f"new {'flaky ' if name == 'fails_on_call_40' else ''}{expected}" in captured.out, captured.out[-2000:]
    assert victim.read_text() == "untouched\n" and _files(outside, skip=()) == [str(victim)]
    assert not (tmp_path / "away").exists() or _files(tmp_path / "away", skip=()) == []
    assert _files(work, skip=(work / "out",)) == ([] if name != "replaces_out" else [str(work / "out")])
    report = json.loads((tmp_path / "report.json").read_text())
    row = next(r for r in report["invariants"] if r["id"] == expected)
    if name == "replaces_out":
        assert row.get("unsaved") and "not saved" in captured.out
        printed = [json.loads(line) for line in captured.err.splitlines() if line.startswith("{")]
        assert [p["problem"] for p in printed] == [expected]
        assert Trace.from_dict(printed[0]["trace"]).meta["problem"] == expected
        return
    saved = Trace.load(row["counterexample"])
    assert Path(row["counterexample"]).parent == work / "out" / "counterexamples"
    assert not Path(row["counterexample"]).is_symlink()
    if name == "fails_on_call_40":
        assert row["flaky"] and saved.meta["flaky"] and not saved.meta["shrunk"]
    else:
        assert (work / "out" / "counterexamples" / f"{expected}.html").is_file(), _files(work, skip=())


def test_escape_sequences_in_an_adapters_message_reach_the_terminal_escaped(tmp_path, capsys):
    code = main(["conform", "--adapter", "hostile_adapters:escapes_in_message", "--max-examples", "2", "--seed", "1",
                 "--quiet", "--timeout", "2", "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 1
    assert not any(c in out for c in "\x1b\x00\x07\x9b"), repr(out[-1500:])
    assert "\\x1b]0;pwned\\x07" in out and "[bold]markup[/]" in out  # shown, not obeyed (nor taken for markup)
    assert ESCAPES not in out


def test_replay_of_a_hostile_trace_runs_nothing_without_adapter(tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef make():\n    raise SystemExit(0)\n")
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"version": 1, "config": {}, "requests": [{"id": "r0", "prompt_len": 3, "max_tokens": 2}],
                                 "max_steps": 10, "meta": {"adapter_spec": f"{evil}:make", "profile": "safety"}}))
    assert main(["replay", str(trace)]) == 2
    err = capsys.readouterr().err
    assert f"to run it: kvsched replay {trace} --adapter {evil}:make" in err, err
    assert not marker.exists()
    assert main(["replay", str(trace), "--adapter", "reference"]) == 0 and not marker.exists()


def test_a_profile_whose_lockstep_cannot_run_says_so(tmp_path, capsys):
    report = tmp_path / "r.json"
    code = main(["conform", "--adapter", "reference-v1", "--profile", "vllm-v0", "--max-examples", "3", "--seed", "1",
                 "--quiet", "--out", str(tmp_path / "out"), "--json", str(report)])
    out = capsys.readouterr().out
    assert code in (0, 1)
    assert "not run: LOCKSTEP: profile vllm-v0 steps the reference in lockstep, but" in " ".join(out.split())
    assert "LOCKSTEP" in json.loads(report.read_text())["not_run"]
