"""Traces: the environment's side of a run, as versioned JSON.

A trace fixes everything a scheduler does not choose: the config, which requests arrive at
which step, which are aborted when, and which sequences sample a stop token at which step.
The same trace drives every implementation, so their runs can be compared step for step, and
a failing run is saved as a trace that ``kvsched replay`` runs again.

Format (version 1)::

    {"version": 1,
     "config": {"block_size": 16, ...},
     "requests": [{"id": "A", "prompt_len": 200, "max_tokens": 4, "n": 1,
                   "priority": 0, "arrival_step": 0}],    # optional: "prompt_tokens": [ids]
     "aborts": [{"step": 3, "request": "A"}],
     "stops": [{"step": 2, "seq": "A#0"}],
     "max_steps": 200,
     "meta": {}}

Optional (left out when empty, so older traces read and write unchanged): ``"drafts":
[{"step": 2, "seq": "A#0", "accepted": 1, "proposed": 3, "stop_at": 0, "empty": false}]``,
speculative decoding's per-step decisions (`spec.speculative.DraftDecision`; only a config with
``num_speculative_tokens`` > 0 reads them).

Also optional, left out when empty (issue 21): ``"abort_batches": [{"step": 3, "requests": ["A",
"B", "X"]}]``, one abort call naming a list of ids (vLLM's ``EngineCore.abort_requests``); ids
that are unknown or already finished are skipped, the others are aborted as by single aborts. And
``"admin": [{"step": 5, "op": "reset_prefix_cache"}]``, engine admin calls (`ADMIN_OPS`):
``reset_prefix_cache`` empties the prefix cache's hash map if no block is in use and refuses
(answers false) otherwise (vLLM's ``Scheduler.reset_prefix_cache()`` without
``reset_running_requests``). ``pause_new`` stops admissions from waiting, ``pause_all`` stops all
scheduling, ``resume`` undoes either (vLLM's ``PauseState``); each answers true. Within a step: arrivals, aborts, abort batches, admin calls, then
``schedule()``.

A request may be a streaming-input session (issue 32, spec/session.py): ``"session": {"version": 1,
"inputs": [{"step": 5, "prompt_len": 3, "max_tokens": 2}]}`` on the request, its later inputs,
each taken up before that step's ``schedule()`` once the session's generation so far is done
(version 2: a piece may carry ``encoder_inputs``, positions within the piece). Left out for a
plain request.

A trace whose config has ``kv_connector`` may carry ``"connector": {"version": 1, "requests":
[{"request": "A", "external_tokens": 32, "load_async": true, "load_steps": 2, "failed_blocks": [1],
"send_steps": 3}]}``, the KV connector's script per request (`spec.connector.ConnectorScript`;
a request not named gets none of it: nothing external, no delayed free). Left out when empty.

A pipelined trace (``config.pipeline_depth`` d > 0, docs/ASYNC.md) also carries
``"pipeline": {"version": 1, "depth": d}``, so that a reader of the file knows the outcomes lag:
a stop at step N is the sample of step N (the outcome belongs to step N), and the engine processes
it, and reports the finish, in step N + d. The field is written only when d > 0 (older traces and
synchronous ones are unchanged); when present, its depth must equal the config's.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spec.config import MAX_SEQS, MAX_SPECULATIVE_TOKENS, MAX_TOKENS, SchedulerConfig
from spec.connector import NO_SCRIPT, ConnectorScript, scripts_from_dict, scripts_to_dict
from spec.encoder import EncoderInput
from spec.errors import InputError, shown
from spec.json_input import read_json
from spec.session import session_from_dict
from spec.speculative import NO_DECISION, DraftDecision
from spec.types import Request

TRACE_VERSION = 1
PIPELINE_VERSION = 1  # of the optional "pipeline" field
# Every engine loop runs up to max_steps steps and the checker looks at each: 10**5 steps is
# minutes of reference time, 10**9 would be days, so a larger value is a mistake, refused up
# front rather than discovered as a hang. The other limits keep one trace to what a real
# workload replay holds, with every message still one line.
MAX_STEPS = 100_000
MAX_REQUESTS = 100_000
MAX_ID_CHARS = 200
MAX_PRIORITY = 2**31
# Engine admin calls a trace may make between steps. pause_new / pause_all / resume: vLLM 0.33.0's
# Scheduler.set_pause_state(PauseState.PAUSED_NEW / PAUSED_ALL / UNPAUSED) (issue 32; spec/protocol.py).
ADMIN_OPS = ("reset_prefix_cache", "pause_new", "pause_all", "resume")
MAX_BATCH = 1000  # ids in one batched abort


@dataclass(frozen=True)
class Arrival:
    step: int
    request: Request


@dataclass(frozen=True)
class Trace:
    config: SchedulerConfig
    arrivals: tuple[Arrival, ...] = ()
    aborts: tuple[tuple[int, str], ...] = ()  # (step, request id), applied before schedule()
    stops: tuple[tuple[int, str], ...] = ()  # (step, seq id), applied to that step's outcome
    max_steps: int = 1000
    meta: Mapping[str, Any] = field(default_factory=dict)
    drafts: tuple[tuple[int, str, DraftDecision], ...] = ()  # (step, seq id, decision): spec/speculative.py
    abort_batches: tuple[tuple[int, tuple[str, ...]], ...] = ()  # (step, ids): one batched abort call
    admin: tuple[tuple[int, str], ...] = ()  # (step, op in ADMIN_OPS), after the aborts, before schedule()
    connector: Mapping[str, ConnectorScript] = field(default_factory=dict)  # request id -> script (spec/connector.py)

    def __post_init__(self) -> None:
        index: dict[int, list[Request]] = defaultdict(list)
        for a in self.arrivals:
            index[a.step].append(a.request)
        abort_index: dict[int, list[str]] = defaultdict(list)
        for step, rid in self.aborts:
            abort_index[step].append(rid)
        stop_index: dict[int, set[str]] = defaultdict(set)
        for step, sid in self.stops:
            stop_index[step].add(sid)
        object.__setattr__(self, "_arrivals", dict(index))
        object.__setattr__(self, "_aborts", dict(abort_index))
        object.__setattr__(self, "_stops", {k: frozenset(v) for k, v in stop_index.items()})
        draft_index: dict[int, dict[str, DraftDecision]] = defaultdict(dict)
        for step, sid, decision in self.drafts:
            draft_index[step][sid] = decision
        object.__setattr__(self, "_drafts", dict(draft_index))
        batch_index: dict[int, list[tuple[str, ...]]] = defaultdict(list)
        for step, ids in self.abort_batches:
            batch_index[step].append(tuple(ids))
        admin_index: dict[int, list[str]] = defaultdict(list)
        for step, op in self.admin:
            admin_index[step].append(op)
        object.__setattr__(self, "_batches", dict(batch_index))
        object.__setattr__(self, "_admin", dict(admin_index))
        # Every engine loop asks for it after every step; a scan of the arrivals each time made a
        # 300-request trace's loop quadratic.
        object.__setattr__(self, "_last_arrival_step", max((a.step for a in self.arrivals), default=0))

    # -- queries used by every driver ---------------------------------------------------------
    def arrivals_at(self, step: int) -> list[Request]:
        return self._arrivals.get(step, [])  # type: ignore[attr-defined]

    def aborts_at(self, step: int) -> list[str]:
        return self._aborts.get(step, [])  # type: ignore[attr-defined]

    def abort_batches_at(self, step: int) -> list[tuple[str, ...]]:
        return self._batches.get(step, [])  # type: ignore[attr-defined]

    def admin_at(self, step: int) -> list[str]:
        return self._admin.get(step, [])  # type: ignore[attr-defined]

    def stops_at(self, step: int) -> frozenset[str]:
        return self._stops.get(step, frozenset())  # type: ignore[attr-defined]

    def drafts_at(self, step: int) -> Mapping[str, DraftDecision]:
        """The step's speculative decisions by sequence; a sequence not named gets `NO_DECISION`."""
        return self._drafts.get(step, _NO_DRAFTS)  # type: ignore[attr-defined]

    def connector_script(self, request_id: str) -> ConnectorScript:
        """The KV connector's script for a request (`spec.connector.NO_SCRIPT` when not named)."""
        return self.connector.get(request_id, NO_SCRIPT)

    @property
    def last_arrival_step(self) -> int:
        return self._last_arrival_step  # type: ignore[attr-defined]

    @property
    def requests(self) -> list[Request]:
        return [a.request for a in self.arrivals]

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = {
            "version": TRACE_VERSION,
            "config": self.config.to_dict(),
            "requests": [{**a.request.to_dict(), "arrival_step": a.step} for a in self.arrivals],
            "aborts": [{"step": s, "request": r} for s, r in self.aborts],
            "stops": [{"step": s, "seq": q} for s, q in self.stops],
            "max_steps": self.max_steps,
            "meta": dict(self.meta),
            **({"drafts": [{"step": s, "seq": q, **d.to_dict()} for s, q, d in self.drafts]} if self.drafts else {}),
            **({"abort_batches": [{"step": s, "requests": list(ids)} for s, ids in self.abort_batches]}
               if self.abort_batches else {}),
            **({"admin": [{"step": s, "op": op} for s, op in self.admin]} if self.admin else {}),
            **({"connector": scripts_to_dict(self.connector)} if self.connector else {}),
        }
        if self.config.pipeline_depth:
            data["pipeline"] = {"version": PIPELINE_VERSION, "depth": self.config.pipeline_depth}
        return data

    def outcome_step(self, step: int) -> int | None:
        """The step whose outcome (sampled tokens, stops) the engine processes in ``step``'s
        update: ``step - pipeline_depth``, None while the pipeline fills."""
        of = step - self.config.pipeline_depth
        return of if of >= 0 else None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def save(self, path: str | Path, *, no_links: bool = False) -> Path:
        """Write the trace whole or not at all: a temporary file beside ``path``, then a rename,
        so that a run interrupted mid-write (Ctrl-C, SIGTERM) or a reader polling for the file
        never sees half a trace, and an earlier trace at ``path`` survives a failed write.
        ``no_links``: ``path`` is absolute and no folder on it, nor the name, is followed if it is
        a link (`spec.safe_write`: a folder the code under test can reach)."""
        path = Path(path)
        if no_links:
            from spec.safe_write import write_no_links

            return write_no_links(path, (self.to_json() + "\n").encode())
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_json() + "\n"
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def from_dict(cls, data: Any) -> Trace:
        if not isinstance(data, Mapping):
            raise InputError("trace", "must be a JSON object")
        version = data.get("version")
        if type(version) is not int or version != TRACE_VERSION:  # true == 1 and 1.0 == 1 in Python
            raise InputError("version", f"must be {TRACE_VERSION}, got {shown(version)}")
        known = {"version", "config", "requests", "aborts", "stops", "max_steps", "meta", "pipeline", "drafts",
                 "abort_batches", "admin", "connector"}
        for key in data:
            if key not in known:
                raise InputError(str(key)[:40], f"unknown field (known: {', '.join(sorted(known))})")
        config = SchedulerConfig.from_dict(data.get("config", {}))
        if "pipeline" in data:
            _pipeline(data["pipeline"], config)
        requests = _list(data, "requests")
        if len(requests) > MAX_REQUESTS:
            raise InputError("requests", f"has {len(requests)} requests, more than the {MAX_REQUESTS} a trace may have")
        arrivals = []
        seen: set[str] = set()
        for i, raw in enumerate(requests):
            where = f"requests[{i}]"
            if not isinstance(raw, Mapping):
                raise InputError(where, "must be an object")
            allowed = {"id", "prompt_len", "max_tokens", "n", "priority", "arrival_step", "prompt_tokens",
                       "encoder_inputs", "lora_id", "grammar_ready_step", "session"}
            for key in raw:
                if key not in allowed:
                    raise InputError(f"{where}.{str(key)[:40]}", f"unknown field (known: {', '.join(sorted(allowed))})")
            if "id" not in raw or "prompt_len" not in raw:
                raise InputError(where, "needs 'id' and 'prompt_len'")
            _str(raw["id"], f"{where}.id")
            step = _int(raw.get("arrival_step", 0), f"{where}.arrival_step", 0, MAX_STEPS)
            _int(raw["prompt_len"], f"{where}.prompt_len", 1, MAX_TOKENS)
            _int(raw.get("max_tokens", 16), f"{where}.max_tokens", 1, MAX_TOKENS)
            _int(raw.get("n", 1), f"{where}.n", 1, MAX_SEQS)
            _int(raw.get("priority", 0), f"{where}.priority", -MAX_PRIORITY, MAX_PRIORITY)
            encoder_inputs = _encoder_inputs(raw, config, where)
            lora_id = _int(raw.get("lora_id", 0), f"{where}.lora_id", 0, MAX_PRIORITY)
            if lora_id and not config.max_loras:
                raise InputError(f"{where}.lora_id", f"needs config.max_loras > 0, got lora_id {lora_id}")
            session = session_from_dict(raw["session"], f"{where}.session", MAX_STEPS, MAX_TOKENS) \
                if "session" in raw else ()
            for i, piece in enumerate(session):  # a piece's encoder inputs: as a request's (`_encoder_inputs`)
                _encoder_inputs({"encoder_inputs": [e.to_dict() for e in piece.encoder_inputs]}, config,
                                f"{where}.session.inputs[{i}]")
            try:
                request = Request(
                    request_id=raw["id"],
                    prompt_len=raw["prompt_len"],
                    max_tokens=raw.get("max_tokens", 16),
                    n=raw.get("n", 1),
                    priority=raw.get("priority", 0),
                    prompt_tokens=raw.get("prompt_tokens"),
                    encoder_inputs=encoder_inputs,
                    lora_id=lora_id,
                    grammar_ready_step=_int(raw["grammar_ready_step"], f"{where}.grammar_ready_step", 0, MAX_STEPS)
                    if raw.get("grammar_ready_step") is not None else None,
                    session=session,
                )
            except InputError as err:
                field_name = err.where.rsplit(".", 1)[-1]
                raise InputError(f"{where}.{field_name}", err.message) from None
            if request.request_id in seen:
                raise InputError(f"{where}.id", f"duplicate request id {request.request_id!r}")
            if config.kv_connector:
                _not_beside_a_connector(raw, where)
            seen.add(request.request_id)
            arrivals.append(Arrival(step, request))
        arrivals.sort(key=lambda a: a.step)  # stable: same-step arrivals keep file order
        aborts = []
        for i, raw in enumerate(_list(data, "aborts")):
            where = f"aborts[{i}]"
            if not isinstance(raw, Mapping) or "step" not in raw or "request" not in raw:
                raise InputError(where, "must be an object with 'step' and 'request'")
            aborts.append((_int(raw["step"], f"{where}.step", 0, MAX_STEPS), _str(raw["request"], f"{where}.request")))
        stops = []
        for i, raw in enumerate(_list(data, "stops")):
            where = f"stops[{i}]"
            if not isinstance(raw, Mapping) or "step" not in raw or "seq" not in raw:
                raise InputError(where, "must be an object with 'step' and 'seq'")
            stops.append((_int(raw["step"], f"{where}.step", 0, MAX_STEPS), _str(raw["seq"], f"{where}.seq")))
        max_steps = _int(data.get("max_steps", 1000), "max_steps", 1, MAX_STEPS)
        meta = data.get("meta", {})
        if not isinstance(meta, Mapping):
            raise InputError("meta", "must be an object")
        drafts = tuple(_draft(raw, f"drafts[{i}]") for i, raw in enumerate(_list(data, "drafts")))
        batches = tuple(_batch(raw, f"abort_batches[{i}]") for i, raw in enumerate(_list(data, "abort_batches")))
        admin = tuple(_admin(raw, f"admin[{i}]") for i, raw in enumerate(_list(data, "admin")))
        connector = (scripts_from_dict(data["connector"], seen, config.kv_connector) if "connector" in data else {})
        return cls(config, tuple(arrivals), tuple(aborts), tuple(stops), max_steps, dict(meta), drafts, batches, admin,
                   connector)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file through `spec.json_input.read_json` (size, encoding, depth and number
        limits); every error names the file and then the field."""
        path = Path(path)
        data = read_json(path)
        try:
            return cls.from_dict(data)
        except InputError as err:
            raise InputError(f"{path}: {err.where}", err.message) from None


_NO_DRAFTS: Mapping[str, DraftDecision] = {}
assert NO_DECISION == DraftDecision()  # what a sequence not named in ``drafts`` gets


def _draft(raw: Any, where: str) -> tuple[int, str, DraftDecision]:
    """``{"step", "seq"[, "accepted", "proposed", "stop_at", "empty"]}`` -> (step, seq, decision)."""
    if not isinstance(raw, Mapping) or "step" not in raw or "seq" not in raw:
        raise InputError(where, "must be an object with 'step' and 'seq'")
    allowed = {"step", "seq", "accepted", "proposed", "stop_at", "empty"}
    for key in raw:
        if key not in allowed:
            raise InputError(f"{where}.{str(key)[:40]}", f"unknown field (known: {', '.join(sorted(allowed))})")
    step = _int(raw["step"], f"{where}.step", 0, MAX_STEPS)
    seq = _str(raw["seq"], f"{where}.seq")
    accepted = _int(raw.get("accepted", 0), f"{where}.accepted", 0, MAX_SPECULATIVE_TOKENS)
    proposed = raw.get("proposed")
    if proposed is not None:
        proposed = _int(proposed, f"{where}.proposed", 0, MAX_SPECULATIVE_TOKENS)
    stop_at = raw.get("stop_at")
    if stop_at is not None:
        stop_at = _int(stop_at, f"{where}.stop_at", 0, MAX_SPECULATIVE_TOKENS)
    empty = raw.get("empty", False)
    if not isinstance(empty, bool):
        raise InputError(f"{where}.empty", f"must be true or false, got {shown(empty)}")
    return step, seq, DraftDecision(proposed, accepted, stop_at, empty)


# What a request may carry that the KV connector's waiting pass does not model (reference_impl/
# kv_connector.py ``_kv_admit`` has no session, grammar, adapter or encoder waits): refused beside
# config.kv_connector rather than checked against a reference that ignores it.
_NOT_WITH_A_CONNECTOR = ("session", "grammar_ready_step", "lora_id", "encoder_inputs")


def _not_beside_a_connector(raw: Mapping[str, Any], where: str) -> None:
    for name in _NOT_WITH_A_CONNECTOR:
        if raw.get(name) not in (None, 0, [], {}):
            raise InputError(f"{where}.{name}", "is not modelled together with config.kv_connector (the connector's "
                             "waiting pass has no session, grammar, adapter or encoder waits)")


def _encoder_inputs(raw: Mapping[str, Any], config: SchedulerConfig, where: str) -> tuple[EncoderInput, ...]:
    """A request's optional ``encoder_inputs`` (spec/encoder.py). The config must have an encoder,
    and each input must fit one step's encoder budget and the cache (vLLM sizes both to the largest
    item, ``compute_mm_encoder_budget``; a larger one could never be computed)."""
    items = raw.get("encoder_inputs", [])
    if not isinstance(items, list):
        raise InputError(f"{where}.encoder_inputs", "must be a list")
    if items and not config.encoder_cache_size:
        raise InputError(f"{where}.encoder_inputs", "needs config.encoder_cache_size and encoder_compute_budget > 0")
    limit = min(config.encoder_compute_budget, config.encoder_cache_size)
    out = []
    for j, item in enumerate(items):
        parsed = EncoderInput.from_dict(item, f"{where}.encoder_inputs[{j}]")
        if parsed.length > limit:
            raise InputError(f"{where}.encoder_inputs[{j}].length", f"must be at most {limit} (the encoder budget "
                             f"and cache size), got {parsed.length}")
        out.append(parsed)
    return tuple(out)


def _batch(raw: Any, where: str) -> tuple[int, tuple[str, ...]]:
    """``{"step", "requests": [id, ...]}`` -> (step, ids): one batched abort."""
    if not isinstance(raw, Mapping) or "step" not in raw or "requests" not in raw:
        raise InputError(where, "must be an object with 'step' and 'requests'")
    for key in raw:
        if key not in ("step", "requests"):
            raise InputError(f"{where}.{str(key)[:40]}", "unknown field (known: requests, step)")
    ids = raw["requests"]
    if not isinstance(ids, list) or not ids or len(ids) > MAX_BATCH:
        raise InputError(f"{where}.requests", f"must be a list of 1 to {MAX_BATCH} request ids")
    return (_int(raw["step"], f"{where}.step", 0, MAX_STEPS),
            tuple(_str(rid, f"{where}.requests[{j}]") for j, rid in enumerate(ids)))


def _admin(raw: Any, where: str) -> tuple[int, str]:
    """``{"step", "op"}`` -> (step, op): one engine admin call."""
    if not isinstance(raw, Mapping) or "step" not in raw or "op" not in raw:
        raise InputError(where, "must be an object with 'step' and 'op'")
    for key in raw:
        if key not in ("step", "op"):
            raise InputError(f"{where}.{str(key)[:40]}", "unknown field (known: op, step)")
    if raw["op"] not in ADMIN_OPS:
        raise InputError(f"{where}.op", f"must be one of {', '.join(ADMIN_OPS)}, got {shown(raw['op'])}")
    return _int(raw["step"], f"{where}.step", 0, MAX_STEPS), raw["op"]


def _pipeline(value: Any, config: SchedulerConfig) -> None:
    """Check the optional ``pipeline`` field against the config (it only restates the depth)."""
    if not isinstance(value, Mapping):
        raise InputError("pipeline", "must be an object {version, depth}")
    version = value.get("version")
    if type(version) is not int or version != PIPELINE_VERSION:
        raise InputError("pipeline.version", f"must be {PIPELINE_VERSION}, got {shown(version)}")
    for key in value:
        if key not in ("version", "depth"):
            raise InputError(f"pipeline.{str(key)[:40]}", "unknown field (known: depth, version)")
    depth = value.get("depth")
    if type(depth) is not int or depth != config.pipeline_depth:
        raise InputError("pipeline.depth", f"must equal config.pipeline_depth ({config.pipeline_depth}), got {shown(depth)}")


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise InputError(key, "must be a list")
    return value


def _int(value: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(where, f"must be an integer >= {minimum}, got {shown(value)}")
    if value > maximum:
        raise InputError(where, f"must be at most {maximum}, got {shown(value)}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise InputError(where, f"must be a non-empty string, got {shown(value)}")
    if len(value) > MAX_ID_CHARS:
        raise InputError(where, f"must be at most {MAX_ID_CHARS} characters, got {len(value)}")
    return value
