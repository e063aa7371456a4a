"""``kvsched export``: a finding as a file a maintainer runs without kvsched.

    kvsched export TRACE --to pytest [--target NAME] [--property ID] [--out FILE]
    kvsched export TRACE --to report [--target NAME] [--out FILE]

``--to pytest`` writes one standalone test file (`conformance.export`): the engine's real scheduler,
built as the engine's own tests build it, the trace's steps replayed, the violated property
asserted in plain words at the step it breaks; ``python FILE`` runs it too (exit 1 on failure).
``--to report`` drafts the upstream report (markdown) of the trace's finding, the reproducer's
command included. Without ``--out`` the text goes to stdout. Nothing is written until the trace,
the target, the property and the output path have all been checked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from conformance.commands.arguments import check_output_file
from conformance.export import exporter_for, render_pytest, render_report, trace_property
from spec.trace import Trace

FORMATS = ("pytest", "report")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("export", help="write a finding as a standalone test (or an upstream report draft)")
    p.add_argument("trace", type=Path, help="a trace file (a shrunk counterexample)")
    p.add_argument("--to", choices=FORMATS, required=True, help="pytest: a standalone test file; report: markdown")
    p.add_argument("--target", help="the target to export for (default: the trace's meta.adapter)")
    p.add_argument("--property", help="the invariant ID (or FAULT-raised) to assert (default: the trace's finding)")
    p.add_argument("--out", type=Path, help="the file to write (default: stdout)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_output_file(args.out, "--out")
    trace = Trace.load(args.trace)
    exporter = exporter_for(trace, args.target)
    property_id = trace_property(trace, exporter, args.property)
    test = render_pytest(trace, exporter, property_id, str(args.trace))
    if args.to == "pytest":
        text = test
    else:
        text = render_report(trace, exporter, property_id, str(args.trace), args.out)
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out} ({exporter.target}, {property_id})", file=sys.stderr)
    return 0
