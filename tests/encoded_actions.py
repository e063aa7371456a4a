"""One matrix action's Z3 encoding, ready for a concrete state to be pinned into it.

The tests that hold an encoding to the reference it models (V0: test_z3_encoding_matches_reference,
V1: test_proofs_v1_encoding) encode each action once and reuse its solver for every drawn state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import z3


class EncodedAction:
    """``encoder.encode(action)`` with a solver that already holds the config constraints, the
    group constraints and the action's definitions, and the state invariants of its pre-state."""

    def __init__(self, encoder: Any, group_ok: Callable[[Any], Any], invariants: Mapping[str, Callable], action: str) -> None:
        self.enc = encoder
        self.ae = encoder.encode(action)
        self.solver = z3.SolverFor("QF_LIA")
        self.solver.add(encoder.config_ok(), group_ok(encoder), *self.ae.defs)
        self.invariants_of_pre = z3.And([f(encoder, self.ae.pre) for f in invariants.values()])


def encoded_actions(
    make_encoder: Callable[[], Any], group_ok: Callable[[Any], Any], invariants: Mapping[str, Callable]
) -> Callable[[str], EncodedAction]:
    """A lookup that encodes each action once (a fresh encoder per action) and keeps it."""
    cache: dict[str, EncodedAction] = {}

    def encoded(action: str) -> EncodedAction:
        if action not in cache:
            cache[action] = EncodedAction(make_encoder(), group_ok, invariants, action)
        return cache[action]

    return encoded
