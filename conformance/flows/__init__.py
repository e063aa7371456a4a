"""The flows registry: every scheduling policy family kvsched knows, each a `Flow` record in
``conformance/flows/<id>.py`` that names all of its parts (STYLE.md, "How a new flow is laid out").

Code that needs "the reference of flow X" or "every flow with a twin" reads `FLOWS` or `get_flow`
instead of keeping its own per-flow table.
"""

from __future__ import annotations

import importlib

from conformance.flows.record import Flow, resolve
from spec.errors import InputError

FLOW_IDS = ("v0", "v1", "nano", "async", "specdec", "sglang", "hybrid", "connector")
# conformance/flows/async.py: `async` is a keyword, so the modules are imported by name.
FLOWS: dict[str, Flow] = {fid: importlib.import_module(f"conformance.flows.{fid}").FLOW for fid in FLOW_IDS}


def get_flow(flow_id: str) -> Flow:
    if flow_id not in FLOWS:
        raise InputError("flow", f"unknown flow {flow_id!r} (known: {', '.join(FLOWS)})")
    return FLOWS[flow_id]


__all__ = ["FLOWS", "FLOW_IDS", "Flow", "get_flow", "resolve"]
