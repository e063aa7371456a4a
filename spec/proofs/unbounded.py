"""Unbounded proofs: QUE-001 for any number of requests.

The queue partition only depends on each request's status and queue membership, and every
action touches one request. Over arrays indexed by an unbounded integer request id, with the
invariant universally quantified, Z3 proves initiation and preservation for every number of
requests at once. Each action's effect on the one request it touches is the bounded encoding's
(``spec.proofs.encoding``), with "the request finished because no live sequence is left" as a
free choice, which over-approximates it. The v1 flow (``spec.proofs.chunked``) has its own
effects (no swap; an arrival over max_model_len finishes at once).
"""

from __future__ import annotations

from typing import Any

import z3

from spec.proofs.encoding import FIN, NONE, RUN, SWAP, WAIT

# action -> (allowed pre statuses, possible post statuses)
_EFFECTS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "add": ((NONE,), (WAIT,)),
    "admit": ((WAIT,), (RUN, FIN)),
    "fork": ((WAIT,), (RUN, FIN)),
    "decode": ((RUN,), (RUN, FIN)),
    "preempt_recompute": ((RUN,), (WAIT,)),
    "swap_out": ((RUN,), (SWAP,)),
    "swap_in": ((SWAP,), (RUN, FIN)),
    "finish": ((RUN,), (RUN, FIN)),
    "abort": ((WAIT, RUN, SWAP), (FIN,)),
    "ignore": ((WAIT, SWAP), (FIN,)),
}

# The v1 flow (spec/proofs/chunked.py): no swap; an arrival may be rejected (finished) at once.
_EFFECTS_V1: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
    "add": ((NONE,), (WAIT, FIN)),
    "admit": ((WAIT,), (RUN, FIN)),
    "chunk": ((RUN,), (RUN, FIN)),
    "preempt_recompute": ((RUN,), (WAIT,)),
    "abort": ((WAIT, RUN), (FIN,)),
    "ignore": ((WAIT,), (FIN,)),
}


# The async flow (spec/proofs/encoding_async.py): v1's, plus a processed outcome, which may finish
# a waiting (stale outcome) or running request, or touch a finished one (dropped).
_EFFECTS_ASYNC = {**_EFFECTS_V1, "process": ((WAIT, RUN, FIN), (WAIT, RUN, FIN))}
# The speculative flow (spec/proofs/encoding_specdec.py): v1's, plus a verifying step (a chunk's effect).
_EFFECTS_SPECDEC = {**_EFFECTS_V1, "verify": ((RUN,), (RUN, FIN))}
# V1 with a KV connector (spec/proofs/encoding_connector.py): v1's, plus a load that starts (the
# request keeps waiting), lands (a waiting request keeps waiting or fails under fail; an aborted one
# stays finished) and a reported send (a finished request stays finished)
_EFFECTS_CONNECTOR = {**_EFFECTS_V1, "load_start": ((WAIT,), (WAIT,)), "load_land": ((WAIT, FIN), (WAIT, FIN)),
                      "send_done": ((FIN,), (FIN,))}


def _que001(status: Any, w: Any, r: Any, s: Any) -> Any:
    j = z3.Int("j")
    n = z3.If(w[j], 1, 0) + z3.If(r[j], 1, 0) + z3.If(s[j], 1, 0)
    unfinished = z3.Or(status[j] == WAIT, status[j] == RUN, status[j] == SWAP)
    return z3.ForAll([j], z3.If(unfinished, n == 1, n == 0))

def _que002_queues(status: Any, w: Any, r: Any, s: Any) -> Any:
    """QUE-002's per-request half: a request in a queue has that queue's status."""
    j = z3.Int("j")
    return z3.ForAll([j], z3.And(z3.Implies(w[j], status[j] == WAIT), z3.Implies(r[j], status[j] == RUN),
                                 z3.Implies(s[j], status[j] == SWAP)))


QUE_QUEUES = "QUE-002/queues"


def prove_unbounded(timeout_ms: int = 60_000, flow_name: str = "v0") -> set[tuple[str, str]]:
    """The (invariant, action) cells proved for every size (plus ``init``), for the v0, v1, async, specdec
    or connector flow."""
    effects = {"v1": _EFFECTS_V1, "async": _EFFECTS_ASYNC, "specdec": _EFFECTS_SPECDEC,
               "connector": _EFFECTS_CONNECTOR}.get(flow_name, _EFFECTS)
    A = z3.ArraySort(z3.IntSort(), z3.IntSort())
    Bb = z3.ArraySort(z3.IntSort(), z3.BoolSort())
    status, w, r, s = z3.Const("st", A), z3.Const("w", Bb), z3.Const("r", Bb), z3.Const("s", Bb)
    proved: set[tuple[str, str]] = set()
    # init: no request has arrived
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    j = z3.Int("k")
    solver.add(z3.ForAll([j], z3.And(status[j] == NONE, z3.Not(w[j]), z3.Not(r[j]), z3.Not(s[j]))))
    init_facts = solver.assertions()
    for name, fact in (("QUE-001", _que001), (QUE_QUEUES, _que002_queues)):
        init = z3.Solver()
        init.set("timeout", timeout_ms)
        init.add(*init_facts, z3.Not(fact(status, w, r, s)))
        if init.check() == z3.unsat:
            proved.add((name, "init"))
    g = z3.Int("g")
    for action, (pre_ok, post_opts) in effects.items():
        new = z3.Int("new_status")
        status2 = z3.Store(status, g, new)
        queue = {WAIT: w, RUN: r, SWAP: s}
        posts = [z3.Store(arr, g, z3.And(new == code, z3.BoolVal(True))) for code, arr in queue.items()]
        for name, fact in (("QUE-001", _que001), (QUE_QUEUES, _que002_queues)):
            solver = z3.Solver()
            solver.set("timeout", timeout_ms)
            solver.add(_que001(status, w, r, s), _que002_queues(status, w, r, s))
            solver.add(z3.Or([status[g] == c for c in pre_ok]), z3.Or([new == c for c in post_opts]))
            solver.add(z3.Not(fact(status2, *posts)))
            if solver.check() == z3.unsat:
                proved.add((name, action))
    return proved

assert FIN not in (WAIT, RUN, SWAP)
