"""Mutants of the SGLang reference (`reference_impl.sglang_scheduler`), each with the SGL invariant
that catches it (tests/test_mutants.py searches for the trace)."""

from __future__ import annotations

from conformance.flows import get_flow
from conformance.generation.sglang import sglang_carried_chunk_lora_traces
from conformance.selftest.mutant_record import mutant
from reference_impl.sglang_scheduler import SglangScheduler

_SGLANG = get_flow("sglang").mutant_fields()


@mutant("sglang-retract-most-generated", "retract_decode retracts the request with the most generated tokens first",
        ("SGL-001",), **_SGLANG)
class RetractsMostGenerated(SglangScheduler):
    """The retraction sort key turned around (``ScheduleBatch._get_decode_retraction_order`` sorts
    by (generated, shorter prompt) descending and pops the end): the request that has done the
    most decoding is thrown away first, and its work is recomputed."""

    retraction_sign = -1


@mutant("sglang-lora-misses-staged-chunk", "LoRA admission counts the running batch's adapters but not the chunk "
        "staged in the adder before the waiting queue is read (sgl-project/sglang #25865; SGLang before PR #23179)",
        ("LORA-001",), **{**_SGLANG, "trace_strategy": sglang_carried_chunk_lora_traces})
class LoraMissesStagedChunk(SglangScheduler):
    """``running_loras`` without scheduler.py:4190-4191: the chunked request's adapter is not counted, so
    a waiting request of another adapter is admitted beside its next chunk, one adapter over max_loras
    (the ``sglang`` host's ``--lora-counterfactual pre-23179``)."""

    def _running_loras(self, adder) -> set[int]:  # type: ignore[no-untyped-def]
        return {r.request.lora_id for r in self.running if not r.finished}  # bug: the staged chunk is left out
