"""A fix applied to a copy of an installed engine, never to the engine itself.

A fix is a versioned JSON descriptor (docs/reports/fixes/*.json): the package, the release it was
written against, where it comes from (an upstream PR, or our own minimal fix), and edits, each a
file inside the package and one exact ``find`` text (which must occur once) with its ``replace``.
`patched_copy` makes a copy of the package from the target's venv (a tree of symbolic links: the
installed files are read, never written, so a 900 MB package costs a second), replaces each edited
file by a real, patched file, and returns the folder to put first on ``PYTHONPATH``:

    python -m conformance.export.patching docs/reports/fixes/FIX.json --target vllm-v1 --out /tmp/fixed
    PYTHONPATH=/tmp/fixed ~/.cache/kvsched/targets/vllm-v1/venv/bin/python REPRODUCER.py

No engine source is kept in kvsched: a descriptor holds the few lines it changes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conformance.export.strangers import export_target, export_target_names
from spec.errors import InputError

DESCRIPTOR_VERSION = 1


@dataclass(frozen=True)
class Edit:
    file: str  # inside the package, e.g. "v1/core/sched/scheduler.py"
    find: str
    replace: str


@dataclass(frozen=True)
class Fix:
    package: str
    release: str
    source: str
    edits: tuple[Edit, ...]


def load_fix(path: Path) -> Fix:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise InputError(str(path), f"cannot read the fix descriptor: {err}") from None
    if not isinstance(data, dict) or data.get("version") != DESCRIPTOR_VERSION:
        raise InputError(f"{path}: version", f"must be {DESCRIPTOR_VERSION}")
    for key in ("package", "release", "source", "edits"):
        if key not in data:
            raise InputError(f"{path}: {key}", "is missing")
    edits = []
    for index, edit in enumerate(data["edits"]):
        if not isinstance(edit, dict) or not all(isinstance(edit.get(k), str) for k in ("file", "find", "replace")):
            raise InputError(f"{path}: edits[{index}]", "must have the strings file, find and replace")
        edits.append(Edit(edit["file"], edit["find"], edit["replace"]))
    return Fix(data["package"], data["release"], data["source"], tuple(edits))


def installed_package_dir(python: Path, package: str) -> Path:
    """Where ``package`` is installed for the interpreter ``python`` (found without importing it)."""
    code = f"import importlib.util, os; print(os.path.dirname(importlib.util.find_spec({package!r}).origin))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise InputError("--target", f"{package} is not installed for {python}")
    return Path(out.stdout.strip())


def patched_copy(fix: Fix, package_dir: Path, out: Path) -> Path:
    """A copy of ``package_dir`` under ``out/<package>`` with ``fix`` applied; returns ``out``."""
    dest = out / fix.package
    if dest.exists():
        raise InputError("--out", f"{dest} exists already: give an empty folder")
    for root, dirs, files in os.walk(package_dir):
        rel = Path(root).relative_to(package_dir)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not name.endswith(".pyc"):
                (dest / rel / name).symlink_to(Path(root) / name)
    for edit in fix.edits:
        target = dest / edit.file
        text = target.read_text()  # the installed file through its link, or the copy an earlier edit made
        count = text.count(edit.find)
        if count != 1:
            raise InputError(f"edits.{edit.file}", f"the text to replace occurs {count} times in the installed "
                             f"{fix.package} (expected once: is this {fix.release}?)")
        target.unlink()
        target.write_text(text.replace(edit.find, edit.replace))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.export.patching", description=__doc__.split("\n")[0])
    parser.add_argument("fix", type=Path)
    parser.add_argument("--target", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        fix = load_fix(args.fix)
        target = export_target(args.target)
        if target is None:
            raise InputError("--target", f"unknown target {args.target!r} (known: {', '.join(export_target_names())})")
        out = patched_copy(fix, installed_package_dir(target.python, fix.package), args.out)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
