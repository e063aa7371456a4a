"""LoRA admission in the SGLang flow (issue 32; sgl-project/sglang #25865 and #23141): the reference's
rule, and SGLang 0.5.23's own ``can_schedule_lora_req`` / ``LoRAManager`` through the ``sglang`` host
(hosts/sglang_lora.py), on the handmade shape of #25865 (docs/traces/sglang/handmade/lora-carried-chunk.json).

The host tests skip when the ``sglang`` target is not installed: it is in the nightly install profile,
which CI leaves out, so they skip there under KVSCHED_REQUIRE_TARGETS=1 too (`tests.test_targets.need`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conformance.flows.profiles import get_profile
from conformance.runner.driver import run_checked
from reference_impl.engine import iter_steps
from reference_impl.sglang_scheduler import SglangScheduler
from spec.trace import Trace
from tests.test_targets import need

TRACE = Path(__file__).resolve().parent.parent / "docs" / "traces" / "sglang" / "handmade" / "lora-carried-chunk.json"


def _batches(records) -> list[list[str]]:
    return [[s.request_id for s in record.output.scheduled] for record in records]


def test_reference_counts_the_carried_chunk():
    # step 1: A's next chunk is staged before the waiting queue is read; B's adapter would be a second
    trace = Trace.load(TRACE)
    records = list(iter_steps(trace, SglangScheduler(trace.config)))
    batches = _batches(records)
    assert batches[:2] == [["A"], ["A"]]
    assert not any({"A", "B"} <= set(b) for b in batches) and ["B"] in batches
    waits = [r.request_id for r in records[1].output.reasons if r.kind == "wait_lora_slots"]
    assert waits == ["B"]


def test_reference_lets_no_adapter_share_another_adapters_prefix():
    # SGLang namespaces radix keys by lora_id (schedule_batch.py:1164-1170): the same prompt under
    # another adapter is computed again, under the same adapter it is a prefix hit
    trace = Trace.load(TRACE)
    config = replace(trace.config, max_loras=2)
    a = trace.arrivals[0]
    same, other = replace(a.request, request_id="S"), replace(a.request, request_id="O", lora_id=2)
    trace = replace(trace, config=config, arrivals=(a, replace(a, step=6, request=same), replace(a, step=6, request=other)))
    records = list(iter_steps(trace, SglangScheduler(config)))
    prefilled = {rid: sum(s.num_tokens for r in records for s in r.output.scheduled if s.is_prefill and s.request_id == rid)
                 for rid in "SO"}
    assert prefilled == {"S": 1, "O": 12}  # S: all but its last token cached; O: its whole prompt


def test_sglang_release_keeps_the_carried_chunk_within_max_loras():
    result = run_checked(need("sglang").adapter(), Trace.load(TRACE), get_profile("safety").invariants(),
                         timeout=60, stop_at_first=False)
    batches = _batches(result.records)
    assert result.problem_ids == set(), result.problem_ids
    assert batches[:2] == [["A"], ["A"]] and not any({"A", "B"} <= set(b) for b in batches)


def test_sglang_without_pr_23179_batches_two_adapters_and_breaks_lora_001():
    # the host's counterfactual takes scheduler.py:4190-4191 out: #25865's code
    target = replace(need("sglang"), host_args=("--lora-counterfactual", "pre-23179"))
    result = run_checked(target.adapter(), Trace.load(TRACE), get_profile("safety").invariants(),
                         timeout=60, stop_at_first=False)
    assert "LORA-001" in result.problem_ids
    assert _batches(result.records)[1] == ["A", "B"]
