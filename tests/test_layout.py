"""The architecture is checked, not only described: the import-linter contracts in pyproject.toml
(the layers of DESIGN.md, conformance/'s parts in their order, the public runner free of self-test
tooling, no import circle between the parts of a package) hold on the tree as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout, run.stdout[-4000:]
