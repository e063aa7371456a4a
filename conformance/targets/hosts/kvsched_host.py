"""kvsched wire protocol v1, host side: a standalone helper for adapter hosts.

This file imports only the standard library and never kvsched, so it runs inside a target's
own virtual environment (which has no kvsched installed). A host script puts this file's
folder on ``sys.path`` (it ships beside the host scripts) and calls `serve` with an engine
object; see docs/PROTOCOL.md for the messages.

The engine object has these methods, all on plain JSON values:

    hello_extra() -> dict                       (optional: name, profiles, capabilities, version...)
    reset(config: dict) -> None
    add_request(request: dict) -> None
    abort_request(request_id: str) -> dict | None
    schedule() -> dict                           (SchedulerOutput shape)
    update(stopped: list[str]) -> list[dict]     ([{request, status}, ...])
    snapshot() -> dict                           (Snapshot shape, every field optional)

Anything the engine raises becomes ``{"id": n, "error": {"message": ..., "type": ...}}``; the host
stays up and the runner decides what to do. The real stdout is kept for the protocol; file
descriptor 1 is pointed at stderr, so a library that prints (vLLM logs, warnings) cannot corrupt
the stream.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

PROTOCOL_VERSION = 1


def protocol_stream():
    """Take the real stdout for the protocol and send everything else written to fd 1 to stderr.
    A host whose engine logs to stdout while it is imported (vLLM 0.29.0 does) calls this before
    that import and hands the stream to `serve`."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(out_fd, "w", buffering=1, encoding="utf-8")


def serve(engine, name: str, profiles=("safety",), capabilities=("output",), stdin=None, stdout=None) -> int:
    out = stdout if stdout is not None else protocol_stream()
    inp = stdin if stdin is not None else sys.stdin

    def send(obj) -> None:
        out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        out.flush()

    for line in inp:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
            mid, method, params = msg.get("id"), msg["method"], msg.get("params") or {}
        except (ValueError, KeyError, AttributeError) as err:
            send({"id": None, "error": {"message": f"bad request line: {err}", "type": "ProtocolError"}})
            continue
        try:
            if method == "hello":
                result = {"protocol": PROTOCOL_VERSION, "name": name, "profiles": list(profiles),
                          "capabilities": list(capabilities)}
                extra = getattr(engine, "hello_extra", None)
                if extra is not None:
                    result.update(extra())
            elif method == "reset":
                result = engine.reset(params["config"])
            elif method == "add_request":
                result = engine.add_request(params["request"])
            elif method == "abort_request":
                result = engine.abort_request(params["request_id"])
            elif method == "schedule":
                result = engine.schedule()
            elif method == "update":
                result = engine.update(list(params.get("stopped", [])))
            elif method == "snapshot":
                result = engine.snapshot()
            elif method == "shutdown":
                send({"id": mid, "result": None})
                return 0
            else:
                raise ValueError(f"unknown method {method!r}")
        except Exception as err:  # noqa: BLE001 - every engine error goes back to the runner
            tb = traceback.extract_tb(err.__traceback__)
            where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""
            send({"id": mid, "error": {"message": f"{type(err).__name__}: {err}", "type": type(err).__name__,
                                       "where": where}})
            continue
        send({"id": mid, "result": result})
    return 0


def token_ids(request_id: str, count: int, start: int = 0) -> list[int]:
    """Deterministic token ids for a request, distinct from other requests' (no accidental prefix
    sharing) and never 0..15 (kept free for special tokens such as EOS)."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return [base + ((start + k) * 104_729) % 900_000 for k in range(count)]


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)
