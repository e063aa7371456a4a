"""``kvsched check-config``: can some admissible request never run under this config? (Z3)

Exit 0 when every admissible request can run, 1 when one cannot (a witness and the conflicting
settings are printed), 2 on bad input. ``--json`` prints the report (version 1).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.proofs.config_check import check_config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check-config", help="find with Z3 an admissible request that can never run")
    p.add_argument("--config", metavar="FILE", help="a JSON config (the 'config' object of a trace, or a trace)")
    for f in fields(SchedulerConfig):
        kind = float if f.name == "watermark" else (str if f.name in ("preemption_mode", "policy") else int)
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=None,
                       help=f"override config.{f.name} (default {f.default})")
    p.add_argument("--max-n", type=int, default=None, help="largest n a client may send (default: max_num_seqs)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (version 1)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    data: dict = {}
    if args.config:
        path = Path(args.config)
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise InputError(args.config, "no such file") from None
        except json.JSONDecodeError as err:
            raise InputError(args.config, f"not valid JSON (line {err.lineno}: {err.msg})") from None
        if isinstance(raw, dict) and "config" in raw and isinstance(raw["config"], dict):
            raw = raw["config"]
        if not isinstance(raw, dict):
            raise InputError(args.config, "must be a JSON object")
        data.update(raw)
    for f in fields(SchedulerConfig):
        value = getattr(args, f.name)
        if value is not None:
            data[f.name] = value
    config = SchedulerConfig.from_dict(data)
    if args.max_n is not None and args.max_n < 1:
        raise InputError("--max-n", f"must be >= 1, got {args.max_n}")
    report = check_config(config, args.max_n)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("config: " + ", ".join(f"{k}={v}" for k, v in config.to_dict().items()))
        if report.feasible:
            print("feasible: every admissible request can run")
        for f in report.findings:
            tag = "INFEASIBLE" if f.blocking else "warning"
            print(f"{tag}: {f.reason}: request {json.dumps(f.request)} — conflicting settings: "
                  f"{', '.join(f.conflicting) or '(none)'}")
        print(f"guaranteed to run concurrently without preemption: {report.guaranteed_concurrency} sequence(s)")
    return 0 if report.feasible else 1
