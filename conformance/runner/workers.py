"""Several adapter processes at once: the search and the shrinking of `conformance.runner.fuzz` spread
over N isolated runners (`kvsched conform --workers N`).

Each worker is its own search: worker ``i`` draws its traces from seeds derived from the run's
seed and ``i`` (`worker_seed`), a batch at a time, in its own adapter process, which checks
them there and sends back a verdict per trace (`ChildRunner.search`): the parent neither draws
nor serialises a trace that passes, so one parent keeps several children busy. The parent's
threads only wait on their children. The example budget is split across workers up front
(`quotas`), so for a given seed and N the same traces run, whatever order they finish in; the
caller's ``record`` breaks ties between equally small failures by (worker, index), so the
trace each problem is shrunk from, and hence the report, does not depend on timing either.
Shrinking then takes one problem per runner at a time: each problem is shrunk once.
"""

from __future__ import annotations

import hashlib
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from spec.trace import Trace

CHUNK = 32  # traces drawn per Hypothesis run: small enough to start quickly, large enough to vary
T = TypeVar("T")


def worker_seed(run_seed: int, index: int, chunk: int = 0) -> int:
    """A seed for worker ``index``'s ``chunk``-th draw, fixed by the run's seed."""
    digest = hashlib.sha256(f"kvsched:{run_seed}:{index}:{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def quotas(max_examples: int, workers: int) -> list[int]:
    """``max_examples`` split as evenly as it goes, the first workers taking the remainder."""
    share, extra = divmod(max_examples, workers)
    return [share + (i < extra) for i in range(workers)]


def draw(strategy: st.SearchStrategy, seed_value: int, n: int) -> list[Trace]:
    """``n`` traces (or fewer, if Hypothesis runs out of distinct ones) from ``seed_value``."""
    drawn: list[Trace] = []

    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck),
              verbosity=Verbosity.quiet, phases=(Phase.generate,))
    @seed(seed_value)
    @given(strategy)
    def collect(trace: Trace) -> None:
        drawn.append(trace)

    collect()
    return drawn[:n]


def search(
    runners: Sequence[Any],
    strategy: st.SearchStrategy,
    run_seed: int,
    max_examples: int,
    run_batch: Callable[..., Iterator[tuple[int, Any, Trace | None]]],
    on_result: Callable[[Trace | None, Any, tuple[int, int]], None],
    stop: Callable[[], bool],
) -> None:
    """Every worker's search on its own runner, in a thread each; results reach ``on_result(trace,
    summary, (worker, index))`` in this thread as they come. ``run_batch(runner, seed, count,
    should_stop, start)`` runs one batch drawn in the runner's process (`ChildRunner.search`); a trace
    that a fault ended is drawn again by a fresh process of the runner (`ChildRunner.draw`), or
    failing that here from ``strategy``, so that it can be saved. A runner not started yet (``info``
    None) is started by its own worker's thread, so the others search meanwhile."""
    results: queue.Queue = queue.Queue()
    halt = threading.Event()

    def work(worker: int, runner: Any, quota: int) -> None:
        try:
            if getattr(runner, "info", True) is None and not halt.is_set():
                runner.start()  # a worker's own child starts here, while the others search
            done, batch = 0, 0
            while done < quota and not halt.is_set():
                count, seed_value = min(CHUNK, quota - done), worker_seed(run_seed, worker, batch)
                start = 0
                while start < count and not halt.is_set():  # a fault ends a batch: go on after it
                    last = None
                    for index, summary, trace in run_batch(runner, seed_value, count, halt.is_set, start):
                        if trace is None and summary.problems and hasattr(runner, "draw"):
                            trace = runner.draw(seed_value, count, index)  # a fault: drawn again where it was drawn
                        results.put((worker, done + index, trace, summary, (seed_value, count, index)))
                        last = index
                    if last is None:
                        break
                    start = last + 1
                if start == 0:
                    break  # nothing more to draw
                done, batch = done + count, batch + 1
        except BaseException as err:  # noqa: BLE001 - handed to the main thread, which decides
            if not halt.is_set():
                results.put(err)
        finally:
            results.put(None)

    threads = [threading.Thread(target=work, args=(i, r, q), daemon=True, name=f"kvsched-worker-{i}")
               for i, (r, q) in enumerate(zip(runners, quotas(max_examples, len(runners)), strict=True))]
    for thread in threads:
        thread.start()
    running = len(threads)
    try:
        while running:
            try:
                item = results.get(timeout=0.2)
            except queue.Empty:
                continue
            if item is None:
                running -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            worker, index, trace, summary, (seed_value, count, at) = item
            if trace is None and summary.problems:  # a fault, and its process could not draw it again
                batch = draw(strategy, seed_value, count)
                if at >= len(batch):
                    continue  # the runner's strategy is not this process's: the fault cannot be saved
                trace = batch[at]
            on_result(trace, summary, (worker, index))
            if stop():
                halt.set()
                _end_starting(runners)
    except BaseException:
        halt.set()
        _stop_threads(runners, threads)
        raise
    finally:
        halt.set()


def _end_starting(runners: Sequence[Any]) -> None:
    """End the children still starting once the search is over (their workers' threads return),
    so that a slow start is not waited for."""
    for runner in runners:
        if getattr(runner, "info", True) is None and hasattr(runner, "kill"):
            runner.kill()


def _stop_threads(runners: Sequence[Any], threads: Sequence[threading.Thread]) -> None:
    """End the children (a thread waiting on one returns once it is gone) and wait for the
    threads, so that nothing still uses a runner when the caller closes it."""
    for runner in runners:
        getattr(runner, "kill", runner.close)()
    for thread in threads:
        thread.join(timeout=10)


def each_on_a_runner(runners: Sequence[Any], items: Sequence[T], work: Callable[[Any, T], Any]) -> list[Any]:
    """``work(runner, item)`` for every item, each runner doing one at a time; results in item order."""
    if len(runners) == 1 or len(items) <= 1:
        return [work(runners[0], item) for item in items]
    free = list(runners)
    results: dict[int, Any] = {}
    pool = ThreadPoolExecutor(len(runners), thread_name_prefix="kvsched-shrink")
    pending: dict[Future, tuple[int, Any]] = {}
    todo = list(enumerate(items))
    try:
        while todo or pending:
            while todo and free:
                index, item = todo.pop(0)
                runner = free.pop(0)
                pending[pool.submit(work, runner, item)] = (index, runner)
            done, _ = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)  # a timeout: Ctrl-C is taken at once
            for future in done:
                index, runner = pending.pop(future)
                results[index] = future.result()
                free.append(runner)
    except BaseException:
        for runner in runners:
            getattr(runner, "kill", runner.close)()
        pool.shutdown(wait=True, cancel_futures=True)  # no thread uses a runner once this returns
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return [results[i] for i in range(len(items))]
