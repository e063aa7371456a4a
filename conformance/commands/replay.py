"""``kvsched replay``: run a saved trace through an adapter and show what happens at each step.

A trace the runner saved names the adapter (``meta.adapter_spec``, a spec loadable from any
folder) and the profile it was found with. Replay runs only what its command line names: a trace
found on a built-in or an installed target replays with ``kvsched replay TRACE`` alone, but one
that names a file or a module (``path/to/file.py:factory``, ``module:factory``) is code the
trace's author chose, so it runs only when ``--adapter`` names it too; without it, replay refuses
(exit 2) and prints the command that would run it. A trace that names no adapter replays on the
built-in reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from conformance.commands.arguments import check_output_file, check_seconds
from conformance.flows.profiles import PROFILES, get_profile
from conformance.reports.printable import printable
from conformance.runner.fuzz import lockstep_not_run
from conformance.runner.isolated import ChildRunner, Limits
from conformance.runner.signals import SignalRouter
from conformance.runner.summary import Problem
from spec.errors import InputError
from spec.trace import Trace


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="run a JSON trace through an adapter and check it")
    p.add_argument("trace", type=Path, help="a trace file (for example a counterexample the runner wrote)")
    p.add_argument("--adapter", default=None,
                   help="a built-in, a target, path/to/file.py:factory or module:factory "
                        "(default: the trace's meta.adapter_spec, else reference)")
    p.add_argument("--profile", help=f"one of {', '.join(PROFILES)} (default: the trace's, else the adapter's)")
    p.add_argument("--html", type=Path, help="also write a self-contained HTML view of the run here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds an adapter call may take")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Flags and the output path first: nothing is loaded or run for a command that would fail.
    check_seconds(args.timeout, "--timeout")
    check_output_file(args.html, "--html")
    args.html = args.html.resolve() if args.html is not None else None  # before the adapter starts (spec.safe_write)
    if args.profile is not None:
        get_profile(args.profile)
    trace = Trace.load(args.trace)
    # The adapter runs in a child process, as under `kvsched conform`: a replayed hang, exit or
    # crash is reported as the FAULT it is, and never ends or hangs this command.
    runner = ChildRunner(args.adapter or _trace_adapter(trace, args.trace), Limits(timeout=args.timeout))
    router = SignalRouter()  # a signal from the adapter's tree is its FAULT (conformance.runner.signals)
    router.install()
    try:
        info = runner.start()
        name = args.profile or trace.meta.get("profile") or (info.profiles[0] if info.profiles else "safety")
        profile = get_profile(str(name))
        lockstep = profile.lockstep and profile.name in info.profiles
        if profile.lockstep and not lockstep:  # said, never silently weaker than the profile named
            print(printable(f"not run: LOCKSTEP: {lockstep_not_run(profile.name, info.name, info.profiles)}"),
                  file=sys.stderr)
        # The profile's own lockstep reference (vllm-v1, nano-vllm and async each name theirs), as under conform.
        view = runner.replay(trace, [inv.id for inv in profile.invariants()], lockstep=lockstep,
                             reference=profile.reference if lockstep else None, html=args.html)
    finally:
        runner.close()
        router.uninstall()
    if isinstance(view, Problem):
        view = {"steps": [], "violations": [], "fault": view.message, "fault_step": view.step, "divergence": None,
                "failed": True, "lines": [f"ADAPTER FAULT at {view.message}"]}
    if args.json:
        body = {key: value for key, value in view.items() if key != "lines"}
        print(json.dumps({"version": 1, "adapter": info.name, "profile": profile.name, **body}, indent=2))
    else:
        print(printable(f"replay of {trace.meta.get('problem', 'trace')} on {info.name} (profile {profile.name})"))
        for line in view["lines"]:
            print(printable(line))
    return 1 if view["failed"] else 0


def _trace_adapter(trace: Trace, path: Path) -> str:
    """The adapter the trace was found with (``meta.adapter_spec``) when it is a built-in or an
    installed target, the reference when it names none; a file or module adapter is refused
    (the trace does not choose what code runs), with the command that runs it."""
    import shlex

    from conformance.runner.adapter import BUILTIN
    from conformance.targets import TARGETS

    spec = trace.meta.get("adapter_spec")
    if spec is None:
        return "reference"
    if not isinstance(spec, str) or not spec:
        raise InputError("trace.meta.adapter_spec", f"must be an adapter spec string, got {spec!r}")
    if spec in BUILTIN or spec in TARGETS:
        return spec
    command = f"kvsched replay {shlex.quote(str(path))} --adapter {shlex.quote(spec)}"
    raise InputError("--adapter", f"not given, and the trace names a file or module adapter (code the trace chose), "
                                  f"which replay runs only when named; to run it: {command}")
