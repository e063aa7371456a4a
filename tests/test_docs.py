"""The committed docs are exactly what `kvsched docs` generates from the spec and the results."""

from __future__ import annotations

import shutil
from pathlib import Path

from conformance.commands.cli import main

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_committed_docs_are_up_to_date(capsys):
    code = main(["docs", "--out", str(DOCS), "--check"])
    assert code == 0, capsys.readouterr().out


def test_check_notices_a_stale_file(tmp_path, capsys):
    shutil.copytree(DOCS, tmp_path / "docs")
    (tmp_path / "docs" / "INVARIANTS.md").write_text("stale\n")
    assert main(["docs", "--out", str(tmp_path / "docs"), "--check"]) == 1
    assert "INVARIANTS.md is out of date" in capsys.readouterr().out
    assert main(["docs", "--out", str(tmp_path / "docs")]) == 0
    assert main(["docs", "--out", str(tmp_path / "docs"), "--check"]) == 0


def test_every_invariant_has_its_section():
    from spec.catalogue import catalogue

    text = (DOCS / "INVARIANTS.md").read_text()
    for inv in catalogue():
        assert f"## {inv.id}\n" in text and inv.statement in text
