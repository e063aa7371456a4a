"""Small readers over snapshots shared by the predicates."""

from __future__ import annotations

from collections import Counter

from spec.observation import Snapshot, StepRecord

# Several predicates read the same derived views of one snapshot; compute each once. Keyed by
# id() with the snapshot kept alive in the entry, so an id is never reused while cached.
_MEMO: dict[tuple[int, str, str], tuple[Snapshot, object]] = {}


def _memo(snap: Snapshot, kind: str, device: str, build):
    key = (id(snap), kind, device)
    hit = _MEMO.get(key)
    if hit is not None and hit[0] is snap:
        return hit[1]
    if len(_MEMO) > 256:
        _MEMO.clear()
    value = build()
    _MEMO[key] = (snap, value)
    return value


def tables(snap: Snapshot, device: str) -> dict[str, tuple[int, ...]]:
    """Sequence id -> block table, for sequences whose table is on ``device``."""
    assert snap.seqs is not None
    return _memo(snap, "tables", device,
                 lambda: {sid: v.blocks for sid, v in snap.seqs.items() if v.device == device and v.blocks})


def entries(snap: Snapshot, device: str) -> Counter[int]:
    """How many table entries point at each block of ``device``."""

    def build() -> Counter[int]:
        counts: Counter[int] = Counter()
        for blocks in tables(snap, device).values():
            counts.update(blocks)
        return counts

    return _memo(snap, "entries", device, build)


def snapshots(record: StepRecord) -> list[tuple[str, Snapshot]]:
    """The record's state snapshots that carry data: after schedule (when observed) and after the step."""
    found = [("after schedule", record.mid)] if record.mid is not None else []
    return found + [("after the step", record.after)]


def admitted(record: StepRecord) -> list[str]:
    """Requests that were waiting before the step and got a prefill in it."""
    waiting = set(record.before.waiting or ())
    seen: dict[str, None] = {}
    for item in record.output.scheduled:
        if item.is_prefill and item.request_id in waiting:
            seen.setdefault(item.request_id, None)
    return list(seen)
