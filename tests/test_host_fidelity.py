"""Host fidelity: a host admits exactly what its engine's own entry path admits (issue 21, item 4).

A host reaches a scheduler below the engine's front door, so every check the engine makes
before its scheduler (prompt length, parallel sampling, config validation) must be made by the
host, or kvsched reports findings no user of the engine can meet (the lockstep class
chunk-clamped-below-max-model-len came from a generate prompt of exactly max_model_len tokens,
which vLLM 0.33.0 refuses at the door). One test per rule: each pins the rule in the installed
engine's source and drives the host across it. A target that is not installed is skipped.
"""

from __future__ import annotations

import pytest

from conformance.flows.profiles import get_profile
from conformance.runner.driver import run_checked
from spec.config import SchedulerConfig
from spec.status import Status
from spec.trace import Arrival, Trace
from spec.types import Request
from tests.test_targets import need


def _source(target_name: str, relative: str) -> str:
    target = need(target_name)
    found = list((target.root / "venv").glob(f"lib/python3*/site-packages/{relative}"))
    assert found, f"{relative} not found in the {target_name} venv"
    return found[0].read_text()


def _one(target_name: str, config: SchedulerConfig, prompt_len: int, max_tokens: int = 3):
    trace = Trace(config, (Arrival(0, Request("r0", prompt_len, max_tokens)),), (), (), max_steps=12)
    result = run_checked(need(target_name).adapter(), trace, get_profile("safety").invariants(), timeout=60,
                         stop_at_first=False)
    assert result.fault is None, result.fault
    finished = {f.request_id: f.status for rec in result.records for f in rec.finished}
    refused = any("r0" in rec.refused for rec in result.records)
    scheduled = any(s.request_id == "r0" for rec in result.records for s in rec.output.scheduled)
    return refused, scheduled, finished.get("r0"), result


V1_CONFIG = SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2, max_num_batched_tokens=16,
                            max_model_len=8, watermark=0.0, preemption_mode="recompute", policy="fcfs")
V0_CONFIG = SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=4, max_num_seqs=2, max_num_batched_tokens=16,
                            max_model_len=8, watermark=0.01, preemption_mode="recompute", policy="fcfs")


# ---------------------------------------------------------------- vLLM 0.33.0 (V1 and its async scheduler)
def test_vllm_v1_entry_refuses_a_generate_prompt_of_max_model_len():
    source = _source("vllm-v1", "vllm/v1/engine/input_processor.py")
    assert 'prompt_len == max_prompt_len and model_config.runner_type == "generate"' in source


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v1-async"])
def test_vllm_v1_host_refuses_a_prompt_of_max_model_len_at_the_door(name):
    refused, scheduled, status, result = _one(name, V1_CONFIG, prompt_len=8)
    assert refused and not scheduled and status is Status.FINISHED_IGNORED and not result.violations


@pytest.mark.parametrize("name", ["vllm-v1", "vllm-v1-async"])
def test_vllm_v1_host_refuses_a_longer_prompt_at_the_door(name):
    refused, scheduled, status, _ = _one(name, V1_CONFIG, prompt_len=9)
    assert refused and not scheduled and status is Status.FINISHED_IGNORED


def test_vllm_v1_host_admits_a_prompt_one_short_of_max_model_len():
    refused, scheduled, status, result = _one("vllm-v1", V1_CONFIG, prompt_len=7)
    assert not refused and scheduled and status is Status.FINISHED_LENGTH_CAPPED and not result.violations


def test_vllm_v1_entry_has_no_parallel_sampling_in_the_scheduler():
    # vllm/v1/engine: n > 1 is fanned out into n requests (ParentRequest) before the scheduler;
    # the host refuses n > 1 rather than model it, and the target's traces draw n = 1.
    assert "class ParentRequest" in _source("vllm-v1", "vllm/v1/engine/parallel_sampling.py")
    from conformance.targets import get_target

    assert get_target("vllm-v1").domain.max_n == 1


# ---------------------------------------------------------------- vLLM 0.10.2 (V0)
def test_vllm_v0_entry_refuses_only_prompts_over_max_model_len():
    source = _source("vllm-v0", "vllm/engine/llm_engine.py")
    assert "if len(prompt_ids) > max_prompt_len:" in source
    assert "prompt_len == max_prompt_len" not in source  # no generate rule at exactly max_model_len in V0


def test_vllm_v0_host_runs_a_prompt_of_max_model_len_to_its_length_cap():
    refused, scheduled, status, result = _one("vllm-v0", V0_CONFIG, prompt_len=8)
    assert not refused and scheduled and status is Status.FINISHED_LENGTH_CAPPED and not result.violations


def test_vllm_v0_host_never_runs_a_longer_prompt():
    # The engine raises in LLMEngine._validate_model_input; the host leaves it to the scheduler's
    # prompt limit (Scheduler._get_prompt_limit: min(max_model_len, budget) = max_model_len on the
    # target's traces), which ignores it unscheduled: the same verdict, at the head of waiting
    # instead of at the door (an open translation gap, docs/CONFORMANCE.md).
    refused, scheduled, status, _ = _one("vllm-v0", V0_CONFIG, prompt_len=9)
    assert not scheduled and status is Status.FINISHED_IGNORED


# ---------------------------------------------------------------- nano-vllm
def test_nano_vllm_entry_checks_nothing():
    source = _source("nano-vllm", "nanovllmnpu/engine/llm_engine.py")
    add = source[source.index("def add_request"):source.index("def step")]
    assert "max_model_len" not in add and "raise" not in add


def test_nano_vllm_host_passes_an_over_long_prompt_to_the_scheduler():
    config = SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=8, watermark=0.0, preemption_mode="recompute",
                             policy="fcfs")
    refused, scheduled, _, _ = _one("nano-vllm", config, prompt_len=9)
    assert not refused and scheduled  # the LEN-002 finding is nano's own


# ---------------------------------------------------------------- SGLang 0.5.23
def test_sglang_entry_refuses_prompts_near_its_request_limit():
    source = _source("sglang", "sglang/srt/managers/tp_worker.py")
    assert "max_req_len" in source and "max_req_input_len" in source


def test_sglang_host_refuses_a_prompt_of_max_model_len():
    # max_req_len = min(context_len - 1, kv_capacity - 1); prompts at or over max_req_len - 5 are
    # refused (tp_worker.py), so a prompt of max_model_len tokens never runs.
    config = SchedulerConfig(block_size=1, num_gpu_blocks=32, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=32, max_model_len=16, watermark=0.0, preemption_mode="recompute",
                             policy="fcfs")
    _, scheduled, status, _ = _one("sglang", config, prompt_len=16)
    assert not scheduled and status is Status.FINISHED_IGNORED
    _, scheduled, _, _ = _one("sglang", config, prompt_len=4)
    assert scheduled


def test_v1_watermark_counts_the_spec_blocks_not_v1s_null_block():
    """The spec's watermark is ``int(watermark * num_gpu_blocks)`` blocks; the host gives V1 one more
    block (its null block), over which V1 counts ``int(watermark * num_blocks)``
    (kv_cache_manager.py:210): 0.1 of 9 is 0 spec blocks but would be 1 of V1's 10. The host passes
    the fraction that makes them equal (`v1_watermark`), so an admission beside a running request
    that needs every free block is made, as the spec's count says."""
    from conformance.selftest.campaigns import lockstep_v1 as L

    src = _source("vllm-v1", "vllm/v1/core/kv_cache_manager.py")
    assert "self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)" in src
    config = SchedulerConfig(block_size=2, num_gpu_blocks=9, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=18, max_model_len=18, watermark=0.1, preemption_mode="recompute")
    assert config.watermark_blocks == 0
    trace = Trace(config, (Arrival(0, Request("a", 4, 8)), Arrival(1, Request("b", 12, 2))), (), (), max_steps=30)
    outcome = L.run_one(need("vllm-v1").adapter(), trace, get_profile("vllm-v1").invariants())
    assert outcome.divergence_step is None, outcome.describe()
    assert any(s.request_id == "b" for s in outcome.result.records[1].output.scheduled)  # b fits the 6 free blocks
