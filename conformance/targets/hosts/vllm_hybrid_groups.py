"""Hybrid KV cache groups for the vLLM V1 hosts (kvsched's ``config.kv_groups``, spec/kv_groups.py).

Imports only vLLM and torch (it runs in the target's venv, beside ``vllm_v1_host.py``). Builds the
``KVCacheConfig`` a hybrid model gets (one ``KVCacheGroupSpec`` per kvsched group with a table, one
layer each, every group over the one pool of ``num_gpu_blocks + 1`` blocks) and reads each group's
block tables back for ``Snapshot.group_tables``:

* ``full`` -> ``FullAttentionSpec``; ``sliding_window`` W -> ``SlidingWindowSpec(sliding_window=W)``;
  ``chunked_local`` C -> ``ChunkedLocalAttentionSpec(attention_chunk_size=C)``;
* ``mamba`` -> ``MambaSpec`` with ``mamba_cache_mode`` "none" (block size ``max_model_len``: one state
  block per request, as vLLM sizes it) or "align" (the attention block size; with k drafts
  ``num_speculative_blocks`` = k, as a Mamba layer without ReplaySSM builds it); vLLM 0.33.0 has no
  "all" mode (``MambaCacheMode = Literal["align", "none"]``, vllm/config/cache.py:176), so it is refused;
* ``shared`` -> no group (vLLM's KV-sharing layers read their target layer's cache); its table is
  reported empty, as the reference reports it.

Block ids are reported minus one (block 0 is V1's null block), the null block as -1.

``drop_eagle_block`` (kvsched's config, HYB-006): the scheduler and its KV cache manager as vLLM
builds them for an EAGLE/EAGLE3/MTP drafter with lookahead block hashes off
(``SpeculativeConfig.disable_lookahead_block_hashes``, vllm/config/speculative.py:478-483; with them
on, vLLM drops nothing, v1/core/sched/scheduler.py:342-345): ``Scheduler.use_eagle_block_drop`` is
True (scheduler.py:331), so the ``KVCacheManager`` gets ``use_eagle=True`` (scheduler.py:351-356:
the coordinator's last-block drop and its margin, kv_cache_coordinator.py:130-137, 866-905, and
``get_num_cacheable_tokens``, :789-803) and the Mamba-aligned split backs its last cacheable
position off a block (scheduler.py:572-626). The drafter itself needs a draft model, which a host
without weights cannot load, so it is left out: no drafts (k = 0), none of EAGLE's lookahead slots
(``num_lookahead_tokens``); EAGLE's ``num_prefill_lookahead_tokens`` of 1 changes nothing in the
manager (``num_reprefillable_tokens = lookahead - 1``, kv_cache_coordinator.py:118).
"""

from __future__ import annotations

import torch
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

NULL = -1


def groups_of(config: dict) -> list[dict]:
    return list(config.get("kv_groups") or [{"kind": "full"}])


def mamba_mode(config: dict) -> str | None:
    modes = {g.get("mode") for g in groups_of(config) if g["kind"] == "mamba"}
    if "all" in modes:
        raise ValueError("vLLM 0.33.0 has no mamba_cache_mode 'all' (vllm/config/cache.py:176)")
    return next(iter(modes)) if modes else None


def kv_cache_config(config: dict) -> KVCacheConfig:
    bs, mml, blocks = config["block_size"], config["max_model_len"], config["num_gpu_blocks"] + 1
    attention = dict(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    specs = []
    for i, group in enumerate(groups_of(config)):
        kind = group["kind"]
        if kind == "full":
            spec = FullAttentionSpec(**attention)
        elif kind == "sliding_window":
            spec = SlidingWindowSpec(**attention, sliding_window=group["window"])
        elif kind == "chunked_local":
            spec = ChunkedLocalAttentionSpec(**attention, attention_chunk_size=group["window"])
        elif kind == "mamba":
            mode = group["mode"]
            # "align" with k drafts keeps k speculative state blocks, as a Mamba layer's spec has it
            # without ReplaySSM (model_executor/layers/mamba/abstract.py:86-90), which "align" cannot
            # use (config/vllm.py:3507-3512); "none" keeps one block, the ReplaySSM layout.
            spec = MambaSpec(block_size=mml if mode == "none" else bs, shapes=((1,),), dtypes=(torch.float32,),
                             mamba_cache_mode=mode,
                             num_speculative_blocks=int(config.get("num_speculative_tokens", 0)) if mode == "align" else 0)
        else:
            continue  # shared: no group of its own
        specs.append(KVCacheGroupSpec([f"layer{i}"], spec))
    return KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=specs)


def scheduler_block_sizes(kv: KVCacheConfig, vllm_config) -> dict:
    """The scheduler's block size and hash block size, as EngineCore resolves them for several
    groups (the LCM of the groups' block sizes; vllm/v1/engine/core.py:176-187)."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes

    scheduler_block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, vllm_config)
    return {"block_size": scheduler_block_size, "hash_block_size": hash_block_size}


def group_tables(sched, config: dict, live: dict) -> dict:
    """Seq id -> the tables of groups 1 .. n-1 (kvsched's order; a shared group's is empty), for the
    requests in ``live`` (request id -> Request, unfinished)."""
    groups = groups_of(config)
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    index, where = 0, []
    for group in groups:
        where.append(None if group["kind"] == "shared" else index)
        index += group["kind"] != "shared"
    out = {}
    for rid in live:
        tables = []
        for g in range(1, len(groups)):
            m = where[g]
            blocks = managers[m].req_to_blocks.get(rid, ()) if m is not None else ()
            tables.append([NULL if b.is_null else b.block_id - 1 for b in blocks])
        if any(tables):
            out[f"{rid}#0"] = tables
    return out


_EAGLE_CLASSES: dict[tuple[type, int], type] = {}


def with_eagle_block_drop(scheduler_cls: type, lookahead: int = 0) -> type:
    """``scheduler_cls`` with ``use_eagle_block_drop`` held True from its construction on (the
    value an EAGLE SpeculativeConfig gives it, scheduler.py:331), without a SpeculativeConfig;
    ``lookahead``: its ``num_lookahead_tokens`` (EAGLE's k slots past the scheduled tokens,
    config/vllm.py:649-653, scheduler.py:298), 0 without drafts."""
    if (scheduler_cls, lookahead) not in _EAGLE_CLASSES:
        _EAGLE_CLASSES[scheduler_cls, lookahead] = type(f"EagleBlockDrop{scheduler_cls.__name__}", (scheduler_cls,), {
            "use_eagle_block_drop": property(lambda self: True, lambda self, value: None),
            "num_lookahead_tokens": property(lambda self: lookahead, lambda self, value: None)})
    return _EAGLE_CLASSES[scheduler_cls, lookahead]
