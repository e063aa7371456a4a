"""Text from the code under test, made safe to print on a terminal.

An adapter's messages (an exception's text, its last line of output, its name) and a trace's ids
reach the terminal inside kvsched's reports. A terminal acts on what it is sent: an ANSI or OSC
escape sequence can clear the screen, set the window title or hide the rest of a line, a NUL or
a bidirectional override makes a line read as something else, and a lone surrogate cannot even
be encoded (the print fails). `printable` writes every such character as its escape (``\\x1b``,
``\\x00``, ``\\u202e``, ``\\udc80``), so the text is shown, never obeyed; newlines and tabs
stay. `markup_safe` also escapes rich's markup (``[bold]``, ``[/]``) for text printed through a
rich console.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL and C1, the bidirectional and zero-width format characters,
# and lone surrogates.
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object) -> str:
    """``text`` (made a string) with every character a terminal would act on written as its escape."""
    return _UNSAFE.sub(_escaped, text if isinstance(text, str) else str(text))


def markup_safe(text: object) -> str:
    """`printable`, with rich's markup escaped too."""
    from rich.markup import escape

    return escape(printable(text))
