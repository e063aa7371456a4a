"""Export to tokasaurus 0.0.4 (``tokasaurus``, a stranger adapter: docs/examples/tokasaurus/, not a
`kvsched targets` target; its venv is built by hand, conformance.export.strangers). The file builds
tokasaurus' real manager state from a ``ServerConfig`` set as its tests/test_basic.py
``make_basic_config`` sets one, and calls the manager's own functions in ``manager_loop``'s order,
as docs/examples/tokasaurus/tokasaurus_host.py does (the same stubs: flashinfer, the model folder,
``prepare_and_submit_to_model``)."""

from __future__ import annotations

from conformance.export.record import Exporter, token_ids

PROPERTIES = ("FAULT-raised", "LIV-001", "BUD-001", "QUE-001")
IDIOM = ("tokasaurus' manager state (BlockAllocator, SchedulingQueue, BatchIndexAllocator) from a ServerConfig set "
         "as its tests/test_basic.py make_basic_config sets one, driven by its own manager functions in "
         "manager_loop's order (handle_new_server_commands, try_cancelling_requests, schedule_steps, handle_output, "
         "finish_sequences)")


def prompt_of(request: dict) -> list[int]:
    """The trace's ``prompt_tokens``, else ids of its own per request (the stranger host draws them
    from Python's per-process string hash, which no file can replay: fixed ids here)."""
    tokens = request.get("prompt_tokens")
    return list(tokens) if tokens else token_ids(request["id"], request["prompt_len"])


EXPORTERS = (Exporter("tokasaurus", "tokasaurus", PROPERTIES, prompt_of, IDIOM,
                      needs="the tokasaurus venv of docs/examples/tokasaurus/README.md; no model, no GPU"),)
