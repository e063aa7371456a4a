"""Export to vLLM V1 (``vllm-v1``: ``Scheduler``; ``vllm-v1-async``: ``AsyncScheduler`` driven as
``EngineCore.step_with_batch_queue`` drives it), in the idiom of vLLM's
tests/v1/core/utils.py (``create_scheduler`` from ``VllmConfig`` pieces, ``create_requests``,
``ModelRunnerOutput``s fed to ``update_from_output``). Mirrors conformance/targets/hosts/
vllm_v1_host.py and vllm_v1_async_host.py: the same token scheme and the same door."""

from __future__ import annotations

from conformance.export.record import Exporter
from spec.types import default_prompt_tokens

PROPERTIES = ("FAULT-raised", "LIV-001", "CHK-002", "BUD-003", "QUE-001", "REQ-004")
IDIOM = ("a Scheduler built from VllmConfig pieces and a KVCacheConfig, fed ModelRunnerOutputs, as in vLLM's "
         "tests/v1/core/utils.py create_scheduler / create_requests")


def prompt_of(request: dict) -> list[int]:
    """The V1 host's prompt: the trace's ``prompt_tokens``, else spec.types.default_prompt_tokens."""
    return list(request.get("prompt_tokens") or default_prompt_tokens(request["prompt_len"]))


SYNC = Exporter("vllm-v1", "vllm_v1", PROPERTIES, prompt_of, IDIOM, needs="the installed vLLM, on CPU")

ASYNC = Exporter("vllm-v1-async", "vllm_v1", PROPERTIES, prompt_of,
                 IDIOM + "; AsyncScheduler with two batches in flight as EngineCore.step_with_batch_queue runs it",
                 extra="vllm_v1_async", needs="the installed vLLM, on CPU")

EXPORTERS = (SYNC, ASYNC)
