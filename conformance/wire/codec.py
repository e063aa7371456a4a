"""JSON codec for the wire protocol: the spec's values <-> plain JSON (docs/PROTOCOL.md).

Every decoder checks shapes and raises `WireError` naming the field, so a host that sends
something malformed is reported as such and never crashes the runner.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spec import observation
from spec.config import SchedulerConfig
from spec.connector import KV_TRANSFERS_VERSION, TransferView
from spec.encoder import EncoderEntry
from spec.observation import GROUP_TABLES_VERSION, IN_FLIGHT_VERSION, InFlightView, SeqView, Snapshot
from spec.reasons import Reason
from spec.status import Status
from spec.types import Finished, Request, SchedulerOutput


class WireError(Exception):
    """A host broke the protocol (bad JSON, wrong shape, unknown status), died, or hung; or the
    engine raised inside the host, ``location`` then being where (the host's ``file:line in fn``),
    so that a fault is placed in the engine's code, not in the wire client."""

    def __init__(self, message: str, location: str | None = None) -> None:
        super().__init__(message)
        self.location = location

    # What the guard reports this as (`conformance.runner.guard.fault_from`): an engine's exception and bad
    # JSON are ``raised``; `HostDied` says ``exit`` for an exit and ``crash`` for a signal; a reset that failed
    # inside a later message is ``config-rejected`` (conformance/wire/client.py `_rejected`).
    fault_kind = "raised"
    fault_call: str | None = None  # the call that failed, when not the one the driver made (a folded reset)
    # True when the runner cannot tell at which step this happened (a host killed while it held
    # step lines): the driver then replays the trace with each line written at once.
    step_uncertain = False


class HostDied(WireError):
    """The host process ended without answering. ``returncode``: its exit status, negative for the
    signal that killed it (a segfault in an engine's C code, the OOM killer), which is a
    ``crash`` like an isolated adapter's process killed by one (conformance/runner/isolated.py); an
    exit, whatever its code, is an ``exit``, as an isolated adapter's is. ``step_uncertain``: it died during a `steps` run
    whose lines it was allowed to hold (``flush_ms`` > 0), so the lines of its last steps may be
    lost with it."""

    def __init__(self, message: str, returncode: int | None, step_uncertain: bool = False) -> None:
        super().__init__(message)
        self.returncode = returncode
        self.step_uncertain = step_uncertain
        if returncode is not None:
            self.fault_kind = "crash" if returncode < 0 else "exit"


def config_to_json(config: SchedulerConfig) -> dict[str, Any]:
    return config.to_dict()


def request_to_json(request: Request) -> dict[str, Any]:
    return request.to_dict()


def output_from_json(data: Any) -> SchedulerOutput:
    if not isinstance(data, Mapping):
        raise WireError(f"schedule: result must be an object, got {type(data).__name__}")
    try:
        return SchedulerOutput.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise WireError(f"schedule: malformed SchedulerOutput ({type(err).__name__}: {err})") from None


def _status(value: Any, where: str) -> Status:
    try:
        return Status(value)
    except ValueError:
        raise WireError(f"{where}: unknown status {value!r}") from None


def finished_from_json(data: Any, where: str) -> Finished:
    if not isinstance(data, Mapping) or not isinstance(data.get("request"), str):
        raise WireError(f"{where}: expected {{request, status}}, got {data!r}")
    return Finished(data["request"], _status(data.get("status"), f"{where}.status"),
                    _reason(data.get("reason"), data["request"], f"{where}.reason"))


def _reason(value: Any, request_id: str, where: str) -> Reason | None:
    """An optional ``{"kind": str, "numbers": {name: int or str}}`` (spec.reasons): an engine that
    ends a request on its own says why with ``{"kind": "engine_error", "numbers": {"error": ...}}``."""
    if value is None:
        return None
    numbers = value.get("numbers", {}) if isinstance(value, Mapping) else None
    if not isinstance(value, Mapping) or not isinstance(value.get("kind"), str) or not isinstance(numbers, Mapping) \
            or not all(isinstance(k, str) and isinstance(v, (int, str)) and not isinstance(v, bool)
                       for k, v in numbers.items()):
        raise WireError(f"{where}: expected {{kind: str, numbers: {{name: int or str}}}}, got {value!r}")
    return Reason(value["kind"], request_id, tuple(sorted(numbers.items())))


def finished_list_from_json(data: Any, where: str) -> list[Finished]:
    if not isinstance(data, list):
        raise WireError(f"{where}: expected a list of finished requests, got {type(data).__name__}")
    return [finished_from_json(item, f"{where}[{i}]") for i, item in enumerate(data)]


def snapshot_to_json(snap: Snapshot) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if snap.statuses is not None:
        out["statuses"] = {rid: s.value for rid, s in snap.statuses.items()}
    if snap.seqs is not None:
        out["seqs"] = {
            sid: {"request": v.request_id, "status": v.status.value, "num_tokens": v.num_tokens,
                  "num_computed": v.num_computed, "blocks": None if v.blocks is None else list(v.blocks),
                  "device": v.device}
            for sid, v in snap.seqs.items()
        }
    for name in ("waiting", "running", "swapped", "gpu_ref_counts", "cpu_ref_counts", "gpu_free_ids", "cpu_free_ids"):
        value = getattr(snap, name)
        if value is not None:
            out[name] = list(value)
    for name in ("gpu_free", "cpu_free"):
        value = getattr(snap, name)
        if value is not None:
            out[name] = value
    if snap.gpu_block_keys is not None:
        out["gpu_block_keys"] = list(snap.gpu_block_keys)
    if snap.gpu_fenced is not None:
        out["gpu_fenced"] = list(snap.gpu_fenced)
    if snap.gpu_cache_holds is not None:
        out["gpu_cache_holds"] = list(snap.gpu_cache_holds)
    if snap.in_flight is not None:
        out["in_flight"] = {"version": IN_FLIGHT_VERSION,
                            "seqs": {sid: v._asdict() for sid, v in snap.in_flight.items()}}
    if snap.group_tables is not None:
        out["group_tables"] = {"version": GROUP_TABLES_VERSION,
                               "seqs": {sid: [list(t) for t in tables] for sid, tables in snap.group_tables.items()}}
    for name in ("kv_transfers", "kv_reported"):
        transfers = getattr(snap, name)
        if transfers is not None:
            out[name] = {"version": KV_TRANSFERS_VERSION,
                         "transfers": {rid: {**t._asdict(), "blocks": list(t.blocks), "failed": list(t.failed)}
                                       for rid, t in transfers.items()}}
    if snap.encoder_cache is not None:
        out["encoder_cache"] = {"version": ENCODER_CACHE_VERSION,
                                "entries": {h: {"size": e.size, "users": sorted(e.users)}
                                            for h, e in snap.encoder_cache.items()}}
    for name in ("encoder_free", "pause_state"):
        if getattr(snap, name) is not None:
            out[name] = getattr(snap, name)
    return out


ENCODER_CACHE_VERSION = 1


def _encoder_cache(value: Any) -> dict[str, EncoderEntry] | None:
    """``{"version": 1, "entries": {hash: {"size": n, "users": [request, ...]}}}`` (Capability.ENCODER)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("version") != ENCODER_CACHE_VERSION:
        raise WireError(f"snapshot.encoder_cache.version: expected {ENCODER_CACHE_VERSION}, got "
                        f"{value.get('version') if isinstance(value, Mapping) else value!r}")
    entries = value.get("entries")
    if not isinstance(entries, Mapping):
        raise WireError("snapshot.encoder_cache.entries: expected an object")
    out = {}
    for digest, entry in entries.items():
        where = f"encoder_cache.entries.{digest}"
        if not isinstance(entry, Mapping):
            raise WireError(f"snapshot.{where}: expected {{size, users}}")
        size = _opt_int(entry.get("size"), f"{where}.size")
        if size is None:
            raise WireError(f"snapshot.{where}.size: expected an integer")
        out[str(digest)] = EncoderEntry(size, frozenset(_strs(entry.get("users", []), f"{where}.users") or ()))
    return out


def _pause_state(value: Any, _name: str) -> str | None:
    if value is None:
        return None
    if value not in observation.PAUSE_STATES:
        raise WireError(f"snapshot.pause_state: expected one of {', '.join(observation.PAUSE_STATES)}, got {value!r}")
    return value


def _group_tables(value: Any) -> dict[str, tuple[tuple[int, ...], ...]] | None:
    """``{"version": 1, "seqs": {seq: [[block or -1, ...], ...]}}``: the tables of KV cache groups
    1 .. n-1 per sequence (docs/PROTOCOL.md, spec/kv_groups.py)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("version") != GROUP_TABLES_VERSION:
        raise WireError(f"snapshot.group_tables.version: expected {GROUP_TABLES_VERSION}, got "
                        f"{value.get('version') if isinstance(value, Mapping) else value!r}")
    seqs = value.get("seqs")
    if not isinstance(seqs, Mapping):
        raise WireError("snapshot.group_tables.seqs: expected an object")
    out = {}
    for sid, tables in seqs.items():
        if type(tables) is not list:
            raise WireError(f"snapshot.group_tables.seqs.{sid}: expected a list of tables")
        out[str(sid)] = tuple(_ints(t, f"group_tables.seqs.{sid}[{i}]") or () for i, t in enumerate(tables))
    return out


def _in_flight(value: Any) -> dict[str, InFlightView] | None:
    """``{"version": 1, "seqs": {seq: {placeholders, in_flight_tokens, stale}}}`` (docs/PROTOCOL.md).
    Negative counts are well formed: they are what PIP-003 reports."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("version") != IN_FLIGHT_VERSION:
        raise WireError(f"snapshot.in_flight.version: expected {IN_FLIGHT_VERSION}, got "
                        f"{value.get('version') if isinstance(value, Mapping) else value!r}")
    seqs = value.get("seqs")
    if not isinstance(seqs, Mapping):
        raise WireError("snapshot.in_flight.seqs: expected an object")
    out = {}
    for sid, counters in seqs.items():
        where = f"in_flight.seqs.{sid}"
        if not isinstance(counters, Mapping):
            raise WireError(f"snapshot.{where}: expected an object")
        if any(counters.get(name) is None for name in InFlightView._fields):
            raise WireError(f"snapshot.{where}: expected {', '.join(InFlightView._fields)}")
        out[str(sid)] = InFlightView(*(_opt_int(counters[name], f"{where}.{name}") for name in InFlightView._fields))
    return out


# The element checks below look at a whole list's types at once (``set(map(type, ...))``, C speed):
# a per-element generator cost more than the JSON decode of a pool's reference counts. JSON gives
# exact types (``bool`` is not ``int`` here, so ``true`` is refused as a count).
_INT, _STR, _KEY = frozenset({int}), frozenset({str}), frozenset({str, type(None)})


def _ints(value: Any, where: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if type(value) is not list or not set(map(type, value)) <= _INT:
        raise WireError(f"snapshot.{where}: expected a list of integers")
    return tuple(value)


def _strs(value: Any, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if type(value) is not list or not set(map(type, value)) <= _STR:
        raise WireError(f"snapshot.{where}: expected a list of request ids")
    return tuple(value)


def _keys(value: Any, where: str) -> tuple[str | None, ...] | None:
    if value is None:
        return None
    if type(value) is not list or not set(map(type, value)) <= _KEY:
        raise WireError(f"snapshot.{where}: expected a list of strings or nulls")
    return tuple(value)


def _opt_int(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"snapshot.{where}: expected an integer, got {value!r}")
    return value


def _statuses_from_json(raw: Any) -> dict[str, Status]:
    if not isinstance(raw, Mapping):
        raise WireError("snapshot.statuses: expected an object")
    return {str(rid): _status(s, f"snapshot.statuses.{rid}") for rid, s in raw.items()}


def _seqs_from_json(raw: Any) -> dict[str, SeqView]:
    if not isinstance(raw, Mapping):
        raise WireError("snapshot.seqs: expected an object")
    seqs = {}
    for sid, v in raw.items():
        where = f"seqs.{sid}"
        if not isinstance(v, Mapping):
            raise WireError(f"snapshot.{where}: expected an object")
        device = v.get("device")
        if device not in (None, "gpu", "cpu"):
            raise WireError(f"snapshot.{where}.device: expected gpu, cpu or null, got {device!r}")
        seqs[str(sid)] = SeqView(
            str(sid), str(v.get("request", str(sid).rsplit("#", 1)[0])),
            _status(v.get("status"), f"snapshot.{where}.status"),
            _opt_int(v.get("num_tokens"), f"{where}.num_tokens"),
            _opt_int(v.get("num_computed"), f"{where}.num_computed"),
            _ints(v.get("blocks"), f"{where}.blocks"), device,
        )
    return seqs


def _kv_transfers(value: Any, name: str) -> dict[str, TransferView] | None:
    """``{"version": 1, "transfers": {request: {kind, blocks, tokens, load_async, failed}}}`` (spec/connector.py)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("version") != KV_TRANSFERS_VERSION:
        raise WireError(f"snapshot.{name}.version: expected {KV_TRANSFERS_VERSION}, got "
                        f"{value.get('version') if isinstance(value, Mapping) else value!r}")
    transfers = value.get("transfers")
    if not isinstance(transfers, Mapping):
        raise WireError(f"snapshot.{name}.transfers: expected an object")
    out = {}
    for rid, t in transfers.items():
        where = f"{name}.transfers.{rid}"
        if not isinstance(t, Mapping) or t.get("kind") not in ("load", "send"):
            raise WireError(f"snapshot.{where}: expected an object with kind load or send")
        out[str(rid)] = TransferView(t["kind"], _ints(t.get("blocks"), f"{where}.blocks") or (),
                                     _opt_int(t.get("tokens", 0), f"{where}.tokens") or 0,
                                     bool(t.get("load_async", False)), _ints(t.get("failed"), f"{where}.failed") or ())
    return out


# Each part besides statuses and seqs: its decoder.
_PARTS = {
    "waiting": _strs, "running": _strs, "swapped": _strs,
    "gpu_ref_counts": _ints, "cpu_ref_counts": _ints, "gpu_free": _opt_int, "cpu_free": _opt_int,
    "gpu_free_ids": _ints, "cpu_free_ids": _ints, "gpu_block_keys": _keys,
    "in_flight": lambda value, _name: _in_flight(value), "gpu_fenced": _ints,
    "gpu_cache_holds": _ints,
    "group_tables": lambda value, _name: _group_tables(value),
    "kv_transfers": _kv_transfers, "kv_reported": _kv_transfers,
    # issue 32: the encoder cache and the pause state
    "encoder_cache": lambda value, _name: _encoder_cache(value), "encoder_free": _opt_int,
    "pause_state": _pause_state,
}


def snapshot_from_json(data: Any, previous: Snapshot | None = None) -> Snapshot:
    """A whole snapshot, or (protocol 2, ``{"delta": true, ...}``) one given as the parts that
    differ from ``previous``, the snapshot decoded just before it in the same `steps` run: every
    part the delta leaves out is ``previous``'s own object, and ``seqs`` / ``statuses`` are
    ``previous``'s with the entries sent replaced and those in ``<part>_gone`` dropped. The
    result is a whole snapshot (no `Snapshot.base`): the driver diffs it like any other
    (`spec.observation.with_delta`), and finds the unchanged parts by identity."""
    if not isinstance(data, Mapping):
        raise WireError(f"snapshot: result must be an object, got {type(data).__name__}")
    if data.get("delta") is True:
        return _snapshot_from_delta(data, previous)
    return Snapshot(
        statuses=_statuses_from_json(data["statuses"]) if data.get("statuses") is not None else None,
        seqs=_seqs_from_json(data["seqs"]) if data.get("seqs") is not None else None,
        **{name: decode(data.get(name), name) for name, decode in _PARTS.items()},
    )


def _snapshot_from_delta(data: Mapping[str, Any], previous: Snapshot | None) -> Snapshot:
    """The delta's snapshot, already in the form the checks want (`Snapshot.base` = ``previous``,
    ``changed_seqs`` / ``changed_requests`` = the entries the host sent or dropped): the host
    diffed the two snapshots, so the runner does not diff them again (`with_delta` cost a fifth
    of the runner's decoding). The host sends exactly the parts and entries that differ
    (docs/PROTOCOL.md); with incremental checking off the result is a plain whole snapshot."""
    if previous is None:
        raise WireError("snapshot: a delta (\"delta\": true) with no snapshot before it in this steps run")
    absent = data.get("absent") or []
    if not isinstance(absent, list):
        raise WireError("snapshot.absent: expected a list of part names")
    parts: dict[str, Any] = {}
    changed: dict[str, frozenset[str] | None] = {}
    for name, decode in (("statuses", _statuses_from_json), ("seqs", _seqs_from_json)):
        old, gone = getattr(previous, name), data.get(f"{name}_gone") or []
        if name in absent:
            parts[name], changed[name] = None, None
        elif name not in data and not gone:
            parts[name], changed[name] = old, frozenset()
        else:
            if not isinstance(gone, list):
                raise WireError(f"snapshot.{name}_gone: expected a list of ids")
            sent = decode(data.get(name) or {})
            merged = dict(old or {})
            if name == "seqs" and old:
                sent = _same_tables(sent, old)
            merged.update(sent)
            for key in gone:
                merged.pop(key, None)
            parts[name] = merged
            changed[name] = frozenset(sent).union(gone) if old is not None else None
    for name, decode in _PARTS.items():
        if name in absent:
            parts[name] = None
        else:
            parts[name] = decode(data[name], name) if name in data else getattr(previous, name)
    if not observation.INCREMENTAL or changed["seqs"] is None or changed["statuses"] is None:
        return Snapshot(**parts)
    return Snapshot(**parts, base=previous, changed_seqs=changed["seqs"], changed_requests=changed["statuses"])


def _same_tables(sent: dict[str, SeqView], old: Mapping[str, SeqView]) -> dict[str, SeqView]:
    """``sent`` with each view whose block table equals its old one given that very tuple (the
    checks skip a table that is the same object: `spec.observation.with_delta` does the same)."""
    for sid, view in sent.items():
        before = old.get(sid)
        if before is not None and view.blocks is not None and view.blocks == before.blocks:
            sent[sid] = view._replace(blocks=before.blocks)
    return sent
