"""Exported reproducers for the targets that have no defect finding (SGLang, LMDeploy).

A target kvsched found no defect in still gets its exporter checked both ways, on traces of two
kinds:

* ``deviation``: a trace the release fails by design (a deviation of docs/CONFORMANCE.md, not a
  defect, so no upstream report): the exported file must fail on the release, for that reason;
* ``seeded``: a trace the release passes, and a seeded defect (docs/reports/seeded/*.json, a
  `conformance.export.patching` descriptor that plants a defect instead of fixing one) applied to a
  copy of the engine: the file must pass on the release and fail on the seeded copy. This shows
  the exported check catches a defect of the engine's own code, not only of kvsched's harness.

`conformance.selftest.campaigns.export_both_ways` runs them and records the results in
docs/reports/both-ways.json under ``demonstrations``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Demonstration:
    slug: str
    target: str
    kind: str  # "deviation" or "seeded"
    title: str
    trace: str  # path from the repository root
    fails_with: str  # a piece of the FAILED line: on the release (deviation) or on the seeded copy (seeded)
    property: str | None = None  # None: the trace's own
    seeded: str = ""  # docs/reports/seeded/<name>.json (kind "seeded")
    why: str = ""  # where the deviation is explained, or what the seeded defect is


DEMONSTRATIONS: tuple[Demonstration, ...] = (
    Demonstration(
        "sglang-first-prefill-above-input-budget", "sglang", "deviation",
        "SGLang admits the first request of a prefill batch whatever its length against the token budget "
        "(chunked prefill off)", "docs/traces/lockstep-sglang/fcfs-first-prefill-above-input-budget.json",
        "scheduled 2 tokens (per request: {'r8': 2}) with max_num_batched_tokens=1", property="BUD-001",
        why="docs/CONFORMANCE.md, SGLang lockstep class first-prefill-above-input-budget: deviation by design "
            "(sglang/srt/managers/schedule_policy.py:1627-1633, 'Without chunking, allow the first request even "
            "above the input cap')"),
    Demonstration(
        "sglang-seeded-chunk-over-budget", "sglang", "seeded",
        "A seeded defect in SGLang's chunked-prefill cut (one token past the chunk budget) breaks the token budget",
        "docs/reports/traces/sglang-seeded-chunk.json", "scheduled 5 tokens (per request: {'r0': 5})",
        seeded="sglang-chunk-one-over-budget.json",
        why="schedule_policy.py:1665 `extend_len = chunk_tokens_limit // page_size * page_size` with "
            "chunk_tokens_limit + 1"),
    Demonstration(
        "lmdeploy-lazy-recompute-eviction", "lmdeploy", "deviation",
        "LMDeploy leaves a recompute-preempted sequence's blocks in place until another sequence needs them",
        "docs/traces/lmdeploy/counterexamples/RES-003.json", "request r2 is waiting (status WAITING) but holds blocks",
        why="docs/CONFORMANCE.md, lmdeploy RES-003: deviation by design (lazy recompute eviction, "
            "lmdeploy/pytorch/paging/scheduler.py: Scheduler.preempt_seqs, 520-526)"),
    Demonstration(
        "lmdeploy-seeded-seats-overfilled", "lmdeploy", "seeded",
        "A seeded defect in LMDeploy's prefill seat limit (the running sequences not counted) overfills "
        "max_batches", "docs/reports/traces/lmdeploy-seeded-seats.json", "3 sequences are running",
        seeded="lmdeploy-prefill-ignores-running-seats.json",
        why="prefill_scheduler.py:847 `max_batches = max_batches - num_ready - num_running` without `- num_running`"),
)


def get_demonstration(slug: str) -> Demonstration:
    for demo in DEMONSTRATIONS:
        if demo.slug == slug:
            return demo
    raise KeyError(slug)
