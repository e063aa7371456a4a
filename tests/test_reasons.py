"""Audit of the reference's reasons: every decision carries one, of the right kind, with numbers
that agree with the observed state (issue #10, part 1)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
from hypothesis import given

from conformance.generation.v0 import traces
from conformance.reports.explain import explain_step
from reference_impl.engine import run_trace
from reference_impl.workloads import BUILTIN
from spec.config import SchedulerConfig
from spec.observation import StepRecord
from spec.reasons import TEMPLATES, Reason
from spec.status import PreemptionMode, Status
from spec.trace import Trace
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput

PREFILL_WAITS = {"wait_blocks", "wait_watermark", "wait_token_budget", "wait_seq_budget"}
FINISH_KIND = {
    Status.FINISHED_STOPPED: {"finished_stopped"},
    Status.FINISHED_LENGTH_CAPPED: {"finished_length_capped"},
    Status.FINISHED_ABORTED: {"finished_aborted"},
    Status.FINISHED_IGNORED: {"ignored_too_long", "ignored_never_fits", "ignored_too_many_seqs",
                              "ignored_swap_never_fits"},
}


def _of(reasons: list[Reason], kind: str | set[str], request_id: str | None = None) -> list[Reason]:
    kinds = {kind} if isinstance(kind, str) else kind
    return [r for r in reasons if r.kind in kinds and (request_id is None or r.request_id == request_id)]


def _distinct_blocks(record: StepRecord, request_id: str, device: str) -> set[int]:
    assert record.mid is not None and record.mid.seqs is not None
    return {b for v in record.mid.seqs.values() if v.request_id == request_id and v.device == device for b in v.blocks}


def audit_step(config: SchedulerConfig, record: StepRecord) -> None:
    out, before, mid = record.output, record.before, record.mid
    assert mid is not None
    reasons = list(out.reasons)
    where = f"step {record.step}"
    wm = config.watermark_blocks

    for r in reasons:  # every reason renders with its own numbers
        assert r.kind in TEMPLATES, (where, r)
        assert r.text().startswith(r.request_id) and "{" not in r.text(), (where, r)

    # -- admissions -------------------------------------------------------------------------
    prefill_tokens: Counter[str] = Counter()
    for s in out.scheduled:
        if s.is_prefill:
            prefill_tokens[s.request_id] += s.num_tokens
    admitted = _of(reasons, "admitted")
    assert sorted(r.request_id for r in admitted) == sorted(prefill_tokens), (where, admitted, prefill_tokens)
    for r in admitted:
        assert r.get("tokens") == prefill_tokens[r.request_id] <= config.prompt_limit, (where, r)
        assert r.get("blocks") == len(_distinct_blocks(record, r.request_id, "gpu")), (where, r)
        assert r.get("watermark") == wm and r.get("free_after") >= wm, (where, r)
    if admitted:  # prefill steps do not decode, so the last admission left exactly what mid shows
        assert admitted[-1].get("free_after") == mid.gpu_free, (where, admitted[-1], mid.gpu_free)

    # -- ignored ----------------------------------------------------------------------------
    ignores = _of(reasons, FINISH_KIND[Status.FINISHED_IGNORED])
    assert [r.request_id for r in ignores] == list(out.ignored), (where, ignores, out.ignored)
    capacity = config.num_gpu_blocks - wm
    for r in ignores:
        if r.kind == "ignored_too_long":
            assert r.get("limit") == config.prompt_limit < r.get("tokens"), (where, r)
        elif r.kind == "ignored_too_many_seqs":
            assert r.get("limit") == config.max_num_seqs < r.get("seqs"), (where, r)
        elif r.kind == "ignored_never_fits":
            assert r.get("capacity") == capacity < r.get("blocks"), (where, r)
        else:
            assert r.get("capacity") == capacity < r.get("need"), (where, r)

    # -- why a waiting request was not admitted ----------------------------------------------
    if before.swapped:
        if before.waiting:
            (r,) = _of(reasons, "wait_swapped_first")
            assert r.request_id == before.waiting[0] and r.get("swapped") == len(before.swapped), (where, r)
        assert not _of(reasons, PREFILL_WAITS - {"wait_token_budget", "wait_seq_budget"}), where
    else:
        passed_over = [rid for rid in before.waiting or () if rid not in prefill_tokens and rid not in out.ignored]
        waits = [r for r in _of(reasons, PREFILL_WAITS) if r.request_id not in (out.swapped_in or ())]
        waits = [r for r in waits if r.request_id not in (before.swapped or ())]
        if passed_over:
            assert len(waits) == 1, (where, passed_over, waits)
            assert waits[0].request_id in (mid.waiting or ()), (where, waits[0])
    for r in _of(reasons, PREFILL_WAITS):
        if r.kind == "wait_blocks":
            assert r.get("blocks") > r.get("free"), (where, r)
        elif r.kind == "wait_watermark":
            assert r.get("blocks") <= r.get("free") < r.get("blocks") + r.get("watermark"), (where, r)
        elif r.kind == "wait_token_budget":
            assert r.get("tokens") > r.get("left") >= 0, (where, r)
        else:
            assert r.get("seqs") > r.get("left") >= 0, (where, r)
        if r.kind in ("wait_blocks", "wait_watermark"):
            assert r.get("watermark") == wm, (where, r)
            if prefill_tokens:
                assert r.get("free") == mid.gpu_free, (where, r, mid.gpu_free)
            elif not _of(reasons, "preempted_priority"):
                assert r.get("free") == before.gpu_free, (where, r, before.gpu_free)

    # -- preemptions ------------------------------------------------------------------------
    by_mode = {PreemptionMode.SWAP: "preempted_swap", PreemptionMode.RECOMPUTE: "preempted_recompute"}
    assert len(_of(reasons, set(by_mode.values()))) == len(out.preempted), where
    swapped_blocks = 0
    for p in out.preempted:
        (r,) = _of(reasons, by_mode[p.mode], p.request_id)
        assert p.request_id in (before.running or ()), (where, p)
        if _of(reasons, "preempted_priority", p.request_id):
            assert r.get("needed_by") in (before.waiting or ()), (where, r)
        else:  # a decode preemption: the group that needed slots had fewer free blocks than sequences
            assert r.get("needed_by") in (before.running or ()), (where, r)
            assert r.get("need") > r.get("free"), (where, r)
        if p.mode is PreemptionMode.SWAP:
            assert r.get("blocks") == len(_distinct_blocks(record, p.request_id, "cpu")), (where, r)
            swapped_blocks += r.get("blocks")
            assert not _of(reasons, "swap_space_exhausted", p.request_id), (where, r)
        for e in _of(reasons, "swap_space_exhausted", p.request_id):
            assert p.mode is PreemptionMode.RECOMPUTE and e.get("blocks") > e.get("free"), (where, e)
    assert swapped_blocks == len(out.swap_out), (where, swapped_blocks, out.swap_out)

    # -- swap-ins ---------------------------------------------------------------------------
    swapped_in = _of(reasons, "swapped_in")
    assert [r.request_id for r in swapped_in] == list(out.swapped_in), (where, swapped_in)
    assert sum(r.get("blocks") for r in swapped_in) == len(out.swap_in), (where, swapped_in, out.swap_in)
    for r in swapped_in:
        assert r.get("free_after") >= wm, (where, r)
    if swapped_in:
        assert swapped_in[-1].get("free_after") == mid.gpu_free, (where, swapped_in[-1])
    for r in _of(reasons, "wait_swap_in"):
        assert r.get("free") - r.get("need") < r.get("watermark") == wm, (where, r)
    if before.swapped and mid.swapped and not out.preempted and not prefill_tokens:
        head = mid.swapped[0]  # the swapped head that stayed says why
        assert _of(reasons, {"wait_swap_in", "wait_token_budget", "wait_seq_budget"}, head), (where, head)

    # -- decodes ----------------------------------------------------------------------------
    decode_tokens: Counter[str] = Counter()
    for s in out.scheduled:
        if not s.is_prefill and s.request_id not in out.swapped_in:
            decode_tokens[s.request_id] += s.num_tokens
    decodes = {r.request_id: r.get("tokens") for r in _of(reasons, "decode")}
    assert decodes == dict(decode_tokens), (where, decodes, decode_tokens)
    assert sum(r.get("copies") for r in _of(reasons, "decode")) <= len(out.copies), where

    # -- finishes ---------------------------------------------------------------------------
    for f in record.finished:
        assert f.reason is not None, (where, f)
        assert f.reason.request_id == f.request_id and f.reason.kind in FINISH_KIND[f.status], (where, f)
        if f.reason.kind == "finished_length_capped":
            assert f.reason.get("max_model_len") == config.max_model_len, (where, f)


def audit(trace: Trace) -> None:
    run = run_trace(trace)
    for record in run.records:
        audit_step(trace.config, record)
        lines = explain_step(record.output, record.finished)
        assert lines and all(isinstance(line, str) and line for line in lines)


@given(traces())  # example count: the Hypothesis profile (tests/conftest.py)
def test_every_decision_has_a_consistent_reason(trace: Trace) -> None:
    audit(trace)


def test_builtin_workloads_are_explained() -> None:
    for make in BUILTIN.values():
        audit(make())


def test_explain_step_names_decisions_without_reasons() -> None:
    """A target's output without reasons is still described, decision by decision."""
    out = SchedulerOutput(
        step=3,
        scheduled=(ScheduledSeq("A#0", "A", 7, True), ScheduledSeq("B#0", "B", 1, False)),
        preempted=(Preempted("C", PreemptionMode.SWAP),),
        swap_out=((4, 0),),
        ignored=("D",),
    )
    lines = explain_step(out, [Finished("E", Status.FINISHED_STOPPED)])
    assert lines == [
        "A prefills 7 token(s)",
        "B decodes 1 token(s)",
        "C preempted by swap",
        "D ignored",
        "swap out (GPU→CPU): 4→0",
        "E finished: FINISHED_STOPPED",
    ]
    assert explain_step(SchedulerOutput(step=0)) == ["nothing scheduled"]


def test_explain_step_prefers_the_reference_reasons() -> None:
    run = run_trace(BUILTIN["tour"]())
    step8 = run.records[8]
    lines = explain_step(step8.output, step8.finished)
    assert any(line.startswith("D preempted by swap: D needed 2 free block(s), 1 free") for line in lines), lines
    assert all(line.startswith("D preempted by swap:") for line in lines if line.startswith("D preempted"))
    ignored = next(r for r in run.records if r.output.ignored)
    lines = explain_step(ignored.output, ignored.finished)
    assert sum("C ignored" in line for line in lines) == 1, lines  # the finish does not repeat it


def _with_reasons(record: StepRecord, reasons: tuple[Reason, ...]) -> StepRecord:
    return dataclasses.replace(record, output=dataclasses.replace(record.output, reasons=reasons))


def test_the_audit_catches_wrong_or_missing_reasons() -> None:
    trace = BUILTIN["tour"]()
    records = run_trace(trace).records
    step0, step8 = records[0], records[8]
    audit_step(trace.config, step0)
    bad = tuple(
        Reason.of("admitted", r.request_id, **{**dict(r.numbers), "free_after": 0}) if r.kind == "admitted" else r
        for r in step0.output.reasons
    )
    with pytest.raises(AssertionError):
        audit_step(trace.config, _with_reasons(step0, bad))
    audit_step(trace.config, step8)
    without = tuple(r for r in step8.output.reasons if r.kind != "preempted_swap")
    with pytest.raises(AssertionError):
        audit_step(trace.config, _with_reasons(step8, without))
