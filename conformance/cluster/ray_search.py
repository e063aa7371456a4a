"""The fuzz search on a Ray cluster (``kvsched conform --ray ADDRESS``; the ``kvsched[cluster]`` extra).

The work units are those of local workers (`conformance.runner.workers`): seeded batches, each drawn,
run and checked by one adapter process, which answers a verdict per trace and the trace only
when it failed. Here each worker is a Ray actor (`BatchWorker`) somewhere on the cluster,
holding a `conformance.runner.isolated.ChildRunner`, so the adapter still runs in a child process
that the actor watches (hangs, crashes and memory are faults there as they are locally).
`RayRunner` is the parent's handle on one actor, with the runner interface the fuzz driver
already drives (`start`, `clone`, `search`, `run`, `close`): the split of the budget, the
merging of results, the ties and the shrinking are `conformance.runner.workers` and
`conformance.runner.fuzz`, unchanged.

Two simplifications, both deliberate:

* A batch comes back whole (a list), not trace by trace: a remote call per trace would cost
  more than the traces. So a stop (a budget, Ctrl-C) takes effect between batches
  (`conformance.runner.workers.CHUNK` traces), not mid-batch.
* Only plain JSON-shaped values cross the wire (trace and summary dicts, `Trace.to_dict`,
  `TraceSummary.to_dict`): what Ray pickles is data, never kvsched objects whose layout could
  differ between the nodes' installs.

An actor that dies (its worker process or its node gone: the cluster's doing, since the
adapter's own deaths are faults inside the actor) is replaced once and its call run again.

Every node needs kvsched installed (the same version) and the adapter spec loadable there: a
built-in, a target, an installed module, or a file at the same absolute path on every node
(specs are made absolute before they leave, `conformance.runner.adapter.canonical_spec`). An HTML
view the adapter's process writes is written on its node, then sent back and written here.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from conformance.runner.isolated import AdapterInfo, ChildRunner, Limits
from conformance.runner.summary import TraceSummary
from spec.errors import InputError
from spec.trace import Trace

EXTRA = "needs the cluster extra: pip install 'kvsched[cluster]'"


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError("--ray", EXTRA) from None
    return ray


def connect(address: str) -> int:
    """Join the Ray cluster at ``address`` (``host:port``, ``ray://host:port`` or ``auto``) and
    return its CPU count (the default number of workers). A cluster that does not answer is one
    line naming ``--ray``."""
    ray = _ray()
    if not ray.is_initialized():
        _check_listening(address)
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise InputError("--ray", f"no Ray cluster answered at {address} ({str(err).splitlines()[0]})") from None
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _check_listening(address: str, seconds: float = 5.0) -> None:
    """Refuse a ``host:port`` where nothing listens at once: ``ray.init`` would retry for minutes."""
    if address == "auto" or "://" in address:
        return  # Ray finds "auto" itself and fails fast; a ray:// client has its own timeout
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise InputError("--ray", f"must be host:port, auto or ray://host:port, got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as err:
        raise InputError("--ray", f"no Ray cluster answered at {address} ({err.strerror or err})") from None


def disconnect() -> None:
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()


class BatchWorker:
    """A Ray actor's body: one `ChildRunner` on the actor's node, answering in plain dicts."""

    def __init__(self, spec: str, limits: dict[str, Any]) -> None:
        self.runner = ChildRunner(spec, Limits(**limits))

    def start(self) -> dict[str, Any]:
        try:
            info = self.runner.start()
        except InputError as err:  # sent back as data: the parent raises it, naming the field
            return {"error": [err.where, err.message]}
        data = asdict(info)
        data["profiles"], data["capabilities"] = list(info.profiles), sorted(info.capabilities)
        return data

    def search(self, seed_value: int, count: int, invariants: list[str], lockstep: bool,
               reference: str | None, start: int = 0) -> list[tuple[int, dict[str, Any], dict[str, Any] | None]]:
        items = []
        for index, summary, trace in self.runner.search(seed_value, count, invariants, lockstep=lockstep,
                                                        reference=reference, start=start):
            if trace is None and summary.problems:  # a fault: drawn again by a fresh child, here on the node
                trace = self.runner.draw(seed_value, count, index)
            items.append((index, summary.to_dict(), trace.to_dict() if trace is not None else None))
        return items

    def run(self, trace: dict[str, Any], invariants: list[str], options: dict[str, Any],
            html: bool) -> tuple[dict[str, Any], str | None]:
        """One trace; with ``html``, the page's text comes back (the parent writes it)."""
        if not html:
            return self.runner.run(Trace.from_dict(trace), invariants, **options).to_dict(), None
        with tempfile.TemporaryDirectory(prefix="kvsched-html-") as folder:
            page = Path(folder) / "trace.html"
            summary = self.runner.run(Trace.from_dict(trace), invariants, html=page, **options)
            text = page.read_text() if summary.html else None
        return summary.to_dict(), text

    def close(self) -> None:
        self.runner.close()


class RayRunner:
    """The parent's handle on one `BatchWorker` actor: the interface of `ChildRunner` that
    `conformance.runner.fuzz` drives. Call `connect` first."""

    def __init__(self, spec: str, limits: Limits | None = None) -> None:
        from conformance.runner.adapter import canonical_spec

        self.spec = canonical_spec(spec)
        self.limits = limits or Limits()
        self.info: AdapterInfo | None = None
        self._actor: Any = None

    def start(self) -> AdapterInfo:
        ray = _ray()
        self.close()
        # One CPU each: the actor waits while its adapter's process (on the same node) works.
        actor_class = ray.remote(num_cpus=1, max_restarts=0)(BatchWorker)
        self._actor = actor_class.remote(self.spec, asdict(self.limits))
        hello = ray.get(self._actor.start.remote())
        if "error" in hello:
            where, message = hello["error"]
            raise InputError(where, message)
        self.info = AdapterInfo(hello["name"], tuple(hello["profiles"]), frozenset(hello["capabilities"]),
                                hello.get("domain"), hello.get("reset_timeout"))
        return self.info

    def clone(self, index: int) -> RayRunner:
        del index  # the adapter's output stays on its node (Ray's worker logs)
        return RayRunner(self.spec, self.limits)

    def keep_log(self, log: Path) -> None:
        """The adapter's output stays in the actor's node's Ray logs; nothing is copied here."""
        del log

    def search(self, seed_value: int, count: int, invariants: Sequence[str], *, lockstep: bool = False,
               reference: str | None = None, should_stop: Callable[[], bool] = lambda: False, start: int = 0,
               ) -> Iterator[tuple[int, TraceSummary, Trace | None]]:
        """`ChildRunner.search` on the actor's node, the batch coming back whole (``should_stop``
        is looked at only before the batch starts; a trace a fault ended comes back with it)."""
        if should_stop():
            return
        items = self._call("search", seed_value, count, list(invariants), lockstep, reference, start)
        for index, summary, trace in items:
            yield index, TraceSummary.from_dict(summary), Trace.from_dict(trace) if trace is not None else None

    def run(self, trace: Trace, invariants: Sequence[str], *, lockstep: bool = False, reference: str | None = None,
            stop_at_first: bool = False, stop_on: str | None = None, html: Path | None = None,
            fresh: bool = False) -> TraceSummary:
        options = {"lockstep": lockstep, "reference": reference, "stop_at_first": stop_at_first, "stop_on": stop_on,
                   "fresh": fresh}
        data, page = self._call("run", trace.to_dict(), list(invariants), options, html is not None)
        summary = TraceSummary.from_dict(data)
        summary.html = None
        if html is not None and page is not None:
            from spec.safe_write import write_no_links

            try:
                write_no_links(Path(os.path.abspath(html)), page.encode("utf-8", "backslashreplace"))
                summary.html = str(html)
            except OSError:
                pass  # the page is a convenience: the JSON trace is the evidence
        return summary

    def _call(self, method: str, *args: Any) -> Any:
        """``method`` on the actor, in a fresh actor once more if the first died. The adapter's own
        deaths are faults inside the actor (its `ChildRunner` reports them); an actor dies only
        with its worker process or its node, which is the cluster's doing, not the adapter's,
        and Ray places the new actor where it can. The call is a seeded batch or one trace, so
        running it again gives the same verdicts."""
        ray = _ray()
        for attempt in (1, 2):
            if self._actor is None:
                self.start()
            try:
                return ray.get(getattr(self._actor, method).remote(*args))
            except ray.exceptions.RayActorError:
                self._actor = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Ask the actor to end its adapter's process, then end the actor. An actor still in a
        batch (Ctrl-C) is given a few seconds; after that its child, whose answers pipe has lost
        its reader, exits at its next answer (one trace later)."""
        actor, self._actor = self._actor, None
        if actor is None:
            return
        ray = _ray()
        try:
            ray.get(actor.close.remote(), timeout=5)
        except Exception:  # noqa: BLE001 - the actor (or its node) is gone: nothing left to close
            pass
        ray.kill(actor)
