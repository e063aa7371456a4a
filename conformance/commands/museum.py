"""``kvsched museum``: run the conformance runner against every exhibit of the bug museum."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from conformance.selftest.museum.exhibits import EXHIBITS, get_exhibit
from conformance.selftest.museum.run import (
    MAX_EXAMPLES,
    MAX_STEPS,
    SEED,
    ExhibitResult,
    all_caught,
    run_museum,
    to_json,
)
from spec.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "museum", help="re-create real scheduler bugs as mutants of the reference and check that each is caught"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--out", type=Path, help="keep counterexamples here (default: a temporary folder)")
    p.add_argument("--exhibit", action="append", metavar="ID", help="run only this exhibit (repeatable)")
    p.add_argument("--max-examples", type=int, default=MAX_EXAMPLES, help=f"traces per exhibit (default {MAX_EXAMPLES})")
    p.add_argument("--seed", type=int, default=SEED, help=f"random seed (default {SEED})")
    p.add_argument("--list", action="store_true", help="list the exhibits and their sources, run nothing")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.max_examples < 1:
        raise InputError("--max-examples", f"must be >= 1, got {args.max_examples}")
    exhibits = [get_exhibit(i) for i in args.exhibit] if args.exhibit else list(EXHIBITS)
    if args.list:
        for e in exhibits:
            print(f"{e.id}\t{e.source_label}\t{e.url}\t{', '.join(e.expected)}")
        return 0
    from rich.console import Console

    console = Console(stderr=True, width=max(Console().width, 120))
    started = time.monotonic()
    if args.json:
        results = run_museum(exhibits, args.out, max_examples=args.max_examples, seed=args.seed)
    else:
        with console.status("") as status:
            def progress(r: ExhibitResult) -> None:
                status.update(f"museum: {r.exhibit.id} {'caught' if r.caught else 'NOT caught'} ({r.seconds:.1f} s)")

            results = run_museum(exhibits, args.out, max_examples=args.max_examples, seed=args.seed, on_result=progress)
    seconds = time.monotonic() - started
    if args.json:
        report = to_json(results, seconds)
        report["seed"] = args.seed
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        print_table(results, seconds)
    return 0 if all_caught(results) else 1


def print_table(results: list[ExhibitResult], seconds: float) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 140))
    table = Table(title="kvsched bug museum")
    for col in ("exhibit", "source", "caught", "by", "steps", "time"):
        table.add_column(col, no_wrap=col != "source", justify="right" if col in ("steps", "time") else "left")
    for r in results:
        e = r.exhibit
        caught = "[green]caught[/]" if r.caught else "[bold red]NOT caught[/]"
        by = r.caught_by or ("-" if not r.problems else "other: " + ", ".join(sorted(r.problems)))
        table.add_row(e.id, f"{e.source_label}", caught, by, str(r.steps) if r.steps is not None else "-",
                      f"{r.seconds:.1f} s")
    console.print(table)
    caught = sum(r.caught for r in results)
    console.print(f"{caught} of {len(results)} exhibits caught, each within {MAX_STEPS} steps required; "
                  f"{seconds:.1f} s in all")
    for r in results:
        if not r.caught:
            why = (f"caught by {r.caught_by} only with {r.steps} steps" if r.caught_by
                   else f"expected {', '.join(r.exhibit.expected)}; found {', '.join(sorted(r.problems)) or 'nothing'}")
            console.print(f"[bold red]{r.exhibit.id}[/]: {why}", highlight=False)
