"""Export to vLLM V1 (``vllm-v1``: ``Scheduler``; ``vllm-v1-async``: ``AsyncScheduler`` driven as
``EngineCore.step_with_batch_queue`` drives it), in the idiom of vLLM's
tests/v1/core/utils.py (``create_scheduler`` from ``VllmConfig`` pieces, ``create_requests``,
``ModelRunnerOutput``s fed to ``update_from_output``). Mirrors conformance/targets/hosts/
vllm_v1_host.py and vllm_v1_async_host.py: the same token scheme and the same door."""

from __future__ import annotations

from pathlib import Path

from conformance.export.record import Exporter
from spec.session import piece_tokens
from spec.types import default_prompt_tokens

PROPERTIES = ("FAULT-raised", "LIV-001", "CHK-002", "BUD-003", "QUE-001", "REQ-004")
SESSION_PROPERTIES = ("SES-003", "LEN-001", "CAP-005")  # the synchronous host's streaming sessions (vllm_budgets.py)
HYBRID_PROPERTIES = ("LIV-002",)  # a livelock of the pipelined loop with hybrid KV cache groups
IDIOM = ("a Scheduler built from VllmConfig pieces and a KVCacheConfig, fed ModelRunnerOutputs, as in vLLM's "
         "tests/v1/core/utils.py create_scheduler / create_requests")


def prompt_of(request: dict) -> list[int]:
    """The V1 host's prompt: the trace's ``prompt_tokens``, else spec.types.default_prompt_tokens."""
    return list(request.get("prompt_tokens") or default_prompt_tokens(request["prompt_len"]))


def session_of(request: dict) -> dict:
    """A streaming session's later inputs as the V1 host's client sends them (vllm_budgets.py
    SessionClient): each arrival step, its token ids (spec.session.piece_tokens) and max_tokens.
    Nothing for a plain request, whose exported dict stays as it was."""
    inputs = (request.get("session") or {}).get("inputs") or ()
    return {"session": [{"step": piece["step"], "prompt": list(piece_tokens(i, piece["prompt_len"])),
                         "max_tokens": piece["max_tokens"]} for i, piece in enumerate(inputs)]} if inputs else {}


SYNC = Exporter("vllm-v1", "vllm_v1", PROPERTIES + SESSION_PROPERTIES, prompt_of, IDIOM,
                needs="the installed vLLM, on CPU", connector=("vllm_v1_connector",), request_extra=session_of,
                sessions="vllm_v1_sessions")

ASYNC = Exporter("vllm-v1-async", "vllm_v1", PROPERTIES + HYBRID_PROPERTIES, prompt_of,
                 IDIOM + "; AsyncScheduler with two batches in flight as EngineCore.step_with_batch_queue runs it",
                 extra="vllm_v1_async", needs="the installed vLLM, on CPU",
                 connector=("vllm_v1_connector", "vllm_v1_async_connector"), hybrid="vllm_v1_hybrid")

# Aphrodite 0.24.1 (aphrodite-engine): vLLM's V1 scheduler under the package name ``aphrodite``, as
# conformance/targets/hosts/aphrodite_host.py drives it: ``vllm.*`` imports answered by
# ``aphrodite.*``, ``VllmConfig`` is ``AphroditeConfig``, the scheduler's keyword ``aphrodite_config``.
APHRODITE = Exporter("aphrodite", "vllm_v1", PROPERTIES, prompt_of,
                     IDIOM + "; Aphrodite's modules under vLLM's names (a vLLM fork with vLLM's module paths)",
                     extra="aphrodite", preamble=(Path(__file__).parent / "templates" / "aphrodite_alias.py.in").read_text(),
                     needs="the installed aphrodite-engine, on CPU")

EXPORTERS = (SYNC, ASYNC, APHRODITE)
