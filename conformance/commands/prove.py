"""``kvsched prove``: the Z3 invariant x action matrix (initiation and inductive step).

Exit 0 when every cell is proved, 1 when any cell has a counterexample or is unknown, 2 on bad
input. ``--json`` prints the matrix (version 1); ``--traces DIR`` writes, for each
counterexample, a version-1 JSON trace that replays it on the reference.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from spec.catalogue import catalogue
from spec.errors import InputError
from spec.proofs.bound import DEFAULT, PRESETS, Bound
from spec.proofs.encoding import ACTIONS, MUTANTS
from spec.proofs.matrix import PROVED, prove


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("prove", help="prove the state invariants inductive with Z3 (invariant x action matrix)")
    p.add_argument("--bound", default="default",
                   help=f"size of the symbolic state: a preset ({', '.join(PRESETS)}) or name=value pairs, "
                        f"e.g. gpu_blocks=6,seqs=4 (default: {DEFAULT})")
    p.add_argument("--json", action="store_true", help="print the matrix as JSON (version 1)")
    p.add_argument("--action", action="append", choices=ACTIONS, help="only these actions (repeatable)")
    p.add_argument("--invariant", action="append", help="only these invariants (repeatable)")
    p.add_argument("--alone", action="store_true", help="assume each invariant alone (shows which are inductive alone)")
    p.add_argument("--mutant", choices=sorted(MUTANTS), help="prove against a deliberately broken transition")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per cell before it is 'unknown' (default 60)")
    p.add_argument("--traces", metavar="DIR", help="write a replayable JSON trace per counterexample here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    bound = Bound.parse(args.bound)
    if args.jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {args.jobs}")
    if args.timeout <= 0:
        raise InputError("--timeout", f"must be > 0, got {args.timeout}")
    from spec.proofs.properties import STATE_INVARIANTS, TRANSITION_PROPERTIES

    known = list(STATE_INVARIANTS) + list(TRANSITION_PROPERTIES)
    for iid in args.invariant or ():
        if iid not in known:
            raise InputError("--invariant", f"{iid!r} is not in the matrix (known: {', '.join(known)})")
    matrix = prove(
        bound, mutant=args.mutant, alone=args.alone, invariants=args.invariant, actions=args.action,
        timeout_ms=int(args.timeout * 1000), catalogue_ids=[i.id for i in catalogue()], jobs=args.jobs,
        unbounded=not args.alone,
    )
    written = _write_traces(matrix, Path(args.traces), args.mutant) if args.traces else []
    if args.json:
        out = matrix.to_dict()
        out["traces"] = written
        print(json.dumps(out, indent=2))
    else:
        _print(matrix, written)
    return 0 if matrix.all_proved else 1


def _write_traces(matrix, directory: Path, mutant: str | None) -> list[str]:
    from conformance.proof_bridge import counterexample_trace
    from reference_impl.scheduler import Scheduler

    ids = {i.id for i in catalogue()}
    written = []
    for cell in matrix.failing():
        if cell.counterexample is None or cell.invariant not in ids or cell.action == "init":
            continue
        found = counterexample_trace(cell.counterexample, cell.invariant, Scheduler, tries=500)
        if found is None:
            continue
        trace, violations = found
        path = directory / f"{cell.invariant}-{cell.action}.json"
        trace.save(path)
        written.append(str(path))
    return written


def _print(matrix, written: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    actions = list(dict.fromkeys(c.action for c in matrix.cells))
    rows = list(dict.fromkeys(c.invariant for c in matrix.cells))
    mark = {PROVED: "[green]proved[/]", "counterexample": "[red]cex[/]", "unknown": "[yellow]unknown[/]"}
    table = Table(title=f"kvsched prove: bound {matrix.bound}" + (f", mutant {matrix.mutant}" if matrix.mutant else ""))
    table.add_column("invariant", no_wrap=True)
    for a in actions:
        table.add_column(a)
    for iid in rows:
        cells = {c.action: c for c in matrix.cells if c.invariant == iid}
        row = []
        for a in actions:
            c = cells.get(a)
            if c is None:
                row.append("")
                continue
            text = mark.get(c.result, c.result) + f" {c.seconds:.2f}s"
            if c.scope == "unbounded":
                text += " [cyan]∞[/]"
            row.append(text)
        table.add_row(iid, *row)
    console = Console()
    console.print(table)
    for iid, why in matrix.out_of_scope.items():
        console.print(f"{iid}: outside the matrix — {why}")
    bad = matrix.failing()
    console.print(f"{len(matrix.cells) - len(bad)}/{len(matrix.cells)} cells proved in {matrix.seconds:.1f}s"
                  " (∞ = unbounded: proved for every size)")
    for c in bad[:10]:
        if c.counterexample:
            console.print(f"counterexample {c.invariant} x {c.action}: {json.dumps(c.counterexample.get('params', {}))} "
                          f"config {json.dumps(c.counterexample['config'])}")
    for path in written:
        console.print(f"trace written: {path}")
