"""Profiles: which invariants a run checks, and whether the reference runs in lockstep.

``safety`` holds for any correct scheduler of this kind, whatever its policy. ``liveness`` adds
progress and completion. ``vllm-v0`` is the reference's own policy (vLLM V0's default flow):
safety, liveness, the policy invariants, and step-for-step agreement with the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.catalogue import Invariant, catalogue
from spec.errors import InputError


@dataclass(frozen=True)
class Profile:
    name: str
    categories: tuple[str, ...]
    lockstep: bool
    description: str

    def invariants(self) -> list[Invariant]:
        return [inv for inv in catalogue() if inv.category in self.categories]


PROFILES: dict[str, Profile] = {
    "safety": Profile("safety", ("safety",), False, "every safety invariant; any policy"),
    "liveness": Profile("liveness", ("safety", "liveness"), False, "safety plus progress and completion"),
    "vllm-v0": Profile(
        "vllm-v0", ("safety", "liveness", "policy"), True,
        "vLLM V0's default flow: safety, liveness, FCFS, swapped-first, victim order, and lockstep with the reference",
    ),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise InputError("--profile", f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    return PROFILES[name]
