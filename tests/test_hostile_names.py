"""Issue 35, second round: hostile names in every command's input exit 0, 1 or 2, never 3 (an
internal error), and never reach the terminal raw.

`NAMES` holds 12 names a user or a trace author can write: a lone surrogate, rich markup (``[/]``,
``[bold red]``), ANSI and OSC escapes, NUL, a bidirectional override, a newline, 64 KiB of text,
and three harmless ones (an emoji, a space, a backslash) that must still work. Each goes into a
trace in 4 places (a request id, an abort, a stop, the meta the reports print), and each of the 48
files runs through ``simulate`` (table and ``--json``), and those with the name in an id or the
meta through ``replay`` (with ``--html``) and ``check-config`` too: 144 runs. Each name also goes into 6 flags (``conform --adapter``, ``--profile``,
``--skip``, ``replay --profile``, ``museum --exhibit``, ``prove --invariant``): 72 runs. Every run
exits 0, 1 or 2; none prints an escape character, a NUL or a lone surrogate; an HTML view, where
written, is a whole page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.commands.cli import main

NAMES = {"surrogate": "a\ud800b", "markup_close": "[/]", "markup_open": "[bold red]x", "ansi": "\x1b[31mred",
         "osc": "\x1b]0;title\x07", "nul": "a\x00b", "bidi": "ab\u202ecd", "newline": "a\nb", "long_64k": "x" * 65536,
         "emoji": "\U0001f642", "space": "a b", "backslash": "a\\b"}
PLACES = ("id", "abort", "stop", "meta")
BASE = {"version": 1, "config": {"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 8, "max_num_seqs": 2,
                                 "max_num_batched_tokens": 32, "max_model_len": 24, "watermark": 0.0},
        "requests": [{"id": "A", "prompt_len": 5, "max_tokens": 3}], "max_steps": 20}
RAW = ("\x1b", "\x00", "\x07", "\x9b")


def _trace(name: str, place: str) -> dict:
    trace = json.loads(json.dumps(BASE))
    if place == "id":
        trace["requests"][0]["id"] = name
    elif place == "abort":
        trace["aborts"] = [{"step": 1, "request": name}]
    elif place == "stop":
        trace["stops"] = [{"step": 1, "seq": f"{name}#0"}]
    else:
        trace["meta"] = {"name": name, "problem": name, "adapter": name}
    return trace


def _clean(text: str) -> bool:
    return not any(c in text for c in RAW) and not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_12_names_in_4_places_in_144_runs_never_exit_3(tmp_path, capsys):
    assert len(NAMES) * len(PLACES) == 48
    bad = []
    runs = 0
    for key, name in NAMES.items():
        for place in PLACES:
            path = tmp_path / f"{key}-{place}.json"
            path.write_text(json.dumps(_trace(name, place)))  # ensure_ascii: a surrogate as its \\ud800 escape
            html = tmp_path / f"{key}-{place}.html"
            commands = [["simulate", "--workload", str(path)], ["simulate", "--workload", str(path), "--json"]]
            if place in ("id", "meta"):  # replay starts a process and check-config a solver per trace: the two
                commands += [["replay", str(path), "--adapter", "reference", "--html", str(html)],  # places they print
                             ["check-config", "--config", str(path)]]
            for argv in commands:
                runs += 1
                code, text = _run(argv, capsys)
                if code not in (0, 1, 2) or not _clean(text):
                    bad.append((key, place, argv[0], code, text[-300:]))
            if html.exists():
                assert html.read_text(encoding="utf-8").rstrip().endswith("</html>"), html
    assert runs == 144
    assert not bad, bad
    # The harmless names still run (a trace with them is not refused).
    for key in ("emoji", "space", "backslash"):
        assert main(["simulate", "--workload", str(tmp_path / f"{key}-id.json")]) in (0, 1)
    capsys.readouterr()


@pytest.mark.parametrize("key", NAMES)
def test_each_name_in_6_flags_exits_2_at_worst(key, tmp_path, capsys):
    name = NAMES[key]
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(BASE))
    flags = [["conform", "--adapter", name, "--max-examples", "1", "--out", str(tmp_path / "out")],
             ["conform", "--adapter", "reference", "--profile", name, "--out", str(tmp_path / "out")],
             ["conform", "--adapter", "reference", "--skip", name, "--out", str(tmp_path / "out")],
             ["replay", str(trace), "--profile", name], ["museum", "--exhibit", name, "--list"],
             ["prove", "--invariant", name]]
    assert len(flags) == 6
    for argv in flags:
        code, text = _run(argv, capsys)
        assert code in (0, 1, 2) and _clean(text), (argv[:2], code, text[-300:])
    assert not Path("kvsched-out").exists()
