"""``kvsched prove``: the Z3 invariant x action matrix (initiation and inductive step).

Exit 0 when every cell is proved, 1 when any cell has a counterexample or is unknown, 2 on bad
input. ``--json`` prints the matrix (version 1); ``--traces DIR`` writes, for each
counterexample, a version-1 JSON trace that replays it on the reference.

``--flow``: ``v0`` (vLLM V0's flow, reference_impl/scheduler.py), ``v1`` (vLLM V1's flow with
chunked prefill, reference_impl/v1_scheduler.py, spec/proofs/chunked.py), ``async`` (the pipelined
V1 flow, reference_impl/async_scheduler.py, spec/proofs/encoding_async.py), ``specdec`` (V1 with
speculative decoding, reference_impl/specdec_scheduler.py, spec/proofs/encoding_specdec.py),
``hybrid`` (V1's actions over KV cache groups in one pool, reference_impl/hybrid_scheduler.py: the
per-group block rows for every size by spec/proofs/groups.py; no bounded encoding, so ``--bound``
does not apply) or ``all`` (default: every flow, one table each; ``--bound`` then applies to v0,
the others keep their own bound).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from spec.catalogue import catalogue
from spec.errors import InputError
from spec.proofs.bound import DEFAULT, PRESETS, Bound
from spec.proofs.chunked import V1_ACTIONS, V1_BOUND, V1_MUTANTS
from spec.proofs.encoding import ACTIONS, MUTANTS
from spec.proofs.encoding_async import ASYNC_ACTIONS, ASYNC_BOUND, ASYNC_MUTANTS
from spec.proofs.encoding_connector import CONNECTOR_ACTIONS, CONNECTOR_MUTANTS
from spec.proofs.encoding_specdec import SPECDEC_ACTIONS, SPECDEC_BOUND, SPECDEC_MUTANTS
from spec.proofs.groups import GROUP_ACTION_OPS, GROUP_MUTANTS, GROUP_ROW_FACTS
from spec.proofs.matrix import FLOW_NAMES, HYBRID_FLOW, PROVED, flow, merge, prove, prove_hybrid


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("prove", help="prove the state invariants inductive with Z3 (invariant x action matrix)")
    p.add_argument("--bound", default="default",
                   help=f"size of the symbolic state: a preset ({', '.join(PRESETS)}) or name=value pairs, "
                        f"e.g. gpu_blocks=6,seqs=4 (default: {DEFAULT})")
    p.add_argument("--flow", choices=[*FLOW_NAMES, HYBRID_FLOW, "all"], default="all",
                   help=f"which scheduler flow: v0 (vLLM V0), v1 (vLLM V1, chunked prefill; bound {V1_BOUND}), "
                        f"async (pipelined V1; bound {ASYNC_BOUND}), specdec (V1 with speculative decoding; "
                        f"bound {SPECDEC_BOUND}), hybrid (KV cache groups; every size), connector (V1 with a KV "
                        f"connector's loads and sends) or all (default)")
    p.add_argument("--json", action="store_true", help="print the matrix as JSON (version 1)")
    p.add_argument("--action", action="append", choices=list(dict.fromkeys([*ACTIONS, *V1_ACTIONS, *ASYNC_ACTIONS, *SPECDEC_ACTIONS,
                                                             *GROUP_ACTION_OPS, *CONNECTOR_ACTIONS])),
                   help="only these actions (repeatable)")
    p.add_argument("--invariant", action="append", help="only these invariants (repeatable)")
    p.add_argument("--alone", action="store_true", help="assume each invariant alone (shows which are inductive alone)")
    p.add_argument("--mutant", choices=sorted({*MUTANTS, *V1_MUTANTS, *ASYNC_MUTANTS, *SPECDEC_MUTANTS, *GROUP_MUTANTS,
                                               *CONNECTOR_MUTANTS}),
                   help="prove against a deliberately broken transition (selects its flow)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes (default 2)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per cell before it is 'unknown' (default 60)")
    p.add_argument("--traces", metavar="DIR", help="write a replayable JSON trace per counterexample here")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {args.jobs}")
    if args.timeout <= 0:
        raise InputError("--timeout", f"must be > 0, got {args.timeout}")
    names = [*FLOW_NAMES, HYBRID_FLOW] if args.flow == "all" else [args.flow]
    if args.mutant:
        by_flow = {**{m: "v1" for m in V1_MUTANTS}, **{m: "async" for m in ASYNC_MUTANTS},
                   **{m: "specdec" for m in SPECDEC_MUTANTS}, **{m: HYBRID_FLOW for m in GROUP_MUTANTS},
                   **{m: "connector" for m in CONNECTOR_MUTANTS}}
        names = [by_flow.get(args.mutant, "v0")]
        if args.flow not in ("all", names[0]):
            raise InputError("--mutant", f"{args.mutant!r} is a mutant of the {names[0]} flow, not of {args.flow}")
    explicit_bound = args.bound != "default"
    bound = Bound.parse(args.bound)
    known = list(dict.fromkeys([*(i for n in FLOW_NAMES for i in [*flow(n).state_invariants, *flow(n).transition_properties]),
                                *GROUP_ROW_FACTS]))
    for iid in args.invariant or ():
        if iid not in known:
            raise InputError("--invariant", f"{iid!r} is not in the matrix (known: {', '.join(known)})")
    matrices = []
    for name in names:
        if name == HYBRID_FLOW:
            rows = [i for i in args.invariant or () if i in GROUP_ROW_FACTS]
            columns = [a for a in args.action or () if a in GROUP_ACTION_OPS]
            if (args.invariant and not rows) or (args.action and not columns):
                continue
            matrices.append(prove_hybrid(mutant=args.mutant, invariants=rows or None, actions=columns or None,
                                         timeout_ms=int(args.timeout * 1000)))
            continue
        fl = flow(name)
        invariants = [i for i in args.invariant or () if i in fl.state_invariants or i in fl.transition_properties]
        actions = [a for a in args.action or () if a in fl.actions]
        if (args.invariant and not invariants) or (args.action and not actions):
            continue  # the filters name nothing of this flow
        if name in ("v1", "async", "specdec", "connector"):
            flow_bound = bound if explicit_bound and len(names) == 1 else fl.default_bound
            if flow_bound.groups != flow_bound.seqs:
                raise InputError("--bound", f"the {name} flow needs groups == seqs (one sequence per request), got {flow_bound}")
        else:
            flow_bound = bound if explicit_bound or name == "v0" else DEFAULT
        matrices.append(prove(
            flow_bound, flow_name=name, mutant=args.mutant, alone=args.alone, invariants=invariants or None,
            actions=actions or None, timeout_ms=int(args.timeout * 1000),
            catalogue_ids=[i.id for i in catalogue()], jobs=args.jobs, unbounded=not args.alone,
        ))
    if not matrices:
        raise InputError("--action", "the --action / --invariant filters select no cell of the chosen flow")
    matrix = matrices[0] if len(matrices) == 1 else merge(matrices)
    written = _write_traces(matrix, Path(args.traces), args.mutant) if args.traces else []
    if args.json:
        out = matrix.to_dict()
        out["traces"] = written
        print(json.dumps(out, indent=2))
    else:
        _print(matrix, written)
    return 0 if matrix.all_proved else 1


def _write_traces(matrix, directory: Path, mutant: str | None) -> list[str]:
    from conformance.selftest.proof_bridge import (
        counterexample_trace,
        specdec_counterexample_trace,
        v1_counterexample_trace,
    )
    from reference_impl.scheduler import Scheduler
    from reference_impl.specdec_scheduler import SpecDecScheduler
    from reference_impl.v1_scheduler import V1Scheduler

    ids = {i.id for i in catalogue()}
    written = []
    for cell in matrix.failing():
        iid = cell.invariant.split("/")[0]  # a partial row (ID/part) replays as its catalogue invariant
        if cell.counterexample is None or iid not in ids or cell.action == "init" or cell.flow in ("async", "connector"):
            continue  # an async or connector counterexample has no trace bridge yet (docs/PROOFS.md)
        if cell.flow == "v1":
            found = v1_counterexample_trace(cell.counterexample, iid, V1Scheduler, tries=500)
        elif cell.flow == "specdec":
            found = specdec_counterexample_trace(cell.counterexample, iid, SpecDecScheduler, tries=500)
        else:
            found = counterexample_trace(cell.counterexample, iid, Scheduler, tries=500)
        if found is None:
            continue
        trace, violations = found
        prefix = f"{cell.flow}-" if cell.flow in ("v1", "specdec") else ""
        path = directory / f"{prefix}{iid}-{cell.action}.json"
        trace.save(path)
        written.append(str(path))
    return written


def _print(matrix, written: list[str]) -> None:
    from rich.console import Console

    console = Console()
    for name in dict.fromkeys(c.flow for c in matrix.cells):
        cells = [c for c in matrix.cells if c.flow == name]
        bound = matrix.bounds.get(name, matrix.bound) if matrix.bounds else matrix.bound
        console.print(_table(cells, name, bound, matrix.mutant))
    for iid, why in matrix.out_of_scope.items():
        console.print(f"{iid}: outside the matrix — {why}")
    bad = matrix.failing()
    console.print(f"{len(matrix.cells) - len(bad)}/{len(matrix.cells)} cells proved in {matrix.seconds:.1f}s"
                  " (∞ = unbounded: proved for every size)")
    broken = matrix.parametric.get("cells") if matrix.mutant else None
    if broken:
        w = matrix.parametric["witness"]
        how = f"{w['fact']} of micro-op {w['op']} fails (params {json.dumps(w['params'])})" if w else \
            "the generic sequence's rule fails"
        console.print(f"unbounded proof broken by the mutant: {how}, cells {', '.join(f'{r} x {a}' for r, a in broken)}")
    for c in bad[:10]:
        if c.counterexample:
            console.print(f"counterexample {c.invariant} x {c.action} ({c.flow}): {json.dumps(c.counterexample.get('params', {}))} "
                          f"config {json.dumps(c.counterexample['config'])}")
    for path in written:
        console.print(f"trace written: {path}")


def _table(cells, flow_name: str, bound, mutant: str | None):
    from rich.table import Table

    actions = list(dict.fromkeys(c.action for c in cells))
    rows = list(dict.fromkeys(c.invariant for c in cells))
    mark = {PROVED: "[green]proved[/]", "counterexample": "[red]cex[/]", "unknown": "[yellow]unknown[/]"}
    what = {"v0": "vLLM V0 flow", "v1": "vLLM V1 flow, chunked prefill",
            "async": "pipelined V1 flow (outcomes pipeline_depth steps late)",
            "specdec": "V1 flow with speculative decoding (drafts verified, rolled back)",
            "connector": "V1 flow with a KV connector's loads and sends",
            HYBRID_FLOW: "V1 flow over KV cache groups in one pool"}.get(flow_name, flow_name)
    size = "every size (no bounded encoding)" if flow_name == HYBRID_FLOW else f"bound {bound}"
    table = Table(title=f"kvsched prove: {what}, {size}" + (f", mutant {mutant}" if mutant else ""))
    table.add_column("invariant", no_wrap=True)
    for a in actions:
        table.add_column(a)
    for iid in rows:
        by_action = {c.action: c for c in cells if c.invariant == iid}
        row = []
        for a in actions:
            c = by_action.get(a)
            if c is None:
                row.append("")
                continue
            text = mark.get(c.result, c.result) + f" {c.seconds:.2f}s"
            if c.scope == "unbounded":
                text += " [cyan]∞[/]"
            row.append(text)
        table.add_row(iid, *row)
    return table
