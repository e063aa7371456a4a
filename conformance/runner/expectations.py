"""Known failures and skipped checks, kept per engine as data (as test262 and the wasm spec tests
keep theirs), instead of a hand-made profile per engine.

An expectations file is versioned JSON::

    {"version": 1,
     "expected": [{"id": "RES-004", "reason": "frees a finished request's blocks one step late",
                   "source": "myengine/scheduler.py:free_finished"}],
     "skip": [{"id": "LOCKSTEP", "reason": "a different admission order by design"}]}

``expected``: the run still checks these, still shrinks and saves each failure, and reports it
as ``expected`` (it does not make the run fail); one that is not seen in the run is reported as
``unexpected_pass``, a hint to update the file (not a failure: a fuzz run that did not meet a
bug has not shown it is gone). ``skip``: not checked at all, reported as ``skipped``. An id is
an invariant ID, ``LOCKSTEP``, or ``FAULT-<kind>`` (expected only). ``--skip ID[,ID]`` adds skips
on the command line.

A ``FAULT-<kind>`` entry may say ``"where": ["scheduler.py:1579", ...]``: then only a fault whose
location or message contains one of those strings is the expected one; any other fault of that
kind is a new finding, reported as ``FAULT-<kind>@<its location>`` (`Expectations.relabel`). Why:
every exception an engine raises is ``FAULT-raised``, so an entry without ``where`` would hide a
new crash behind a known one; every target file gives one.

A real target keeps its known deviations in ``conformance/targets/expectations/<target>.json``
(`target_expectations`): ``kvsched conform --adapter <target>`` reads it unless ``--expect`` names
another file or ``--no-expect`` asks for every failure to count. Why by default: a target's
known deviations are found in the first few steps of most traces; reported as failures they
bury a new one, and a user who wants them all back says so in one flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spec.errors import InputError
from spec.json_input import read_json

EXPECTATIONS_VERSION = 1


@dataclass(frozen=True)
class Expectations:
    expected: dict[str, str] = field(default_factory=dict)  # problem id -> reason
    skip: dict[str, str] = field(default_factory=dict)  # invariant id or LOCKSTEP -> reason
    source: str | None = None  # the file they were read from, for the report
    where: dict[str, tuple[str, ...]] = field(default_factory=dict)  # FAULT-<kind> -> where it is expected

    def with_skips(self, ids: list[str], reason: str = "--skip") -> Expectations:
        return Expectations(self.expected, {**self.skip, **{i: reason for i in ids}}, self.source, self.where)

    def relabel(self, problems: dict[str, Any]) -> dict[str, Any]:
        """``problems`` (id -> `conformance.runner.summary.Problem`) with every fault the expectations
        place elsewhere renamed ``FAULT-<kind>@<location>``: a new crash, not the known one."""
        if not self.where or not any(p in self.where for p in problems):
            return problems
        out: dict[str, Any] = {}
        for problem, found in problems.items():
            places = self.where.get(problem)
            text = f"{found.location or ''} {found.message}"
            if places and not any(place in text for place in places):
                problem = f"{problem}@{found.location or 'unknown'}"
                found = replace(found, id=problem)
            out[problem] = found
        return out


def _known_ids() -> set[str]:
    from spec.catalogue import catalogue

    return {inv.id for inv in catalogue()} | {"LOCKSTEP"}


def check_id(problem: str, where: str, *, faults: bool) -> str:
    from conformance.runner.summary import FAULT_KINDS

    if problem in _known_ids() or (faults and problem.removeprefix("FAULT-") in FAULT_KINDS and problem.startswith("FAULT-")):
        return problem
    allowed = "an invariant ID, LOCKSTEP" + (" or FAULT-<kind>" if faults else "")
    raise InputError(where, f"unknown id {problem!r} (expected {allowed}; see `kvsched invariants`)")


def parse_skip(value: str | None) -> list[str]:
    if not value:
        return []
    return [check_id(part.strip(), "--skip", faults=False) for part in value.split(",") if part.strip()]


def load_expectations(path: Path | None) -> Expectations:
    if path is None:
        return Expectations()
    where = "--expect"
    data = read_json(path, where=f"{where} {path}", max_bytes=1 << 20)
    loaded = expectations_from_dict(data, where)
    return replace(loaded, source=str(path))


TARGET_EXPECTATIONS_DIR = Path(__file__).parents[1] / "targets" / "expectations"


def target_expectations_path(adapter: str) -> Path | None:
    """The expectations file kept for the real target ``adapter``, if it has one."""
    path = TARGET_EXPECTATIONS_DIR / f"{adapter}.json"
    return path if "/" not in adapter and ":" not in adapter and path.is_file() else None


def target_expectations(adapter: str) -> Expectations:
    """The target's own expectations (empty for an adapter without a file)."""
    path = target_expectations_path(adapter)
    if path is None:
        return Expectations()
    data = read_json(path, where=str(path), max_bytes=1 << 20)
    loaded = expectations_from_dict(data, str(path))
    return replace(loaded, source=str(path))


def expectations_from_dict(data: Any, where: str = "expectations") -> Expectations:
    if not isinstance(data, dict):
        raise InputError(where, "must be a JSON object")
    if data.get("version") != EXPECTATIONS_VERSION:
        raise InputError(f"{where}.version", f"must be {EXPECTATIONS_VERSION}, got {data.get('version')!r}")
    unknown = set(data) - {"version", "expected", "skip", "adapter", "profile", "comment", "pinned"}
    if unknown:
        raise InputError(f"{where}.{sorted(unknown)[0]}",
                         "unknown field (known: version, expected, skip, adapter, profile, comment, pinned)")
    parts: dict[str, dict[str, str]] = {}
    places: dict[str, tuple[str, ...]] = {}
    for name in ("expected", "skip"):
        entries = data.get(name, [])
        if not isinstance(entries, list):
            raise InputError(f"{where}.{name}", "must be a list of {id, reason}")
        parts[name] = {}
        for i, entry in enumerate(entries):
            at = f"{where}.{name}[{i}]"
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
                raise InputError(at, "must be an object with an 'id' string")
            if not isinstance(entry.get("reason"), str) or not entry["reason"].strip():
                raise InputError(f"{at}.reason", "must say why (a non-empty string)")
            problem = check_id(entry["id"], f"{at}.id", faults=name == "expected")
            # two entries for one fault kind (two known crashes): both reasons, both places
            parts[name][problem] = " / ".join(filter(None, (parts[name].get(problem), entry["reason"])))
            if "where" in entry:
                places[problem] = (*places.get(problem, ()), *_places(entry["where"], f"{at}.where", problem))
    return Expectations(parts["expected"], parts["skip"], where=places)


def _places(value: Any, where: str, problem: str) -> tuple[str, ...]:
    if not problem.startswith("FAULT-"):
        raise InputError(where, "only a FAULT-<kind> entry says where it is expected")
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise InputError(where, "must be a non-empty list of strings found in the fault's location or message")
    return tuple(value)
