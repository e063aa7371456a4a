"""The hybrid reference (`reference_impl.hybrid_scheduler`): with one full-attention group it is the
V1 reference step for step; with groups it holds its own profile; configs with groups are checked
and read back."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.hybrid import hybrid_traces
from conformance.generation.specdec import specdec_traces, with_drafts
from conformance.generation.v1 import v1_traces
from conformance.selftest.mutants import violated
from reference_impl.engine import iter_steps
from reference_impl.hybrid_scheduler import HybridV1Scheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.kv_groups import KVGroup
from spec.speculative import DraftDecision
from spec.trace import Arrival, Trace
from spec.types import Request

SETTINGS = settings(max_examples=60, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


def _steps(factory, trace: Trace) -> list[tuple]:
    out = []
    for rec in iter_steps(trace, factory(trace.config)):
        seqs = {sid: (v.status, v.num_computed, v.blocks) for sid, v in (rec.after.seqs or {}).items()}
        out.append((rec.output.scheduled, rec.output.preempted, rec.output.ignored, rec.finished, seqs,
                    rec.after.gpu_free_ids, rec.after.gpu_block_keys, rec.after.group_tables or None))
    return out


@SETTINGS
@given(v1_traces())
def test_one_full_group_is_the_v1_reference_step_for_step(trace: Trace) -> None:
    """The V1 flow's own traces, on the hybrid reference with no groups and with one full group:
    the same outputs, tables, free queues and keys at every step."""
    plain = _steps(V1Scheduler, trace)
    assert _steps(HybridV1Scheduler, trace) == plain
    one = dataclasses.replace(trace, config=dataclasses.replace(trace.config, kv_groups=(KVGroup("full"),)))
    assert _steps(HybridV1Scheduler, one) == plain


@SETTINGS
@given(hybrid_traces())
def test_reference_holds_its_profile(trace: Trace) -> None:
    assert violated(HybridV1Scheduler, trace, invariants=get_profile("hybrid").invariants()) == set()


def test_config_reads_back_and_one_group_writes_as_before() -> None:
    config = SchedulerConfig(enable_chunked_prefill=True, enable_prefix_caching=True,
                             kv_groups=[{"kind": "full"}, {"kind": "sliding_window", "window": 7},
                                        {"kind": "mamba", "mode": "align"}, {"kind": "shared", "source": 0}])
    assert SchedulerConfig.from_dict(config.to_dict()) == config
    assert "kv_groups" not in SchedulerConfig().to_dict()


@pytest.mark.parametrize("groups, where", [
    ([{"kind": "sliding_window", "window": 4}], "config.kv_groups[0].kind"),
    ([{"kind": "full"}, {"kind": "sliding_window"}], "config.kv_groups[1].window"),
    ([{"kind": "full"}, {"kind": "mamba", "mode": "some"}], "config.kv_groups[1].mode"),
    ([{"kind": "full"}, {"kind": "shared", "source": 1}], "config.kv_groups[1].source"),
    ([{"kind": "full"}, {"kind": "full", "colour": 1}], "config.kv_groups[1].colour"),
    ([{"kind": "full"}, {"kind": "mamba", "mode": "none"}], "config.kv_groups[1].mode"),  # with prefix caching
    ("full", "config.kv_groups"),
])
def test_bad_groups_name_the_field(groups, where: str) -> None:
    with pytest.raises(InputError) as err:
        SchedulerConfig(enable_chunked_prefill=True, enable_prefix_caching=True, kv_groups=groups)
    assert err.value.where == where


def test_group_tables_cross_the_wire_and_are_checked_whole() -> None:
    from conformance.runner.normalize import check_snapshot
    from conformance.wire.codec import snapshot_from_json, snapshot_to_json
    from spec.observation import Capability, Snapshot

    snap = Snapshot(group_tables={"a#0": ((3, -1, 4), ())})
    assert snapshot_from_json(snapshot_to_json(snap)).group_tables == snap.group_tables
    with pytest.raises(Exception, match="group_tables"):
        check_snapshot(Snapshot(group_tables={"a#0": ([1, 2],)}), frozenset({Capability.KV_GROUPS}))


def _pipelined(trace: Trace) -> Trace:
    return dataclasses.replace(trace, config=dataclasses.replace(trace.config, pipeline_depth=1, watermark=0.0))


@settings(max_examples=30, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(v1_traces())
def test_pipelined_one_group_is_the_async_reference_step_for_step(trace: Trace) -> None:
    from reference_impl.async_scheduler import AsyncV1Scheduler
    from reference_impl.hybrid_scheduler import HybridAsyncScheduler

    trace = _pipelined(trace)
    assert _steps(HybridAsyncScheduler, trace) == _steps(AsyncV1Scheduler, trace)


@settings(max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(hybrid_traces())
def test_pipelined_reference_holds_the_async_profile(trace: Trace) -> None:
    from reference_impl.hybrid_scheduler import HybridAsyncScheduler

    assert violated(HybridAsyncScheduler, _pipelined(trace), invariants=get_profile("async").invariants()) == set()


CHEAP = settings(max_examples=8, deadline=None, database=None, derandomize=True,
                 suppress_health_check=list(HealthCheck))


@CHEAP
@given(specdec_traces())
def test_one_full_group_is_the_specdec_reference_step_for_step(trace: Trace) -> None:
    """The speculative flow's traces (k > 0, draft decisions) on the hybrid speculative reference
    with one full-attention group: the speculative reference's outputs, tables and keys at every step."""
    from reference_impl.hybrid_scheduler import HybridSpecDecScheduler
    from reference_impl.specdec_scheduler import SpecDecScheduler

    one = dataclasses.replace(trace, config=dataclasses.replace(trace.config, kv_groups=(KVGroup("full"),)))
    assert _steps(HybridSpecDecScheduler, one) == _steps(SpecDecScheduler, trace)


@CHEAP
@given(hybrid_traces(layout="swa").flatmap(with_drafts))
def test_speculative_reference_with_a_window_holds_the_hybrid_and_specdec_profiles(trace: Trace) -> None:
    """Drafts over a sliding-window group (sync and at depth 1): the hybrid profile and the
    speculative one hold (`test_drafts_take_window_slots_and_slide_it` shows drafts scheduled)."""
    from conformance.flows.profiles import invariants_of
    from reference_impl.hybrid_scheduler import HybridAsyncScheduler, HybridSpecDecScheduler

    invariants = invariants_of(("hybrid", "specdec"))
    assert violated(HybridSpecDecScheduler, trace, invariants=invariants) == set()
    assert violated(HybridAsyncScheduler, _pipelined(trace), invariants=get_profile("async").invariants()) == set()


@settings(max_examples=20, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_speculative_reference_with_an_align_group_holds_the_hybrid_and_specdec_profiles(data) -> None:
    """Drafts over a Mamba "align" group (the ``mamba-align+spec`` lockstep path's traces, sync and
    at depth 1): the hybrid and speculative profiles hold, the slots HYB-003/005/007 cannot see
    left out (`spec.invariants.groups._slots_observed`)."""
    from conformance.flows.profiles import invariants_of
    from conformance.selftest.campaigns.lockstep_hybrid import path_strategy
    from reference_impl.hybrid_scheduler import HybridAsyncScheduler, HybridSpecDecScheduler

    trace = data.draw(path_strategy("mamba-align+spec"))
    list(iter_steps(trace, HybridSpecDecScheduler(trace.config)))  # `violated` would hide a crash
    assert violated(HybridSpecDecScheduler, trace, invariants=invariants_of(("hybrid", "specdec"))) == set()
    assert violated(HybridAsyncScheduler, _pipelined(trace), invariants=get_profile("async").invariants()) == set()


def test_drafts_with_a_mamba_all_group_are_refused() -> None:
    from reference_impl.hybrid_scheduler import HybridSpecDecScheduler

    config = SchedulerConfig(enable_chunked_prefill=True, enable_prefix_caching=True, num_speculative_tokens=2,
                             kv_groups=[{"kind": "full"}, {"kind": "mamba", "mode": "all"}])
    with pytest.raises(InputError) as err:
        HybridSpecDecScheduler(config)
    assert err.value.where == "config.num_speculative_tokens"


def test_align_drafts_keep_k_speculative_state_blocks() -> None:
    """Full + Mamba "align" with k = 2 (vLLM MambaSpec.num_speculative_blocks = k, the
    ``mamba-align+spec`` lockstep path): the first allocation takes the state block and k
    speculative ones (1 + k fresh, single_type_kv_cache_manager.py:1785-1790); the running state
    sits k blocks from the end; a speculative block the table passes over moves to its end
    (``_relocate_speculative_block``); the state before is freed once the next is written."""
    from reference_impl.hybrid_scheduler import HybridSpecDecScheduler

    config = SchedulerConfig(block_size=2, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=24, watermark=0.0, preemption_mode="recompute",
                             enable_chunked_prefill=True, enable_prefix_caching=True, num_speculative_tokens=2,
                             kv_groups=[{"kind": "full"}, {"kind": "mamba", "mode": "align"}])
    accept = DraftDecision(proposed=2, accepted=2)
    trace = Trace(config, (Arrival(0, Request("A", 4, 8)),), max_steps=4,
                  drafts=tuple((step, "A#0", accept) for step in range(4)))
    tables = [rec.mid.group_tables["A#0"][0] for rec in iter_steps(trace, HybridSpecDecScheduler(config))]
    assert tables == [(1, 2, 3), (1, 2, 3, 5), (-1, 2, -1, 5, 3, 8), (-1, -1, -1, 5, 3, 8, 10)]


def test_a_padding_the_threshold_cuts_is_dropped_with_an_align_group() -> None:
    """With a Mamba "align" group vLLM drops a one-token admission's padding to 1 + k that the
    long-prefill threshold cut (scheduler.py:1332-1333, 1359-1370): B (a hit on all but its last
    token, threshold 1, k = 2) is scheduled 1 token and no drafts. Without an "align" group the
    reference pads it (vLLM then fails its assertion, ``padded-admission-cut-by-threshold``)."""
    from conformance.selftest.campaigns.lockstep_hybrid import RecordingHybridSpec

    def b_at_step_6(groups: list[dict]) -> tuple[int, int]:
        config = SchedulerConfig(block_size=4, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=4,
                                 max_num_batched_tokens=8, max_model_len=16, watermark=0.0,
                                 preemption_mode="recompute", enable_chunked_prefill=True, enable_prefix_caching=True,
                                 num_speculative_tokens=2, long_prefill_token_threshold=1, kv_groups=groups)
        trace = Trace(config, (Arrival(0, Request("A", 5, 8, prompt_tokens=(1, 1, 0, 0, 1))),
                               Arrival(6, Request("B", 5, 2, prompt_tokens=(1, 1, 0, 0, 2)))), max_steps=7)
        rec = list(iter_steps(trace, RecordingHybridSpec(config)))[6]
        return next((s.num_tokens, s.num_drafts) for s in rec.output.scheduled if s.seq_id == "B#0")

    assert b_at_step_6([{"kind": "full"}, {"kind": "mamba", "mode": "align"}]) == (1, 0)
    assert b_at_step_6([{"kind": "full"}, {"kind": "sliding_window", "window": 8}]) == (3, 2)


def test_drafts_take_window_slots_and_slide_it() -> None:
    """One request decoding with k = 2 over a 3-token window, every draft accepted: drafts are
    scheduled, and the window group's table nulls the blocks behind the window as drafts commit."""
    from reference_impl.hybrid_scheduler import HybridSpecDecScheduler

    config = SchedulerConfig(block_size=2, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=24, watermark=0.0, preemption_mode="recompute",
                             num_speculative_tokens=2, kv_groups=[{"kind": "full"}, {"kind": "sliding_window",
                                                                                       "window": 3}])
    accept = DraftDecision(proposed=2, accepted=2)
    trace = Trace(config, (Arrival(0, Request("A", 4, 12)),), max_steps=8,
                  drafts=tuple((step, "A#0", accept) for step in range(8)))
    steps = list(iter_steps(trace, HybridSpecDecScheduler(config)))
    assert any(s.num_drafts for rec in steps for s in rec.output.scheduled)
    tables = [rec.after.group_tables["A#0"][0] for rec in steps if "A#0" in (rec.after.group_tables or {})]
    assert -1 in tables[-1] and tables[-1][-1] != -1


def test_padding_to_one_plus_k_over_the_budget_starves_admission() -> None:
    """lockstep_hybrid's ``padded-admission-starves-below-1+k`` (a vLLM defect, scheduler.py:1309-1328):
    with a budget of 2 tokens and k = 3, B's hit on all but its last token is padded to 4 tokens,
    which never fit, and admission stops for ever; the spec's admission (no padding) serves B."""
    from conformance.flows.profiles import invariants_of
    from reference_impl.hybrid_scheduler import HybridSpecDecScheduler

    config = SchedulerConfig(block_size=2, num_gpu_blocks=16, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=2, max_model_len=17, watermark=0.0, preemption_mode="recompute",
                             enable_chunked_prefill=True, enable_prefix_caching=True, num_speculative_tokens=3,
                             kv_groups=[{"kind": "full"}, {"kind": "sliding_window", "window": 6}])
    trace = Trace(config, (Arrival(0, Request("A", 3, 2, prompt_tokens=(1, 1, 0))),
                           Arrival(6, Request("B", 3, 2, prompt_tokens=(1, 1, 0)))), max_steps=30)
    padded = type("Padded", (HybridSpecDecScheduler,), {"pads_new_decode_drafts": True})
    liveness = invariants_of(("liveness",))
    assert {"LIV-001", "LIV-003"} <= violated(padded, trace, invariants=liveness)
    assert violated(HybridSpecDecScheduler, trace, invariants=liveness) == set()


def test_a_stale_steps_drafts_are_what_was_proposed_before_the_preemption() -> None:
    """lockstep_hybrid's ``stale-step-drafts-voided`` (a reference bug, fixed): r1's step 2 ran with a
    real draft, the trace accepts it, and r1 is preempted at step 3 before that step returns. vLLM
    delivers a stale step's tokens whole (v1/core/sched/scheduler.py:1825-1835, 2346-2364: only the
    counters are spared), so r1 holds 4 tokens after step 3; the reference, which judged the stale
    step's drafts by the proposal the preemption had just cleared, delivered the bonus only (3)."""
    import json
    from pathlib import Path

    from conformance.selftest.campaigns.lockstep_hybrid import RecordingHybridAsyncSpec

    trace = Trace.from_dict(json.loads(Path("docs/traces/lockstep-hybrid/async-local-spec-stale-step-drafts.json")
                                       .read_text()))
    records = list(iter_steps(dataclasses.replace(trace, max_steps=4), RecordingHybridAsyncSpec(trace.config)))
    assert [p.request_id for p in records[3].output.preempted] == ["r1"]
    assert records[3].after.seqs["r1#0"].num_tokens == 4


def test_the_starvation_counterfactual_is_behind_the_door() -> None:
    """lockstep_hybrid.classify's counterfactual for ``padded-admission-starves-below-1+k`` runs behind
    `GenerateDoor`, as the lockstep reference does: on this async-swa+prefix+spec trace (k = 1, a
    budget of 1 token, r1's prompt exactly max_model_len) both sides stall, the unpadded reference
    behind the door finishes, and without the door it stalls on r1 instead (the max_model_len clamp,
    scheduler.py:850-857), which had left 17 of 1000 such traces ``unclassified``."""
    import json
    from pathlib import Path

    from conformance.flows.profiles import invariants_of
    from conformance.selftest.campaigns.lockstep_hybrid import RecordingHybridAsyncSpec, unpadded_reference
    from reference_impl.hybrid_scheduler import HybridAsyncScheduler

    trace = Trace.from_dict(json.loads(Path("docs/traces/lockstep-hybrid/async-swa-prefix-spec-counterfactual-door.json")
                                       .read_text()))
    trace = dataclasses.replace(trace, max_steps=40)  # the unpadded run drains in 18 steps; the stalls show by then
    liveness = invariants_of(("liveness",))
    assert {"LIV-001", "LIV-003"} <= violated(RecordingHybridAsyncSpec, trace, invariants=liveness)
    assert not {p for p in violated(unpadded_reference(trace.config), trace, invariants=liveness) if p.startswith("LIV-")}
    doorless = type("Doorless", (HybridAsyncScheduler,), {"drafts_past_max_tokens": True,
                                                          "clamps_chunk_at_max_model_len": True})
    assert "LIV-001" in violated(doorless, trace, invariants=liveness)


def test_eagle_drop_at_depth_one_makes_a_mamba_request_preempt_itself() -> None:
    """lockstep_hybrid's ``eagle-drop-mamba-self-preemption`` (vLLM 0.33.0 agrees step for step): with
    EAGLE's block drop, a full + Mamba-align request alone in a 5-block pool preempts itself on every
    second step at depth 1 and never finishes (LIV-002); without the drop it finishes."""
    import json
    from pathlib import Path

    from conformance.selftest.campaigns.lockstep_hybrid import RecordingHybridAsync, eagle_drop_stalls

    trace = Trace.from_dict(json.loads(Path("docs/traces/lockstep-hybrid/async-mamba-align-eagle-self-preemption.json")
                                       .read_text()))
    assert eagle_drop_stalls(trace)
    records = list(iter_steps(dataclasses.replace(trace, max_steps=16), RecordingHybridAsync(trace.config)))
    assert [r.step for r in records if [p.request_id for p in r.output.preempted] == ["r5"]] == [9, 11, 13, 15]


def test_eagle_lookahead_slots_are_allocated_past_the_scheduled_tokens() -> None:
    """`lookahead_slots_with_eagle` (the ``*+spec+eagle`` lockstep paths): with drafts and
    ``drop_eagle_block`` each allocation also takes EAGLE's k lookahead slots (vLLM
    num_lookahead_tokens, scheduler.py:914-918), in the window group too, capped at max_model_len;
    without the flag, or without the drop, it does not."""
    from reference_impl.hybrid_scheduler import HybridSpecDecScheduler

    config = SchedulerConfig(block_size=2, num_gpu_blocks=24, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=24, watermark=0.0, preemption_mode="recompute",
                             num_speculative_tokens=2, drop_eagle_block=True,
                             kv_groups=[{"kind": "full"}, {"kind": "sliding_window", "window": 8}])
    trace = Trace(config, (Arrival(0, Request("A", 4, 6)),), max_steps=1)
    eagle = type("Eagle", (HybridSpecDecScheduler,), {"lookahead_slots_with_eagle": True})

    def held(factory, trace) -> tuple[int, int]:
        rec = next(iter_steps(trace, factory(trace.config)))
        return len(rec.after.seqs["A#0"].blocks), len(rec.after.group_tables["A#0"][0])

    assert held(eagle, trace) == (3, 3)  # 4 prompt tokens + 2 lookahead slots
    assert held(HybridSpecDecScheduler, trace) == (2, 2)
    no_drop = dataclasses.replace(trace, config=dataclasses.replace(config, drop_eagle_block=False))
    assert held(eagle, no_drop) == (2, 2)


def test_an_idle_engine_ignores_a_head_its_mamba_hit_makes_too_big() -> None:
    """A hit costs a Mamba "align" group a block more than none (the hit's state and a fresh one):
    R1 (17 tokens over 2-token blocks, a hit on R0's cached first block) needs 11 blocks, the whole
    pool of 11 less the watermark's 1 holds 10, and with nothing running the cache stays as it is.
    Waiting would be forever (LIV-001, LIV-003: found by tests/test_stateful.py's hybrid machine);
    it is ignored, with the count it needed."""
    config = SchedulerConfig(block_size=2, num_gpu_blocks=11, num_cpu_blocks=0, max_num_seqs=1,
                             max_num_batched_tokens=1, max_model_len=17, watermark=0.1,
                             preemption_mode="recompute", enable_chunked_prefill=True, enable_prefix_caching=True,
                             kv_groups=(KVGroup("full"), KVGroup("mamba", mode="align"), KVGroup("shared", source=0)))
    trace = Trace(config, (Arrival(0, Request("R0", 2, 3, prompt_tokens=(0, 1))),
                           Arrival(4, Request("R1", 17, 1, prompt_tokens=tuple(i % 3 for i in range(17))))),
                  max_steps=6)
    records = list(iter_steps(trace, HybridV1Scheduler(config)))
    assert records[4].output.ignored == ("R1",)
    reason = next(r for r in records[4].output.reasons if r.request_id == "R1")
    assert reason.kind == "ignored_never_fits" and dict(reason.numbers) == {"blocks": 11, "capacity": 10}
    assert not violated(HybridV1Scheduler, trace, invariants=get_profile("hybrid").invariants())
