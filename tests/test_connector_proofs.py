"""The connector flow's Z3 matrix (spec/proofs/encoding_connector.py), bounded and for every size.

* Bounded: each mutated transition is caught by the cell of the invariant it breaks, and the same
  cell is proved without it.
* For every size (issue 30 item 7): every cell of the flow is proved by the arguments of the v1
  flow extended to the connector's transitions: the per-request rows and transition properties on
  one generic request (`GenericConnector`), the block rows by the block layer's micro-ops, KVC-002
  by its per-request half and the block facts, QUE, STR-002/BUD-003 and WF by their per-request
  arguments. Each mutant breaks an unbounded cell too (the proof has teeth), and each action's
  hypotheses are satisfiable (not vacuous).

The whole matrix is a command: ``python3 -m conformance prove --flow connector`` (docs/PROOFS.md).
"""

from __future__ import annotations

import pytest
import z3
from hypothesis import HealthCheck, given, settings

from conformance.generation.connector import connector_traces
from spec.proofs import sequence_cells as PS
from spec.proofs.counting import prove_counts
from spec.proofs.counting import satisfiable as counts_satisfiable
from spec.proofs.encoding_connector import (
    CONNECTOR_ACTIONS,
    CONNECTOR_MUTANT_ACTIONS,
    CONNECTOR_MUTANTS,
    CONNECTOR_STATE_INVARIANTS,
    CONNECTOR_TRANSITION_PROPERTIES,
    FIN,
    KVC_SEQS,
    LOADING,
    SENDING,
    STEPS_CONNECTOR_SEQ,
    GenericConnector,
)
from spec.proofs.matrix import COUNTEREXAMPLE, PROVED, prove
from spec.proofs.parametric import MUTANTS as BLOCK_MUTANTS
from spec.proofs.parametric import prove_blocks
from spec.proofs.unbounded import prove_unbounded
from tests.conftest import examples

# mutant -> the (invariant, action) cell that catches it (bounded, and for every size)
CAUGHT_BY = {
    "admit-while-loading": ("KVC-001", "admit"),
    "load-allocates-past-load": ("KVC-004", "load_start"),
    "land-counts-failed": ("KVC-005", "load_land"),
    "send-done-keeps-blocks": ("KVC-007", "send_done"),
    "frees-while-transferring": ("KVC-002", "abort"),
    "fail-policy-ignored": ("KVC-006", "load_land"),
    "load-into-held-block": ("BLK-003", "load_start"),
}


def _cell(invariant: str, action: str, mutant: str | None) -> str:
    matrix = prove(flow_name="connector", mutant=mutant, invariants=[invariant], actions=[action], unbounded=False,
                   timeout_ms=60_000)
    return matrix.cell(invariant, action).result


def test_every_mutant_has_its_cell() -> None:
    assert set(CAUGHT_BY) == set(CONNECTOR_MUTANTS)
    # each is a per-request rule of the generic request or a block-layer micro-op
    assert set(CONNECTOR_MUTANTS) == set(CONNECTOR_MUTANT_ACTIONS) | {m for m in BLOCK_MUTANTS if m in CONNECTOR_MUTANTS}


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
def test_mutant_is_caught_and_the_cell_holds_without_it(mutant: str) -> None:
    invariant, action = CAUGHT_BY[mutant]
    assert _cell(invariant, action, mutant) == COUNTEREXAMPLE
    assert _cell(invariant, action, None) == PROVED


def test_every_connector_cell_is_proved_for_every_size() -> None:
    """All 312 cells (24 state rows x init + 9 actions, 8 transition rows x 9 actions) by the
    arguments for every size; the bounded queries are not run here (``reuse_unbounded``: the whole
    bounded matrix is the command above)."""
    m = prove(flow_name="connector", reuse_unbounded=True, timeout_ms=20_000)
    assert m.all_proved, m.failing()
    assert len(m.cells) == len(CONNECTOR_STATE_INVARIANTS) * (1 + len(CONNECTOR_ACTIONS)) \
        + len(CONNECTOR_TRANSITION_PROPERTIES) * len(CONNECTOR_ACTIONS)
    assert [c for c in m.cells if c.scope != "unbounded"] == []


def test_the_parts_of_the_argument() -> None:
    """Each argument the matrix composes proves its cells of the connector flow on its own."""
    proved = PS.proved_cells(flow_name="connector")  # cached: the matrix above ran the same queries
    rows, actions = PS.rows_actions("connector")
    assert actions == CONNECTOR_ACTIONS and KVC_SEQS in rows
    assert proved >= {(row, a) for row in rows for a in ("init", *actions)} \
        | {(row, a) for row in STEPS_CONNECTOR_SEQ for a in actions}
    assert all(v == "proved" for v in prove_counts("connector").values())
    assert {("QUE-001", a) for a in ("init", *CONNECTOR_ACTIONS)} <= prove_unbounded(flow_name="connector")
    assert {("BLK-005", a) for a in ("init", *CONNECTOR_ACTIONS)} <= prove_blocks().cells("connector")


@pytest.mark.parametrize("action", CONNECTOR_ACTIONS)
def test_the_hypotheses_are_satisfiable(action: str) -> None:
    """Each action's generic query has a model (its guard with the invariants): with a live
    request, or, for a reported send and a load that lands after an abort, a finished request
    that holds the transfer's blocks; the counting argument's too, with other requests."""
    G = GenericConnector()
    q = G.seq("pre")
    guard, _ = G.effect(action, q, q)
    s = z3.Solver()
    s.add(G.base(), G.inv(q), guard, q.tl <= G.L)
    if action == "send_done":
        s.add(q.st == FIN, q.x == SENDING, q.tl >= 1)
    elif action == "load_land":
        s.add(q.x == LOADING, q.tl >= 1)
    elif action != "add":
        s.add(G.live(q))
    assert s.check() == z3.sat
    if action == "load_land":  # also with the request aborted during its load
        s.add(q.st == FIN)
        assert s.check() == z3.sat
    assert counts_satisfiable("connector", action)


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
def test_each_mutant_breaks_its_cell_for_every_size(mutant: str) -> None:
    """The mutated transition breaks the argument for every size of the cell that catches it
    bounded: the generic request's rule, or the block layer's micro-op (with Z3's witness)."""
    invariant, action = CAUGHT_BY[mutant]
    m = prove(flow_name="connector", mutant=mutant, invariants=[invariant], actions=[action], reuse_unbounded=True)
    assert [invariant, action] in m.parametric["cells"], m.parametric
    if mutant in BLOCK_MUTANTS:
        assert m.parametric["witness"]["op"] == "append"


def _slot(enc, st, g):  # type: ignore[no-untyped-def]
    """The bounded state's request g as the generic request's fields."""
    at = enc._at
    return [at(st.sstat, g), at(st.dev, g), at(st.tlen, g), at(st.ntok, g), at(st.ncomp, g), at(st.xfer, g),
            at(st.ltok, g), at(st.lval, g)]


def _follows(action: str, generic_mutant: str | None = None) -> bool:
    """Whether every bounded step of ``action`` is, for the request it touches, a step of the
    generic rule (None when the bounded action is impossible)."""
    from spec.proofs.encoding import RUN, WAIT
    from spec.proofs.encoding_connector import ConnectorEncoder, grp_ok_connector
    from spec.proofs.matrix import flow

    fl = flow("connector")
    enc = ConnectorEncoder(fl.default_bound)
    ae = enc.encode(action)
    g, pre, post = ae.params["group"], ae.pre, ae.post
    G = GenericConnector(generic_mutant)
    q = G.seq("pre")
    guard, gpost = G.effect(action, q, q)
    own_partial = z3.If(z3.And(enc._at(pre.sstat, g) == RUN, enc._at(pre.ncomp, g) < enc._at(pre.ntok, g) - 1), 1, 0)
    own_active = z3.If(z3.Or(enc.gsel(pre.gstat, g) == WAIT, enc.gsel(pre.gstat, g) == RUN), 1, 0)
    params = {"tokens": G.k, "stop": G.stop, "send": G.send, "external": G.e, "valid": G.v}
    links = [G.bs == enc.bs, G.ML == enc.ML, G.L == enc.L, G.gs == enc.gsel(pre.gstat, g), G.FAIL == enc.FAIL,
             G.F == enc.free_count(pre.gpu), G.W == enc.W, G.TH == enc.TH, G.P == enc.P, G.CH == enc.CH,
             G.rest_partial == enc.partial(pre) - own_partial, G.rest_active == enc.active(pre) - own_active,
             G.plen == enc.gsel(post.plen, g), G.mtok == enc.gsel(post.mtok, g),
             *[getattr(q, f) == v for f, v in zip(("st", "dv", "tl", "nt", "nc", "x", "lt", "lv"), _slot(enc, pre, g), strict=True)],
             *[G_param == ae.params[name] for name, G_param in params.items() if name in ae.params]]
    same = z3.And([getattr(gpost, f) == v for f, v in
                   zip(("st", "dv", "tl", "nt", "nc", "x", "lt", "lv"), _slot(enc, post, g), strict=True)])
    s = z3.Solver()
    s.set("timeout", 60_000)
    s.add(enc.config_ok(), grp_ok_connector(enc), *[inv(enc, pre) for inv in CONNECTOR_STATE_INVARIANTS.values()],
          ae.guard, *ae.defs, *links)
    assert s.check() == z3.sat  # the bounded action is possible
    s.add(z3.Not(z3.And(guard, same)))
    return s.check() == z3.unsat


@pytest.mark.parametrize("action", CONNECTOR_ACTIONS)
def test_the_generic_request_follows_the_bounded_encoding(action: str) -> None:
    """The generic request's rule covers the bounded encoding's (`ConnectorEncoder`): at the bound,
    from every state of the invariants, whatever the action does to the request it touches is a
    step of the generic rule (its guard holds, its post-state is the request's), with the
    generic's free count, rest and parameters read off the bounded state; the pool and the other
    requests are what the other arguments speak of (the block layer's micro-ops, the counting)."""
    assert _follows(action)


@pytest.mark.parametrize(("mutant", "action"), [("land-counts-failed", "load_land"),
                                                ("send-done-keeps-blocks", "send_done")])
def test_a_mutated_generic_rule_does_not_follow(mutant: str, action: str) -> None:
    """The check above has teeth: a generic rule with a mutant's post-state is not the bounded one."""
    assert not _follows(action, mutant)


# ---------------------------------------------------------------------- the reference's states
def _generic_facts_hold(sched) -> None:  # type: ignore[no-untyped-def]
    """Between two steps of the connector reference, every request, read as the generic request
    (its transfer from the connector's record), has every fact the generic queries assume and
    prove (WF's per-request part and the rows): the induction's states include the reference's.
    A load reported done with nothing valid is still the encoding's load in flight: the reference
    frees its blocks at the next promotion, the encoding at the landing."""
    config, connector = sched.config, sched.connector
    tracked = sorted(sched.requests.values(), key=lambda t: t.arrival)
    partial = {t.request_id for t in tracked if t.status.value == "RUNNING" and t.num_computed < t.num_tokens - 1}
    for t in tracked:
        G = GenericConnector()
        q = G.seq("ref")
        flight = connector.transfers.get(t.request_id)
        assert flight is None or flight.kind == "send" or flight.load_async, flight  # a synchronous load lands in its step
        status, dv, tl, nt, nc, x, lt, lv = _reads(sched, t)
        values = {q.st: status, q.dv: dv, q.tl: tl, q.nt: nt, q.nc: nc, q.x: x, q.lt: lt, q.lv: lv, G.gs: status,
                  G.bs: config.block_size,
                  G.ML: config.max_model_len, G.plen: t.request.prompt_len, G.mtok: t.request.max_tokens,
                  G.P: config.max_num_partial_prefills, G.rest_partial: len(partial - {t.request_id}),
                  G.L: max(len(t.blocks), 1)}
        facts = {"WF": G.wf(q), **G.rows(q)}
        s = z3.Solver()
        s.add(*[var == val for var, val in values.items()])
        broken = [name for name, fact in facts.items() if s.check(z3.Not(fact)) != z3.unsat]
        assert not broken, (t.request_id, t.status, values, broken)


def _run_checked(trace, base=None) -> int:  # type: ignore[no-untyped-def]
    """Run ``trace`` on the connector reference (``base``: a mutant of it; prefix caching off),
    checking the generic facts after every update() and abort; the number of states checked with
    a transfer."""
    from dataclasses import replace

    from reference_impl.engine import run_trace
    from reference_impl.kv_connector_scheduler import ConnectorScheduler

    base = base or ConnectorScheduler
    seen = [0]

    class Checked(base):  # type: ignore[misc, valid-type]
        def update(self, outcome):  # type: ignore[no-untyped-def]
            out = base.update(self, outcome)
            _remember_loads(self)
            _generic_facts_hold(self)
            seen[0] += bool(self.connector.transfers or self._kv_landed)
            return out

        def abort_request(self, request_id):  # type: ignore[no-untyped-def]
            out = base.abort_request(self, request_id)
            _generic_facts_hold(self)
            return out

    run_trace(replace(trace, config=replace(trace.config, enable_prefix_caching=False)), Checked)
    return seen[0]


@pytest.mark.parametrize(("script", "policy", "aborts"), [
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, "recompute", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "recompute", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [0]}, "recompute", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "fail", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 3}, "recompute", (1,)),
])
def test_the_reference_states_have_the_generic_facts(script, policy, aborts) -> None:  # type: ignore[no-untyped-def]
    from tests.test_parametric_matches_reference import _connector_trace

    assert _run_checked(_connector_trace(script, policy, aborts)) >= 1


@settings(max_examples=examples(3), deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(trace=connector_traces())
def test_drawn_reference_states_have_the_generic_facts(trace) -> None:  # type: ignore[no-untyped-def]
    _run_checked(trace)


@pytest.mark.parametrize(("name", "script", "broken"), [
    ("KeepsFailedTokens", {"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "KVC-005"),
    ("LeaksAfterTransfer", {"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, "KVC-007"),
    ("AllocatesPastTheLoad", {"external_tokens": 6, "load_async": True, "load_steps": 2}, "KVC-004"),
    ("FreesWhileSending", {"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, KVC_SEQS),
])
def test_a_mutated_reference_leaves_the_generic_facts(name: str, script: dict, broken: str) -> None:
    """The check has teeth: the conformance mutants of the connector reference reach a state
    outside the generic request's facts, at the row their invariant's proof is about."""
    from conformance.selftest import mutants_connector
    from reference_impl.engine import StepFailed
    from tests.test_parametric_matches_reference import _connector_trace

    with pytest.raises((AssertionError, StepFailed), match=f"'{broken}'"):
        _run_checked(_connector_trace(script), getattr(mutants_connector, name))


# ---------------------------------------------------------------------- the reference's steps
# What one reference step (its aborts, schedule() and update()) may do to one request, as generic
# actions in order: a load reported with nothing valid lands for the encoding at the promotion
# (schedule()), and may be retried at once; a landed load is promoted by its admission.
STEP_SEQUENCES = (
    (), ("abort",), ("admit",), ("chunk",), ("load_start",), ("load_land",), ("send_done",),
    ("preempt_recompute",), ("ignore",), ("load_land", "load_start"), ("load_land", "admit"),
    ("abort", "load_land"), ("abort", "send_done"), ("load_start", "load_land"), ("preempt_recompute", "admit"),
    ("load_land", "load_start", "load_land"), ("admit", "load_land"), ("chunk", "send_done"), ("admit", "send_done"),
    ("abort", "load_land", "send_done"),
)
FIELDS = ("st", "dv", "tl", "nt", "nc", "x", "lt", "lv")


def _remember_loads(sched) -> None:  # type: ignore[no-untyped-def]
    """Keep each load the last outcome reported: a landed request may wait several steps for its
    promotion (the waiting pass may not reach it), after the connector's record of it is gone."""
    if not hasattr(sched, "landed_loads"):
        sched.landed_loads = {}
    sched.landed_loads.update({rid: t for rid, t in sched.connector.reported.items() if t.kind == "load"})


def _reads(sched, t):  # type: ignore[no-untyped-def]
    """Request ``t`` of the connector reference as the generic request's fields (see
    `_generic_facts_hold`)."""
    from spec.proofs.encoding import GPU, NODEV, RUN, WAIT
    from spec.proofs.encoding_connector import LANDED, NO_XFER

    config, connector = sched.config, sched.connector
    status = FIN if t.status.is_finished else RUN if t.status.value == "RUNNING" else WAIT
    x, lt, lv = NO_XFER, 0, 0
    flight = connector.transfers.get(t.request_id)
    if flight is not None:
        x, lt = (SENDING, 0) if flight.kind == "send" else (LOADING, flight.tokens)
    elif t.request_id in sched._kv_landed or (t.status.value == "WAITING_FOR_REMOTE_KV" and t.blocks
                                                and t.request_id in getattr(sched, "landed_loads", {})):
        # landed, or promoted (its valid blocks cached) and not yet admitted: the encoding's landed
        # load either way, which holds its blocks until the request is scheduled
        load = sched.landed_loads[t.request_id]  # reported in an outcome, maybe not the last one
        lt = load.tokens  # valid: up to its first failed block (the script's), all of it else
        valid = min((i * config.block_size for i, b in enumerate(load.blocks) if b in load.failed), default=lt)
        x, lv = (LANDED, min(valid, lt)) if t.num_computed else (LOADING, 0)
    return (status, GPU if t.blocks else NODEV, len(t.blocks), t.num_tokens, t.num_computed, x, lt, lv)


def _pins(q, values):  # type: ignore[no-untyped-def]
    """The fields' values; a load's tokens only while there is a load, its valid ghost only once it
    landed (the reference's record of a load ends with it), the computed count only while the
    request is unfinished or holds blocks (a load that fails under ``fail`` cuts it in the reference
    before the request ends, the encoding ends it uncut: no row reads it after)."""
    from spec.proofs.encoding_connector import LANDED

    x, st, tl = values[FIELDS.index("x")], values[FIELDS.index("st")], values[FIELDS.index("tl")]
    keep = {"lt": x in (LOADING, LANDED), "lv": x == LANDED, "nc": st != FIN or tl > 0}
    return [getattr(q, f) == v for f, v in zip(FIELDS, values, strict=True) if keep.get(f, True)]


def _follows_rules(config, request, before, after) -> bool:  # type: ignore[no-untyped-def]
    """Whether some sequence of `STEP_SEQUENCES` of the generic rules takes the request from
    ``before`` to ``after`` (the rules' parameters and the other requests' terms free)."""
    G = GenericConnector()
    params = [G.k, G.stop, G.send, G.e, G.v]
    fixed = [G.bs == config.block_size, G.ML == config.max_model_len, G.plen == request.prompt_len,
             G.mtok == request.max_tokens, G.FAIL == z3.BoolVal(config.kv_load_failure_policy == "fail"),
             G.CH == z3.BoolVal(config.enable_chunked_prefill), G.base()]
    for sequence in STEP_SEQUENCES:
        q = G.seq("pre")
        s = z3.Solver()
        s.add(*fixed, *_pins(q, before))
        for n, action in enumerate(sequence):
            fresh = [(p, z3.Int(f"{p}_{n}")) for p in params]
            guard, post = G.effect(action, q, q)
            now = [(G.gs, q.st), *fresh]
            s.add(z3.substitute(guard, *now))
            q = type(q)(*[z3.substitute(getattr(post, f), *now) for f in FIELDS])
        s.add(*_pins(q, after))
        if s.check() == z3.sat:
            return True
    return False


def _run_steps_checked(trace, base=None) -> int:  # type: ignore[no-untyped-def]
    """Run ``trace`` on the connector reference (prefix caching off), checking each request's
    change over each step against the generic rules; the number of changes checked. A request
    whose script loads synchronously is left out: synchronous loads are not encoded (its first
    tokens count as computed without being scheduled; a failed one may end the request holding a
    send with nothing computed)."""
    from dataclasses import replace

    from reference_impl.engine import run_trace
    from reference_impl.kv_connector_scheduler import ConnectorScheduler

    base = base or ConnectorScheduler
    checked = [0]
    sync = {rid for rid, script in trace.connector.items() if script.external_tokens and not script.load_async}

    class Checked(base):  # type: ignore[misc, valid-type]
        last: dict = {}

        def _reads_all(self):  # type: ignore[no-untyped-def]
            return {rid: _reads(self, t) for rid, t in self.requests.items()}

        def schedule(self):  # type: ignore[no-untyped-def]
            if not self.last:
                self.last = self._reads_all()
            return base.schedule(self)

        def update(self, outcome):  # type: ignore[no-untyped-def]
            out = base.update(self, outcome)
            _remember_loads(self)
            now = self._reads_all()
            for rid, after in now.items():
                before = self.last.get(rid)
                if before is None or before == after or rid in sync:
                    continue  # arrived in this step (``add``), unchanged, or not encoded
                checked[0] += 1
                assert _follows_rules(self.config, self.requests[rid].request, before, after), (rid, before, after)
            self.last = now
            return out

    run_trace(replace(trace, config=replace(trace.config, enable_prefix_caching=False)), Checked)
    return checked[0]


@pytest.mark.parametrize(("script", "policy", "aborts"), [
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, "recompute", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "recompute", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [0]}, "recompute", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "fail", ()),
    ({"external_tokens": 6, "load_async": True, "load_steps": 3}, "recompute", (1,)),
])
def test_each_reference_step_follows_the_generic_rules(script, policy, aborts) -> None:  # type: ignore[no-untyped-def]
    from tests.test_parametric_matches_reference import _connector_trace

    assert _run_steps_checked(_connector_trace(script, policy, aborts)) >= 2  # B loads synchronously: left out


@pytest.mark.parametrize(("name", "script", "policy"), [
    ("KeepsFailedTokens", {"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "recompute"),
    ("IgnoresFailPolicy", {"external_tokens": 6, "load_async": True, "load_steps": 2, "failed_blocks": [1]}, "fail"),
    ("LeaksAfterTransfer", {"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, "recompute"),
    ("AllocatesPastTheLoad", {"external_tokens": 6, "load_async": True, "load_steps": 2}, "recompute"),
    ("FreesWhileSending", {"external_tokens": 6, "load_async": True, "load_steps": 2, "send_steps": 2}, "recompute"),
])
def test_a_mutated_reference_step_does_not_follow(name: str, script: dict, policy: str) -> None:
    """The check has teeth: a step of each of these conformance mutants of the connector reference
    is no sequence of the generic rules."""
    from conformance.selftest import mutants_connector
    from reference_impl.engine import StepFailed
    from tests.test_parametric_matches_reference import _connector_trace

    with pytest.raises((AssertionError, StepFailed)):
        _run_steps_checked(_connector_trace(script, policy), getattr(mutants_connector, name))
