"""Draft an upstream report (markdown) from a trace, its finding and its exported reproducer."""

from __future__ import annotations


def render_report(*args, **kwargs) -> str:
    raise NotImplementedError
