"""The speculative reference's vLLM-compatible knobs (`V1Scheduler.drafts_past_max_tokens`,
`V1Scheduler.pads_new_decode_drafts`, `V1Scheduler.clamps_chunk_at_max_model_len`): off by default (the spec's policies, SPD-004), on in the
lockstep campaign's reference (conformance/selftest/campaigns/lockstep_specdec.py) so it compares vLLM
0.33.0 past them. Each knob changes what is scheduled, never what is delivered."""

from __future__ import annotations

import dataclasses

import pytest

from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.specdec_scheduler import SpecDecScheduler
from spec.config import SchedulerConfig
from spec.speculative import DraftDecision
from spec.status import Status
from spec.types import Request, StepOutcome

CONFIG = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=4, max_num_batched_tokens=32,
                         max_model_len=32, watermark=0.0, preemption_mode="recompute", num_speculative_tokens=3)


def _knobs(base: type, **knobs: bool) -> type:
    return type(f"{base.__name__}_knobs", (base,), knobs)


def _run(scheduler, arrivals: dict[int, list[Request]], accepted: int, steps: int = 12):
    """Every step accepts ``accepted`` drafts of every sequence; returns the outputs and the
    final token count and status per request."""
    outputs = []
    for step in range(steps):
        for request in arrivals.get(step, ()):
            scheduler.add_request(request)
        outputs.append(scheduler.schedule())
        decisions = {s.seq_id: DraftDecision(accepted=accepted) for s in outputs[-1].scheduled}
        scheduler.update(StepOutcome(frozenset(), decisions))
    snap = scheduler.snapshot()
    return outputs, {rid: (tr.num_tokens, snap.statuses[rid]) for rid, tr in scheduler.requests.items()}


@pytest.mark.parametrize("base", [SpecDecScheduler, AsyncV1Scheduler])
def test_drafts_past_max_tokens_schedules_more_and_delivers_the_same(base):
    config = dataclasses.replace(CONFIG, pipeline_depth=1 if base is AsyncV1Scheduler else 0)
    arrivals = {0: [Request("a", 4, 3)]}
    policy_out, policy_end = _run(base(config), arrivals, accepted=3)
    vllm_out, vllm_end = _run(_knobs(base, drafts_past_max_tokens=True)(config), arrivals, accepted=3)
    most = lambda outs: max(s.num_drafts for o in outs for s in o.scheduled)  # noqa: E731
    assert most(policy_out) < 3 and most(vllm_out) == 3  # SPD-004 caps them; vLLM schedules all k
    assert policy_end == vllm_end == {"a": (7, Status.FINISHED_LENGTH_CAPPED)}  # trimmed at max_tokens


@pytest.mark.parametrize("base", [SpecDecScheduler, AsyncV1Scheduler])
def test_a_one_token_admission_is_padded_with_placeholders_never_accepted(base):
    config = dataclasses.replace(CONFIG, pipeline_depth=1 if base is AsyncV1Scheduler else 0)
    arrivals = {0: [Request("a", 4, 10)], 2: [Request("b", 1, 4)]}  # b: one token, while a decodes
    policy_out, policy_end = _run(base(config), arrivals, accepted=3)
    vllm_out, vllm_end = _run(_knobs(base, pads_new_decode_drafts=True)(config), arrivals, accepted=3)
    admitted = lambda outs: next(s for o in outs for s in o.scheduled if s.request_id == "b")  # noqa: E731
    assert (admitted(policy_out).num_tokens, admitted(policy_out).num_drafts) == (1, 0)
    assert (admitted(vllm_out).num_tokens, admitted(vllm_out).num_drafts) == (1 + 3, 3)
    assert policy_end == vllm_end  # the placeholders were rejected although the step accepted 3


def test_no_padding_while_a_running_request_is_mid_prefill_or_alone():
    """vLLM pads only with no running request mid-prefill and some running request scheduled
    (or tokens computed): a lone one-token prompt is scheduled as it is."""
    ref = _knobs(SpecDecScheduler, pads_new_decode_drafts=True)(CONFIG)
    ref.add_request(Request("b", 1, 4))
    output = ref.schedule()
    assert [(s.num_tokens, s.num_drafts) for s in output.scheduled] == [(1, 0)]


@pytest.mark.parametrize("accepted", [0, 1])
def test_in_flight_drafts_reaching_max_model_len_hold_the_request_back(accepted):
    """Async, k = 2, max_model_len 5, a 2-token prompt: step 1 runs 1 token + 1 draft, so with step
    1 in flight its drafts, all accepted, would take it to max_model_len. vLLM (the knob) skips it in
    step 2; the spec schedules the token a rejection would still need. Same stream either way."""
    config = dataclasses.replace(CONFIG, max_model_len=5, block_size=2, num_speculative_tokens=2, pipeline_depth=1)
    arrivals = {0: [Request("a", 2, 8)]}
    policy_out, policy_end = _run(AsyncV1Scheduler(config), arrivals, accepted=accepted)
    vllm_out, vllm_end = _run(_knobs(AsyncV1Scheduler, clamps_chunk_at_max_model_len=True)(config), arrivals,
                              accepted=accepted)
    plan = lambda outs: [[(s.num_tokens, s.num_drafts) for s in o.scheduled] for o in outs[:3]]  # noqa: E731
    assert plan(policy_out) == [[(2, 0)], [(2, 1)], [(1, 0)]]
    assert plan(vllm_out) == [[(2, 0)], [(2, 1)], []]
    assert policy_end == vllm_end == {"a": (5, Status.FINISHED_LENGTH_CAPPED)}


def test_the_knobs_are_off_by_default():
    assert not SpecDecScheduler.drafts_past_max_tokens and not SpecDecScheduler.pads_new_decode_drafts
    assert not SpecDecScheduler.clamps_chunk_at_max_model_len
