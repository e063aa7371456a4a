"""A shared example database: failing traces kept where every run, on any machine, can read them
(`kvsched conform --redis URL`).

``<out>/counterexamples/`` and ``<out>/found/`` remember failures for reruns with the same
folder; a campaign spread over a cluster (or a nightly job on a fresh machine) has no such
folder in common. `SharedExamples` keeps the same traces in a Hypothesis example database,
normally `hypothesis.extra.redis.RedisExampleDatabase`, under one key per adapter spec and
profile, so that a run of the same adapter and profile anywhere replays them first.

Values are the JSON bytes of the trace (`spec.trace.Trace.to_json`, with the ``problem`` and
``shrunk`` metadata the fuzz driver writes), never a pickle: a database shared between
machines must not be able to run code in the reader. A first failure is stored the moment it
is found; once its problem is shrunk, the shrunk trace is stored and the unshrunk ones this run
stored for that problem are removed. Traces other runs stored are never removed here (Redis
lets keys expire after ``expire_after`` unused; Hypothesis' default is 8 days).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from spec.errors import InputError
from spec.json_input import MAX_BYTES, parse_json
from spec.trace import Trace

KEY_PREFIX = b"kvsched:"
KEY_VERSION = 1  # part of the key: a later layout of the values gets a key of its own


def key_for(adapter_spec: str, profile: str) -> bytes:
    """The database key of an adapter (its canonical spec, `conformance.runner.adapter.canonical_spec`)
    under a profile."""
    return f"v{KEY_VERSION}|{adapter_spec}|{profile}".encode()


class SharedExamples:
    """The traces one adapter spec and profile keep in ``database`` (any Hypothesis
    `ExampleDatabase`: Redis for a cluster, an in-memory one in tests)."""

    def __init__(self, database: Any, adapter_spec: str, profile: str) -> None:
        self.database = database
        self.key = key_for(adapter_spec, profile)
        self._unshrunk: dict[str, set[bytes]] = {}  # problem -> what this run stored before shrinking

    def traces(self) -> Iterator[Trace]:
        """Every stored trace that still loads (a damaged or foreign value is passed over), in a
        fixed order so that a replay does not depend on the set's order in Redis."""
        for value in sorted(self.database.fetch(self.key)):
            if len(value) > MAX_BYTES:
                continue
            try:
                yield Trace.from_dict(parse_json(value, "the shared example database"))
            except (InputError, ValueError):
                continue

    def found(self, problem: str, trace: Trace) -> None:
        """Store a failing trace of ``problem`` before it is shrunk (the moment it is found)."""
        value = _encode(trace)
        self.database.save(self.key, value)
        self._unshrunk.setdefault(problem, set()).add(value)

    def shrunk(self, problem: str, trace: Trace) -> None:
        """Store ``problem``'s shrunk trace in place of the unshrunk ones this run stored."""
        value = _encode(trace)
        self.database.save(self.key, value)
        for old in self._unshrunk.pop(problem, set()) - {value}:
            self.database.delete(self.key, old)


def _encode(trace: Trace) -> bytes:
    return trace.to_json().encode()


def open_redis(url: str) -> Any:
    """The Hypothesis database in the Redis server at ``url`` (``redis://host:port/db``), for
    `SharedExamples`; a missing extra or a server that does not answer is one line naming
    ``--redis``."""
    try:
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
    except ImportError:
        raise InputError("--redis", "needs the cluster extra: pip install 'kvsched[cluster]'") from None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=5)
        client.ping()
    except ValueError as err:
        raise InputError("--redis", f"is not a Redis URL ({err})") from None
    except redis.RedisError as err:
        raise InputError("--redis", f"no Redis server answered at {url} ({err})") from None
    return RedisExampleDatabase(client, key_prefix=KEY_PREFIX)
