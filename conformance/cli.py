"""The ``kvsched`` command line.

Each subcommand lives in its own module under `conformance.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` to a function returning the
exit code. Exit codes everywhere: 0 success, 1 a finding (a violation, a failed check), 2 a
usage or input error, printed as one line without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from spec.errors import InputError

COMMANDS = (
    "conformance.commands.simulate",
    "conformance.commands.invariants",
    "conformance.commands.conform",
    "conformance.commands.replay",
    "conformance.commands.targets",
    "conformance.commands.docs",
    "conformance.commands.prove",
    "conformance.commands.check_config",
    "conformance.commands.museum",
)

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(EXIT_USAGE, f"kvsched: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsched", description="Specification and conformance suite for LLM-serving schedulers.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except InputError as err:
        print(f"kvsched: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
