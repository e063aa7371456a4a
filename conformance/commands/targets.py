"""``kvsched targets``: install and list the real third-party schedulers (conformance.targets)."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("targets", help="install or list real third-party scheduler targets")
    sub = p.add_subparsers(dest="targets_command", required=True)
    ls = sub.add_parser("list", help="each target: installed or not, pinned version, venv path")
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    ls.set_defaults(handler=run_list)
    inst = sub.add_parser("install", help="install targets into their cached virtual environments")
    inst.add_argument("names", nargs="+", metavar="NAME", help="target names, 'all' (CI's set) or 'nightly' (the slow installs 'all' skips)")
    inst.add_argument("--force", action="store_true", help="rebuild the venv from scratch")
    inst.set_defaults(handler=run_install)


def run_list(args: argparse.Namespace) -> int:
    from conformance.targets import TARGET_SPECS, status

    rows = [status(name) for name in TARGET_SPECS]
    if args.json:
        print(json.dumps({"version": 1, "targets": rows}, indent=2))
        return 0
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        state = "installed" if r["installed"] else ("unverified" if r.get("note") else "not installed")
        print(f"{r['name']:<{width}} {state:<14} {r['package']:<26} {r['venv']}")
    return 0


def run_install(args: argparse.Namespace) -> int:
    from conformance.targets import get_target, install, install_names

    names = install_names(args.names)
    for name in names:
        get_target(name)  # unknown names: a usage error before anything is installed
    failed = 0
    done: dict[str, dict] = {}  # venv -> its install: targets that share a venv install it once
    for name in names:
        venv = get_target(name).venv_of or name
        if venv in done:
            print(f"{name}: shares {venv}'s venv, installed above", flush=True)
            continue
        try:
            info = done[venv] = install(name, force=args.force, log=lambda line: print(line, flush=True))
        except RuntimeError as err:
            print(f"kvsched: target install failed: {err}", file=sys.stderr)
            failed += 1
            continue
        print(f"{name}: installed {info['package']} in {info['seconds']} s ({info['venv']})", flush=True)
    return 1 if failed else 0
