"""Run an adapter in a child process the runner owns, and turn anything it does into a verdict.

`ChildRunner` starts ``python -m conformance.runner.worker`` (see that module for the child's side),
sends it one whole trace at a time and reads back a `conformance.runner.summary.TraceSummary`. While
it waits, a watchdog looks, every few milliseconds, at what only the parent can see:

| what the child does                      | what the runner reports                       |
| ---------------------------------------- | --------------------------------------------- |
| an adapter call outlives ``timeout``     | ``FAULT-hang`` (stack dumped, then killed)    |
| it exits (``sys.exit``, ``os._exit``)    | ``FAULT-exit`` with the code                  |
| a signal kills it (a segfault, ...)      | ``FAULT-crash`` with the signal and the stack |
| its memory passes ``max_memory_mb``      | ``FAULT-memory`` (killed)                     |
| it prints more than ``max_output_mb``    | ``FAULT-output`` (killed)                     |

Each is a problem of the trace at the step the child's stamp names, so the fuzz driver shrinks
and saves it like any violation. A hang is reported within ``timeout`` plus the poll and the
stack dump (well under a second). After a fault that ended the child, the next trace starts a
fresh one. `LocalRunner` is the same interface in the runner's own process (the project's own
tests and benchmarks use it; nothing guards it against an adapter that exits or hangs).
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.runner.channel import ChannelClosed, Stamp, receive, send
from conformance.runner.guard import AdapterFault, adapter_location
from conformance.runner.summary import Problem, TraceSummary
from spec.errors import InputError
from spec.trace import Trace

POLL = 0.01  # seconds between the watchdog's looks
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class AdapterInfo:
    """What the runner knows of an adapter without importing it: its answer to the child's hello."""

    name: str
    profiles: tuple[str, ...]
    capabilities: frozenset[str]
    domain: dict[str, Any] | None = None
    # An engine that builds itself in reset() (vLLM: 5-20 s under load) declares how long that may take;
    # every other call keeps the runner's --timeout, so a hang mid-trace is still caught quickly.
    reset_timeout: float | None = None
    reservation: dict[str, Any] | None = None  # what it declares it reserves (spec.reservation), for the report


@dataclass(frozen=True)
class Limits:
    timeout: float = 10.0  # seconds one adapter call may take
    start_timeout: float = 300.0  # seconds loading the adapter may take (vLLM imports for ~30 s)
    max_memory_mb: int = 8192  # the child's resident memory
    max_output_mb: int = 16  # what the adapter may print per trace


@dataclass
class _Output:
    """The child's stdout and stderr, drained by a thread: counted, the head kept in a log file,
    the tail kept for fault messages.

    With no log file yet, the head is held in memory until `attach` names one: `kvsched conform`
    creates its ``--out`` folder only once the adapter has loaded, so that a refused adapter
    leaves nothing on disk, yet what the adapter printed while loading still reaches the log."""

    log: Path | None
    total: int = 0
    since_mark: int = 0
    tail: bytes = b""
    cap: int = 1 << 20
    written: int = 0
    held: bytearray = field(default_factory=bytearray)
    out: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def drain(self, pipe) -> None:
        try:
            if self.log:
                self.attach(self.log)
        except OSError:
            pass  # no log, but the pipe is still drained: a full pipe would stall the adapter
        try:
            while chunk := pipe.read1(1 << 16):
                with self.lock:
                    self.total += len(chunk)
                    self.since_mark += len(chunk)
                    self.tail = (self.tail + chunk)[-2048:]
                    self._keep(chunk)
        except (OSError, ValueError):
            pass
        finally:
            with self.lock:
                if self.out is not None:
                    self.out.close()
                    self.out = None

    def attach(self, log: Path) -> None:
        """Write the head to ``log`` from now on, starting with what was held in memory."""
        with self.lock:
            held, self.held, self.written = bytes(self.held), bytearray(), 0
            self.log, self.out = log, open(log, "ab")  # noqa: SIM115 - closed when the pipe ends
            self._keep(held)

    def _keep(self, chunk: bytes) -> None:
        room = self.cap - self.written
        if room <= 0 or not chunk:
            return
        if self.out is not None:
            self.out.write(chunk[:room])
            self.out.flush()
        else:
            self.held += chunk[:room]
        self.written += min(len(chunk), room)

    def mark(self) -> None:
        with self.lock:
            self.since_mark = 0

    def last_line(self) -> str:
        lines = self.tail.decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else ""


_FRAME = re.compile(r'File "(.+)", line (\d+) in ')


def _stack_location(dump: Path, start: int) -> str | None:
    """The adapter's file:line in the stack faulthandler wrote after byte ``start`` of ``dump``
    (most recent call first; the first thread listed is the one that was running)."""
    try:
        with open(dump, "rb") as f:
            f.seek(start)
            text = f.read(1 << 20).decode(errors="replace")
    except OSError:
        return None
    start_at = text.find("Current thread")
    if start_at < 0:
        start_at = text.find("(most recent call first)")
    if start_at < 0:
        return None
    running = text[start_at:].split("\n\n")[0]  # the thread that was running, innermost frame first
    return adapter_location((m.group(1), int(m.group(2))) for m in _FRAME.finditer(running))


class ChildRunner:
    """One adapter in one child process, reused across traces until a fault ends it."""

    def __init__(self, spec: str, limits: Limits | None = None, *, log: Path | None = None) -> None:
        self.spec = spec
        self.limits = limits or Limits()
        self.log = log
        self.info: AdapterInfo | None = None
        self._proc: subprocess.Popen | None = None
        self._dir: Path | None = None  # this child's stamp and stack dump; removed when it ends
        self.starts = 0

    # -- the child's life ----------------------------------------------------------------------
    def start(self) -> AdapterInfo:
        """Start the child and wait for its hello; a broken adapter spec raises InputError."""
        self.close()
        self.starts += 1
        self._dir = Path(tempfile.mkdtemp(prefix="kvsched-child-"))
        stamp_path, self._dump = self._dir / "stamp", self._dir / "stack.txt"
        self._stamp = Stamp(str(stamp_path), create=True)
        self._dump.write_bytes(b"")
        req_r, self._requests = os.pipe()
        self._answers, ans_w = os.pipe()
        env = {**os.environ, "KVSCHED_PARENT_PATH": os.pathsep.join(p for p in sys.path if p),
               "KVSCHED_FROM_MAIN_THREAD": "1" if threading.current_thread() is threading.main_thread() else "0",
               "PYTHONUNBUFFERED": "1"}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "conformance.runner.worker", "--adapter", self.spec, "--requests", str(req_r),
             "--answers", str(ans_w), "--stamp", str(stamp_path), "--dump", str(self._dump)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, pass_fds=(req_r, ans_w),
            start_new_session=True, env=env,
        )
        os.close(req_r)
        os.close(ans_w)
        self._output = _Output(self.log)
        threading.Thread(target=self._output.drain, args=(self._proc.stdout,), daemon=True).start()
        hello = self._wait(self.limits.start_timeout, loading=True)
        if isinstance(hello, AdapterFault):
            raise InputError("--adapter", f"{self.spec} did not load: {hello.message}")
        if hello.get("op") == "input-error":
            self.close()
            raise InputError(str(hello.get("where") or "--adapter"), str(hello.get("message")))
        if hello.get("op") != "hello":
            raise InputError("--adapter", f"{self.spec}: the adapter's process answered {hello.get('op')!r}")
        self.info = AdapterInfo(hello["name"], tuple(hello["profiles"]), frozenset(hello["capabilities"]),
                                hello.get("domain"), hello.get("reset_timeout"), hello.get("reservation"))
        return self.info

    def clone(self, index: int) -> ChildRunner:
        """Another child of the same adapter and limits (a parallel worker), logging beside this
        one's log as ``<name>-<index><suffix>``."""
        log = self.log.with_name(f"{self.log.stem}-{index}{self.log.suffix}") if self.log else None
        return ChildRunner(self.spec, self.limits, log=log)

    def keep_log(self, log: Path) -> None:
        """Log the adapter's output to ``log`` from now on (this child's, held so far, included)."""
        self.log = log
        if self._proc is not None:
            self._output.attach(log)

    def kill(self) -> None:
        """End the child's process group now, from any thread. Unlike `close`, the pipes stay
        open: a thread waiting on this child sees it gone and returns (closing them itself),
        and no closed descriptor number can be reused under it by another thread's open()."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for fd in (self._requests, self._answers):
            try:
                os.close(fd)
            except OSError:
                pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        proc.wait()
        self._stamp.close()
        if self._dir is not None:  # a fault's location was read from the dump before close()
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    # -- one trace -------------------------------------------------------------------------------
    def run(self, trace: Trace, invariants: Sequence[str], *, lockstep: bool = False, reference: str | None = None,
            stop_at_first: bool = False, stop_on: str | None = None, html: Path | None = None) -> TraceSummary:
        answer = self._ask({"op": "run", "trace": trace.to_dict(), "invariants": list(invariants),
                            "lockstep": lockstep, "reference": reference, "stop_at_first": stop_at_first,
                            "stop_on": stop_on, "html": str(html) if html else None})
        if isinstance(answer, Problem):
            return TraceSummary(answer.step + 1, {answer.id: answer})
        return TraceSummary.from_dict(answer["summary"])

    def replay(self, trace: Trace, invariants: Sequence[str], *, lockstep: bool = False,
               reference: str | None = None, html: Path | None = None) -> dict[str, Any] | Problem:
        """Every step of one trace as `conformance.reports.replay_view` tells it, or the fault that ended the
        child. ``reference``: the lockstep reference, "module:attr" (None: the V0 reference)."""
        answer = self._ask({"op": "replay", "trace": trace.to_dict(), "invariants": list(invariants),
                            "lockstep": lockstep, "reference": reference, "html": str(html) if html else None})
        return answer if isinstance(answer, Problem) else answer["replay"]

    def search(self, seed_value: int, count: int, invariants: Sequence[str], *, lockstep: bool = False,
               reference: str | None = None, should_stop: Callable[[], bool] = lambda: False, start: int = 0,
               ) -> Iterator[tuple[int, TraceSummary, Trace | None]]:
        """Let the child draw ``count`` traces from ``seed_value`` (`conformance.runner.workers.draw`) and
        check each from ``start`` on: ``(index, summary, trace)`` per trace, the trace only when it
        showed a problem.
        A fault ends the batch with the index of the trace in hand and no trace (the caller draws
        it again from the same seed). Once ``should_stop()`` is true the child is asked to stop
        after the trace in hand."""
        if self._proc is None:
            self.start()
        self._output.mark()
        try:
            send(self._requests, {"op": "search", "seed": seed_value, "count": count, "start": start,
                                  "invariants": list(invariants), "lockstep": lockstep, "reference": reference})
        except OSError:
            pass  # the child is gone: _wait says how
        received, stop_sent = start, False
        while True:
            answer = self._wait(None)
            if isinstance(answer, AdapterFault):
                _, _, step, _ = self._stamp.read()
                self.close()
                problem = Problem(f"FAULT-{answer.kind}", step, f"step {step}: {answer}", answer.location)
                yield received, TraceSummary(step + 1, {problem.id: problem}), None
                return
            if answer.get("op") != "item":
                return
            trace = Trace.from_dict(answer["trace"]) if answer.get("trace") else None
            yield int(answer["index"]), TraceSummary.from_dict(answer["summary"]), trace
            received += 1
            self._output.mark()
            if not stop_sent and should_stop():
                stop_sent = True
                try:
                    send(self._requests, {"op": "stop"})
                except OSError:
                    pass

    def draw(self, seed_value: int, count: int, index: int) -> Trace | None:
        """Trace ``index`` of the batch `search` drew from ``seed_value`` (drawn again by the
        adapter's process, whose strategy it is); None if the process cannot say."""
        answer = self._ask({"op": "draw", "seed": seed_value, "count": count, "index": index})
        if isinstance(answer, Problem) or not answer.get("trace"):
            return None
        return Trace.from_dict(answer["trace"])

    def _ask(self, request: dict[str, Any]) -> dict[str, Any] | Problem:
        if self._proc is None:
            self.start()
        self._output.mark()
        try:
            send(self._requests, request)
        except OSError:
            pass  # the child is gone: _wait says how
        answer = self._wait(None)
        if isinstance(answer, AdapterFault):
            _, _, step, _ = self._stamp.read()
            self.close()
            return Problem(f"FAULT-{answer.kind}", step, f"step {step}: {answer}", answer.location)
        return answer

    def _wait(self, deadline_s: float | None, loading: bool = False) -> dict[str, Any] | AdapterFault:
        """The child's next frame, or the fault that ended the wait."""
        assert self._proc is not None
        limits, started, last_calls, idle_since = self.limits, time.monotonic(), -1, time.monotonic()
        next_memory_look = 0.0
        while True:
            ready, _, _ = select.select([self._answers], [], [], POLL)
            if ready:
                try:
                    return receive(self._answers)
                except ChannelClosed:
                    pass  # the child died mid-frame or before one: poll() below says how
            now = time.monotonic()
            calls, call_started, step, call = self._stamp.read()
            if self._proc.poll() is not None:
                return self._ended(call or "between calls")
            if deadline_s is not None and now - started > deadline_s:
                return self._kill("hang", call or "load", f"no answer within {deadline_s:g} s")
            allowed = self._call_limit(call)
            if call and not loading and now - call_started > allowed and self._stamp.read() == (calls, call_started, step, call):
                # the same call still on at a second reading: a stamp read mid-write (conformance.runner.channel)
                # is never taken twice, a hang is
                return self._kill("hang", call, f"no answer within {allowed:g} s")
            if calls != last_calls:
                last_calls, idle_since = calls, now
            elif not loading and not call and now - idle_since > max(60.0, 10 * limits.timeout):
                return self._kill("hang", "the runner's checks", "no adapter call for too long")
            if self._output.since_mark > limits.max_output_mb << 20:
                return self._kill("output", call or "between calls",
                                  f"printed more than {limits.max_output_mb} MB (last line: {self._output.last_line()!r})",
                                  dump=False)
            if now >= next_memory_look:
                next_memory_look = now + 0.05
                rss = self._resident_mb()
                if rss > limits.max_memory_mb:
                    return self._kill("memory", call or "between calls",
                                      f"resident memory {rss} MB passed the limit of {limits.max_memory_mb} MB")

    def _call_limit(self, call: str) -> float:
        """Seconds ``call`` may take: --timeout, or the adapter's declared reset time when longer."""
        declared = self.info.reset_timeout if self.info is not None and call == "reset" else None
        return max(self.limits.timeout, declared or 0.0)

    def _resident_mb(self) -> int:
        try:
            with open(f"/proc/{self._proc.pid}/statm") as f:  # type: ignore[union-attr]
                return int(f.read().split()[1]) * _PAGE >> 20
        except (OSError, ValueError, IndexError):
            return 0

    def _kill(self, kind: str, call: str, message: str, dump: bool = True) -> AdapterFault:
        """Take the stack (SIGUSR1 makes faulthandler write it), then kill the child's session."""
        assert self._proc is not None
        location = None
        if dump:
            size = self._dump.stat().st_size
            try:
                os.kill(self._proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline and self._dump.stat().st_size == size:
                time.sleep(0.005)
            time.sleep(0.01)
            location = _stack_location(self._dump, size)
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._proc.wait()
        return AdapterFault(kind, call, message, location)

    def _ended(self, call: str) -> AdapterFault:
        assert self._proc is not None
        code = self._proc.returncode
        said = self._output.last_line()
        tail = f"; its last output: {said!r}" if said else ""
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
            return AdapterFault("crash", call, f"the adapter's process was killed by {name}{tail}",
                                _stack_location(self._dump, 0))
        return AdapterFault("exit", call, f"the adapter's process exited with code {code}{tail}")


class LocalRunner:
    """The same interface in the runner's own process, over ``make_adapter()`` (for the project's
    own tests, benchmarks and the museum, whose adapters are kvsched's own)."""

    def __init__(self, make_adapter: Callable[[], Any], timeout: float | None = 10.0) -> None:
        self.make_adapter = make_adapter
        self.timeout = timeout
        self.adapter = make_adapter()
        self.info = AdapterInfo(self.adapter.name, tuple(getattr(self.adapter, "profiles", ("safety",))),
                                frozenset(str(c) for c in getattr(self.adapter, "capabilities", ())))

    def run(self, trace: Trace, invariants: Sequence[str], *, lockstep: bool = False, reference: str | None = None,
            stop_at_first: bool = False, stop_on: str | None = None, html: Path | None = None) -> TraceSummary:
        from conformance.runner.coverage import step_tests
        from conformance.runner.driver import run_checked
        from conformance.runner.summary import summarize
        from spec.catalogue import get

        checks = [get(i) for i in invariants]
        factory = _import_factory(reference) if reference else None
        result = run_checked(self.adapter, trace, checks, timeout=self.timeout, lockstep=lockstep,
                             stop_at_first=stop_at_first, reference_factory=factory, stop_on=stop_on)
        if result.fault is not None and result.fault.kind == "hang":
            self.adapter = self.make_adapter()  # a hung adapter is abandoned, never reused
        summary = summarize(result, step_tests(i.id for i in checks))
        if html is not None:
            from conformance.reports.html_view import write_run_view

            written = write_run_view(html, trace, result)
            summary.html = str(written) if written else None
        return summary

    def close(self) -> None:
        pass


def _import_factory(reference: str) -> Callable[..., Any]:
    import importlib

    module, _, attr = reference.partition(":")
    return getattr(importlib.import_module(module), attr)
