"""``kvsched simulate``: run the reference scheduler over a workload and show every step."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from conformance.reports.printable import markup_safe
from reference_impl.engine import iter_steps
from reference_impl.scheduler import Scheduler
from reference_impl.workloads import BUILTIN
from spec.catalogue import Checker
from spec.errors import InputError, shown
from spec.observation import StepRecord
from spec.trace import Trace


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("simulate", help="run the reference scheduler over a workload")
    p.add_argument(
        "--workload", default="tour",
        help=f"a JSON trace file, or a built-in name ({', '.join(BUILTIN)}); default: tour",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--explain", action="store_true", help="print the reason behind every decision")
    p.set_defaults(handler=run)


def load_workload(spec: str) -> Trace:
    """A built-in workload by name, else a trace file (read with every limit of `Trace.load`)."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    path = Path(spec)
    try:
        path.lstat()
    except FileNotFoundError:
        raise InputError("--workload", f"no such file or built-in workload {shown(spec, 200)} "
                         f"(built-ins: {', '.join(BUILTIN)})") from None
    except OSError as err:  # a name the system refuses: too long, under a file, ...
        raise InputError(f"--workload {shown(spec, 200)}", f"cannot read: {err.strerror}") from None
    try:
        return Trace.load(path)
    except InputError as err:
        raise InputError(f"--workload {err.where}", err.message) from None


def run(args: argparse.Namespace) -> int:
    # Everything the user gave is read and checked before the first step runs.
    trace = load_workload(args.workload)
    scheduler = Scheduler(trace.config)
    checker = Checker(trace.config, scheduler.capabilities)
    records: list[StepRecord] = []
    violations = []
    for record in iter_steps(trace, scheduler):
        records.append(record)
        violations.extend(checker.check_step(record))
    arrived = {r.request_id for r in trace.requests}
    drained = arrived <= set(checker.context.finished)
    violations.extend(checker.check_end(drained, not drained))
    metrics = {**scheduler.metrics(), "steps": len(records), "drained": drained}
    if args.json:
        print(json.dumps({
            "version": 1,
            "workload": trace.to_dict(),
            "steps": [_step_json(r) for r in records],
            "metrics": metrics,
            "violations": [str(v) for v in violations],
        }, indent=2))
    else:
        _print_table(trace, records, metrics, violations, args.explain)
    return 1 if violations else 0


def _step_json(r: StepRecord) -> dict[str, object]:
    return {
        **r.output.to_dict(),
        "added": [q.request_id for q in r.added],
        "aborted": list(r.aborted),
        "finished": [{"request": f.request_id, "status": f.status.value} for f in r.finished],
        "queues": {q: list(r.after.queue(q) or ()) for q in ("waiting", "running", "swapped")},
        "gpu_free": r.after.gpu_free,
        "cpu_free": r.after.cpu_free,
    }


def _print_table(trace: Trace, records: list[StepRecord], metrics: dict, violations: list, explain: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 132))
    name = trace.meta.get("name", "workload")
    table = Table(title=f"kvsched simulate: {markup_safe(name)} ({trace.config.num_gpu_blocks} GPU blocks of "
                        f"{trace.config.block_size})")
    for col in ("step", "scheduled (seq:tokens)", "preempted", "swap out/in", "CoW", "finished", "W/R/S", "free gpu/cpu"):
        table.add_column(col)
    for r in records:
        out = r.output
        sched = " ".join(f"{s.seq_id}:{s.num_tokens}{'P' if s.is_prefill else ''}" for s in out.scheduled) or "-"
        pre = " ".join(f"{p.request_id}({p.mode.value})" for p in out.preempted) or "-"
        swaps = f"{len(out.swap_out)}/{len(out.swap_in)}" if out.swap_out or out.swap_in else "-"
        fin = " ".join(f"{f.request_id}:{f.status.value.removeprefix('FINISHED_')}" for f in r.finished) or "-"
        queues = "/".join(str(len(r.after.queue(q) or ())) for q in ("waiting", "running", "swapped"))
        sched, pre, fin = markup_safe(sched), markup_safe(pre), markup_safe(fin)  # ids are the trace author's text
        table.add_row(str(r.step), sched, pre, swaps, str(len(out.copies)) if out.copies else "-", fin, queues,
                      f"{r.after.gpu_free}/{r.after.cpu_free}")
    console.print(table)
    if explain:
        for r in records:
            console.print(f"[bold]step {r.step}[/bold]")
            for reason in r.output.reasons:
                console.print(f"  {markup_safe(reason.text())}", highlight=False)
            for f in r.finished:
                if f.reason is not None and f.reason.kind.startswith("finished"):
                    console.print(f"  {markup_safe(f.reason.text())}", highlight=False)
    console.print("metrics: " + ", ".join(f"{k}={v}" for k, v in metrics.items()))
    if violations:
        console.print(f"[red]{len(violations)} invariant violation(s):[/red]")
        for v in violations:
            console.print(f"  {markup_safe(v)}", highlight=False)
    else:
        console.print("all invariants hold")
