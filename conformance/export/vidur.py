"""Export to Vidur's replica schedulers (``vidur-vllm``, ``vidur-sarathi``, ``vidur-orca``: vidur==0.0.26).
Vidur is a simulator: its idiom is the event loop of ``Simulator.run``, so the file handles one
batch's events in that order on one replica, with a fixed stage time and no metrics. Mirrors
conformance/targets/hosts/vidur_host.py."""

from __future__ import annotations

from conformance.export.record import Exporter

PROPERTIES = ("FAULT-raised", "LIV-001", "BUD-003", "REQ-004")


def prompt_of(request: dict) -> list[int]:
    """Vidur has no token ids: a prompt is its length (the ids here are only counted)."""
    return list(range(request["prompt_len"]))


EXPORTERS = tuple(
    Exporter(f"vidur-{kind}", "vidur", PROPERTIES, prompt_of,
             f"Vidur's {kind} replica scheduler with its Request, Batch and event entities, the events of each batch "
             "handled in Simulator.run's order on one replica (a fixed stage time, no metrics)",
             preamble=f"KIND = {kind!r}  # the replica scheduler under test\n", needs="the installed vidur")
    for kind in ("vllm", "sarathi", "orca")
)
