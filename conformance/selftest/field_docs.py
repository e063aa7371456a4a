"""The field tables of the types an adapter builds, read from their source (docs/ADAPTERS.md).

Each field's line in the table is its type, its default and the comment the code gives it: the
comment at the end of its line, or else the comment block just above it. A field with no comment
is an error (`field_table` raises), so a new field cannot reach the docs unexplained; the
generated page is drift-checked with the others (`kvsched docs --check`, tests/test_docs.py).
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import textwrap
from typing import Any

_FIELD = re.compile(r"^    (\w+): ([^=#]+?)(?:\s*=\s*(.+?))?\s*(?:#\s*(.*))?$")


def field_comments(cls: type) -> dict[str, tuple[str, str]]:
    """Field name -> (its type as written, its comment), from the class body's source."""
    lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    comments: dict[str, tuple[str, str]] = {}
    above: list[str] = []
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("#") and line.startswith("    #"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match and not stripped.startswith(("def ", "@")):
            name, trailing = match.group(1), match.group(4)
            comments[name] = (match.group(2).strip(), (trailing or " ".join(above)).strip())
        above = [] if not stripped.startswith("#") else above
    return comments


def _names_and_defaults(cls: type) -> list[tuple[str, str]]:
    if dataclasses.is_dataclass(cls):
        out = []
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                default = repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = repr(f.default_factory())  # type: ignore[misc]
            else:
                default = ""
            out.append((f.name, default))
        return out
    defaults: dict[str, Any] = getattr(cls, "_field_defaults", {})
    return [(name, repr(defaults[name]) if name in defaults else "") for name in cls._fields]  # type: ignore[attr-defined]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def field_table(cls: type, skip: tuple[str, ...] = ()) -> str:
    """A markdown table of ``cls``'s fields: name, type, default, meaning."""
    comments = field_comments(cls)
    rows = []
    for name, default in _names_and_defaults(cls):
        if name in skip:
            continue
        kind, text = comments.get(name, ("", ""))
        if not text:
            raise ValueError(f"{cls.__module__}.{cls.__qualname__}.{name} has no comment to document it by")
        default_cell = f"`{_cell(default)}`" if default else "required"
        rows.append(f"| `{name}` | `{_cell(kind)}` | {default_cell} | {_cell(text)} |")
    return "| field | type | default | meaning |\n| --- | --- | --- | --- |\n" + "\n".join(rows) + "\n"
