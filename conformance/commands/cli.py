"""The ``kvsched`` command line.

Each subcommand lives in its own module under `conformance.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``handler`` to a function returning the
exit code. Exit codes everywhere: 0 success, 1 a finding (a violation, a failed check), 2 a
usage or input error, printed as one line without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from conformance.reports.printable import printable
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
    "conformance.commands.export",
)

EXIT_OK, EXIT_FINDING, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
MAX_LINE = 400


def one_line(message: str) -> str:
    """``message`` as one line of at most `MAX_LINE` characters, safe to print (`printable`:
    escape sequences, NUL and lone surrogates from an adapter or a file are shown, never obeyed)."""
    text = printable(" ".join(str(message).split("\n")))
    return text if len(text) <= MAX_LINE else f"{text[: MAX_LINE - 20]} ... ({len(text)} characters)"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        self.exit(EXIT_USAGE, f"kvsched: error: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsched", description="Specification and conformance suite for LLM-serving schedulers.")
    subparsers = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in COMMANDS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a name no encoding can print is escaped, never a crash (exit 3)
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            pass
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _check_encodable(args)
        return int(args.handler(args))
    except InputError as err:
        print(f"kvsched: error: {one_line(str(err))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("kvsched: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except OSError as err:  # a path the checks could not foresee (disk full, removed meanwhile)
        where = f"{err.filename}: " if err.filename else ""
        print(f"kvsched: error: {one_line(where + (err.strerror or str(err)))}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as err:  # noqa: BLE001 - the catch-all: one line, never a traceback
        if os.environ.get("KVSCHED_TRACEBACK"):
            raise
        print(f"kvsched: internal error in {args.command}: {one_line(f'{type(err).__name__}: {err}')} "
              "(a kvsched bug: set KVSCHED_TRACEBACK=1 for the traceback and report it)", file=sys.stderr)
        return EXIT_INTERNAL


def _check_encodable(args: argparse.Namespace) -> None:
    """Every text argument can be carried on (to a file name, a child's command line): a lone
    surrogate (``\ud800``; not one Python made from an undecodable byte, which goes back as that
    byte) or a NUL cannot, and is refused here, naming its flag, rather than failing deep inside a
    command."""
    for name, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str | os.PathLike):
                try:
                    carried = "\x00" not in os.fsdecode(os.fsencode(item))
                except UnicodeEncodeError:
                    carried = False
                if not carried:
                    flag = "--" + name.replace("_", "-")
                    raise InputError(flag, f"holds a character no file name or command line can carry "
                                           f"(a lone surrogate or a NUL): {ascii(os.fspath(item))[:80]}")


if __name__ == "__main__":
    sys.exit(main())
