"""The one error type for bad input.

Every user-facing mistake (a config value, a trace field, a CLI argument) is raised as
`InputError` naming *where* it is, so the CLI can print a single line and exit 2 instead of
showing a traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input, located by a dotted path such as ``config.block_size`` or ``requests[2].n``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message
