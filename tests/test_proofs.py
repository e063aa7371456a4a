"""The Z3 proofs: the default matrix is proved, mutated transitions are caught and their
counterexamples replay on the mutated reference, and the CLI reports both."""

from __future__ import annotations

import json

import pytest
import z3

from conformance.commands.cli import main
from conformance.selftest.proof_bridge import counterexample_trace, find_violation
from reference_impl.scheduler import Scheduler
from spec.catalogue import catalogue
from spec.errors import InputError
from spec.proofs.bound import DEFAULT, Bound
from spec.proofs.encoding import MUTANTS, Encoder, pin_state
from spec.proofs.matrix import prove
from spec.proofs.parametric import ROW_FACTS
from spec.proofs.per_sequence import ROWS as PS_ROWS
from spec.proofs.properties import STATE_INVARIANTS, TRANSITION_PROPERTIES
from spec.proofs.unbounded import prove_unbounded
from spec.trace import Trace
from tests.proof_mutants import MUTATED_REFERENCES

CATALOGUE = {inv.id for inv in catalogue()}


@pytest.fixture(scope="module")
def default_matrix():
    return prove(DEFAULT, jobs=2, catalogue_ids=sorted(CATALOGUE))


def test_default_matrix_is_proved(default_matrix):
    assert default_matrix.all_proved, [(c.invariant, c.action, c.result) for c in default_matrix.failing()]
    # every state invariant has an init cell and a cell per action
    for iid in STATE_INVARIANTS:
        assert {c.action for c in default_matrix.cells if c.invariant == iid} >= {"init", "admit", "swap_in"}


def test_matrix_names_what_it_does_not_prove(default_matrix):
    covered = set(STATE_INVARIANTS) | set(TRANSITION_PROPERTIES) | set(default_matrix.out_of_scope)
    assert CATALOGUE <= covered  # nothing silently omitted
    assert "not a state invariant" in default_matrix.out_of_scope["BUD-001"]
    assert default_matrix.out_of_scope["POL-001"].startswith("policy")


def test_queue_partition_is_proved_unbounded(default_matrix):
    cells = [c for c in default_matrix.cells if c.invariant == "QUE-001"]
    assert cells and all(c.scope == "unbounded" for c in cells)
    # spec/proofs/unbounded.py, parametric.py, per_sequence.py, counting.py, writes.py: every cell
    lifted = {"QUE-001", "QUE-002", "STR-002", "BUD-003", "WF", *ROW_FACTS, *PS_ROWS, "COW-001", "ALLOC", "ADM-002"}
    assert {c.invariant for c in default_matrix.cells} <= lifted
    assert all(c.scope == "unbounded" for c in default_matrix.cells)
    assert ("QUE-001", "swap_out") in prove_unbounded()


def test_some_invariants_are_not_inductive_alone():
    """Alone, BLK-001 (a count) is not inductive: the proof needs the per-block facts
    (BLK-003, BLK-005, or STR-001). The counterexample's pre-state violates STR-001, so no trace
    reaches it; the conjunction with the strengthening is what is inductive."""
    m = prove(DEFAULT, alone=True, invariants=["BLK-001"], actions=["admit"], unbounded=False)
    cell = m.cell("BLK-001", "admit")
    assert cell.result == "counterexample"
    enc = Encoder(DEFAULT)
    pre = enc.state("p")
    s = z3.Solver()
    s.add(*pin_state(enc, pre, cell.counterexample["pre"]), STATE_INVARIANTS["STR-001"](enc, pre))
    assert s.check() == z3.unsat


@pytest.mark.parametrize("mutant", sorted(MUTATED_REFERENCES))
def test_mutated_transition_is_caught_and_replays(mutant, tmp_path):
    scheduler_class, actions = MUTATED_REFERENCES[mutant]
    matrix = prove(DEFAULT, mutant=mutant, actions=actions, unbounded=False, jobs=1)
    failing = [c for c in matrix.failing() if c.invariant in CATALOGUE and c.result == "counterexample"]
    assert failing, f"{mutant}: prove found no counterexample"
    found = None
    for cell in failing:
        found = counterexample_trace(cell.counterexample, cell.invariant, scheduler_class)
        if found:
            break
    assert found is not None, f"{mutant}: no trace reproduces {[c.invariant for c in failing]}"
    trace, violations = found
    path = trace.save(tmp_path / f"{mutant}.json")
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["meta"]["counterexample"]["invariant"] == cell.invariant
    replayed = Trace.load(path)
    assert find_violation(replayed, scheduler_class, cell.invariant), "the saved trace does not replay the violation"
    assert not find_violation(replayed, Scheduler, cell.invariant), "the unmutated reference violates it too"


def test_every_encoding_mutant_has_a_mutated_reference():
    assert set(MUTANTS) == set(MUTATED_REFERENCES)


def test_bound_parsing():
    assert Bound.parse("gpu_blocks=6,seqs=4").gpu_blocks == 6
    assert Bound.parse("large").seqs == 4
    with pytest.raises(InputError, match="--bound.gpu_blocks"):
        Bound.parse("gpu_blocks=x")
    with pytest.raises(InputError, match="unknown bound"):
        Bound.parse("blocks=3")
    with pytest.raises(InputError, match="groups"):
        Bound.parse("groups=5,seqs=2")


def test_cli_prove_json_and_exit_codes(capsys):
    assert main(["prove", "--json", "--action", "finish", "--invariant", "BLK-003", "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1 and out["all_proved"]
    assert {c["action"] for c in out["cells"]} == {"init", "finish"}
    assert main(["prove", "--mutant", "abort-no-free", "--action", "abort", "--invariant", "RES-004", "--jobs", "1"]) == 1
    assert "cex" in capsys.readouterr().out
    assert main(["prove", "--bound", "gpu_blocks=0"]) == 2
    assert main(["prove", "--invariant", "NOPE-1"]) == 2


# ---------------------------------------------------------------- the strengthening invariants have teeth
def _leaky_scheduler(config):
    """decref never returns a block to the free list (ref count 0, yet not free)."""
    from reference_impl.block_pool import BlockPool

    class LeakyPool(BlockPool):
        def decref(self, block: int) -> None:
            self.ref_counts[block] -= 1

    sched = Scheduler(config)
    for name in ("gpu", "cpu"):
        pool = getattr(sched.block_manager, name)
        leaky = LeakyPool(pool.device, pool.num_blocks)
        setattr(sched.block_manager, name, leaky)
    return sched


def _seat_blind_scheduler(config):
    from reference_impl.sequence import SequenceGroup

    class SeatBlindGroup(SequenceGroup):
        def max_running_seqs(self) -> int:  # counts live sequences even before the fork
            return len(self.live_seqs())

    class SeatBlind(Scheduler):
        def add_request(self, request):
            super().add_request(request)
            group = self.groups[request.request_id]
            group.__class__ = SeatBlindGroup

    return SeatBlind(config)


@pytest.mark.parametrize("invariant_id, make", [("STR-001", _leaky_scheduler), ("STR-002", _seat_blind_scheduler)])
def test_strengthening_invariants_catch_broken_implementations(invariant_id, make):
    from spec.config import SchedulerConfig
    from spec.trace import Arrival
    from spec.types import Request

    config = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=4, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=8, watermark=0.0)
    trace = Trace(config, (Arrival(0, Request("a", 3, max_tokens=1, n=2)), Arrival(0, Request("b", 3, max_tokens=1, n=2))),
                  max_steps=5)
    assert find_violation(trace, make, invariant_id)
    assert not find_violation(trace, Scheduler, invariant_id)
