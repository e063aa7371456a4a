"""The Z3 proofs of the speculative-decoding flow (spec/proofs/encoding_specdec.py): the matrix is
proved at its bound and for every size, for every k, no action is proved vacuously (each can fire from an invariant
state, the speculative paths included), each mutated transition is caught by the cells it names,
SPD-007 without its empty-outcome allowance fails only where `SPD007_STRENGTHENING` says (and the reference
holds SPD-007 and PFX-001 with the allowance there),
and the CLI runs the flow."""

from __future__ import annotations

import json

import pytest
import z3

import conformance.selftest.mutants_specdec as mutants_specdec
from conformance.commands.cli import main
from spec.catalogue import catalogue
from spec.proofs.encoding import FIN, RUN
from spec.proofs.encoding_specdec import (
    SPECDEC_ACTIONS,
    SPECDEC_BOUND,
    SPECDEC_MUTANTS,
    SPECDEC_STATE_INVARIANTS,
    SPECDEC_TRANSITION_PROPERTIES,
    SpecDecEncoder,
    grp_ok_specdec,
    spd007_strict,
    spd009,
)
from spec.proofs.matrix import prove

CATALOGUE = {inv.id for inv in catalogue()}


def test_specdec_matrix_is_proved():
    m = prove(flow_name="specdec", jobs=1, catalogue_ids=sorted(CATALOGUE))
    assert m.all_proved, [(c.invariant, c.action, c.result) for c in m.failing()]
    assert {c.action for c in m.cells} == {"init", *SPECDEC_ACTIONS}
    rows = {c.invariant for c in m.cells}
    assert rows >= {"SPD-001", "SPD-002", "SPD-003", "SPD-004", "SPD-005", "SPD-006", "SPD-007", "SPD-008",
                    "SPD-009",
                    "CAP-001", "CAP-003", "CHK-002", "CHK-004", "BLK-001", "BLK-003", "COW-001", "ALLOC", "WF"}
    assert all(c.flow == "specdec" for c in m.cells)
    # every cell for every size: the block layer (parametric, v1's micro-ops), QUE-001, COW-001, the
    # generic request (per_sequence.py with GenericSpecDec) and the counts (counting.py)
    assert all(c.scope == "unbounded" for c in m.cells), sorted({(c.invariant, c.scope) for c in m.cells})
    covered = set(SPECDEC_STATE_INVARIANTS) | set(SPECDEC_TRANSITION_PROPERTIES) | set(m.out_of_scope)
    assert CATALOGUE <= covered  # nothing silently omitted
    assert "SPD-007" not in m.out_of_scope  # proved as catalogued (the allowance is in the predicate)


def _fires(action: str, *extra) -> bool:
    """Whether ``action`` can fire from a state satisfying every specdec invariant, with ``extra``
    (a function of the encoder and the action's encoding) on top."""
    enc = SpecDecEncoder(SPECDEC_BOUND)
    ae = enc.encode(action)
    s = z3.Solver()
    s.add(enc.config_ok(), grp_ok_specdec(enc), *[f(enc, ae.pre) for f in SPECDEC_STATE_INVARIANTS.values()],
          ae.guard, *ae.defs, *[e(enc, ae) for e in extra])
    return s.check() == z3.sat


def _param(name: str, cond):
    return lambda enc, ae: cond(ae.params[name])


def _acted(cond):
    return lambda enc, ae: z3.Or([z3.And(ae.params["group"] == s, cond(enc, ae, s)) for s in range(enc.S)])


@pytest.mark.parametrize("action", SPECDEC_ACTIONS)
def test_no_specdec_action_is_vacuous(action):
    assert _fires(action)


def test_the_speculative_paths_are_reachable_by_the_hypotheses():
    # two drafts, one rejected: the rollback keeps the rejected draft's slot
    assert _fires("verify", _param("drafts", lambda d: d == 2), _param("accepted", lambda j: j == 1),
                  _param("empty", lambda e: e == 0))
    # an empty outcome with drafts outstanding (vllm#42722's shape), the request still running
    assert _fires("verify", _param("empty", lambda e: e == 1),
                  _acted(lambda enc, ae, s: ae.post.sstat[s] == RUN))
    # a stop on the first of three committed tokens
    assert _fires("verify", _param("accepted", lambda j: j == 2), _param("stop", lambda v: v == 1),
                  _param("stop_at", lambda i: i == 0), _acted(lambda enc, ae, s: ae.post.sstat[s] == FIN))
    # the slots of rejected drafts are kept: a table past the computed tokens' blocks
    assert _fires("chunk", _acted(lambda enc, ae, s: ae.pre.tlen[s] > enc.ceil_blocks(ae.pre.ncomp[s] + 1)))
    # preemption and abort of a request holding a proposal
    assert _fires("preempt_recompute", _acted(lambda enc, ae, s: ae.pre.npr[s] >= 1))
    assert _fires("abort", _acted(lambda enc, ae, s: ae.pre.npr[s] >= 1))
    # the drafts fit the room the bonus token leaves (max_model_len): the verify guard is not vacuous there
    assert _fires("verify", _acted(lambda enc, ae, s: ae.pre.ncomp[s] + ae.params["tokens"] + 1 == enc.ML))
    assert not _fires("verify", _acted(lambda enc, ae, s: ae.pre.npr[s] == 0))  # SPD-008: no proposal, no drafts


# mutant -> (the cells that must fail, the conformance mutant of the specdec reference with the same bug)
CAUGHT = {
    "empty-outcome-skips-rollback": ({("SPD-005", "verify"), ("SPD-005", "chunk"), ("CAP-003", "verify")},
                                     mutants_specdec.EmptyOutcomeKeepsDrafts),
    "drafts-outside-budget": ({("SPD-001", "verify")}, mutants_specdec.DraftsOutsideBudget),
    "drafts-on-prefill-chunk": ({("SPD-002", "chunk"), ("SPD-002", "admit")}, mutants_specdec.DraftsOnPrefillChunk),
    # its SPD-009 harm is one step later: test_a_kept_proposal_puts_drafts_after_a_cut_chunk
    "drafts-after-cut-chunk": ({("SPD-002", "chunk"), ("SPD-002", "admit")}, mutants_specdec.DraftsAfterCutChunk),
    "keys-rejected-kv": ({("SPD-007", "verify"), ("SPD-007", "chunk")},
                         mutants_specdec.CachesRejectedKv),
}


def test_every_specdec_mutant_is_listed():
    assert set(CAUGHT) == set(SPECDEC_MUTANTS)


@pytest.mark.parametrize("mutant", sorted(CAUGHT))
def test_specdec_mutant_is_caught(mutant):
    cells, _ = CAUGHT[mutant]
    m = prove(flow_name="specdec", mutant=mutant, actions=sorted({a for _, a in cells}),
              invariants=sorted({i for i, _ in cells}), jobs=1)
    failed = {(c.invariant, c.action) for c in m.cells if c.result == "counterexample"}
    assert cells <= failed, (mutant, failed)
    for c in m.cells:
        if (c.invariant, c.action) in cells:
            assert c.counterexample["flow"] == "specdec" and "proposed" in c.counterexample["pre"]["seqs"][0]


def test_spd007_without_its_allowance_fails_only_after_an_empty_outcome_with_prefix_caching():
    """SPD007_STRENGTHENING: from a state satisfying every invariant, SPD-007 without its
    empty-outcome allowance breaks only on an outcome with no token, with prefix caching on."""
    for empty, want in ((1, z3.sat), (0, z3.unsat)):
        enc = SpecDecEncoder(SPECDEC_BOUND)
        ae = enc.encode("verify")
        s = z3.Solver()
        s.add(enc.config_ok(), grp_ok_specdec(enc), *[f(enc, ae.pre) for f in SPECDEC_STATE_INVARIANTS.values()],
              spd007_strict(enc, ae.pre), ae.guard, *ae.defs, ae.params["empty"] == empty,
              z3.Not(spd007_strict(enc, ae.post)))
        assert s.check() == want, empty
        if want == z3.sat:
            assert z3.is_true(s.model().eval(enc.PC))


def test_empty_outcome_with_prefix_caching_on_the_reference():
    """The same state on the reference: a two-token prompt whose first outcome is empty, prefix
    caching on, k = 1: its one block was keyed when allocated and its computed tokens roll back to
    1. The block holds the last known token's KV (the forward pass ran), so SPD-007 and PFX-001
    allow it (`void_outcomes`); a key one further (a mutant) is still caught."""
    from conformance.selftest.mutants import violated
    from reference_impl.specdec_scheduler import SpecDecScheduler
    from spec.config import SchedulerConfig
    from spec.speculative import DraftDecision
    from spec.trace import Arrival, Trace
    from spec.types import Request

    config = SchedulerConfig(block_size=2, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=8, max_model_len=20, watermark=0.0, preemption_mode="recompute",
                             enable_prefix_caching=True, num_speculative_tokens=1)
    empty = Trace(config, (Arrival(0, Request("A", 2, 5, prompt_tokens=(1, 2))),), max_steps=6,
                  drafts=((0, "A#0", DraftDecision(empty=True)),))
    assert not {"SPD-007", "PFX-001"} & set(violated(SpecDecScheduler, empty))
    assert not {"SPD-007", "PFX-001"} & set(violated(SpecDecScheduler, Trace(config, empty.arrivals, max_steps=6)))


def test_cli_prove_flow_specdec(capsys):
    assert main(["prove", "--flow", "specdec", "--json", "--action", "verify", "--invariant", "SPD-001",
                 "--jobs", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["all_proved"] and out["flow"] == "specdec"
    assert {(c["action"], c["flow"]) for c in out["cells"]} == {("verify", "specdec")}
    assert main(["prove", "--mutant", "drafts-outside-budget", "--action", "verify", "--invariant", "SPD-001",
                 "--jobs", "1"]) == 1
    assert "cex" in capsys.readouterr().out
    assert main(["prove", "--flow", "v1", "--mutant", "drafts-outside-budget"]) == 2


@pytest.mark.parametrize("mutant", sorted(CAUGHT))
def test_specdec_counterexample_replays_on_the_conformance_mutant(mutant, tmp_path):
    """Each mutant's counterexample becomes a trace (`specdec_counterexample_trace`) that breaks the
    catalogue invariant on the conformance mutant with the same bug, and not on the reference."""
    from conformance.selftest.proof_bridge import find_violation, specdec_counterexample_trace
    from reference_impl.specdec_scheduler import SpecDecScheduler
    from spec.trace import Trace

    cells, scheduler_class = CAUGHT[mutant]
    row = sorted(cells)[-1][0]
    invariant = row.split("/")[0]  # a partial row (ID/part) replays as its catalogue invariant
    m = prove(flow_name="specdec", mutant=mutant, actions=sorted({a for r, a in cells if r == row}),
              invariants=[row], jobs=1)
    found = None
    for cell in m.failing():  # Z3's model may differ from run to run: any cell's, any of two seeds
        for seed in (0, 1):
            found = found or specdec_counterexample_trace(cell.counterexample, invariant, scheduler_class, tries=400,
                                                          seed=seed)
    assert found is not None, f"{mutant}: no trace reproduces {invariant}"
    trace, violations = found
    assert all(v.step is not None for v in violations), violations  # a real violation, not a crash
    replayed = Trace.load(trace.save(tmp_path / f"{mutant}.json"))
    assert replayed.meta["counterexample"]["flow"] == "specdec"
    assert find_violation(replayed, scheduler_class, invariant), "the saved trace does not replay the violation"
    assert not find_violation(replayed, SpecDecScheduler, invariant), "the unmutated reference violates it too"


@pytest.mark.parametrize("mutant", sorted(CAUGHT))
def test_specdec_mutant_breaks_the_generic_request(mutant):
    """Each proof mutant also breaks the unbounded argument (the generic request's rule) in the
    cells it names, so no unbounded cell hides it."""
    m = prove(flow_name="specdec", mutant=mutant, actions=sorted({a for _, a in CAUGHT[mutant][0]}),
              invariants=sorted({i for i, _ in CAUGHT[mutant][0]}), jobs=1)
    assert CAUGHT[mutant][0] <= {tuple(c) for c in m.parametric["cells"]}, m.parametric


def test_a_kept_proposal_puts_drafts_after_a_cut_chunk():
    """vllm#30618 where it corrupts, end to end: from a state satisfying every invariant, the
    mutated prefill chunk keeps the drafter's proposal, and the request's next chunk, cut short of
    the prompt's end, carries drafts after it (SPD-009 fails); the unmutated flow never does."""
    for mutant, want in (("drafts-after-cut-chunk", z3.sat), (None, z3.unsat)):
        enc = SpecDecEncoder(SPECDEC_BOUND, mutant)
        first = enc.encode("chunk")
        facts = [first.guard, *first.defs]
        second = enc.encode("verify", pre=first.post)
        renamed = [(second.params["group"], first.params["group"])]
        renamed += [(v, z3.Int(f"second_{n}")) for n, v in second.params.items() if n not in ("group", "drafts")]
        facts += [z3.substitute(f, *renamed) for f in (second.guard, *second.defs, z3.Not(spd009(second)))]
        s = z3.Solver()
        s.add(enc.config_ok(), grp_ok_specdec(enc), *[f(enc, first.pre) for f in SPECDEC_STATE_INVARIANTS.values()],
              *facts)
        assert s.check() == want, mutant
