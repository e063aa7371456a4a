"""``kvsched invariants``: print the invariant catalogue."""

from __future__ import annotations

import argparse
import json

from spec.catalogue import catalogue


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("invariants", help="list the invariant catalogue")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--category", choices=("safety", "policy", "liveness"), help="only this category")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    items = [inv for inv in catalogue() if args.category in (None, inv.category)]
    if args.json:
        print(json.dumps({"version": 1, "invariants": [inv.to_dict() for inv in items]}, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"kvsched invariant catalogue ({len(items)})", show_lines=False)
    table.add_column("ID", no_wrap=True)
    table.add_column("category")
    table.add_column("statement")
    table.add_column("needs")
    for inv in items:
        needs = ", ".join(sorted(c.value for c in inv.needs if c.value != "output")) or "output"
        table.add_row(inv.id, inv.category, inv.statement, needs)
    Console().print(table)
    return 0
