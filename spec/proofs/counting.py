"""Seat and running-sequence counts for every number of requests (STR-002, BUD-003).

STR-002 bounds a sum over requests (the running requests' seats: n before the fork, live
sequences after) and BUD-003 a sum over sequences (those RUNNING); neither is a quantified fact
about one object. Both sums are split as *the touched request's term plus the rest*: an action
changes only its request's term (every other request keeps its status, fork flag and live
sequences), so with ``rest`` an arbitrary integer the query covers every number of requests.

Per request ``j``: ``seats(j)`` counts when it is RUNNING, and its running sequences are its live
ones when it is RUNNING (QUE-002: a live sequence has its request's status), so
``running_seqs(j) <= seats(j)`` follows from the per-request fact ``live <= seats`` (before the
fork one sequence lives and n >= 1 seats; after it, seats are the live sequences). Summed over the
other requests that gives ``rest_seqs <= rest_seats`` (a sum of terms each at most its
counterpart), the one hypothesis about the rest besides the pre-state's STR-002 and BUD-003.

The per-request effects (status, fork flag, live count before and after) are checked against the
reference on drawn states of any size by ``tests/test_counting_matches_reference.py``.
"""

from __future__ import annotations

from typing import Any

import z3

from spec.proofs.encoding import FIN, NONE, RUN, SWAP, WAIT

ROWS = ("STR-002", "BUD-003")
WF_REQUESTS = "WF/requests"  # WF's per-request part (spec/proofs/per_sequence.py has the rest)
V1_LIKE = ("v1", "specdec", "async", "connector")  # one sequence per request, no swap


class Request:
    def __init__(self, p: str) -> None:
        self.st, self.live, self.plen, self.mtok = z3.Ints(f"{p}_status {p}_live {p}_prompt_len {p}_max_tokens")
        self.forked = z3.Bool(f"{p}_forked")


class Counting:
    def __init__(self, flow_name: str = "v0") -> None:
        self.flow = flow_name
        self.M, self.n = z3.Ints("c_max_num_seqs c_n")
        self.rest_seats, self.rest_seqs = z3.Ints("c_rest_seats c_rest_seqs")

    def seats(self, r: Request) -> Any:
        return z3.If(r.forked, r.live, self.n)

    def term(self, r: Request) -> tuple[Any, Any]:
        """The request's terms of the two sums: (seats if running, running sequences)."""
        running = r.st == RUN
        return z3.If(running, self.seats(r), 0), z3.If(running, r.live, 0)

    def local(self, r: Request) -> Any:
        """Per-request facts (WF): live sequences are between 0 and n, an unfinished request has
        one, a request of n = 1 (every v1 request) counts as forked, live <= seats."""
        unfinished = z3.Or(r.st == WAIT, r.st == RUN, r.st == SWAP)
        arrived = r.st != NONE
        out = [r.st >= NONE, r.st <= FIN, r.live >= 0, r.live <= self.n,
               z3.Implies(unfinished, r.live >= 1), z3.Implies(z3.Or(r.st == NONE, r.st == FIN), r.live == 0),
               z3.Implies(z3.And(arrived, self.n == 1), r.forked), r.live <= self.seats(r),
               z3.Implies(z3.Not(r.forked), r.live <= 1), z3.Implies(arrived, z3.And(r.plen >= 1, r.mtok >= 1))]
        if self.flow in V1_LIKE:
            out += [self.n == 1, r.st != SWAP]
        return z3.And(out)

    def rows(self, r: Request) -> dict[str, Any]:
        seats, seqs = self.term(r)
        return {"STR-002": self.rest_seats + seats <= self.M, "BUD-003": self.rest_seqs + seqs <= self.M}

    def effect(self, action: str, a: Request, b: Request) -> Any:
        """The relation between the touched request's pre (``a``) and post (``b``) state, with
        the action's guard on the sums (the reference's admission / swap-in seat check)."""
        running_seats = self.rest_seats + self.term(a)[0]
        same_fork = z3.And(b.forked == a.forked, b.plen == a.plen, b.mtok == a.mtok)
        run_or_end = z3.Or(z3.And(b.st == RUN, b.live >= 1), z3.And(b.st == FIN, b.live == 0))
        if action == "add":
            arrives = z3.And(b.st == WAIT, b.live == 1)
            if self.flow in V1_LIKE:  # V1's input processor rejects a prompt over max_model_len
                arrives = z3.Or(arrives, z3.And(b.st == FIN, b.live == 0))
            return z3.And(a.st == NONE, arrives, b.forked == (self.n == 1), b.plen >= 1, b.mtok >= 1)
        if action == "admit":
            guard = z3.And(a.st == WAIT, a.forked, self.seats(a) <= self.M, running_seats + self.seats(a) <= self.M)
            if self.flow in V1_LIKE:  # V1 admits while fewer than max_num_seqs run (a chunk may end it)
                guard = z3.And(a.st == WAIT, running_seats < self.M)
                return z3.And(guard, same_fork, run_or_end, b.live <= a.live)
            return z3.And(guard, same_fork, run_or_end, b.live <= a.live)
        if action == "fork":
            guard = z3.And(a.st == WAIT, z3.Not(a.forked), self.n >= 2, self.n <= self.M,
                           running_seats + self.n <= self.M)
            return z3.And(guard, b.forked, b.plen == a.plen, b.mtok == a.mtok, run_or_end, b.live <= self.n)
        if action in ("decode", "finish", "chunk", "verify"):  # verify: a speculative chunk (specdec)
            return z3.And(a.st == RUN, same_fork, run_or_end, b.live <= a.live)
        if action == "swap_in":
            guard = z3.And(a.st == SWAP, running_seats + self.seats(a) <= self.M)
            return z3.And(guard, same_fork, run_or_end, b.live <= a.live)
        if action == "preempt_recompute":
            return z3.And(a.st == RUN, same_fork, b.st == WAIT, b.live == a.live)
        if action == "swap_out":
            return z3.And(a.st == RUN, same_fork, b.st == SWAP, b.live == a.live)
        if action in ("abort", "ignore"):
            ok = z3.Or(a.st == WAIT, a.st == SWAP) if action == "ignore" else z3.Or(a.st == WAIT, a.st == RUN, a.st == SWAP)
            return z3.And(ok, same_fork, b.st == FIN, b.live == 0)
        if action == "load_start":  # connector: a load starts for a waiting request, which keeps waiting
            return z3.And(a.st == WAIT, same_fork, b.st == WAIT, b.live == a.live)
        if action == "load_land":  # connector: a waiting request keeps waiting or fails; an aborted one stays ended
            return z3.And(z3.Or(a.st == WAIT, a.st == FIN), same_fork,
                          z3.Or(z3.And(b.st == a.st, b.live == a.live), z3.And(b.st == FIN, b.live == 0)))
        if action == "send_done":  # connector: a finished request's send is reported; it stays finished
            return z3.And(a.st == FIN, same_fork, b.st == FIN, b.live == 0)
        if action == "process":  # async: an outcome leaves its request where it was, or ends it (a stale one too)
            return z3.And(a.st != NONE, same_fork,
                          z3.Or(z3.And(b.st == a.st, b.live == a.live), z3.And(b.st == FIN, b.live == 0)))
        raise ValueError(action)


ACTIONS = {
    "v0": ("add", "admit", "fork", "decode", "preempt_recompute", "swap_out", "swap_in", "finish", "abort", "ignore"),
    "v1": ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore"),
    "specdec": ("add", "admit", "chunk", "verify", "preempt_recompute", "abort", "ignore"),
    "async": ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore", "process"),
    "connector": ("add", "admit", "chunk", "preempt_recompute", "abort", "ignore", "load_start", "load_land",
                  "send_done"),
}


def prove_counts(flow_name: str = "v0", timeout_ms: int = 20_000) -> dict[tuple[str, str], str]:
    """Each row (and the per-request facts) after each action, for every number of requests."""
    C = Counting(flow_name)
    out: dict[tuple[str, str], str] = {}
    for action in ACTIONS[flow_name]:
        a, b = Request("pre"), Request("post")
        hyps = [C.n >= 1, C.M >= 1, C.rest_seqs >= 0, C.rest_seqs <= C.rest_seats, C.local(a),
                *C.rows(a).values(), C.effect(action, a, b)]
        goals = {**C.rows(b), "local": C.local(b)}
        results = {}
        for name, goal in goals.items():
            s = z3.Solver()
            s.set("timeout", timeout_ms)
            s.add(*hyps, z3.Not(goal))
            r = s.check()
            results[name] = "proved" if r == z3.unsat else "counterexample" if r == z3.sat else "unknown"
        for row in ROWS:
            out[(row, action)] = "proved" if results[row] == results["local"] == "proved" else results[row]
        out[(WF_REQUESTS, action)] = results["local"]
    for row in (*ROWS, WF_REQUESTS):  # the empty scheduler: both sums are 0, no request arrived
        out[(row, "init")] = "proved"
    return out


def satisfiable(flow_name: str, action: str) -> bool:
    """The hypotheses have a model (with a non-empty rest): the proof is not vacuous."""
    C = Counting(flow_name)
    a, b = Request("pre"), Request("post")
    s = z3.Solver()
    s.add(C.n >= 1, C.M >= 1, C.rest_seqs >= 1, C.rest_seqs <= C.rest_seats, C.local(a), *C.rows(a).values(),
          C.effect(action, a, b))
    return s.check() == z3.sat


_CACHE: dict[tuple[str, int], set[tuple[str, str]]] = {}


def proved_cells(flow_name: str = "v0", timeout_ms: int = 20_000) -> set[tuple[str, str]]:
    key = (flow_name, timeout_ms)
    if key not in _CACHE:
        _CACHE[key] = {cell for cell, r in prove_counts(flow_name, timeout_ms).items() if r == "proved"}
    return _CACHE[key]
