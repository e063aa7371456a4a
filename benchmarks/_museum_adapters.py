"""Adapter factories for the museum's exhibits, loadable by spec in a worker's child process:
``benchmarks/_museum_adapters.py:<exhibit id>`` (bench_museum_workers.py). Each is the museum's
own adapter (`conformance.selftest.museum.run.make_adapter`) carrying the exhibit's trace
strategy, so that the child draws the traces the museum draws."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from conformance.selftest.museum.exhibits import get_exhibit
    from conformance.selftest.museum.run import make_adapter

    exhibit = get_exhibit(name)

    def factory() -> Any:
        adapter = make_adapter(exhibit)
        if exhibit.strategy is not None:
            adapter.trace_strategy = exhibit.strategy
        return adapter

    return factory
