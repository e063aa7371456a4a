"""The speculative-decoding flow's reference (`reference_impl.specdec_scheduler`, and the async
reference with k > 0): it holds its own profile, spends no draft it was not proposed, delivers the
non-speculative run's stream, and at k = 0 is the V1 reference."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.specdec import pipelined, specdec_traces
from conformance.generation.v1 import v1_traces
from conformance.selftest.mutants import violated
from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.engine import run_trace
from reference_impl.specdec_scheduler import SpecDecScheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.speculative import DraftDecision
from spec.trace import Arrival, Trace
from spec.types import Request, generated_token, seq_id

SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


@SETTINGS
@given(specdec_traces())
def test_reference_holds_its_profile(trace: Trace) -> None:
    assert violated(SpecDecScheduler, trace, invariants=get_profile("specdec").invariants()) == set()


def _empty_with_prefix_caching(trace: Trace) -> bool:
    return trace.config.enable_prefix_caching and any(d.empty for _, _, d in trace.drafts)


@SETTINGS
@given(specdec_traces(allow_empty=True).filter(_empty_with_prefix_caching))
def test_empty_outcomes_with_prefix_caching_hold_the_profile(trace: Trace) -> None:
    """docs/SPECDEC.md section 8: the generator draws empty outcomes with prefix caching on, and
    the rollback to the last known token leaves its block keyed, which SPD-007 and PFX-001 allow
    (the step's forward pass wrote that token's KV: `spec.invariants._views.void_outcomes`)."""
    assert violated(SpecDecScheduler, trace, invariants=get_profile("specdec").invariants()) == set()
    assert violated(AsyncV1Scheduler, pipelined(trace, 0), invariants=get_profile("async").invariants()) == set()


def test_pipelined_empty_outcomes_run_without_prefix_caching() -> None:
    """At depth > 0 the allowance is not stated (docs/SPECDEC.md section 8): `pipelined` turns
    prefix caching off for a trace with an empty outcome, and keeps it at depth 0."""
    config = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=8, max_model_len=20, watermark=0.0, preemption_mode="recompute",
                             enable_prefix_caching=True, num_speculative_tokens=1)
    trace = Trace(config, (Arrival(0, Request("A", 2, 5, prompt_tokens=(1, 2))),), max_steps=6,
                  drafts=((0, "A#0", DraftDecision(empty=True)),))
    assert pipelined(trace, 0).config.enable_prefix_caching
    assert not pipelined(trace, 1).config.enable_prefix_caching


@SETTINGS
@given(specdec_traces(), st.integers(0, 2))
def test_async_reference_holds_the_async_profile_with_drafts_at_every_depth(trace: Trace, depth: int) -> None:
    """SPD-005/006/007/008 read the step whose outcome a record processes, so they hold the async
    reference with drafts at depth 0, 1 and 2 (the async profile claims them all)."""
    claimed = {inv.id for inv in get_profile("async").invariants()}
    assert {"SPD-005", "SPD-006", "SPD-007", "SPD-008"} <= claimed
    trace = pipelined(trace, depth)
    assert violated(AsyncV1Scheduler, trace, invariants=get_profile("async").invariants()) == set()


@SETTINGS
@given(v1_traces())
def test_k_zero_is_the_v1_reference(trace: Trace) -> None:
    ours, theirs = run_trace(trace, SpecDecScheduler), run_trace(trace, V1Scheduler)
    assert [r.output for r in ours.records] == [r.output for r in theirs.records]


def _stream_by_position(trace: Trace, make) -> dict[str, tuple[int, ...]]:
    run = run_trace(trace, make)
    return {sid: v.token_ids for sid, v in run.records[-1].after.seqs.items()}


def test_accepted_run_is_the_plain_stream_and_a_stop_truncates_it() -> None:
    """k = 3, every draft accepted, a stop on the second committed token of the step that first
    verifies drafts: the stream is the samples by position, cut right after the stop, and the
    step before the stop scheduled 1 + 3 tokens."""
    config = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=32, max_model_len=32, watermark=0.0,
                             preemption_mode="recompute", num_speculative_tokens=3)
    request = Request("A", 5, 20, prompt_tokens=(1, 2, 3, 4, 5))
    sid = seq_id("A", 0)
    decisions = tuple((step, sid, DraftDecision(accepted=3, stop_at=1 if step == 2 else None)) for step in range(4))
    trace = Trace(config, (Arrival(0, request),), stops=((2, sid),), max_steps=20, drafts=decisions)
    for make in (SpecDecScheduler, lambda c: AsyncV1Scheduler(c, depth=0)):
        run = run_trace(trace, make)
        assert [s.num_drafts for r in run.records for s in r.output.scheduled] == [0, 3, 3]
        tokens = run.records[-1].after.seqs[sid].token_ids
        # prefill samples 1 token, step 1 commits 4, step 2 stops on its second: 5 + 1 + 4 + 2
        assert len(tokens) == 12
        assert tokens[5:] == tuple(generated_token("A", 0, p) for p in range(5, 12))
        assert run.finished[-1].status.name == "FINISHED_STOPPED"


def test_rejections_roll_back_and_the_stream_is_unchanged() -> None:
    """Whatever the acceptance, the tokens are the samples by position, and a request with every
    draft rejected ends with the same stream as one with every draft accepted."""
    config = SchedulerConfig(block_size=2, num_gpu_blocks=32, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=40, watermark=0.0,
                             preemption_mode="recompute", enable_prefix_caching=True, num_speculative_tokens=2)
    request = Request("A", 3, 9, prompt_tokens=(1, 2, 3))
    sid = seq_id("A", 0)
    streams = []
    for accepted in (0, 1, 2):
        drafts = tuple((step, sid, DraftDecision(accepted=accepted)) for step in range(12))
        trace = Trace(config, (Arrival(0, request),), max_steps=30, drafts=drafts)
        for make in (SpecDecScheduler, lambda c: AsyncV1Scheduler(dataclasses.replace(c, pipeline_depth=1))):
            streams.append(_stream_by_position(trace, make)[sid])
    assert len(set(streams)) == 1 and len(streams[0]) == 3 + 9



def test_drafts_round_trip_and_bad_fields_name_themselves() -> None:
    import pytest

    from spec.errors import InputError

    config = SchedulerConfig(num_speculative_tokens=2)
    trace = Trace(config, (Arrival(0, Request("A", 3, 4)),), max_steps=9,
                  drafts=((1, "A#0", DraftDecision(proposed=1, accepted=2, stop_at=0)), (2, "A#0", DraftDecision(empty=True))))
    again = Trace.from_dict(trace.to_dict())
    assert again.drafts == trace.drafts and again.config.num_speculative_tokens == 2
    assert "drafts" not in Trace(config, (), max_steps=3).to_dict()  # old readers see the old format
    bad = trace.to_dict()
    bad["drafts"][0]["accepted"] = -1
    with pytest.raises(InputError, match=r"drafts\[0\]\.accepted"):
        Trace.from_dict(bad)
    bad["drafts"][0] = {"step": 1, "seq": "A#0", "acepted": 1}
    with pytest.raises(InputError, match=r"drafts\[0\]\.acepted"):
        Trace.from_dict(bad)
    with pytest.raises(InputError, match="config.num_speculative_tokens"):
        SchedulerConfig(num_speculative_tokens=17)


@SETTINGS
@given(specdec_traces(allow_empty=True), st.integers(0, 2))
def test_async_reference_with_empty_outcomes_at_every_depth(trace: Trace, depth: int) -> None:
    """vllm-project/vllm#42722's empty outcomes, drawn at depth 0..2: the async reference rolls the
    step back and voids the request's later steps already in flight (fed a token that never came),
    and holds the async profile."""
    assert violated(AsyncV1Scheduler, pipelined(trace, depth), invariants=get_profile("async").invariants()) == set()


def test_empty_outcome_at_depth_one_voids_the_step_in_flight() -> None:
    """k = 2, depth 1: step 1 verifies drafts and its outcome is empty; step 2, already in flight,
    was fed a token that never came. Its outcome is dropped, the request recomputes its last token
    (one token, no drafts: nothing was proposed), and the stream is the samples by position."""
    config = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=32, max_model_len=32, watermark=0.0,
                             preemption_mode="recompute", num_speculative_tokens=2, pipeline_depth=1,
                             max_num_partial_prefills=0)
    request = Request("A", 4, 12, prompt_tokens=(1, 2, 3, 4))
    sid = seq_id("A", 0)
    trace = Trace(config, (Arrival(0, request),), max_steps=40,
                  drafts=((1, sid, DraftDecision(accepted=2, empty=True)),))
    run = run_trace(trace, AsyncV1Scheduler)
    shapes = [[(s.num_tokens, s.num_drafts) for s in r.output.scheduled] for r in run.records]
    # 0: prefill; 1: next token + 2 placeholder drafts; 2: in flight when 1's empty outcome lands;
    # 3: the last token again, alone (step 2's outcome is dropped in step 3's update)
    assert shapes[:4] == [[(4, 0)], [(3, 2)], [(3, 2)], [(1, 0)]]
    after = run.records[2].after
    assert after.seqs[sid].num_computed == 4 and after.seqs[sid].num_tokens == 5
    assert after.in_flight[sid].stale == 3 and after.in_flight[sid].placeholders == 0
    tokens = run.records[-1].after.seqs[sid].token_ids
    assert tokens[4:] == tuple(generated_token("A", 0, p) for p in range(4, 16))
    assert violated(AsyncV1Scheduler, trace, invariants=get_profile("async").invariants()) == set()


def test_returned_step_is_the_step_whose_outcome_a_record_processed() -> None:
    """`returned_step` hands each record the step pipeline_depth earlier (itself at depth 0), with
    that step's scheduled sequences and decisions; a request preempted or finished since counts as
    having left."""
    from spec.catalogue import CheckContext
    from spec.invariants._views import returned_step

    config = SchedulerConfig(block_size=4, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=32, max_model_len=32, watermark=0.0,
                             preemption_mode="recompute", num_speculative_tokens=2, max_num_partial_prefills=0)
    sid = seq_id("A", 0)
    decisions = tuple((step, sid, DraftDecision(accepted=1)) for step in range(8))
    for depth in (0, 1, 2):
        trace = Trace(dataclasses.replace(config, pipeline_depth=depth), (Arrival(0, Request("A", 4, 6)),),
                      max_steps=20, drafts=decisions)
        records = run_trace(trace, AsyncV1Scheduler).records
        ctx = CheckContext(trace.config)
        for rec in records:
            returned = returned_step(ctx, rec)
            assert returned_step(ctx, rec) is returned  # one answer per step
            if rec.step < depth:
                assert returned is None
                continue
            scheduled_then = records[rec.step - depth].output.scheduled
            assert returned.step == rec.step - depth
            assert set(returned.scheduled) == {s.seq_id for s in scheduled_then}
            assert returned.left == frozenset(f.request_id for r in records[rec.step - depth:rec.step]
                                              for f in r.finished)
