"""The `Flow` record: one scheduling policy family's table of contents (STYLE.md, "How a new flow
is laid out"). Heavy parts are "module:attr" strings, resolved only when asked for, so that
reading the registry imports no scheduler, strategy or engine."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any


def resolve(ref: str) -> Any:
    """The object a "module:attr" string names (a plain "module" names the module)."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Flow:
    """Every part of one flow, by name. Empty strings and tuples: the flow has no such part."""

    id: str  # used verbatim in file names, the profile's flow, the proof flow and test names
    title: str
    reference: str  # "module:attr" of the reference scheduler class (config -> scheduler)
    traces: str  # "module:attr" of a zero-argument callable -> the flow's trace strategy
    profile: str  # the policy profile its reference claims (`conformance.flows.profiles`)
    configs: str = ""  # "module:attr" of a zero-argument callable -> the configs its traces run on
    invariant_families: tuple[str, ...] = ()  # spec/invariants modules the flow introduced
    mutants: str = ""  # the module that registers its mutants
    twin: str = ""  # "module:attr" of the GPU twin's factory
    proof_flow: str = ""  # its id in `spec.proofs.matrix.flow`, when Z3 encodes it
    proof_encoding: str = ""  # the module of that encoding
    adapters: tuple[str, ...] = ()  # built-in adapter names (`conformance.runner.adapter.BUILTIN`)
    targets: tuple[str, ...] = ()  # real engines (`conformance.targets.TARGET_SPECS`)
    lockstep: str = ""  # "module:attr" of the lockstep campaign's entry point
    deviations: str = ""  # "module:attr" of the classified divergences (class -> (kind, why))
    tests: tuple[str, ...] = ()  # its own test files
    extra: dict[str, str] = field(default_factory=dict)  # other parts, name -> "module:attr"

    def refs(self) -> dict[str, str]:
        """Every "module:attr" part, by field name (what tests/test_flows.py resolves)."""
        found = {name: getattr(self, name) for name in ("reference", "traces", "configs", "mutants", "twin",
                                                        "proof_encoding", "lockstep", "deviations")}
        found.update({f"invariant_families[{m}]": m for m in self.invariant_families})
        found.update({f"extra[{k}]": v for k, v in self.extra.items()})
        return {k: v for k, v in found.items() if v}

    def make_reference(self) -> Any:
        return resolve(self.reference)

    def trace_strategy(self) -> Any:
        return resolve(self.traces)()

    def config_strategy(self) -> Any:
        return resolve(self.configs)()

    def mutant_fields(self) -> dict[str, Any]:
        """What a mutant of this flow's reference registers with (`conformance.selftest.mutants.mutant`)."""
        return {"reference": self.make_reference(), "trace_strategy": self.trace_strategy, "profile": self.profile}
