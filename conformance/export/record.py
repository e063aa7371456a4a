"""`Exporter`: what kvsched needs to know to write one target's standalone test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Exporter:
    """One target's export: the engine fragment (``templates/<engine>.py.in``), the lines that
    make it this target (a subclass, the package to load), the properties it has checks for, how
    a trace request's prompt ids are chosen (the host's rule), and, for the docstring, the release
    it runs on and the idiom it follows."""

    target: str
    engine: str
    properties: tuple[str, ...]
    prompt_of: Callable[[dict], list[int]]
    idiom: str
    extra: str = ""  # a second fragment, after the engine's (the async engine loop)
    preamble: str = ""  # constants the engine fragment reads, at its ``# @TARGET@`` line (the package to load)
    request_extra: Callable[[dict], dict] | None = None  # more fields per exported request (the host's rules)
    needs: str = ""  # what the venv must have, said in the docstring (the release is the target's pin)
    hybrid: str = ""  # the fragment that builds hybrid KV cache groups (a trace with ``kv_groups``); none: refused
    sessions: str = ""  # the fragment that plays streaming-input sessions' client (a trace with sessions); none: refused
    connector: tuple[str, ...] = ()  # the fragments that play a KV connector (a trace with ``kv_connector``); none: refused


def token_ids(request_id: str, count: int, start: int = 0) -> list[int]:
    """conformance/targets/hosts/kvsched_host.py: token_ids, the ids the V0 and nano-vllm hosts give
    a request that has no ``prompt_tokens`` (distinct per request, never 0..15)."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return [base + ((start + k) * 104_729) % 900_000 for k in range(count)]
