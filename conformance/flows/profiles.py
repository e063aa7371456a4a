"""Profiles: which invariants a run checks, and whether the reference runs in lockstep.

``safety`` holds for any correct scheduler of this kind, whatever its policy (the zoo in
tests/zoo/ holds it to that). ``liveness`` adds progress and completion. ``vllm-v0`` is the
reference's own policy (vLLM V0's default flow): safety, liveness, the policy invariants (queue
order, victims, and vLLM's block timing: exact block counts CAP-001/002 and ADM-001, the
watermark ADM-002, freeing in the finishing step RES-004; the running set bounded by
max_num_seqs, BUD-003 / STR-002), and step-for-step agreement with the reference.
``vllm-v1`` and ``nano-vllm`` are today's engines' flows, each with its own reference
(`reference_impl.v1_scheduler`, `reference_impl.nano_scheduler`) for lockstep; ``async`` is
V1's with outcomes ``pipeline_depth`` steps late (`reference_impl.async_scheduler`); ``specdec``
is V1's with draft tokens (`reference_impl.specdec_scheduler`).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from spec.catalogue import Invariant, catalogue
from spec.config import SchedulerConfig
from spec.errors import InputError


@dataclass(frozen=True)
class Profile:
    name: str
    categories: tuple[str, ...]
    lockstep: bool
    description: str
    include: tuple[str, ...] = ()  # invariant ids checked besides the categories
    exclude: tuple[str, ...] = ()  # invariant ids of those categories that this policy breaks by design
    reference: str = "reference_impl.scheduler:Scheduler"  # the lockstep reference, module:factory

    def invariants(self) -> list[Invariant]:
        return [
            inv for inv in catalogue()
            if (inv.category in self.categories or inv.id in self.include) and inv.id not in self.exclude
        ]

    def make_reference(self, config: SchedulerConfig) -> Any:
        """A fresh lockstep reference for ``config``."""
        module, _, attr = self.reference.partition(":")
        return getattr(importlib.import_module(module), attr)(config)


# The V0 policy invariants that today's engines break by design: V1 and nano-vllm keep running in
# admission order (POL-006) and pick victims by that order (POL-003; ORD-003 says what they do);
# V1 mixes prefill chunks with decodes (POL-005).
_V0_ONLY = ("POL-003", "POL-005", "POL-006")
# SGLang's policy (spec/invariants/sglang.py): a scheduler that claims SGLang's flow
# (Capability.SGLANG_FLOW) is held to it; the other engines' profiles leave it out.
_SGLANG_ONLY = ("SGL-001",)



PROFILES: dict[str, Profile] = {
    "safety": Profile("safety", ("safety",), False, "every safety invariant; any policy"),
    "liveness": Profile("liveness", ("safety", "liveness"), False, "safety plus progress and completion"),
    "vllm-v0": Profile(
        "vllm-v0", ("safety", "liveness", "policy"), True,
        "vLLM V0's default flow: safety, liveness, FCFS, swapped-first, victim order, exact block counts, "
        "watermark, eager freeing, and lockstep with the reference",
        exclude=("ORD-001", "ORD-002", "ORD-003", "PFX-001", "PFX-002", "PFX-003", "PFX-004", "PFX-005",
                 *_SGLANG_ONLY),
    ),
    "vllm-v1": Profile(
        "vllm-v1", ("safety", "liveness", "policy"), True,
        "vLLM V1's flow: one token budget, running first, chunked prefill, prefix caching, recompute-only "
        "preemption of the running tail; lockstep with reference_impl.v1_scheduler",
        # ADM-002 is V0's every-admission watermark; V1's own rule is ADM-004
        exclude=(*_V0_ONLY, *_SGLANG_ONLY, "ADM-002"), reference="reference_impl.v1_scheduler:V1Scheduler",
    ),
    "nano-vllm": Profile(
        "nano-vllm", ("safety", "liveness", "policy"), True,
        "nano-vllm's flow: prefill steps first and never mixed with decodes, prefix caching, recompute-only "
        "preemption of the running tail; lockstep with reference_impl.nano_scheduler",
        exclude=(*_V0_ONLY, *_SGLANG_ONLY, "ORD-001"), include=("POL-005",), reference="reference_impl.nano_scheduler:NanoScheduler",
    ),
    "sglang": Profile(
        "sglang", ("safety", "liveness"), True,
        "SGLang's flow (page size 1, radix cache): prefill steps first and never mixed with decodes (POL-005), "
        "admission sized by the new-token ratio, the fcfs or lpm waiting order, retraction of the fewest generated "
        "tokens first (SGL-001); lockstep with reference_impl.sglang_scheduler",
        include=("POL-005", *_SGLANG_ONLY),
        reference="reference_impl.sglang_scheduler:SglangScheduler",
    ),
    "async": Profile(
        "async", ("safety", "liveness"), True,
        "vLLM V1's flow with outcomes pipeline_depth steps late (AsyncScheduler): safety without the invariants "
        "that assume a synchronous step, the PIP family, finish latency within the depth (PIP-006), no unproposed "
        "draft accepted (SPD-008, whose scheduling half needs a synchronous step), and lockstep with "
        "reference_impl.async_scheduler",
        include=("PIP-006", "SPD-008"), reference="reference_impl.async_scheduler:AsyncV1Scheduler",
    ),
    "specdec": Profile(
        "specdec", ("safety", "liveness", "policy"), True,
        "vLLM V1's flow with speculative decoding: the vllm-v1 claims plus drafts capped at max_tokens (SPD-004), "
        "drafts only on a decode, never on a prefill chunk (SPD-002), "
        "and lockstep with reference_impl.specdec_scheduler",
        # CAP-002 (tables exactly the computed plus scheduled tokens): a rejected draft's slots are
        # kept (vLLM frees no block on a rejection), so a step after a rejection or an empty outcome
        # that schedules fewer drafts holds more; CAP-005 and the declared k-slot reservation (CAP-006)
        # bound the table instead.
        exclude=(*_V0_ONLY, *_SGLANG_ONLY, "CAP-002"), reference="reference_impl.specdec_scheduler:SpecDecScheduler",
    ),
    "hybrid": Profile(
        "hybrid", ("safety", "liveness", "policy"), True,
        "vLLM V1's flow over hybrid KV cache groups (sliding window, chunked local, Mamba, shared beside full "
        "attention): the vllm-v1 claims plus vLLM's window freeing (HYB-004) and state blocks per mode (HYB-005); "
        "lockstep with reference_impl.hybrid_scheduler",
        exclude=(*_V0_ONLY, *_SGLANG_ONLY, "ADM-002"), reference="reference_impl.hybrid_scheduler:HybridV1Scheduler",
    ),
    "connector": Profile(
        "connector", ("safety", "liveness", "policy"), True,
        "vLLM V1's flow with a KV connector: the vllm-v1 claims, the KVC family (remote and offloaded loads, "
        "load failures, delayed frees), and lockstep with reference_impl.kv_connector_scheduler",
        # RES-004 (a finished request holds nothing after its step): a delayed free keeps a finished
        # request's blocks while its send is in flight, by design (KVC-002, KVC-007 bound it).
        # CAP-001 / CAP-002 (tables exactly the computed tokens): a load that failed keeps the blocks
        # past its first failed block for the recompute (vLLM frees nothing there; KVC-005 bounds
        # what counts as computed, CAP-005 that the blocks cover it).
        # ADM-001 (an admission holds exactly its chunk's blocks): a landed load that failed keeps them too.
        exclude=(*_V0_ONLY, *_SGLANG_ONLY, "ADM-002", "RES-004", "CAP-001", "CAP-002", "ADM-001"),
        reference="reference_impl.kv_connector_scheduler:ConnectorScheduler",
    ),
}


def get_profile(name: str) -> Profile:
    if name not in PROFILES:
        raise InputError("--profile", f"unknown profile {name!r} (known: {', '.join(PROFILES)})")
    return PROFILES[name]


def invariants_of(names: Iterable[str]) -> list[Invariant]:
    """Every invariant of the named profiles, once each, in the order they first appear (a hunt
    checks safety and liveness together)."""
    chosen: dict[str, Invariant] = {}
    for name in names:
        for inv in get_profile(name).invariants():
            chosen.setdefault(inv.id, inv)
    return list(chosen.values())
