"""Export to vLLM V0 (``vllm-v0``: vllm==0.10.2's ``vllm/core/scheduler.py``), in the idiom of vLLM's
tests/core/test_scheduler.py (``Scheduler(scheduler_config, cache_config, None)`` with the block
counts set on the CacheConfig), the outcome processed as ``LLMEngine._process_model_outputs`` does.
Mirrors conformance/targets/hosts/vllm_v0_host.py (one sequence per group: n > 1 is refused)."""

from __future__ import annotations

from conformance.export.record import Exporter, token_ids

PROPERTIES = ("FAULT-raised", "LIV-001", "BUD-003", "QUE-001", "QUE-002", "RES-004", "SWP-001", "REQ-004")


def prompt_of(request: dict) -> list[int]:
    """The V0 host's prompt: ids of its own per request (the host ignores ``prompt_tokens``)."""
    return token_ids(request["id"], request["prompt_len"])


EXPORTERS = (
    Exporter("vllm-v0", "vllm_v0", PROPERTIES, prompt_of,
             "vLLM V0's Scheduler built as tests/core/test_scheduler.py builds it, each step's outcome processed as "
             "LLMEngine._process_model_outputs does (vLLM's StopChecker, free_seq, free_finished_seq_groups)",
             needs="the installed vLLM with its V0 engine, VLLM_USE_V1=0, on CPU"),
)
