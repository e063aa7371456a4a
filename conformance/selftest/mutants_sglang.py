"""Mutants of the SGLang reference (`reference_impl.sglang_scheduler`), each with the SGL invariant
that catches it (tests/test_mutants.py searches for the trace)."""

from __future__ import annotations

from conformance.flows import get_flow
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
