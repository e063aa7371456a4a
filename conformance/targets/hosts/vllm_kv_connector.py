"""A scripted KV connector for the vLLM V1 hosts (vllm_v1_host.py, vllm_v1_async_host.py): vLLM
0.33.0's real ``Scheduler`` runs its connector paths against a ``KVConnectorBase_V1`` whose answers
come from the trace (spec/connector.py, docs/CONNECTORS.md). No GPU, no network: the host plays the
worker side, reporting each transfer done in the ``KVConnectorOutput`` of the step the script names.

Runs in the target's venv (imports vLLM and the standard library only, never kvsched). The
connector is registered through vLLM's own factory (``KVConnectorFactory.register_connector``) and
built by the scheduler from the ``KVTransferConfig`` the host passes (kv_role ``kv_consumer``: the
decode side of disaggregated prefill, which is also the side that loads offloaded KV).

The scheduler-side calls, as the trace scripts them (the same rules as the reference's
``reference_impl.kv_connector.ScriptedConnector``):

* ``get_num_new_matched_tokens(request, local)``: ``max(min(external_tokens, num_tokens - 1) -
  local, 0)``, asynchronous as scripted;
* ``update_state_after_alloc(request, blocks, n)``: with n > 0 a load into the blocks past the
  local hit; the first load of a request fails on its script's ``failed_blocks`` (table indices);
  a synchronous load is reported in its step's outcome, an asynchronous one in the outcome of the
  ``load_steps``-th step from the one that started it (``finished_recving``);
* ``request_finished_all_groups``: a request that ran and whose script has ``send_steps`` keeps its
  blocks (delayed free) until ``finished_sending`` names it in the outcome of the
  ``send_steps``-th step scheduled after its finish.

What the host reports besides vLLM's own state (`snapshot_parts`): the transfers in flight and the
ones the last outcome reported (``kv_transfers`` / ``kv_reported``, wire version 1); the waiting
queue as vLLM drains it (``kv_holding_waiting`` first); a waiting request that holds KV blocks as
``WAITING_FOR_REMOTE_KV`` (vLLM: WAITING_FOR_REMOTE_KVS, or WAITING / PREEMPTED after its load was
promoted); a request whose asynchronous load is in flight with the computed tokens of its local hit
only (vLLM sets ``num_computed_tokens`` to the load's end at allocation, "not used anywhere until
the request finished the KV transfer", scheduler.py:1524-1537); a finished request's blocks while
vLLM still holds them.
"""

from __future__ import annotations

from typing import Any

from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorMetadata, SupportsHMA
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import RequestStatus

NAME = "KvschedScriptedConnector"
KV_TRANSFERS_VERSION = 1  # spec.connector.KV_TRANSFERS_VERSION


class _Metadata(KVConnectorMetadata):
    """Nothing travels to a worker: there is none."""


class ScriptedConnector(KVConnectorBase_V1, SupportsHMA):
    """The scheduler side of a connector that does what the trace says (module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.scripts: dict[str, dict] = {}
        self.step = 0  # the step the host is scheduling (set by the host before schedule())
        self.next_step = 0  # the next step the host will schedule (a finish's sends count from it)
        self.transfers: dict[str, dict] = {}  # rid -> {kind, blocks, tokens, load_async, failed, due} (vLLM ids)
        self.reported: dict[str, dict] = {}
        self.loaded: set[str] = set()
        self.ran: set[str] = set()
        self._matched: dict[str, tuple[int, int, bool]] = {}  # rid -> (local, external, async) of the last answer

    # -- the scheduler side -------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        script = self.scripts.get(request.request_id, {})
        external = max(min(int(script.get("external_tokens", 0)), request.num_tokens - 1) - num_computed_tokens, 0)
        load_async = bool(external) and bool(script.get("load_async", False))
        self._matched[request.request_id] = (num_computed_tokens, external, load_async)
        return external, load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        if num_external_tokens <= 0:
            return
        rid = request.request_id
        local, external, load_async = self._matched[rid]
        assert external == num_external_tokens, (rid, external, num_external_tokens)
        table = list(blocks.get_block_ids()[0])
        bs = self._kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
        first, end = local // bs, -(-(local + external) // bs)
        script = self.scripts.get(rid, {})
        failed = () if rid in self.loaded else tuple(
            table[i] for i in script.get("failed_blocks", ()) if first <= i < end)
        self.loaded.add(rid)
        due = self.step + int(script.get("load_steps", 1)) - 1 if load_async else self.step
        self.transfers[rid] = {"kind": "load", "blocks": tuple(table[first:end]), "tokens": local + external,
                               "load_async": load_async, "failed": failed, "due": due}

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        return _Metadata()

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        load = self.transfers.get(rid)
        if load is not None and load["load_async"]:
            return True, None  # a load in flight still writes them
        # (a synchronous load lands in its step's forward pass: a request finished while that step is in
        # flight, as pipelined steps allow, is held by vLLM's fence, defer_block_free, not by the connector)
        steps = int(self.scripts.get(rid, {}).get("send_steps", 0))
        manager = self._kv_cache_manager
        table = [b.block_id for b in manager.coordinator.single_type_managers[0].req_to_blocks.get(rid, ())
                 if not b.is_null] if manager is not None else []
        if not steps or rid not in self.ran or not table:
            return False, None
        self.transfers[rid] = {"kind": "send", "blocks": tuple(table), "tokens": 0, "load_async": False,
                               "failed": (), "due": self.next_step + steps - 1}
        return True, None

    # -- the worker side: no worker ------------------------------------------------------------
    def start_load_kv(self, forward_context, **kwargs) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    # -- the host's side ------------------------------------------------------------------------
    def report(self, step: int) -> KVConnectorOutput:
        """What the workers report in step ``step``'s outcome: loads first, then sends, each in the
        order started (the reference's order)."""
        due = [(rid, t) for rid, t in self.transfers.items() if t["due"] <= step]
        due.sort(key=lambda item: item[1]["kind"] != "load")
        for rid, _ in due:
            del self.transfers[rid]
        self.reported = dict(due)
        return KVConnectorOutput(
            finished_recving={rid for rid, t in due if t["kind"] == "load" and t["load_async"]} or None,
            finished_sending={rid for rid, t in due if t["kind"] == "send"} or None,
            invalid_block_ids={b for _, t in due for b in t["failed"]})


KVConnectorFactory.register_connector(NAME, __name__, ScriptedConnector.__name__)


def transfer_config(config: dict) -> KVTransferConfig | None:
    """The host's ``KVTransferConfig`` for a kvsched config (None without ``kv_connector``)."""
    if not config.get("kv_connector"):
        return None
    return KVTransferConfig(kv_connector=NAME, kv_role="kv_consumer",
                            kv_load_failure_policy=config.get("kv_load_failure_policy", "recompute"))


def _views(transfers: dict) -> dict:
    return {rid: {"kind": t["kind"], "blocks": [b - 1 for b in t["blocks"]], "tokens": t["tokens"],
                  "load_async": t["load_async"], "failed": [b - 1 for b in t["failed"]]}
            for rid, t in transfers.items()}


def snapshot_parts(sched, snap: dict, tables: dict) -> None:
    """Put the connector's record into a host snapshot and report vLLM's connector states in the
    spec's terms (module docstring). ``tables``: req_to_blocks of the single KV cache group."""
    connector = sched.connector
    snap["waiting"] = [r.request_id for r in sched.kv_holding_waiting] + [r.request_id for r in sched.waiting]
    for view in snap["seqs"].values():
        request = sched.requests.get(view["request"])
        if request is None:
            continue
        table = [b.block_id - 1 for b in tables.get(view["request"], ()) if not b.is_null]
        if request.is_finished():
            view["blocks"], view["device"] = table, "gpu" if table else None  # held for a transfer
        waiting = request.status in (RequestStatus.WAITING_FOR_REMOTE_KVS, RequestStatus.WAITING,
                                     RequestStatus.PREEMPTED)
        if waiting and (request.status == RequestStatus.WAITING_FOR_REMOTE_KVS or table):
            view["status"] = "WAITING_FOR_REMOTE_KV"
            snap["statuses"][view["request"]] = "WAITING_FOR_REMOTE_KV"
        transfer = connector.transfers.get(view["request"])
        if transfer is not None and transfer["kind"] == "load" and transfer["load_async"]:
            local, external, _ = connector._matched[view["request"]]
            view["num_computed"] = local
    snap["kv_transfers"] = {"version": KV_TRANSFERS_VERSION, "transfers": _views(connector.transfers)}
    snap["kv_reported"] = {"version": KV_TRANSFERS_VERSION, "transfers": _views(connector.reported)}


def pipelined_snapshot_parts(sched, snap: dict) -> None:
    """What the async host (vllm_v1_async_host.py) adds to `snapshot_parts` with a connector: an
    asynchronous load in flight shows its local hit as computed again (the host's processed frontier
    reads vLLM's ``num_computed_tokens``, the load's end), and the blocks vLLM holds back while an
    in-flight step still writes them (``defer_block_free`` with a consumer connector and two batches
    in flight, scheduler.py:189-195; ``deferred_frees``, :3088-3093, freed tail first, :3106-3118)."""
    connector = sched.connector
    for rid, transfer in connector.transfers.items():
        view = snap["seqs"].get(f"{rid}#0")
        if view is not None and transfer["kind"] == "load" and transfer["load_async"]:
            view["num_computed"] = connector._matched[rid][0]
    snap["gpu_fenced"] = [b.block_id - 1 for _, blocks in sched.deferred_frees for b in reversed(blocks)]
