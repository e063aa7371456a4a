"""Export to nano-vllm (``nano-vllm``: nano-vllm-npu's ``nanovllmnpu``; ``nano-vllm-fork``: ``nanovllm``),
in nano-vllm's own idiom: nano-vllm has no tests, so the file drives ``Scheduler`` as
``LLMEngine.step`` does (schedule, one token per sequence, postprocess). Mirrors
conformance/targets/hosts/nano_vllm_host.py, package stub included."""

from __future__ import annotations

from conformance.export.record import Exporter, token_ids

PROPERTIES = ("FAULT-raised", "LIV-001", "BUD-003", "QUE-001", "QUE-002", "REQ-004")
IDIOM = ("nano-vllm's Scheduler driven as LLMEngine.step drives it (schedule(), one token per scheduled sequence, "
         "postprocess()), its Config replaced by the five fields the Scheduler reads")


def prompt_of(request: dict) -> list[int]:
    """The nano host's prompt: the trace's ``prompt_tokens``, else ids of its own per request."""
    tokens = request.get("prompt_tokens")
    return list(tokens) if tokens is not None else token_ids(request["id"], request["prompt_len"])


def own_ids(request: dict) -> dict:
    """A request without ``prompt_tokens`` samples ids of its own too (the host's rule)."""
    return {} if request.get("prompt_tokens") is not None else {"own_ids": True}


EXPORTERS = tuple(
    Exporter(target, "nano_vllm", PROPERTIES, prompt_of, IDIOM, preamble=f"PKG = {pkg!r}  # the package under test\n",
             request_extra=own_ids,
             needs="the installed package; no torch, no model")
    for target, pkg in (("nano-vllm", "nanovllmnpu"), ("nano-vllm-fork", "nanovllm"))
)
