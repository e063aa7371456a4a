"""``kvsched conform``: check a scheduler against the spec (the project's main job)."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
from pathlib import Path
from typing import Any

from conformance.commands.arguments import (
    DAY_S,
    check_count,
    check_output_dir,
    check_output_file,
    check_seconds,
    parse_workers,
)
from conformance.flows.profiles import PROFILES, get_profile
from conformance.reports.printable import printable
from conformance.reports.report import conforming, print_terminal, write_json, write_junit
from conformance.runner.expectations import Expectations, load_expectations, parse_skip, target_expectations
from conformance.runner.fuzz import fuzz
from conformance.runner.isolated import AdapterInfo, ChildRunner, Limits
from conformance.runner.plan import RunPlan
from conformance.runner.signals import SignalRouter
from spec.errors import InputError
from spec.safe_write import open_folder_no_links

# A budget, not a limit of the method: a million traces is days of fuzzing; more is a typo.
MAX_EXAMPLES = 10**6


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("conform", help="fuzz a scheduler through an adapter and check every invariant")
    p.add_argument("--adapter", required=True, help="a built-in (reference, reference-v1, reference-nano, gpu, gpu-v1), a target, "
                        "path/to/file.py:factory, or module:factory (the current folder importable)")
    p.add_argument("--profile", help=f"one of {', '.join(PROFILES)} (default: the adapter's first claim)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--max-examples", type=int, default=None, help="traces to generate (default 200)")
    budget.add_argument("--time-budget", type=float, default=None, help="seconds to spend generating traces")
    p.add_argument("--seed", type=int, default=None, help="random seed (printed; reuse it to repeat a run)")
    p.add_argument("--json", type=Path, help="write the report as JSON here")
    p.add_argument("--junit", type=Path, help="write a JUnit XML report here")
    p.add_argument("--out", type=Path, default=Path("kvsched-out"), help="folder for counterexamples and the example database; "
                        "nothing is written outside it")
    p.add_argument("--db", type=Path, default=None, metavar="DIR",
                   help="Hypothesis' storage folder (its example database and caches; default: OUT/.hypothesis)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds an adapter call may take before it counts as hung")
    p.add_argument("--skip", help="invariant IDs (or LOCKSTEP) not to check, comma-separated")
    expect = p.add_mutually_exclusive_group()
    expect.add_argument("--expect", type=Path, help="an expectations file: known failures, each with a reason (docs/ADAPTERS.md); "
                        "a real target's own (conformance/targets/expectations/) is read by default")
    expect.add_argument("--no-expect", action="store_true",
                        help="do not read the target's own expectations file: every failure counts")
    p.add_argument("--max-memory", type=int, default=8192, metavar="MB", help="the adapter process's memory limit (default 8192)")
    p.add_argument("--max-output", type=int, default=16, metavar="MB", help="what the adapter may print per trace (default 16)")
    p.add_argument("--workers", default=None, metavar="N|auto",
                   help="adapter processes searching at once, each its own seeded search (default 1, or the cluster's "
                        "CPUs with --ray; auto: the cores available)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the workers as actors on this Ray cluster (host:port or auto; "
                        "needs kvsched[cluster], and the adapter loadable on every node)")
    p.add_argument("--redis", metavar="URL", help="share failing traces through this Redis server (redis://host:port): "
                        "replayed first, every failure stored (needs kvsched[cluster])")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check every flag and output path, then load the adapter, and only then create ``--out``
    and print: a refused run (bad flag, unwritable path, adapter that does not load) exits 2
    with nothing on stdout and nothing written."""
    check_count(args.max_examples, "--max-examples", maximum=MAX_EXAMPLES)
    check_seconds(args.time_budget, "--time-budget", maximum=30 * DAY_S)
    check_seconds(args.timeout, "--timeout", maximum=DAY_S)
    check_count(args.max_memory, "--max-memory", minimum=64, maximum=1 << 22, unit="(MB)")
    check_count(args.max_output, "--max-output", maximum=1 << 14, unit="(MB)")
    check_count(args.seed, "--seed", minimum=0, maximum=2**64 - 1)
    args.workers = parse_workers(args.workers) if args.workers is not None else None
    if args.expect is None and not args.no_expect:
        expectations = target_expectations(args.adapter)
    else:
        expectations = load_expectations(args.expect)
    expectations = expectations.with_skips(parse_skip(args.skip))
    if args.profile is not None:
        get_profile(args.profile)  # a bad name fails before the adapter's process starts
    check_output_dir(args.out, "--out")
    # Absolute before the adapter starts: nothing it does (changing folder, planting links) moves what
    # is written (`spec.safe_write`).
    args.out = args.out.resolve()
    if args.db is not None:
        check_output_dir(args.db, "--db")
    args.db = (args.db or args.out / ".hypothesis").resolve()
    check_output_file(args.json, "--json")
    check_output_file(args.junit, "--junit")
    limits = Limits(timeout=args.timeout, max_memory_mb=args.max_memory, max_output_mb=args.max_output)
    database = None
    if args.redis is not None:
        from conformance.runner.example_db import open_redis

        database = open_redis(args.redis)  # a server that does not answer is refused before anything starts
    if args.ray is not None:
        from conformance.cluster.ray_search import RayRunner, connect, disconnect

        cpus = connect(args.ray)
        args.workers = args.workers or cpus
        if args.workers > cpus:  # each actor takes a CPU: the rest would wait for one forever
            disconnect()
            raise InputError("--workers", f"{args.workers} is more than the {cpus} CPUs of the Ray cluster at {args.ray} "
                                          "(each worker takes one)")
        runner = RayRunner(args.adapter, limits)
    else:
        args.workers = args.workers or 1
        runner = ChildRunner(args.adapter, limits, storage=args.db)
    # SIGTERM stops the run like Ctrl-C: what was found is on disk, and the report says so.
    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    previous_home = _hypothesis_home(args.db)
    # A signal from the adapter's tree is its FAULT, not a stop (conformance.runner.signals); Ray's own
    # processes are the cluster's, so under --ray signals act as before.
    router = SignalRouter() if args.ray is None else None
    if router is not None:
        router.install()
    try:
        info = runner.start()  # an adapter that does not load raises InputError naming --adapter
        os.close(open_folder_no_links(args.out))
        try:
            runner.keep_log(args.out / "adapter-output.log")
        except OSError:
            pass  # a link where the log goes (planted while the adapter loaded): no log, the run goes on
        return _conform(args, runner, expectations, info, database)
    finally:
        runner.close()
        if router is not None:
            router.uninstall()
        signal.signal(signal.SIGTERM, previous_term)
        _hypothesis_home(previous_home)
        if args.ray is not None:
            from conformance.cluster.ray_search import disconnect

            disconnect()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _hypothesis_home(folder: Path | None) -> Path | None:
    """Point Hypothesis' storage (the example database, its caches) at ``folder`` in this process
    and return where it pointed before (None: its default, ``./.hypothesis``, which a run must not
    create). The adapter's process gets the same folder (`ChildRunner`'s ``storage``)."""
    from hypothesis import configuration

    previous = getattr(configuration, "__hypothesis_home_directory", None)
    configuration.set_hypothesis_home_dir(folder)
    return previous


def plan_of(args: argparse.Namespace, info: AdapterInfo, expectations: Expectations) -> RunPlan:
    """The run ``kvsched conform``'s arguments describe, made once: the profile (the adapter's first
    declared one by default), a drawn seed when none is given (printed, so the run can be repeated),
    and the example budget (200, or unbounded under ``--time-budget``)."""
    return RunPlan(
        profile=get_profile(args.profile or (info.profiles[0] if info.profiles else "safety")),
        out_dir=args.out,
        max_examples=args.max_examples or (10**6 if args.time_budget else 200),
        time_budget=args.time_budget,
        seed=args.seed if args.seed is not None else random.randrange(2**31),
        timeout=args.timeout,
        workers=args.workers,
        adapter_spec=args.adapter,
        expectations=expectations,
    )


def _conform(args: argparse.Namespace, runner: Any, expectations, info: AdapterInfo, database: Any = None) -> int:
    """One campaign on ``runner`` (a `ChildRunner`, or a `conformance.cluster.ray_search.RayRunner` under
    ``--ray``), sharing failures through ``database`` (``--redis``) when given."""
    plan = plan_of(args, info, expectations)
    profile, max_examples = plan.profile, plan.max_examples
    print(printable(f"kvsched conform: adapter {info.name}, profile {profile.name}, seed {plan.seed}"), flush=True)
    if expectations.source:
        print(f"expectations: {expectations.source} ({len(expectations.expected)} expected, {len(expectations.skip)} "
              "skipped; --no-expect counts every failure)", flush=True)
    shared = None
    if database is not None:
        from conformance.runner.adapter import canonical_spec
        from conformance.runner.example_db import SharedExamples

        shared = SharedExamples(database, canonical_spec(args.adapter), profile.name)

    progress_cb = None
    progress = None
    if not args.quiet:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("fuzzing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            TextColumn("{task.fields[found]}"), transient=True)
        total = None if args.time_budget else max_examples
        task = progress.add_task("fuzz", total=total, found="")
        progress.start()

        def progress_cb(result):
            progress.update(task, completed=result.examples, found=f"{result.steps_checked} steps")

    try:
        result = fuzz(runner, plan, on_example=progress_cb, shared=shared)
    finally:
        if progress is not None:
            progress.stop()
    print_terminal(result)
    for problem, finding in sorted(result.findings.items()):
        if finding.unsaved:  # the finding stands; its trace goes where it can still be read
            print(json.dumps({"version": 1, "problem": problem, "unsaved": finding.unsaved,
                              "trace": finding.trace.to_dict()}), file=sys.stderr)
    if args.json:
        write_json(result, args.json)
    if args.junit:
        write_junit(result, args.junit)
    if result.interrupted and conforming(result):
        return 130  # stopped before the budget was spent: not a pass
    return 0 if conforming(result) else 1
