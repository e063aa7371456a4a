"""External KV: what a KV connector supplies and holds, as the environment's script (docs/CONNECTORS.md).

A KV connector (vLLM's ``KVConnectorBase_V1``: NIXL or P2P for disaggregated prefill, the
OffloadingConnector or LMCache for offloading) is not the scheduler's choice any more than a stop
token is: how many tokens it can supply for a request, whether the load is asynchronous, how long
it takes, which blocks fail, how long a finished request's sends (or stores) keep its blocks. A
trace fixes all of it per request, relative to the scheduler's own moves, so the same script drives
every implementation whatever it decides (an absolute "completes at step 7" would depend on when
the scheduler started the load):

| field | meaning | default |
| --- | --- | --- |
| ``external_tokens`` | tokens past the local prefix hit the connector holds (at most all but the last token) | 0 |
| ``load_async`` | the load is asynchronous: the request waits in ``WAITING_FOR_REMOTE_KV`` holding its blocks | false |
| ``load_steps`` | an asynchronous load is reported done in the outcome of the ``load_steps``-th step from the one that started it (1: that step's own) | 1 |
| ``failed_blocks`` | indices, in the request's block table, of the blocks its first load fails to fill | () |
| ``send_steps`` | when the request finishes, the connector keeps its blocks for a send (or an offloading store) reported done in the outcome of the ``send_steps``-th step scheduled after the finish; 0: no delayed free | 0 |

The connector is asked each time a waiting request with no computed tokens is considered for
admission (a fresh admission or a recompute after preemption, as vLLM's
``get_num_new_matched_tokens``): it answers ``min(external_tokens, num_tokens - 1) - local hit``
(never below 0). A synchronous load is done within the step that schedules the request; a failure
is reported in that step's outcome (vLLM's ``invalid_block_ids``). A later load of the same request
never fails (the script's failure is its first load's).

`TransferView` is what a snapshot shows of a transfer in flight (``Snapshot.kv_transfers``, by
request id) and of one the connector reported finished in the step's outcome
(``Snapshot.kv_reported``): the environment's own record, kept by the scripted connector beside the
engine (the connector is the environment, not the code under test).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from spec.errors import InputError, shown

CONNECTOR_VERSION = 1  # of the trace's optional "connector" field
KV_TRANSFERS_VERSION = 1  # of the snapshot parts kv_transfers / kv_reported on the wire
KV_LOAD_FAILURE_POLICIES = ("recompute", "fail")  # vLLM's KVTransferConfig.kv_load_failure_policy
MAX_TRANSFER_STEPS = 1000  # a transfer longer than this is a hang, not a schedule


@dataclass(frozen=True)
class ConnectorScript:
    """One request's connector behaviour (see the module table)."""

    external_tokens: int = 0
    load_async: bool = False
    load_steps: int = 1
    failed_blocks: tuple[int, ...] = ()
    send_steps: int = 0

    def matched_tokens(self, num_tokens: int, local_hit_tokens: int) -> int:
        """vLLM's ``get_num_new_matched_tokens``: external tokens past the local hit, leaving the
        last token to compute (its logits are needed)."""
        return max(min(self.external_tokens, num_tokens - 1) - local_hit_tokens, 0)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"external_tokens": self.external_tokens}
        if self.load_async:
            data["load_async"] = True
        if self.load_steps != 1:
            data["load_steps"] = self.load_steps
        if self.failed_blocks:
            data["failed_blocks"] = list(self.failed_blocks)
        if self.send_steps:
            data["send_steps"] = self.send_steps
        return data


NO_SCRIPT = ConnectorScript()


class TransferView(NamedTuple):
    """One connector transfer as a snapshot shows it (plain values: it crosses the wire)."""

    kind: str  # "load" (external KV into the request's blocks) or "send" (a finished request's blocks out)
    blocks: tuple[int, ...]  # the GPU blocks it writes (a load) or reads (a send)
    tokens: int  # a load: the token count its request's KV reaches once it lands; a send: 0
    load_async: bool = False  # a load the request waits for (WAITING_FOR_REMOTE_KV)
    failed: tuple[int, ...] = ()  # of ``blocks``, the ones it fails to fill (a load)


def check_config(kv_connector: Any, policy: Any) -> None:
    """The config's connector fields (spec.config.SchedulerConfig calls it)."""
    if not isinstance(kv_connector, bool):
        raise InputError("config.kv_connector", f"must be true or false, got {shown(kv_connector)}")
    if not isinstance(policy, str) or policy not in KV_LOAD_FAILURE_POLICIES:
        raise InputError("config.kv_load_failure_policy",
                         f"must be one of {', '.join(KV_LOAD_FAILURE_POLICIES)}, got {shown(policy)}")
    if policy != "recompute" and not kv_connector:
        raise InputError("config.kv_load_failure_policy", f"applies to a KV connector, so it needs kv_connector "
                         f"(got {policy!r} without it)")


def scripts_from_dict(value: Any, request_ids: set[str], has_connector: bool) -> dict[str, ConnectorScript]:
    """The trace's ``connector`` field -> scripts by request id; every error names the field."""
    if not has_connector:
        raise InputError("connector", "needs config.kv_connector: true")
    if not isinstance(value, Mapping):
        raise InputError("connector", "must be an object {version, requests}")
    for key in value:
        if key not in ("version", "requests"):
            raise InputError(f"connector.{str(key)[:40]}", "unknown field (known: requests, version)")
    version = value.get("version")
    if type(version) is not int or version != CONNECTOR_VERSION:
        raise InputError("connector.version", f"must be {CONNECTOR_VERSION}, got {shown(version)}")
    raw_list = value.get("requests", [])
    if not isinstance(raw_list, list):
        raise InputError("connector.requests", "must be a list")
    scripts: dict[str, ConnectorScript] = {}
    for i, raw in enumerate(raw_list):
        where = f"connector.requests[{i}]"
        if not isinstance(raw, Mapping) or "request" not in raw:
            raise InputError(where, "must be an object with 'request'")
        allowed = {"request", "external_tokens", "load_async", "load_steps", "failed_blocks", "send_steps"}
        for key in raw:
            if key not in allowed:
                raise InputError(f"{where}.{str(key)[:40]}", f"unknown field (known: {', '.join(sorted(allowed))})")
        rid = raw["request"]
        if not isinstance(rid, str) or rid not in request_ids:
            raise InputError(f"{where}.request", f"must name a request of the trace, got {shown(rid)}")
        if rid in scripts:
            raise InputError(f"{where}.request", f"names {rid!r} twice")
        load_async = raw.get("load_async", False)
        if not isinstance(load_async, bool):
            raise InputError(f"{where}.load_async", f"must be true or false, got {shown(load_async)}")
        failed = raw.get("failed_blocks", [])
        if not isinstance(failed, list):
            raise InputError(f"{where}.failed_blocks", "must be a list of block indices")
        failed_blocks = tuple(sorted({_count(b, f"{where}.failed_blocks[{j}]", 0, 2**20) for j, b in enumerate(failed)}))
        scripts[rid] = ConnectorScript(
            external_tokens=_count(raw.get("external_tokens", 0), f"{where}.external_tokens", 0, 2**24),
            load_async=load_async,
            load_steps=_count(raw.get("load_steps", 1), f"{where}.load_steps", 1, MAX_TRANSFER_STEPS),
            failed_blocks=failed_blocks,
            send_steps=_count(raw.get("send_steps", 0), f"{where}.send_steps", 0, MAX_TRANSFER_STEPS),
        )
    return scripts


def scripts_to_dict(scripts: Mapping[str, ConnectorScript]) -> dict[str, Any]:
    return {"version": CONNECTOR_VERSION,
            "requests": [{"request": rid, **script.to_dict()} for rid, script in scripts.items()]}


def _count(value: Any, where: str, minimum: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise InputError(where, f"must be an integer in [{minimum}, {maximum}], got {shown(value)}")
    return value
