"""What the Z3-encoding-vs-reference tests of the pipelined and speculative flows share: a chain
of encoded actions pinned to the reference's parameters, and the state invariants a concrete
state breaks. Each flow passes its encoder, its group well-formedness, how a concrete state is
pinned and, for the async flow, the engine checks every action asserts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3


class Chain:
    """A sequence of encoded actions from one symbolic state, each pinned to the reference's
    parameters (request, chunk, drafts, stop, arrival)."""

    def __init__(self, enc: Any, grp_ok: Callable[[Any], Any], pin_state: Callable[..., list[Any]],
                 engine_ok: bool = False) -> None:
        self.enc, self.grp_ok, self.pin_state, self.engine_ok = enc, grp_ok, pin_state, engine_ok
        self.first = self.enc.state("c0")
        self.last = self.first
        self.facts: list[Any] = []
        self.actions: list[str] = []

    def take(self, action: str, g: int, **params: int) -> None:
        ae = self.enc.encode(action, pre=self.last)
        subs = [(ae.params["group"], z3.IntVal(g))]
        subs += [(ae.params[name], z3.IntVal(value)) for name, value in params.items()]
        for fact in [ae.guard, *ae.defs, *(self.enc.engine_ok if self.engine_ok else ())]:
            self.facts.append(z3.substitute(fact, *subs))
        self.last = ae.post
        self.actions.append(f"{action}({g}{''.join(f', {k}={v}' for k, v in params.items())})")

    def consistent(self, before: dict[str, Any], after: dict[str, Any], config: dict[str, Any]) -> bool:
        solver = z3.SolverFor("QF_LIA")
        solver.add(self.enc.config_ok(), self.grp_ok(self.enc), *self.enc.pin_config(config), *self.facts)
        solver.add(*self.pin_state(self.enc, self.first, before), *self.pin_state(self.enc, self.last, after))
        return solver.check() == z3.sat


class StateInvariants:
    """The flow's state invariants over one symbolic state, asked of concrete states."""

    def __init__(self, enc: Any, invariants: dict[str, Callable[[Any, Any], Any]], grp_ok: Callable[[Any], Any],
                 pin_state: Callable[..., list[Any]]) -> None:
        self.enc, self.grp_ok, self.pin_state = enc, grp_ok, pin_state
        self.state = enc.state("x")
        self.formulas = {iid: pred(enc, self.state) for iid, pred in invariants.items()}

    def broken(self, state: dict[str, Any], config: dict[str, Any]) -> list[str]:
        """The invariants ``state`` violates (one query when it violates none)."""
        solver = z3.SolverFor("QF_LIA")
        solver.add(self.enc.config_ok(), self.grp_ok(self.enc), *self.enc.pin_config(config),
                   *self.pin_state(self.enc, self.state, state))
        if solver.check(z3.Not(z3.And(list(self.formulas.values())))) == z3.unsat:
            return []
        return [iid for iid, formula in self.formulas.items() if solver.check(z3.Not(formula)) != z3.unsat]
