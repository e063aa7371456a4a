"""The adapter protocol: how kvsched reaches a scheduler.

An adapter is a `spec.protocol.SchedulerLike` (add, abort, schedule, update, snapshot,
capabilities) plus ``name``, the ``profiles`` it claims, and ``reset(config)``. The runner calls
``reset`` before every trace, so one adapter object serves a whole run.

Most adapters are a few lines around `SchedulerAdapter`, which turns "a function from a config
to a scheduler object" into an adapter. See docs/ADAPTERS.md for a worked example.

An adapter may also define ``trace_strategy()`` returning a Hypothesis strategy of traces
(see `conformance.generate.traces`) when its engine accepts only some configs (vLLM V0's
watermark is fixed at 0.01, say).

A spec string names an adapter: a built-in (``reference``, ``gpu``, ``reference-v1``,
``reference-nano``, ``gpu-v1``) or ``module:factory``,
where ``factory()`` returns an adapter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import Capability, Snapshot
from spec.reservation import Reservation
from spec.types import Finished, Request, SchedulerOutput, StepOutcome


@runtime_checkable
class Adapter(Protocol):
    name: str
    profiles: tuple[str, ...]
    capabilities: frozenset[Capability]

    def reset(self, config: SchedulerConfig) -> None: ...
    def add_request(self, request: Request) -> None: ...
    def abort_request(self, request_id: str) -> Finished | None: ...
    def schedule(self) -> SchedulerOutput: ...
    def update(self, outcome: StepOutcome) -> Sequence[Finished]: ...
    def snapshot(self) -> Snapshot: ...


class SchedulerAdapter:
    """An adapter around any ``make(config) -> SchedulerLike``; ``reset`` builds a fresh one."""

    def __init__(
        self,
        name: str,
        make: Callable[[SchedulerConfig], Any],
        profiles: Sequence[str] = ("safety",),
        capabilities: frozenset[Capability] | None = None,
        reservation: Reservation | None = None,
    ) -> None:
        self.name = name
        # What the scheduler reserves beyond its computed tokens (spec.reservation; CAP-006).
        self.reservation = reservation
        self.profiles = tuple(profiles)
        self._make = make
        self._scheduler: Any = None
        self._fixed_capabilities = capabilities is not None
        self.capabilities = capabilities if capabilities is not None else frozenset({Capability.OUTPUT})

    def reset(self, config: SchedulerConfig) -> None:
        self._scheduler = self._make(config)
        if not self._fixed_capabilities and hasattr(self._scheduler, "capabilities"):
            self.capabilities = frozenset(self._scheduler.capabilities)

    def add_request(self, request: Request) -> Finished | None:
        return self._scheduler.add_request(request)  # a Finished: refused at the door

    def abort_request(self, request_id: str) -> Finished | None:
        return self._scheduler.abort_request(request_id)

    def schedule(self) -> SchedulerOutput:
        return self._scheduler.schedule()

    def update(self, outcome: StepOutcome) -> Sequence[Finished]:
        return self._scheduler.update(outcome)

    def snapshot(self) -> Snapshot:
        return self._scheduler.snapshot()

    @property
    def scheduler(self) -> Any:
        return self._scheduler


def _reference() -> Adapter:
    from reference_impl.scheduler import Scheduler

    adapter = SchedulerAdapter("reference", Scheduler, profiles=("vllm-v0", "safety"))
    adapter.capabilities = Scheduler.capabilities
    return adapter


def _gpu() -> Adapter:
    try:
        module = importlib.import_module("gpu_impl.adapter")
    except ImportError as err:
        raise InputError("--adapter", f"the gpu adapter is unavailable: {err}") from None
    # The twin attaches no reasons to its decisions; everything else it exposes in full.
    return SchedulerAdapter("gpu", module.make, profiles=("vllm-v0", "safety"))


def _reference_v1() -> Adapter:
    from conformance.generate_v1 import token_traces
    from reference_impl.v1_scheduler import V1Scheduler

    adapter = SchedulerAdapter("reference-v1", V1Scheduler, profiles=("vllm-v1", "safety"))
    adapter.capabilities = V1Scheduler.capabilities
    adapter.trace_strategy = lambda: token_traces("v1")  # type: ignore[attr-defined]
    return adapter


def _reference_nano() -> Adapter:
    from conformance.generate_v1 import token_traces
    from reference_impl.nano_scheduler import NanoScheduler

    adapter = SchedulerAdapter("reference-nano", NanoScheduler, profiles=("nano-vllm", "safety"))
    adapter.capabilities = NanoScheduler.capabilities
    adapter.trace_strategy = lambda: token_traces("nano")  # type: ignore[attr-defined]
    return adapter


def _gpu_v1() -> Adapter:
    from dataclasses import replace

    from conformance.generate_v1 import token_configs, token_traces

    try:
        module = importlib.import_module("gpu_impl.adapter_v1")
    except ImportError as err:
        raise InputError("--adapter", f"the gpu-v1 adapter is unavailable: {err}") from None
    # The V1 twin leaves prefix caching out: its traces are the V1 ones with caching forced off.
    adapter = SchedulerAdapter("gpu-v1", module.make, profiles=("vllm-v1", "safety"))
    adapter.capabilities = module.CAPABILITIES
    configs = token_configs("v1").map(lambda c: replace(c, enable_prefix_caching=False))
    adapter.trace_strategy = lambda: configs.flatmap(lambda c: token_traces("v1", config=c))  # type: ignore[attr-defined]
    return adapter


BUILTIN: dict[str, Callable[[], Adapter]] = {
    "reference": _reference, "gpu": _gpu, "reference-v1": _reference_v1, "reference-nano": _reference_nano,
    "gpu-v1": _gpu_v1,
}


def builtin_strategy(spec: str, info: Any = None) -> Any:
    """The trace strategy for adapter ``spec`` as the runner's own process knows it, without
    importing the adapter: a built-in's, a target's, or one built from the config domain the
    adapter declared in its hello (``info.domain``). None: the default traces."""
    from conformance.generate_v1 import token_configs, token_traces

    if spec in ("reference-v1", "reference-nano"):
        return token_traces("v1" if spec == "reference-v1" else "nano")
    if spec == "gpu-v1":
        from dataclasses import replace

        configs = token_configs("v1").map(lambda c: replace(c, enable_prefix_caching=False))
        return configs.flatmap(lambda c: token_traces("v1", config=c))
    try:
        from conformance.targets import get_target

        target = get_target(spec)
    except (ImportError, InputError, KeyError):
        target = None
    if target is not None:
        return target.strategy() if target.strategy else None
    return None


def load_adapter(spec: str) -> Adapter:
    """Resolve an adapter spec; bad specs raise `InputError` naming ``--adapter``."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    try:
        from conformance.targets import TARGETS  # third-party targets, when installed
    except ImportError:
        TARGETS = {}
    if spec in TARGETS:
        return TARGETS[spec]()
    if ":" not in spec:
        known = ", ".join([*BUILTIN, *TARGETS])
        raise InputError("--adapter", f"unknown adapter {spec!r}: use a built-in ({known}) or module:factory")
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise InputError("--adapter", f"cannot import {module_name!r}: {err}") from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise InputError("--adapter", f"{module_name!r} has no callable {attr!r}")
    try:
        adapter = factory()
    except Exception as err:  # noqa: BLE001 - a user's factory may fail in any way
        raise InputError("--adapter", f"{spec} raised {type(err).__name__}: {err}") from None
    missing = [m for m in ("reset", "add_request", "abort_request", "schedule", "update", "snapshot") if not hasattr(adapter, m)]
    if missing:
        raise InputError("--adapter", f"{spec} returned {type(adapter).__name__}, which lacks {', '.join(missing)}")
    for attr_name, default in (("name", spec), ("profiles", ("safety",)), ("capabilities", frozenset({Capability.OUTPUT}))):
        if not hasattr(adapter, attr_name):
            setattr(adapter, attr_name, default)
    return adapter
