"""The per-group block layer for every size (spec/proofs/groups.py): every micro-op keeps every
fact, each group-layer mutant breaks the cells it names, and the hybrid reference's steps are
made of those micro-ops (the part Z3 does not prove)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings

from conformance.commands.cli import main
from conformance.generation.hybrid import fitting_pool, hybrid_traces
from conformance.selftest.mutants import MUTANTS
from reference_impl.engine import StepFailed, iter_steps
from reference_impl.hybrid_scheduler import HybridAsyncScheduler, HybridV1Scheduler
from spec.kv_groups import NULL_BLOCK
from spec.observation import Snapshot
from spec.proofs import groups as G
from spec.status import Status
from spec.trace import Trace

TIMEOUT_MS = 20_000  # the matrix's per-proof cap (spec/proofs/matrix.py prove: min(timeout, 20 s))


def test_every_micro_op_keeps_every_group_fact_for_every_size() -> None:
    proof = G.prove_groups(timeout_ms=TIMEOUT_MS)
    assert [r for r in proof.results if r.result != "proved"] == []
    assert proof.init and proof.partition
    assert proof.cells() == {(row, a) for row in G.GROUP_ROW_FACTS for a in ("init", *G.GROUP_ACTION_OPS)}


def test_each_group_mutant_breaks_the_cells_of_its_fact() -> None:
    for mutant, (op, fact, _) in G.GROUP_MUTANTS.items():
        tables, ng, block_groups = G.MUTANT_WITNESS[mutant]
        assert G.holds(tables, ng, block_groups), mutant  # the witness is an invariant state
        found = G.mutant_breaks(mutant, timeout_ms=TIMEOUT_MS)
        assert found is not None, mutant
        assert found["op"] == op and found["fact"] == fact and found["cells"], found
    # the unmutated micro-op keeps the fact on the same witness
    tables, ng, block_groups = G.MUTANT_WITNESS["hit-not-counted"]
    assert G.holds({**tables, 2: (1, 1, [0])}, ng, block_groups)
    assert not G.holds({0: (0, 1, [0]), 1: (1, 2, [0])}, 3, {0: 1})  # one block in two groups


def _tables(snap: Snapshot) -> dict[tuple[str, int], list[int]]:
    """(seq, group) -> that group's table, group 0 being the sequence's own blocks."""
    out: dict[tuple[str, int], list[int]] = {}
    for sid, view in (snap.seqs or {}).items():
        out[(sid, 0)] = list(view.blocks or ())
    for sid, tables in (snap.group_tables or {}).items():
        for g, table in enumerate(tables, start=1):
            out[(sid, g)] = list(table)
    return out


def _check_pair(pre: Snapshot, post: Snapshot, owner: dict[int, int]) -> None:
    """``post`` is ``pre`` after micro-ops of groups.py: each table keeps or nulls its old
    positions (skip) or loses its tail (drop), and grows by null entries (pad), free or freed
    blocks (append) or blocks its group holds (touch); a waiting or finished sequence names no real
    block."""
    before, after = _tables(pre), _tables(post)
    free = set(pre.gpu_free_ids or ())
    held_after = {b for t in after.values() for b in t if b != NULL_BLOCK}
    # blocks some old position still holds; a block held before and by none of its old positions
    # now was released in the step (drop, skip) and may be taken fresh again
    kept = {b for key, t in before.items() for p, b in enumerate(t)
            if b != NULL_BLOCK and p < len(after.get(key, ())) and after[key][p] == b}
    released = {b for t in before.values() for b in t if b != NULL_BLOCK} - kept
    for (sid, g), table in after.items():
        old = before.get((sid, g), [])
        shared = min(len(old), len(table))
        for p in range(shared):
            assert table[p] in (old[p], NULL_BLOCK), (sid, g, p, old, table)
        for b in table[len(old):]:
            if b == NULL_BLOCK:
                continue  # pad
            if b in free or b in released:
                owner[b] = g  # append (a fresh block) or touch of a free cached block of group g
            else:
                assert owner.get(b) == g, (sid, g, b, owner.get(b))  # touch: held by group g only
        view = (post.seqs or {}).get(sid)
        if view is not None and (view.status is Status.WAITING or view.status.is_finished):
            assert all(b == NULL_BLOCK for b in table), (sid, g, view.status, table)  # waiting-, finished-empty
    for b in held_after:
        groups = {g for (_, g), t in after.items() if b in t}
        assert groups == {owner[b]}, (b, groups, owner[b])  # group-owned


def _check_run(factory, trace: Trace) -> None:  # type: ignore[no-untyped-def]
    owner: dict[int, int] = {}
    previous: Snapshot | None = None
    for rec in iter_steps(trace, factory(trace.config)):
        for snap in (rec.before, rec.after):
            if previous is not None:
                _check_pair(previous, snap, owner)
            previous = snap


@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(hybrid_traces())
def test_each_hybrid_step_is_group_micro_ops(trace: Trace) -> None:
    _check_run(HybridV1Scheduler, trace)


@settings(max_examples=20, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(hybrid_traces())
def test_each_pipelined_hybrid_step_is_group_micro_ops(trace: Trace) -> None:
    """At depth 1 (`HybridAsyncScheduler`: skipped blocks freed on the returned steps' tokens, a
    processed outcome that finishes a request drops its tables) the same micro-ops."""
    pipelined = dataclasses.replace(trace.config, pipeline_depth=1, watermark=0.0)
    _check_run(HybridAsyncScheduler, dataclasses.replace(trace, config=fitting_pool(pipelined)))


@pytest.mark.parametrize("name", ["hybrid-evicted-still-named"])
def test_the_step_check_refuses_a_reference_that_breaks_the_micro_ops(name: str) -> None:
    """The conformance mutant whose block-layer half is groups.py's ``skip-frees-held``: a step of
    it is no sequence of the micro-ops (its freed blocks go to other tables while still named)."""
    mutant = MUTANTS[name]

    def broken(trace: Trace) -> bool:
        try:
            _check_run(mutant.factory, trace)
        except StepFailed:
            return False  # the mutant's own crash, not the check
        except AssertionError:
            return True
        return False

    trace = find(mutant.trace_strategy(), broken, settings=settings(
        max_examples=400, database=None, derandomize=True, phases=[Phase.generate],
        suppress_health_check=list(HealthCheck), deadline=None))
    _check_run(HybridV1Scheduler, trace)


def test_cli_prove_flow_hybrid(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["prove", "--flow", "hybrid", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["all_proved"] and {c["scope"] for c in out["cells"]} == {"unbounded"}
    assert {c["invariant"] for c in out["cells"]} == set(G.GROUP_ROW_FACTS)
    assert "HYB-003" in out["not_state_invariants"]
    assert main(["prove", "--mutant", "skip-frees-held", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert {(c["invariant"], c["action"]) for c in out["cells"] if c["result"] == "counterexample"} == {
        ("BLK-005", "chunk"), ("HYB-001", "chunk")}
