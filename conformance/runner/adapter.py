"""The adapter protocol: how kvsched reaches a scheduler.

An adapter is a `spec.protocol.SchedulerLike` (add, abort, schedule, update, snapshot,
capabilities) plus ``name``, the ``profiles`` it claims, and ``reset(config)``. The runner calls
``reset`` before every trace, so one adapter object serves a whole run.

Most adapters are a few lines around `SchedulerAdapter`, which turns "a function from a config
to a scheduler object" into an adapter. See docs/ADAPTERS.md for a worked example.

An adapter whose engine accepts only some configs (no swap space, a fixed watermark, no
sequence limit, ...) declares ``domain = spec.domain.ConfigDomain(...)``: the runner then
generates and shrinks only traces inside it (`adapter_domain`, `traces_for`). An adapter may
instead define ``trace_strategy()`` (a Hypothesis strategy of traces): its own process draws
from it (`adapter_strategy`), and the shrinker keeps to its declared domain, if any.

A spec string names an adapter: a built-in (``reference``, ``gpu``, ``reference-v1``,
``reference-nano``, ``gpu-v1``, ``reference-async``), a target (`conformance.targets`), ``path/to/file.py:factory``
or ``module:factory`` (the current folder importable, as under ``python -m``), where
``factory()`` returns an adapter. `canonical_spec` turns a spec into one that loads the same
adapter from any folder; traces and printed replay commands carry that one.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from spec.errors import InputError
from spec.observation import Capability, Snapshot
from spec.protocol import OPTIONAL_CALLS
from spec.reservation import Reservation
from spec.types import Finished, Request, SchedulerOutput, StepOutcome


@runtime_checkable
class Adapter(Protocol):
    name: str
    profiles: tuple[str, ...]
    capabilities: frozenset[Capability]

    def reset(self, config: SchedulerConfig) -> SchedulerConfig | None: ...
    def add_request(self, request: Request) -> None: ...
    def abort_request(self, request_id: str) -> Finished | None: ...
    def schedule(self) -> SchedulerOutput: ...
    def update(self, outcome: StepOutcome) -> Sequence[Finished]: ...
    def snapshot(self) -> Snapshot: ...

    # Optional, not part of the Protocol's required surface: ``begin_trace(trace, observe,
    # mid_step)``, called by the driver right after ``reset``, tells an adapter that the calls
    # which follow are the driver's for ``trace`` (conformance/runner/driver.py), so that it may run them
    # ahead in batches; `conformance.wire.WireAdapter` uses it to send many steps per message.
    # ``end_trace()``, called when a trace's run ended without a fault (maybe before its last
    # step), tells such an adapter that what it ran ahead will not be read: the wire marks its
    # host idle, so the next adapter of the same host command reuses the process.


class SchedulerAdapter:
    """An adapter around any ``make(config) -> SchedulerLike``; ``reset`` builds a fresh one.
    ``domain``: the configs the scheduler supports (default: the whole V0 space)."""

    def __init__(
        self,
        name: str,
        make: Callable[[SchedulerConfig], Any],
        profiles: Sequence[str] = ("safety",),
        capabilities: frozenset[Capability] | None = None,
        domain: ConfigDomain | None = None,
        reservation: Reservation | None = None,
    ) -> None:
        self.name = name
        # What the scheduler reserves beyond its computed tokens (spec.reservation; CAP-006).
        self.reservation = reservation
        self._fixed_reservation = reservation is not None  # else the scheduler's own, per config
        self.profiles = tuple(profiles)
        self.domain = domain  # None: the whole V0 space (see `adapter_domain`)
        self._make = make
        self._scheduler: Any = None
        self._fixed_capabilities = capabilities is not None
        self.capabilities = capabilities if capabilities is not None else frozenset({Capability.OUTPUT})

    def reset(self, config: SchedulerConfig) -> SchedulerConfig | None:
        """Build a fresh scheduler. Returns the config as the engine runs it, when the scheduler
        says (a ``config`` attribute that is a SchedulerConfig and its domain's ``engine_pool``)."""
        self._scheduler = self._make(config)
        if not self._fixed_reservation:  # a scheduler whose reservation depends on the config (its k)
            self.reservation = getattr(self._scheduler, "reservation", None)
        if not self._fixed_capabilities and hasattr(self._scheduler, "capabilities"):
            self.capabilities = frozenset(self._scheduler.capabilities)
        sized = getattr(self._scheduler, "engine_config", None)
        return sized if self.domain is not None and self.domain.engine_pool else None

    def add_request(self, request: Request) -> Finished | None:
        return self._scheduler.add_request(request)  # a Finished: refused at the door

    def abort_request(self, request_id: str) -> Finished | None:
        return self._scheduler.abort_request(request_id)

    def schedule(self, *outcome: StepOutcome) -> SchedulerOutput:
        """``outcome``: the step's outcome, given only to a fused step (its domain's ``fused_step``)."""
        return self._scheduler.schedule(*outcome)

    def update(self, outcome: StepOutcome) -> Sequence[Finished]:
        return self._scheduler.update(outcome)

    def snapshot(self) -> Snapshot:
        return self._scheduler.snapshot()

    # the optional calls (spec/protocol.py), passed on where the scheduler has them
    @property
    def optional_calls(self) -> frozenset[str]:
        return frozenset(c for c in OPTIONAL_CALLS if callable(getattr(self._scheduler, c, None)))

    def abort_requests(self, request_ids: Sequence[str]) -> Sequence[Finished]:
        return self._scheduler.abort_requests(request_ids)

    def reset_prefix_cache(self) -> bool:
        return self._scheduler.reset_prefix_cache()

    def pause_new(self) -> bool:
        return self._scheduler.pause_new()

    def pause_all(self) -> bool:
        return self._scheduler.pause_all()

    def resume(self) -> bool:
        return self._scheduler.resume()
    def kv_connector_scripts(self, scripts: Any) -> None:
        """The trace's KV connector scripts (spec/connector.py), for a scheduler that runs a connector."""
        attach = getattr(self._scheduler, "kv_connector_scripts", None)
        if attach is not None:
            attach(scripts)

    @property
    def scheduler(self) -> Any:
        return self._scheduler


# The config domain of each built-in: the space its own trace strategy draws from
# (tests/test_config_domain.py draws from each and checks the domain admits every trace).
_V1_DOMAIN = ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, chunked_prefill=True, prefix_caching=True,
                          budget_covers_model_len=True, cache_holds_model_len=True)
BUILTIN_DOMAINS: dict[str, ConfigDomain] = {
    "reference": ConfigDomain(),
    "gpu": ConfigDomain(),
    "reference-v1": replace(_V1_DOMAIN, encoder=True, lora=True),  # conformance.generation.budgets too
    "reference-nano": ConfigDomain(flow="nano", swap=False, cpu_pool=False, max_n=1, priority=False,
                                   prefix_caching=True, budget_covers_model_len=True, cache_holds_model_len=True),
    "gpu-v1": replace(_V1_DOMAIN, prefix_caching=False),  # the V1 twin leaves prefix caching out
    # the async reference at vLLM's depth (conformance.selftest.campaigns.lockstep_async.all_paths_strategy)
    "reference-async": replace(_V1_DOMAIN, watermark=0.0, pipeline_depth=1),
    "reference-specdec": replace(_V1_DOMAIN, speculative=True),  # conformance.generation.specdec
    # the SGLang flow's own traces (conformance.selftest.campaigns.lockstep_sglang.sglang_traces_any): page size 1
    "reference-sglang": ConfigDomain(flow="v1", swap=False, cpu_pool=False, watermark=0.0, priority=False, lpm=True,
                                     max_n=1, chunked_prefill=True, prefix_caching=True, budget_covers_model_len=True),
}


def _reference() -> Adapter:
    from reference_impl.scheduler import Scheduler

    return SchedulerAdapter("reference", Scheduler, profiles=("vllm-v0", "safety"),
                            capabilities=Scheduler.capabilities, domain=BUILTIN_DOMAINS["reference"])


def _gpu() -> Adapter:
    try:
        module = importlib.import_module("gpu_impl.adapter")
    except ImportError as err:
        raise InputError("--adapter", f"the gpu adapter is unavailable: {err}") from None
    # The twin attaches no reasons to its decisions; everything else it exposes in full.
    return SchedulerAdapter("gpu", module.make, profiles=("vllm-v0", "safety"), domain=BUILTIN_DOMAINS["gpu"])


def _reference_v1() -> Adapter:
    from reference_impl.v1_scheduler import V1Scheduler

    adapter = SchedulerAdapter("reference-v1", V1Scheduler, profiles=("vllm-v1", "safety"),
                               capabilities=V1Scheduler.capabilities, domain=BUILTIN_DOMAINS["reference-v1"])
    adapter.trace_strategy = lambda: _builtin_strategy("reference-v1")  # type: ignore[attr-defined]
    return adapter


def _reference_nano() -> Adapter:
    from reference_impl.nano_scheduler import NanoScheduler

    adapter = SchedulerAdapter("reference-nano", NanoScheduler, profiles=("nano-vllm", "safety"),
                               capabilities=NanoScheduler.capabilities, domain=BUILTIN_DOMAINS["reference-nano"])
    adapter.trace_strategy = lambda: _builtin_strategy("reference-nano")  # type: ignore[attr-defined]
    return adapter


def _reference_async() -> Adapter:
    from reference_impl.async_scheduler import AsyncV1Scheduler
    from spec.reservation import Reservation

    adapter = SchedulerAdapter("reference-async", AsyncV1Scheduler, profiles=("async", "safety"),
                               capabilities=AsyncV1Scheduler.capabilities, domain=BUILTIN_DOMAINS["reference-async"],
                               reservation=Reservation(lookahead_tokens=1))  # its in-flight token's slot
    adapter.trace_strategy = lambda: _builtin_strategy("reference-async")  # type: ignore[attr-defined]
    return adapter


def _reference_specdec() -> Adapter:
    from reference_impl.specdec_scheduler import SpecDecScheduler

    adapter = SchedulerAdapter("reference-specdec", SpecDecScheduler, profiles=("specdec", "safety"),
                               capabilities=SpecDecScheduler.capabilities, domain=BUILTIN_DOMAINS["reference-specdec"])
    adapter.trace_strategy = lambda: _builtin_strategy("reference-specdec")  # type: ignore[attr-defined]
    return adapter


def _reference_sglang() -> Adapter:
    from reference_impl.sglang_scheduler import SglangScheduler

    adapter = SchedulerAdapter("reference-sglang", SglangScheduler, profiles=("sglang", "safety"),
                               capabilities=SglangScheduler.capabilities, domain=BUILTIN_DOMAINS["reference-sglang"])
    adapter.trace_strategy = lambda: _builtin_strategy("reference-sglang")  # type: ignore[attr-defined]
    return adapter


def _gpu_v1() -> Adapter:
    try:
        module = importlib.import_module("gpu_impl.adapter_v1")
    except ImportError as err:
        raise InputError("--adapter", f"the gpu-v1 adapter is unavailable: {err}") from None
    adapter = SchedulerAdapter("gpu-v1", module.make, profiles=("vllm-v1", "safety"),
                               capabilities=module.CAPABILITIES, domain=BUILTIN_DOMAINS["gpu-v1"])
    adapter.trace_strategy = lambda: _builtin_strategy("gpu-v1")  # type: ignore[attr-defined]
    return adapter


BUILTIN: dict[str, Callable[[], Adapter]] = {
    "reference": _reference, "gpu": _gpu, "reference-v1": _reference_v1, "reference-nano": _reference_nano,
    "gpu-v1": _gpu_v1, "reference-async": _reference_async, "reference-specdec": _reference_specdec,
    "reference-sglang": _reference_sglang,
}


def _builtin_strategy(spec: str) -> Any:
    """A built-in's own traces: the V0 generator, or the token flows' (which draw prompt ids that
    share prefixes, so prefix caching is exercised). The V1 twin leaves prefix caching out."""
    from conformance.flows import FLOWS
    from conformance.generation.v0 import traces
    from conformance.generation.v1 import token_configs, token_traces

    if spec == "reference-v1":  # the V1 flow's traces and, some of them, with budgets, grammar waits or sessions
        from conformance.generation.budgets import v1_traces_with_budgets

        return v1_traces_with_budgets()
    for flow in FLOWS.values():
        if spec in flow.adapters and not spec.startswith("gpu"):
            return flow.trace_strategy()
    if spec == "gpu-v1":
        configs = token_configs("v1").map(lambda c: replace(c, enable_prefix_caching=False))
        return configs.flatmap(lambda c: token_traces("v1", config=c))
    return traces()


def _target(spec: str) -> Any:
    try:
        from conformance.targets import TARGET_SPECS
    except ImportError:
        return None
    return TARGET_SPECS.get(spec)


def adapter_domain(adapter: Any) -> ConfigDomain:
    """The config domain ``adapter`` declares (its ``domain`` attribute), else the whole V0 space."""
    domain = getattr(adapter, "domain", None)
    if domain is None:
        return ConfigDomain()
    if isinstance(domain, ConfigDomain):
        return domain
    if isinstance(domain, dict):
        return ConfigDomain.from_dict(domain, "adapter.domain")
    raise InputError("adapter.domain", f"must be a spec.domain.ConfigDomain, got {type(domain).__name__}")


def traces_for(spec: str, domain: dict[str, Any] | None = None) -> Any:
    """The trace strategy for adapter ``spec``, chosen in the runner's process without importing
    the adapter: a built-in's or a target's own, else one inside the ``domain`` the adapter's
    process sent in its hello (`ConfigDomain.to_dict`), else the default traces."""
    if spec in BUILTIN:
        return _builtin_strategy(spec)
    target = _target(spec)
    if target is not None and target.strategy is not None:
        return target.strategy()
    from conformance.generation.domain import traces_in

    return traces_in(ConfigDomain.from_dict(domain) if domain is not None else ConfigDomain())


def adapter_strategy(adapter: Any) -> Any:
    """The traces to draw for a loaded adapter, in its own process: its ``trace_strategy()``
    when it has one (built-ins and targets do: the same as `traces_for` gives), else its domain's."""
    if hasattr(adapter, "trace_strategy"):
        return adapter.trace_strategy()
    from conformance.generation.domain import traces_in

    return traces_in(adapter_domain(adapter))


def _is_file_spec(left: str) -> bool:
    return left.endswith(".py") or "/" in left or os.sep in left


def canonical_spec(spec: str) -> str:
    """A spec that loads the same adapter from any folder: a file's absolute path, and a
    top-level module found in the current folder as that file's path. Built-ins, targets and
    installed modules stay as they are. Imports nothing."""
    if spec in BUILTIN or ":" not in spec:
        return spec
    left, _, attr = spec.rpartition(":")
    if _is_file_spec(left):
        return f"{Path(left).expanduser().resolve()}:{attr}"
    if "." not in left:
        local = Path.cwd() / f"{left}.py"
        if local.is_file():
            return f"{local.resolve()}:{attr}"
    return spec


def user_location(err: BaseException) -> str | None:
    """The user's file:line for an error raised while loading an adapter: the line a
    SyntaxError names, else the innermost frame outside kvsched and the standard library."""
    from conformance.runner.guard import exception_location

    if isinstance(err, SyntaxError) and err.filename:
        return f"{err.filename}:{err.lineno}"
    return exception_location(err)


def _import_file(path_text: str) -> Any:
    """Import ``path_text`` as a script's folder would: its folder first on ``sys.path`` (so
    the modules beside it import), under its own name unless another module has that name."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InputError("--adapter", f"no file {path_text!r} (looked in {os.getcwd()})")
    path = path.resolve()
    if (path.parent / "__init__.py").is_file():
        return _import_package_file(path, path_text)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None:
        if getattr(loaded, "__file__", None) and Path(loaded.__file__).resolve() == path:
            return loaded
        name = f"kvsched_adapter_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InputError("--adapter", f"{path_text!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as err:
        del sys.modules[name]
        raise InputError("--adapter", f"{path_text} could not import: {err} (at {user_location(err)})") from None
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _import_package_file(path: Path, path_text: str) -> Any:
    """A file inside a package (its folder has ``__init__.py``), imported as pytest's default
    import mode does: the folder above the outermost package first on ``sys.path``, then the
    module by its dotted name, so its own absolute and relative imports work."""
    root, parts = path.parent, [path.stem]
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    name = ".".join(parts)
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise InputError("--adapter", f"{path_text} could not import as {name}: {err} (at {user_location(err)})") \
            from None


def _import_module(module_name: str) -> Any:
    """Import ``module_name`` with the current folder importable, as ``python -m`` has it."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except ImportError as err:
        where = user_location(err)
        found = f" (at {where})" if where and not where.startswith("<") else \
            f" (looked in {cwd} and sys.path; a file can be named as path/to/file.py:factory)"
        raise InputError("--adapter", f"cannot import {module_name!r}: {err}{found}") from None


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
        raise InputError("--adapter", f"unknown adapter {spec!r}: use a built-in ({known}), "
                                      "path/to/file.py:factory or module:factory")
    left, _, attr = spec.rpartition(":")
    module = _import_file(left) if _is_file_spec(left) else _import_module(left)
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise InputError("--adapter", f"{left!r} has no callable {attr!r}")
    try:
        adapter = factory()
    except Exception as err:  # noqa: BLE001 - a user's factory may fail in any way
        from conformance.runner.guard import shown_text

        raise InputError("--adapter", f"{spec} raised {type(err).__name__}: {shown_text(err)} "
                                      f"(at {user_location(err)})") from None
    missing = [m for m in ("reset", "add_request", "abort_request", "schedule", "update", "snapshot") if not hasattr(adapter, m)]
    if missing:
        raise InputError("--adapter", f"{spec} returned {type(adapter).__name__}, which lacks {', '.join(missing)}")
    for attr_name, default in (("name", spec), ("profiles", ("safety",)), ("capabilities", frozenset({Capability.OUTPUT}))):
        if not hasattr(adapter, attr_name):
            setattr(adapter, attr_name, default)
    adapter_domain(adapter)  # a malformed declaration fails here, naming adapter.domain
    return adapter
