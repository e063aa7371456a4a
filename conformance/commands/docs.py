"""``kvsched docs``: write the generated documentation (or check that it is up to date)."""

from __future__ import annotations

import argparse
from pathlib import Path

from conformance.selftest.docs_gen import render_all


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("docs", help="generate docs/ from the spec and the committed results")
    p.add_argument("--out", type=Path, default=Path("docs"), help="docs folder (results are read from OUT/results)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file differs from what would be written")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    files = render_all(args.out)
    stale = []
    for name, text in files.items():
        path = args.out / name
        current = path.read_text() if path.exists() else None
        if current != text:
            stale.append(name)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    if args.check:
        for name in stale:
            print(f"kvsched docs: {args.out / name} is out of date; run `kvsched docs --out {args.out}`")
        return 1 if stale else 0
    print(f"wrote {len(stale)} of {len(files)} files in {args.out}" + (f": {', '.join(stale)}" if stale else ""))
    return 0
