"""``kvsched check-config``: can some admissible request never run under this config? (Z3)

Exit 0 when every admissible request can run, 1 when one cannot, 2 on bad input. The report
explains itself, on the defaults as on any config: where each setting came from (default,
``--config`` file, flag), what "admissible" ranges over, and for each rule of
`spec.proofs.config_check` whether it can bite, the worst case against it in the config's own
numbers, and for a failing rule the flag settings that would clear it (`spec.proofs.config_explain`).
``--json`` prints the same (version 1: the report plus ``checks`` and ``sources``).

Every config field is a flag of its own type: integers, ``--watermark`` a float, the two modes
with their choices, and the two switches as ``--enable-X`` / ``--no-enable-X`` (argparse's
``int`` could never set a boolean field).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from conformance.commands.arguments import check_count
from spec.config import MAX_SEQS, POLICIES, PREEMPTION_MODES, SchedulerConfig
from spec.connector import KV_LOAD_FAILURE_POLICIES
from spec.errors import InputError
from spec.json_input import read_json
from spec.trace import Trace

SWITCHES = tuple(f.name for f in fields(SchedulerConfig) if isinstance(f.default, bool))  # --x / --no-x
CHOICES = {"preemption_mode": PREEMPTION_MODES, "policy": POLICIES, "kv_load_failure_policy": KV_LOAD_FAILURE_POLICIES}


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check-config", help="find with Z3 an admissible request that can never run")
    p.add_argument("--config", metavar="FILE", type=Path, help="a JSON config (the 'config' object of a trace, or a trace)")
    for f in fields(SchedulerConfig):
        help_text = f"override config.{f.name} (default {f.default})"
        if f.name in SWITCHES:
            p.add_argument(flag_of(f.name), dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=help_text)
        elif f.name == "kv_groups":  # a JSON list of groups (spec/kv_groups.py), checked by SchedulerConfig
            p.add_argument(flag_of(f.name), dest=f.name, type=_json_list, default=None, metavar="JSON", help=help_text)
        elif f.name in CHOICES:
            p.add_argument(flag_of(f.name), dest=f.name, choices=CHOICES[f.name], default=None, help=help_text)
        else:
            p.add_argument(flag_of(f.name), dest=f.name, type=float if f.name == "watermark" else int, default=None,
                           metavar="N", help=help_text)
    p.add_argument("--max-n", type=int, default=None, metavar="N",
                   help="largest n a client may send (default: max_num_seqs)")
    p.add_argument("--json", action="store_true", help="print the report as JSON (version 1)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    check_count(args.max_n, "--max-n", maximum=MAX_SEQS)  # n sequences of one request: MAX_SEQS at most
    config, sources = _config(args)
    from spec.proofs.config_check import check_config
    from spec.proofs.config_explain import admissible_text, explain

    report = check_config(config, args.max_n)
    checks = explain(report)
    if args.json:
        print(json.dumps({**report.to_dict(), "sources": sources,
                          "checks": [{"reason": c.reason, "applies": c.applies, "holds": c.holds, "why": c.text,
                                      "fixes": list(c.hints)} for c in checks]}, indent=2))
        return 0 if report.feasible else 1
    given = {k: v for k, v in sources.items() if v != "default"}
    print("config: " + ", ".join(f"{k}={v}" for k, v in _all_fields(config).items()))
    print("  from: " + (", ".join(f"{k} ({v})" for k, v in given.items()) + "; the rest kvsched's defaults"
                        if given else "kvsched's defaults (no --config, no flags)"))
    print(f"checked with Z3: {admissible_text(report, args.max_n is not None)}; can any of them never run?")
    blocking = [f.reason for f in report.findings if f.blocking]
    for check in checks:
        mark = "FAILS" if check.holds and check.reason in blocking else "warns" if check.holds else (
            "passes" if check.applies else "n/a")
        print(f"  {check.reason}: {mark}: {check.text}")
        for finding in report.findings:
            if finding.reason == check.reason:
                print(f"    witness: {json.dumps(finding.request)}; conflicting settings: "
                      f"{', '.join(finding.conflicting) or '(none)'}")
        if check.hints:
            print(f"    cleared by any of: {'; '.join(check.hints)}")
    if report.feasible:
        print("verdict: feasible: every admissible request can run" +
              (" (with a warning above)" if report.findings else ""))
    else:
        print(f"verdict: INFEASIBLE: {len(blocking)} rule(s) fail ({', '.join(blocking)}); exit 1")
    print(f"guaranteed to run concurrently without preemption: {report.guaranteed_concurrency} sequence(s) of "
          f"max_model_len {config.max_model_len} tokens")
    return 0 if report.feasible else 1


def _config(args: argparse.Namespace) -> tuple[SchedulerConfig, dict[str, str]]:
    """The config and, per field, where its value came from."""
    data: dict = {}
    sources = {f.name: "default" for f in fields(SchedulerConfig)}
    if args.config is not None:
        where = f"--config {args.config}"
        raw = read_json(args.config, where=where)
        if not isinstance(raw, dict):
            raise InputError(where, "must be a JSON object (a config, or a trace with one)")
        if "version" in raw or "requests" in raw:  # a trace: all of it must be valid, not only its config
            try:
                raw = Trace.from_dict(raw).config.to_dict()
            except InputError as err:
                raise InputError(f"{where}: {err.where}", err.message) from None
        data.update(raw)
        sources.update({k: "--config" for k in raw if k in sources})
    for f in fields(SchedulerConfig):
        value = getattr(args, f.name)
        if value is not None:
            data[f.name] = value
            sources[f.name] = flag_of(f.name)
    return SchedulerConfig.from_dict(data), sources


def _all_fields(config: SchedulerConfig) -> dict[str, object]:
    return {f.name: getattr(config, f.name) for f in fields(SchedulerConfig)}


def _json_list(text: str) -> list:
    """A flag's JSON list (``--kv-groups '[{"kind": "full"}, ...]'``); argparse names the flag if it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a JSON list, got {text[:40]!r}") from None
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(f"must be a JSON list, got {text[:40]!r}")
    return value
