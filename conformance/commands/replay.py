"""``kvsched replay``: run a saved trace through an adapter and show what happens at each step."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from conformance.adapter import load_adapter
from conformance.arguments import check_output_file, check_seconds
from conformance.driver import run_checked
from conformance.profiles import PROFILES, get_profile
from spec.trace import Trace


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="run a JSON trace through an adapter and check it")
    p.add_argument("trace", type=Path, help="a trace file (for example a counterexample the runner wrote)")
    p.add_argument("--adapter", default="reference", help="a built-in, a target, or module:factory (default reference)")
    p.add_argument("--profile", help=f"one of {', '.join(PROFILES)} (default: the trace's, else the adapter's)")
    p.add_argument("--html", type=Path, help="also write a self-contained HTML view of the run here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds an adapter call may take")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Flags and the output path first: nothing is loaded or run for a command that would fail.
    check_seconds(args.timeout, "--timeout")
    check_output_file(args.html, "--html")
    if args.profile is not None:
        get_profile(args.profile)
    trace = Trace.load(args.trace)
    adapter = load_adapter(args.adapter)
    name = args.profile or trace.meta.get("profile") or (adapter.profiles[0] if adapter.profiles else "safety")
    profile = get_profile(str(name))
    lockstep = profile.lockstep and profile.name in adapter.profiles
    result = run_checked(adapter, trace, profile.invariants(), timeout=args.timeout, lockstep=lockstep, stop_at_first=False)
    if args.html:
        from conformance.html_view import write_html

        write_html(args.html, trace, result.records, result.violations)
    if args.json:
        print(json.dumps({
            "version": 1,
            "adapter": adapter.name,
            "profile": profile.name,
            "steps": [r.output.to_dict() | {"finished": [[f.request_id, f.status.value] for f in r.finished]}
                      for r in result.records],
            "violations": [{"invariant": v.invariant_id, "step": v.step, "message": v.message} for v in result.violations],
            "fault": str(result.fault) if result.fault else None,
            "divergence": result.divergence.to_dict() if result.divergence else None,
        }, indent=2))
    else:
        _print(result, adapter.name, profile.name)
    return 1 if result.failed else 0


def _print(result, adapter: str, profile: str) -> None:
    from conformance.explain import explain_step

    print(f"replay of {result.trace.meta.get('problem', 'trace')} on {adapter} (profile {profile})")
    by_step: dict[int | None, list] = {}
    for v in result.violations:
        by_step.setdefault(v.step, []).append(v)
    for record in result.records:
        out = record.output
        sched = " ".join(f"{s.seq_id}:{s.num_tokens}{'P' if s.is_prefill else ''}" for s in out.scheduled) or "-"
        print(f"step {record.step}: scheduled {sched}")
        for line in explain_step(out):
            print(f"    {line}")
        for f in record.finished:
            print(f"    finished {f.request_id}: {f.status.value}")
        for v in by_step.get(record.step, []):
            print(f"  VIOLATION {v}")
    for v in by_step.get(None, []):
        print(f"VIOLATION {v}")
    if result.fault:
        print(f"ADAPTER FAULT at step {result.fault_step}: {result.fault}")
    if result.divergence:
        print("LOCKSTEP DIVERGENCE " + result.divergence.describe())
    if not result.failed:
        print("no violation")
