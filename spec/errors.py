"""The one error type for bad input.

Every user-facing mistake (a config value, a trace field, a CLI argument) is raised as
`InputError` naming *where* it is, so the CLI can print a single line and exit 2 instead of
showing a traceback.
"""

from __future__ import annotations

from typing import Any


class InputError(ValueError):
    """Bad input, located by a dotted path such as ``config.block_size`` or ``requests[2].n``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages that echo what the user gave.

    Why: a message must stay one readable line even when the value is a 10 MB string or a
    nested list, and ``repr`` of an integer past 4300 digits raises `ValueError` on Python 3.11.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 5]}...{text[-2:]}"
