"""kvsched wire protocol v2, host side: a standalone helper for adapter hosts.

This file imports only the standard library and never kvsched, so it runs inside a target's
own virtual environment (which has no kvsched installed). A host script puts this file's
folder on ``sys.path`` (it ships beside the host scripts) and calls `serve` with an engine
object; see docs/PROTOCOL.md for the messages.

The engine object has these methods, all on plain JSON values:

    hello_extra() -> dict                       (optional: name, profiles, capabilities, version...)
    reset(config: dict) -> None
    add_request(request: dict) -> None
    abort_request(request_id: str) -> dict | None
    schedule() -> dict                           (SchedulerOutput shape)
    update(stopped: list[str]) -> list[dict]     ([{request, status}, ...])
    update(stopped, drafts: dict) -> list[dict]  (an engine with ``speculative = True``: the trace's
                                                 draft decisions by seq, docs/PROTOCOL.md)
    snapshot() -> dict                           (Snapshot shape, every field optional; a fresh
                                                  value each call: `steps` diffs it with the last)
    abort_requests(request_ids: list) -> list    (optional: one batched abort, [{request, status}, ...]
                                                  for the ids it aborted; unknown/finished ids skipped)
    reset_prefix_cache() -> bool                 (optional: the engine's admin call)
    pause_new() / pause_all() / resume() -> bool (optional: the engine's pause calls, spec/protocol.py)

An engine that has the optional methods is announced with them in hello's ``optional_calls``; the
runner sends a `steps` Step ``abort_batches`` / ``admin`` only to such a host (docs/PROTOCOL.md).

Protocol 2 adds `steps`, answered here for every engine from the methods above: many steps per
message, called exactly as the runner's driver calls them one by one, each snapshot sent as a
delta on the one before (`_Steps`).

Anything the engine raises becomes ``{"id": n, "error": {"message": ..., "type": ...}}``; the host
stays up and the runner decides what to do. The real stdout is kept for the protocol; file
descriptor 1 is pointed at stderr, so a library that prints (vLLM logs, warnings) cannot corrupt
the stream.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

PROTOCOL_VERSION = 2
OPTIONAL_CALLS = ("abort_requests", "reset_prefix_cache", "pause_new", "pause_all", "resume")  # spec/protocol.py


def protocol_stream():
    """Take the real stdout for the protocol and send everything else written to fd 1 to stderr.
    A host whose engine logs to stdout while it is imported (vLLM 0.29.0 does) calls this before
    that import and hands the stream to `serve`."""
    out_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return os.fdopen(out_fd, "w", buffering=1, encoding="utf-8")


def serve(engine, name: str, profiles=("safety",), capabilities=("output",), stdin=None, stdout=None) -> int:
    out = stdout if stdout is not None else protocol_stream()
    inp = stdin if stdin is not None else sys.stdin
    outbox = _Outbox(_sender(out))
    try:
        return _serve_lines(engine, name, profiles, capabilities, inp, outbox)
    finally:  # a held step line is written even when the host exits by an exception (sys.exit too)
        try:
            outbox.flush()
        except OSError:
            pass


def _serve_lines(engine, name, profiles, capabilities, inp, outbox) -> int:
    send = outbox.send
    steps = _Steps(engine)
    for line in inp:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
            mid, method, params = msg.get("id"), msg["method"], msg.get("params") or {}
        except (ValueError, KeyError, AttributeError) as err:
            send({"id": None, "error": {"message": f"bad request line: {err}", "type": "ProtocolError"}})
            continue
        try:
            if method == "hello":
                result = {"protocol": PROTOCOL_VERSION, "name": name, "profiles": list(profiles),
                          "capabilities": list(capabilities),
                          "optional_calls": [c for c in OPTIONAL_CALLS if callable(getattr(engine, c, None))],
                          "steps_reset": True}  # a `steps` message may carry the trace's reset
                extra = getattr(engine, "hello_extra", None)
                if extra is not None:
                    result.update(extra())
            elif method == "reset":
                steps = _Steps(engine)
                result = engine.reset(params["config"])
            elif method == "steps":
                if params.get("reset") is not None:  # the trace's reset, folded in: a fresh run
                    steps = _Steps(engine)
                outbox.hold(max(0.0, float(params.get("flush_ms") or 0)) / 1000)
                try:
                    result = steps.run(params, lambda line, mid=mid: outbox.put({"id": mid, **line}))
                finally:
                    outbox.hold(0.0)  # the run is over: its closing line goes with every held one
            elif method == "add_request":
                result = engine.add_request(params["request"])
            elif method == "abort_request":
                result = engine.abort_request(params["request_id"])
            elif method == "abort_requests":
                result = engine.abort_requests(list(params["request_ids"]))
            elif method in ("reset_prefix_cache", "pause_new", "pause_all", "resume"):
                result = getattr(engine, method)()
            elif method == "schedule":
                result = engine.schedule()
            elif method == "update":
                if getattr(engine, "speculative", False):
                    result = engine.update(list(params.get("stopped", [])), dict(params.get("drafts") or {}))
                else:
                    result = engine.update(list(params.get("stopped", [])))
            elif method == "snapshot":
                result = engine.snapshot()
            elif method == "shutdown":
                send({"id": mid, "result": None})
                return 0
            else:
                raise ValueError(f"unknown method {method!r}")
        except Exception as err:  # noqa: BLE001 - every engine error goes back to the runner
            send({"id": mid, "error": _error(err)})
            continue
        send({"id": mid, "result": result})
    return 0


# At most this many step lines are held (a host whose steps are fast still streams its lines, so
# the runner checks them while the host runs on: holding a whole fast trace cost nano-vllm more
# wall time than the writes it saved).
_HOLD_LINES = 8
# The watcher's period. A held line past its flush_ms goes out with the next step's line (`put`),
# so the watcher only matters when a step is slow or hangs: it must get the held lines out well
# within the runner's timeout (seconds), not within flush_ms. Polling every flush_ms (1 ms) woke it
# about once a vLLM step, 7-8 µs of the host's CPU a step (BENCHMARKS.md "A faster wire").
_WATCH_S = 0.02
_IDLE_S = 1.0  # after this long without a run the watcher sleeps until the next run wakes it


class _Outbox:
    """The answer lines on their way out. A single call's answer goes at once. In a `steps` run
    (its ``flush_ms``), step lines are held back, up to `_HOLD_LINES` of them, and written
    together (with the closing line when the run ends sooner): each write wakes the runner, and a
    wake-up per step cost more CPU than the step's JSON (BENCHMARKS.md "A faster wire").

    A held line is never lost to a hang or an exception: a watcher thread looks every `_WATCH_S`
    (or ``flush_ms``, if longer) and writes lines held longer than ``flush_ms`` (a step that hangs
    is then pinned to its own step), and `serve` writes them before it exits. The watcher polls
    rather than being woken per batch (a thread wake-up per batch of lines cost a fast host,
    nano-vllm, more than the writes it saved), and sleeps once no run has come for `_IDLE_S`. Only
    a host killed by a signal (a segfault, the OOM killer) can lose held lines; the runner then
    replays the trace with ``flush_ms`` 0 to find the step it dies in (docs/PROTOCOL.md, "Holding
    lines back")."""

    def __init__(self, write_lines) -> None:
        self._write = write_lines
        self._held: list = []
        self._due: float | None = None  # when the held lines are due out
        self._hold = 0.0  # flush_ms of the current steps run, in seconds; 0: no run, write at once
        self._cond = threading.Condition()
        self._watcher: threading.Thread | None = None
        self._idle = False  # the watcher waits for a run (untimed)
        self._last_run = 0.0  # when the last run started

    def send(self, obj) -> None:
        with self._cond:
            self._held.append(obj)
            self._flush()

    def hold(self, seconds: float) -> None:
        """A `steps` run starts (its lines may wait ``seconds``), or ends (0)."""
        with self._cond:
            self._hold = seconds
            if not seconds:
                return
            self._last_run = time.monotonic()
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, daemon=True, name="kvsched-host-outbox")
                self._watcher.start()
            elif self._idle:
                self._cond.notify()  # only a watcher asleep since the last run is woken

    def put(self, obj) -> None:
        with self._cond:
            self._held.append(obj)
            now = time.monotonic()
            if not self._hold or len(self._held) >= _HOLD_LINES or (self._due is not None and now >= self._due):
                self._flush()
            elif self._due is None:
                self._due = now + self._hold

    def flush(self) -> None:
        with self._cond:
            self._flush()

    def _flush(self) -> None:
        if self._held:
            held, self._held = self._held, []
            self._write(held)
        self._due = None

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                if self._due is not None and now >= self._due:
                    self._flush()
                if not self._hold and now - self._last_run > _IDLE_S:
                    self._idle = True
                    self._cond.wait()  # no run for a while
                    self._idle = False
                else:
                    self._cond.wait(max(self._hold, _WATCH_S))


def _sender(out):
    """A function that writes answer lines: on a real file one ``os.write`` for all of them, with
    no text layer and no separate flush."""
    dumps = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
    try:
        fd = out.fileno()
    except (AttributeError, OSError, ValueError):  # a stream in memory (tests, benchmarks)
        fd = None
    if fd is None:
        def write_text(objs: list) -> None:
            out.write("".join(dumps(obj) + "\n" for obj in objs))
            out.flush()

        return write_text
    out.flush()

    def write_lines(objs: list) -> None:
        data = "".join(dumps(obj) + "\n" for obj in objs).encode()
        while data:
            data = data[os.write(fd, data):]

    return write_lines


def _error(err: BaseException) -> dict:
    tb = traceback.extract_tb(err.__traceback__)
    where = f"{os.path.basename(tb[-1].filename)}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""
    return {"message": f"{type(err).__name__}: {err}", "type": type(err).__name__, "where": where}


class _Steps:
    """The `steps` method (protocol 2): run steps of one trace as the runner's driver would call
    them one by one (conformance/runner/driver.py), answering a line per step with every call's result
    in order (``{"id", "calls": [[method, result], ...]}``), then the closing ``{"id", "result":
    {"ended": bool}}``. Per step:

    1. ``add_request`` for each arrival, ``abort_request`` for each abort, ``abort_requests`` for
       each batch, then each admin call (``reset_prefix_cache``, ``pause_new``, ``pause_all``, ``resume``);
    2. ``snapshot`` when ``observe`` and the step did any of that, or is step 0;
    3. ``schedule``; ``snapshot`` when ``observe`` and ``mid_step``;
    4. ``update`` with the step's stopped sequences (and its ``drafts``, for an engine that takes
       them); ``snapshot`` when ``observe``;
    5. stop after a step at or past ``last_arrival_step`` once every request added since
       ``reset`` has finished (``"ended": true``).

    With ``"reset": {"config"}`` (a host that says ``"steps_reset": true`` in hello), the engine
    is reset first, as the `reset` method would; if that raises, the only step line is
    ``{"calls": [], "error": {..., "method": "reset"}}``.

    An engine error ends the run: that step's line holds the calls that succeeded and ``error``
    (with ``method``). A snapshot after the first is sent as a delta on the last one sent (`_delta`)."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.unfinished: set = set()
        self.last: dict | None = None

    def run(self, params: dict, send_line) -> dict:
        observe, mid_step = bool(params.get("observe")), bool(params.get("mid_step"))
        last_arrival = int(params.get("last_arrival_step", 0))
        if params.get("reset") is not None:  # as `reset` would, first; a refusal ends the run
            self.unfinished, self.last = set(), None
            try:
                self.engine.reset(params["reset"]["config"])
            except Exception as err:  # noqa: BLE001 - the runner reports it (config-rejected)
                send_line({"calls": [], "error": {**_error(err), "method": "reset"}})
                return {"ended": False}
        for step in params["steps"]:
            calls: list = []
            try:
                finished = self._step(step, observe, mid_step, calls)
            except _CallFailed as failed:
                send_line({"calls": calls, "error": {**_error(failed.err), "method": failed.method}})
                return {"ended": False}
            send_line({"calls": calls})
            self.unfinished.difference_update(finished)
            pending = getattr(self.engine, "transfers_in_flight", None)  # a KV connector's, still holding blocks
            if step["step"] >= last_arrival and not self.unfinished and not (pending is not None and pending()):
                return {"ended": True}
        return {"ended": False}

    def _step(self, step: dict, observe: bool, mid_step: bool, calls: list) -> list:
        """Run one step's calls into ``calls``; the requests it finished."""
        engine, finished = self.engine, []
        added, aborted = step.get("add") or [], step.get("abort") or []

        def call(method, fn, *args):
            try:
                result = fn(*args)
            except Exception as err:  # noqa: BLE001 - every engine error goes back to the runner
                raise _CallFailed(method, err) from None
            calls.append([method, result])
            return result

        for request in added:
            result = call("add_request", engine.add_request, request)
            self.unfinished.add(request["id"])
            if result:
                finished.append(result["request"])
        for rid in aborted:
            result = call("abort_request", engine.abort_request, rid)
            if result:
                finished.append(result["request"])
        batches, admin = step.get("abort_batches") or [], step.get("admin") or []
        for ids in batches:
            done = call("abort_requests", engine.abort_requests, list(ids))
            finished.extend(d["request"] for d in done or ())
        for op in admin:
            if op not in OPTIONAL_CALLS or op == "abort_requests":
                raise _CallFailed(str(op), ValueError(f"unknown admin call {op!r}"))
            call(op, getattr(engine, op))
        if observe and (added or aborted or batches or admin or step["step"] == 0):
            call("snapshot", self._snapshot)
        call("schedule", engine.schedule)
        if observe and mid_step:
            call("snapshot", self._snapshot)
        if getattr(engine, "speculative", False):  # the step's draft decisions too (docs/PROTOCOL.md)
            done = call("update", engine.update, list(step.get("stopped") or []), dict(step.get("drafts") or {}))
        else:
            done = call("update", engine.update, list(step.get("stopped") or []))
        finished.extend(d["request"] for d in done or ())
        if observe:
            call("snapshot", self._snapshot)
        return finished

    def _snapshot(self) -> dict:
        return self._delta(self.engine.snapshot())

    def _delta(self, snap: dict) -> dict:
        """``snap`` as a delta on the last snapshot sent: ``{"delta": true}`` plus every part that
        differs (``seqs`` and ``statuses`` entry by entry, with ``<part>_gone`` for the entries that
        left), and ``absent`` for the parts that are no longer there."""
        last, self.last = self.last, snap
        if last is None or not isinstance(snap, dict):
            return snap
        out: dict = {"delta": True}
        for key, value in snap.items():
            old = last.get(key)
            if key in ("seqs", "statuses") and isinstance(value, dict) and isinstance(old, dict):
                changed = {k: v for k, v in value.items() if old.get(k) != v}
                gone = [k for k in old if k not in value]
                if changed:
                    out[key] = changed
                if gone:
                    out[f"{key}_gone"] = gone
            elif key not in last or old != value:
                out[key] = value
        absent = [key for key in last if key not in snap]
        if absent:
            out["absent"] = absent
        return out


def token_ids(request_id: str, count: int, start: int = 0) -> list[int]:
    """Deterministic token ids for a request, distinct from other requests' (no accidental prefix
    sharing) and never 0..15 (kept free for special tokens such as EOS)."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return [base + ((start + k) * 104_729) % 900_000 for k in range(count)]


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class _CallFailed(Exception):
    def __init__(self, method: str, err: BaseException) -> None:
        super().__init__(method)
        self.method, self.err = method, err
