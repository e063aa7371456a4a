"""The runner's side of the wire protocol: `WireAdapter`, an adapter whose scheduler lives in
another process (any language) that speaks JSON lines on stdin/stdout (docs/PROTOCOL.md).

One host process per command line serves every trace of a run (``reset`` builds a fresh
scheduler inside it), because a target's start-up can cost many seconds (vLLM imports torch).
Host processes are shared through a small pool: two adapters made from the same command use
the same process, unless the first one was left hanging, in which case the hung process is
killed and a fresh one started.

Faults: an ``error`` answer, a malformed answer, a host that exits, and a host that does not
answer within ``timeout`` seconds (it is then killed) all raise `WireError`; the guarded driver
reports them as adapter faults with the step, and a per-call timeout shorter than ours (the
runner's ``--timeout``) reports a hang first.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from conformance.wire.codec import (
    HostDied,
    WireError,
    config_to_json,
    finished_from_json,
    finished_list_from_json,
    output_from_json,
    request_to_json,
    snapshot_from_json,
)
from spec.config import SchedulerConfig
from spec.observation import Capability, Snapshot
from spec.reservation import Reservation
from spec.trace import Trace
from spec.types import Finished, Request, SchedulerOutput, StepOutcome

PROTOCOL_VERSION = 2
_WRITE_TIMEOUT = 120  # seconds a host may leave a message unread before it counts as hung


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from Linux's /proc (empty elsewhere or once it is gone)."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except (OSError, ValueError):
                continue
            found.extend(kids)
            todo.extend(kids)
    return found


class HostProcess:
    """One running host: a child process whose stdout the caller's thread reads itself (no reader
    thread), and a tail of its stderr (a thread, woken only when the host logs).

    Why no reader thread: handing each answer line from a reader thread to the runner through a
    queue cost the runner about as much CPU per step as vLLM's whole step (a thread wake-up and
    two GIL hand-offs per line; BENCHMARKS.md "A faster wire"). The runner now reads the pipe in
    large chunks when it needs a line, so lines the host wrote while the runner was checking
    arrive in one read."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str] | None, start_timeout: float) -> None:
        self.command = list(command)
        full_env = {**os.environ, **(env or {})}
        try:
            # In the runner's process group, so that the runner's kill of an adapter process
            # (conformance/runner/isolated.py) takes its hosts too; `kill` takes the host's own children.
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=full_env, bufsize=0,
            )
        except OSError as err:
            raise WireError(f"cannot start host {self.command[0]!r}: {err.strerror or err}") from None
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in_fd, self._out_fd = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self._lines: collections.deque[bytes] = collections.deque()  # complete lines read, not yet taken
        self._partial = b""  # the start of a line still being written
        self._eof = False
        self._out_poll = select.poll()
        self._out_poll.register(self._out_fd, select.POLLIN)
        self._both_poll = select.poll()
        self._both_poll.register(self._out_fd, select.POLLIN)
        self._both_poll.register(self._in_fd, select.POLLOUT)
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=40)
        self.busy = False
        self.next_id = 0
        self.folds_reset = False  # set by WireAdapter.reset once a reset of its own succeeded (steps_reset hosts)
        self.lock = threading.Lock()
        threading.Thread(target=self._read_stderr, daemon=True, name="kvsched-wire-err").start()
        self.hello = self.call("hello", {}, start_timeout)
        spoken = self.hello.get("protocol") if isinstance(self.hello, Mapping) else self.hello
        if spoken != PROTOCOL_VERSION:
            self.kill()
            raise WireError(f"host {self.command[-1]!r} speaks protocol {spoken!r}; this runner speaks version "
                            f"{PROTOCOL_VERSION} only (docs/PROTOCOL.md: update the host, e.g. its copy of "
                            f"kvsched_host.py)")

    def _fill(self, deadline: float | None) -> bool:
        """Read what the host has written (waiting until ``deadline`` for something) into whole
        lines; False if nothing came in time. At end of stream, `_eof` is set."""
        left = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000 + 0.999))
        if not self._out_poll.poll(left):
            return False
        chunk = os.read(self._out_fd, 1 << 20)
        if not chunk:
            self._eof = True
            return True
        *whole, self._partial = (self._partial + chunk).split(b"\n")
        self._lines.extend(whole)
        return True

    def _write(self, data: bytes) -> None:
        """Write all of ``data`` to the host's stdin, reading its answers meanwhile: a message larger
        than the pipe must not deadlock against a host blocked on writing lines we are not reading."""
        view = memoryview(data)
        while view:
            ready = dict(self._both_poll.poll(_WRITE_TIMEOUT * 1000))
            if not ready:
                raise WireError(f"host hung: it took no input for {_WRITE_TIMEOUT} s")
            if ready.get(self._in_fd):
                view = view[os.write(self._in_fd, view[:1 << 16]):]  # BrokenPipeError once the host is gone
            elif ready.get(self._out_fd):
                self._fill(0)
                if self._eof:
                    raise BrokenPipeError

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line.decode("utf-8", "replace").rstrip("\n"))

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def died(self, method: str) -> HostDied:
        """The error for a host that is gone (or has closed its stdout): how it ended, by its exit
        status (a signal is a crash, `HostDied`), and the last lines of its stderr."""
        try:
            code = self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            code = None
        tail = " | ".join(list(self.stderr_tail)[-3:])
        if code is not None and code < 0:
            how = f"host killed by {_signal_name(-code)}"
        else:
            how = f"host exited (code {code})"
        return HostDied(f"{how} during {method!r}" + (f"; stderr: {tail}" if tail else ""), code)

    def call(self, method: str, params: Mapping[str, Any], timeout: float | None) -> Any:
        """Send one request and return its result (raise `WireError` on an error answer)."""
        mid = self.send(method, params)
        msg = self.receive(mid, method, timeout)
        self.busy = False
        return result_of(msg, method)

    def send(self, method: str, params: Mapping[str, Any]) -> int:
        """Write one request; the host is busy until `receive` has its last answer line."""
        with self.lock:
            if not self.alive:
                raise self.died(method)
            self.busy = True
            self.next_id += 1
            mid = self.next_id
            try:
                self._write(json.dumps({"id": mid, "method": method, "params": dict(params)},
                                       separators=(",", ":")).encode() + b"\n")
            except (BrokenPipeError, OSError):
                self.busy = False
                raise self.died(method) from None
            return mid

    def receive(self, mid: int, method: str, timeout: float | None) -> Mapping[str, Any]:
        """The next line answering request ``mid`` (lines answering earlier, abandoned requests are
        skipped), as a JSON object; `WireError` if the host exits, hangs or writes garbage."""
        with self.lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                while not self._lines:
                    if self._eof:
                        self.busy = False
                        raise self.died(method)
                    if not self._fill(deadline):
                        self.kill()
                        raise WireError(f"host hung: no answer to {method!r} within {timeout:g} s (killed)")
                line = self._lines.popleft()
                try:
                    msg = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    self.busy = False
                    text = line[:120].decode("utf-8", "replace")
                    raise WireError(f"host sent a line that is not JSON in answer to {method!r}: {text!r}") from None
                if not isinstance(msg, dict) or msg.get("id") != mid:
                    if isinstance(msg, dict) and isinstance(msg.get("id"), int) and msg["id"] < mid:
                        continue  # a late answer to a call that was given up; skip it
                    self.busy = False
                    text = line[:120].decode("utf-8", "replace")
                    raise WireError(f"host answered {method!r} with an unexpected message: {text!r}")
                return msg

    def kill(self) -> None:
        """Kill the host and every process it started (vLLM's helper processes outlived a killed
        host and piled up under a campaign that restarted it), then reap it."""
        if self.proc.poll() is None:
            for pid in [*_descendants(self.proc.pid), self.proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def shutdown(self) -> None:
        if self.proc.poll() is None and not self.busy:
            try:
                self.call("shutdown", {}, 5)
                self.proc.wait(timeout=5)
            except (WireError, subprocess.TimeoutExpired):
                pass
        self.kill()


def _rejected(err: WireError) -> WireError:
    """``err``, a reset that failed after the adapter's own `reset` had returned (folded into the
    next message), marked as the driver's ``config-rejected`` in ``reset``, as when `reset` raised
    (a host killed by a signal in it stays a crash, in ``reset``, as the driver keeps it too)."""
    if err.fault_kind == "raised":
        err.fault_kind = "config-rejected"
    err.fault_call = "reset"
    return err


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def result_of(msg: Mapping[str, Any], method: str) -> Any:
    """The ``result`` of an answer line, or `WireError` for an ``error`` answer."""
    if "error" in msg:
        err = msg["error"] if isinstance(msg["error"], Mapping) else {"message": str(msg["error"])}
        where = f" (at {err['where']})" if err.get("where") else ""
        raise WireError(f"host error in {err.get('method', method)}: {err.get('message', '?')}{where}",
                        str(err["where"]) if err.get("where") else None)
    if "result" not in msg:
        raise WireError(f"host answered {method!r} without result or error")
    return msg["result"]


_POOL: dict[tuple[str, ...], HostProcess] = {}
_POOL_LOCK = threading.Lock()


def acquire_host(command: Sequence[str], env: Mapping[str, str] | None = None, start_timeout: float = 300.0,
                 fresh: bool = False) -> HostProcess:
    """The pooled host for this command: reused when alive and idle, else (re)started."""
    key = tuple(command)
    with _POOL_LOCK:
        host = _POOL.get(key)
        if host is not None and (fresh or host.busy or not host.alive):
            host.kill()  # a busy host was abandoned mid-call by a guard that gave up on it
            host = None
        if host is None:
            host = HostProcess(command, env, start_timeout)
            _POOL[key] = host
        return host


@atexit.register
def _shutdown_all() -> None:
    for host in list(_POOL.values()):
        host.shutdown()
    _POOL.clear()


def _known_capabilities(names: Any) -> frozenset[Capability]:
    """The capabilities among ``names`` (a hello list) that this runner knows; another is simply not used."""
    known = set()
    for name in names if isinstance(names, (list, tuple)) else ():
        try:
            known.add(Capability(name))
        except ValueError:
            continue
    return frozenset(known)


class WireAdapter:
    """An `conformance.runner.adapter.Adapter` that talks to a host process over the wire protocol.

    ``command`` starts the host (for a target: its venv's Python and a host script). The host
    is started lazily (first `reset`) unless ``start()`` is called; its ``hello`` answer sets
    the capabilities (``profiles`` given here win over the host's, so a registry can decide
    which profiles a target is held to).
    """

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        *,
        profiles: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = 60.0,
        start_timeout: float = 300.0,
        trace_strategy: Callable[[], Any] | None = None,
        lookahead_tokens: int = 0,
    ) -> None:
        self.name = name
        # Slots the engine holds past a sequence's last token (CAP-006): its in-flight steps' at
        # pipeline depth d; with k drafts each in-flight step holds 1 + k and the next k more
        # (`reset` declares d * (1 + k) + k for the config's k).
        self.lookahead_tokens = lookahead_tokens
        self.reservation = Reservation(lookahead_tokens=lookahead_tokens) if lookahead_tokens else None
        self.command = list(command)
        self.env = dict(env or {})
        self.timeout = timeout
        # Building the engine in reset may outlast the runner's --timeout (vLLM under load): the
        # isolated runner allows reset this long; a reset that hangs past it is still a FAULT-hang.
        self.reset_timeout = timeout
        self.start_timeout = start_timeout
        self._claimed_profiles = tuple(profiles) if profiles is not None else None
        self.profiles: tuple[str, ...] = self._claimed_profiles or ("safety",)
        self.capabilities: frozenset[Capability] = frozenset({Capability.OUTPUT})
        self.host: HostProcess | None = None
        self.hello: Mapping[str, Any] = {}
        self._batch: _Batch | None = None  # set by `begin_trace`: calls answered from `steps` runs
        self.flush_ms = _FLUSH_MS  # how long the host may hold step lines (0 within `exact_steps`)
        self._pending_reset: dict[str, Any] | None = None  # a reset to send with the next message
        self.optional_calls: frozenset[str] = frozenset()  # from hello (`start`)
        self._hello_capabilities: frozenset[Capability] = self.capabilities
        self._claims_without_kv_connector: frozenset[Capability] = frozenset()  # from hello (`start`)
        self._kv_scripts: dict[str, Any] = {}  # the trace's KV connector scripts, sent with each request
        if trace_strategy is not None:
            self.trace_strategy = trace_strategy

    def start(self) -> WireAdapter:
        if self.host is None or not self.host.alive or self.host.busy:
            self.host = acquire_host(self.command, self.env, self.start_timeout)
            self.hello = self.host.hello
            self.capabilities = _known_capabilities(self.hello.get("capabilities", ["output"])) | {Capability.OUTPUT}
            self._hello_capabilities = self.capabilities
            self._claims_without_kv_connector = _known_capabilities(self.hello.get("claims_without_kv_connector", ()))
            # optional calls the host answers (spec/protocol.py OPTIONAL_CALLS); a host that does not
            # list them has none: batched aborts then go one id at a time, admin calls are refused
            self.optional_calls = frozenset(c for c in self.hello.get("optional_calls", ()) if isinstance(c, str))
            if self._claimed_profiles is None:
                self.profiles = tuple(self.hello.get("profiles", ["safety"]))
        return self

    def _call(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        if self.host is None:
            self.start()
        assert self.host is not None
        if self._pending_reset is not None:  # a reset held for a `steps` message that never came
            pending, self._pending_reset = self._pending_reset, None
            try:
                self.host.call("reset", pending, self.timeout)
            except WireError as err:
                raise _rejected(err) from None
        return self.host.call(method, params or {}, self.timeout)

    # -- the Adapter protocol ------------------------------------------------------------------
    def reset(self, config: SchedulerConfig) -> None:
        if self._batch is not None and self._batch.pending is not None and self.host is not None:
            self.host.busy = False  # ours: its late step lines are skipped by id, the host is not hung
        self._batch = None
        self.start()
        lookahead = self.lookahead_tokens * (1 + config.num_speculative_tokens) + config.num_speculative_tokens
        if config.drop_eagle_block:  # an EAGLE/MTP drafter: k lookahead slots more (vLLM num_lookahead_tokens)
            lookahead += config.num_speculative_tokens
        self.reservation = Reservation(lookahead_tokens=lookahead) if lookahead else None
        # A host shows the KV connector's record only when the config has one (spec/connector.py),
        # and makes the claims hello lists in ``claims_without_kv_connector`` only when it has none
        # (vLLM's ordered_steps: with a consumer connector it fences instead, so PIP-004 is checked);
        # every other claim stays as it is (a campaign may add one once the host is up: hybrid_hunt).
        transfers = {Capability.KV_TRANSFERS} & self._hello_capabilities
        unclaimed = self._claims_without_kv_connector & self._hello_capabilities
        self.capabilities = (self.capabilities | transfers) - unclaimed if config.kv_connector else \
            (self.capabilities | unclaimed) - {Capability.KV_TRANSFERS}
        self._kv_scripts = {}
        params = {"config": config_to_json(config)}
        if _FOLD_RESET and getattr(self.host, "folds_reset", False):
            # Sent with the trace's first `steps` message (or before the next call of its own): one
            # round trip a trace less. A config the engine refuses then fails that message, with
            # the reset named (`_rejected`): the driver still reports it as config-rejected.
            self._pending_reset = params
            return
        self._pending_reset = None
        self._call("reset", params)
        if self.hello.get("steps_reset") is True and self.host is not None:
            # Not before: a fresh host's first reset (an engine's lazy imports, its first build)
            # may need the adapter's reset_timeout, which only a call of its own gets.
            self.host.folds_reset = True

    def begin_trace(self, trace: Trace, observe: bool, mid_step: bool) -> None:
        """Driver hook (conformance/runner/driver.py, right after `reset`): the calls that follow are the
        driver's for ``trace``, so they are run many steps per message (`steps`, protocol 2) and
        answered from the host's results in order. Without this hook every call is a round trip."""
        self._batch = _Batch(trace, observe, mid_step, self.flush_ms)

    def end_trace(self) -> None:
        """Driver hook: the trace ended without a fault, maybe before the steps the host was asked
        for (every request finished, or the problem a shrink try looks for showed). The host's
        lines for them are skipped by id at its next call, so it is idle, not hung: the next
        adapter of the same target reuses it (the wire's pool) rather than kill it and pay the
        engine's start again (4 s for vLLM)."""
        if self._batch is not None and self._batch.pending is not None and self.host is not None:
            self.host.busy = False

    @contextlib.contextmanager
    def exact_steps(self) -> Iterator[None]:
        """Within this block the host writes each step line at once (``flush_ms`` 0), so a death
        is pinned to its step. The driver replays a trace under it when the host died holding
        lines (`HostDied.step_uncertain`): a fault's step is evidence, the held lines a saving."""
        saved, self.flush_ms = self.flush_ms, 0.0
        try:
            yield
        finally:
            self.flush_ms = saved

    def kv_connector_scripts(self, scripts: Mapping[str, Any]) -> None:
        """The trace's KV connector scripts (spec/connector.py): each goes with its request as ``kv``."""
        self._kv_scripts = dict(scripts)

    def _request_json(self, request: Request) -> dict[str, Any]:
        data = request_to_json(request)
        script = self._kv_scripts.get(request.request_id)
        if script is not None:
            data["kv"] = script.to_dict()
        return data

    def add_request(self, request: Request) -> Finished | None:
        """None, or the host's refusal at the door (``{"request", "status": "FINISHED_IGNORED"}``)."""
        result = self._answer("add_request", {"request": self._request_json(request)})
        return None if result is None else finished_from_json(result, "add_request")

    def abort_request(self, request_id: str) -> Finished | None:
        result = self._answer("abort_request", {"request_id": request_id})
        return None if result is None else finished_from_json(result, "abort_request")

    def abort_requests(self, request_ids: Sequence[str]) -> list[Finished]:
        """One batched abort (a host that lists ``abort_requests`` in hello's ``optional_calls``)."""
        return finished_list_from_json(self._answer("abort_requests", {"request_ids": list(request_ids)}),
                                       "abort_requests")

    def reset_prefix_cache(self) -> bool:
        """The engine's admin call (a host that lists ``reset_prefix_cache`` in ``optional_calls``)."""
        return self._answer("reset_prefix_cache")

    def pause_new(self) -> bool:
        """The engine's pause calls (a host that lists them in ``optional_calls``; spec/protocol.py)."""
        return self._answer("pause_new")

    def pause_all(self) -> bool:
        return self._answer("pause_all")

    def resume(self) -> bool:
        return self._answer("resume")

    def schedule(self) -> SchedulerOutput:
        return output_from_json(self._answer("schedule"))

    def update(self, outcome: StepOutcome) -> list[Finished]:
        params: dict = {"stopped": sorted(outcome.stopped)}
        if outcome.drafts:  # speculative decoding's decisions (spec/speculative.py); old hosts never see the key
            params["drafts"] = {sid: d.to_dict() for sid, d in sorted(outcome.drafts.items())}
        return finished_list_from_json(self._answer("update", params), "update")

    def snapshot(self) -> Snapshot:
        if self._batch is None:
            return snapshot_from_json(self._call("snapshot"))
        snap = snapshot_from_json(self._answer("snapshot"), self._batch.last_snapshot)
        self._batch.last_snapshot = snap
        return snap

    def _answer(self, method: str, params: Mapping[str, Any] | None = None) -> Any:
        """``method``'s result: from the current `steps` run when `begin_trace` set one (reading
        the host's next step line, or asking for the next steps, when the answers are used up),
        else a round trip of its own."""
        batch = self._batch
        if batch is None:
            return self._call(method, params)
        while not batch.answers:
            if batch.error is not None:
                # The host answered the failing call with an error and stays up: its closing line
                # is skipped by id at the next call, so it is idle, not hung (marking it busy made
                # the next reset kill and restart it, 0.2-0.3 s per failing trace).
                self._batch = None
                if self.host is not None:
                    self.host.busy = False
                raise batch.error
            if batch.pending is None:
                self._send_steps(batch)
            else:
                self._read_step(batch)
        ran, result = batch.answers.popleft()
        if ran != method:
            self._batch = None
            raise WireError(f"steps: the host ran {ran!r} where the runner called {method!r} (docs/PROTOCOL.md, steps)")
        return result

    def _send_steps(self, batch: _Batch) -> None:
        """Ask for the next ``batch.size`` steps of the trace in one message; the host answers a
        line per step as it runs them."""
        trace = batch.trace
        first = batch.next_step
        last = min(first + batch.size, trace.max_steps)
        if batch.ended or first >= last:
            raise WireError("steps: the runner called past the end of the trace the host ran")
        batched = "abort_requests" in self.optional_calls
        steps = [{"step": k, "add": [self._request_json(r) for r in trace.arrivals_at(k)],
                  "abort": list(trace.aborts_at(k)) + ([] if batched else  # one id at a time (conformance/runner/driver.py)
                                                       [rid for ids in trace.abort_batches_at(k) for rid in ids]),
                  "stopped": sorted(trace.stops_at(k)),
                  **({"drafts": {sid: d.to_dict() for sid, d in sorted(trace.drafts_at(k).items())}}
                     if trace.drafts_at(k) else {}),  # speculative decoding (spec/speculative.py)
                  # optional calls: sent only to a host that announced them, so an older host never sees them
                  **({"abort_batches": [list(ids) for ids in trace.abort_batches_at(k)]}
                     if batched and trace.abort_batches_at(k) else {}),
                  **({"admin": list(trace.admin_at(k))} if trace.admin_at(k) else {})}
                 for k in range(first, last)]
        if self.host is None:
            self.start()
        assert self.host is not None
        params = {"steps": steps, "observe": batch.observe, "mid_step": batch.mid_step,
                  "last_arrival_step": trace.last_arrival_step, "flush_ms": batch.flush_ms}
        if self._pending_reset is not None:  # the trace's reset, folded in (docs/PROTOCOL.md, steps)
            params["reset"], self._pending_reset = self._pending_reset, None
        batch.pending = self.host.send("steps", params)
        batch.next_step = last

    def _read_step(self, batch: _Batch) -> None:
        """The host's next line for the pending `steps` message: one step's calls (``{"id", "calls"}``,
        with ``error`` if an engine call failed) or the closing ``{"id", "result": {"ended"}}``."""
        assert self.host is not None and batch.pending is not None
        try:
            msg = self.host.receive(batch.pending, "steps", self.timeout)
        except HostDied as err:
            if batch.flush_ms:  # it may have died holding the lines of its last steps: which step is unknown
                err.step_uncertain = True
            raise
        if "calls" in msg:
            calls = msg["calls"]
            if not isinstance(calls, list):
                raise WireError(f"steps: expected calls: [[method, result], ...], got {str(calls)[:120]!r}")
            for entry in calls:
                if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
                    raise WireError(f"steps: a call entry must be [method, result], got {str(entry)[:120]!r}")
                batch.answers.append((entry[0], entry[1]))
            if "error" in msg:
                try:
                    result_of(msg, "steps")
                except WireError as err:
                    failed = msg["error"].get("method") if isinstance(msg["error"], Mapping) else None
                    batch.error = _rejected(err) if failed == "reset" else err
            return
        self.host.busy = False
        result = result_of(msg, "steps")
        batch.pending = None
        batch.ended = bool(isinstance(result, Mapping) and result.get("ended"))

    def close(self) -> None:
        if self.host is not None:
            self.host.shutdown()
            self.host = None


_MAX_STEPS_PER_MESSAGE = 64
# How long a host may hold a step's line to write it with the next ones (docs/PROTOCOL.md, steps;
# kvsched_host also writes at most 8 together). Each write wakes the runner: on vLLM, holding
# halved the wire's CPU per step in bench_wire (101 against 196 µs a step, unchecked); on
# nano-vllm, whose steps are fast, it is level by CPU and faster by wall clock (BENCHMARKS.md
# "A faster wire"). 0: every line at once. A host killed by a signal (a segfault in an engine's C
# code, os._exit, the OOM killer) loses its held lines, so its death says nothing of its step: the
# driver then replays the trace with every line written at once (`WireAdapter.exact_steps`) and
# reports the fault where the replay dies (conformance/runner/driver.py).
_FLUSH_MS = 1.0
# Whether a trace's reset goes with its first `steps` message to a host that takes it (hello's
# ``steps_reset``): one round trip a trace less. False only to measure it (benchmarks/bench_wire_ab.py).
_FOLD_RESET = True


class _Batch:
    """One trace's `steps` runs: the answers not yet handed to the driver, in call order."""

    def __init__(self, trace: Trace, observe: bool, mid_step: bool, flush_ms: float = 0.0) -> None:
        self.trace, self.observe, self.mid_step, self.flush_ms = trace, observe, mid_step, flush_ms
        self.answers: collections.deque[tuple[str, Any]] = collections.deque()
        self.error: WireError | None = None
        self.next_step = 0
        # Steps in the next message: most traces end within the first (the host stops at their
        # end), so a trace costs one round trip; a runner that stops early wastes at most this.
        self.size = _MAX_STEPS_PER_MESSAGE
        self.ended = False
        self.last_snapshot: Snapshot | None = None  # the base of the next snapshot delta
        self.pending: int | None = None  # the id of the `steps` message the host is still answering
