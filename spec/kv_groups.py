"""KV cache groups: several attention kinds sharing one block pool (docs/HYBRID.md).

A hybrid model mixes layer kinds, and vLLM V1 gives each kind a *KV cache group* over one block
pool (vllm/v1/core/kv_cache_coordinator.py, single_type_kv_cache_manager.py): every group keeps a
block table per request, all of them take their blocks from the same pool, and each group has its
own rule for which positions of the table hold a real block. A position that holds none holds the
*null block* (`NULL_BLOCK` here; vLLM's block 0, never handed out).

The kinds, with the positions p (blocks of ``block_size`` tokens) a request with ``computed``
tokens whose step runs up to ``end`` tokens reads or writes (`live_range`):

    full            every position below cdiv(end, B)
    sliding_window  W tokens: the token at position t reads t-W+1 .. t, so blocks from
                    (computed - W + 1) // B (the first new token's window) up to cdiv(end, B)
    chunked_local   C tokens: a token reads only its own C-token chunk, so blocks from
                    (computed // C * C) // B up
    mamba           a recurrent state, no per-token KV: ``mode`` says where its state lives
                    none   one state block, read and written in place (vLLM mamba_cache_mode "none")
                    align  one state block per block of tokens, real only for the state the step
                           reads (after ``computed`` tokens, position cdiv(computed, B) - 1) and
                           the one it writes (position cdiv(end, B) - 1); prefill chunks end on a
                           block boundary so that the state written there can be cached
                           (vLLM "align", `Scheduler._mamba_block_aligned_split`)
                    all    a state block for every block of tokens, every one kept (a checkpoint
                           at every boundary; vLLM's earlier "all" mode)
    shared          layers that read another group's KV (vLLM's KV-sharing layers): no table of
                    their own, so nothing to allocate or check; declared so that a config says
                    what the model is

Group 0 is always a full-attention group, and its table is the sequence's ``SeqView.blocks``:
every invariant written for one group keeps reading it unchanged, and a config without groups is
today's one-group engine. The other groups' tables are `Snapshot.group_tables`.

Prefix-cache keys are per group (vLLM's ``BlockHashWithGroupId``): group g > 0 caches a block
under `group_key(g, key)`, so a lookup in one group never finds another group's block.

Simplifications, each without loss for scheduling: every group has the config's block size (vLLM
aligns the groups' block sizes to one scheduler block size when they differ, and the scheduler
only ever sees whole scheduler blocks); a Mamba "none" group's state is one block of the pool
(vLLM sizes it max_model_len tokens, one block per request, from the same pool).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spec.errors import InputError, shown

KINDS = ("full", "sliding_window", "chunked_local", "mamba", "shared")
MAMBA_MODES = ("none", "align", "all")
NULL_BLOCK = -1  # a table position without a real block (vLLM's null block)
MAX_GROUPS = 8


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group: its kind, ``window`` (sliding window W or local chunk C, in tokens),
    ``mode`` (a Mamba group's), ``source`` (a shared group's: the group whose KV it reads)."""

    kind: str
    window: int = 0
    mode: str = ""
    source: int = -1

    @property
    def has_table(self) -> bool:
        return self.kind != "shared"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind}
        if self.window:
            data["window"] = self.window
        if self.mode:
            data["mode"] = self.mode
        if self.source >= 0:
            data["source"] = self.source
        return data


def parse_groups(value: Any, where: str = "config.kv_groups") -> tuple[KVGroup, ...]:
    """A config's ``kv_groups`` (a list of objects or of `KVGroup`) as a tuple of `KVGroup`,
    checked; ``()`` is the one-group engine."""
    if isinstance(value, tuple) and all(isinstance(g, KVGroup) for g in value):
        groups = value
    elif isinstance(value, (list, tuple)):
        groups = tuple(_parse_one(item, f"{where}[{i}]") for i, item in enumerate(value))
    else:
        raise InputError(where, f"must be a list of groups, got {shown(value)}")
    if len(groups) > MAX_GROUPS:
        raise InputError(where, f"at most {MAX_GROUPS} groups, got {len(groups)}")
    for i, group in enumerate(groups):
        _check_one(group, i, f"{where}[{i}]")
    if groups and groups[0].kind != "full":
        raise InputError(f"{where}[0].kind", f"group 0 must be full attention (its table is the sequence's "
                                             f"blocks), got {groups[0].kind!r}")
    return groups


def _parse_one(item: Any, where: str) -> KVGroup:
    if isinstance(item, KVGroup):
        return item
    if not isinstance(item, Mapping):
        raise InputError(where, f"must be an object, got {shown(item)}")
    known = {"kind", "window", "mode", "source"}
    for key in item:
        if key not in known:
            raise InputError(f"{where}.{str(key)[:40]}", f"unknown field (known: {', '.join(sorted(known))})")
    if "kind" not in item:
        raise InputError(f"{where}.kind", "is required")
    return KVGroup(item["kind"], item.get("window", 0), item.get("mode", ""), item.get("source", -1))


def _check_one(group: KVGroup, index: int, where: str) -> None:
    if not isinstance(group.kind, str) or group.kind not in KINDS:
        raise InputError(f"{where}.kind", f"must be one of {', '.join(KINDS)}, got {shown(group.kind)}")
    windowed = group.kind in ("sliding_window", "chunked_local")
    if isinstance(group.window, bool) or not isinstance(group.window, int) or group.window < 0 \
            or group.window > 2**24:
        raise InputError(f"{where}.window", f"must be an integer in [0, 2**24], got {shown(group.window)}")
    if windowed and group.window < 1:
        raise InputError(f"{where}.window", f"a {group.kind} group needs a window of at least 1 token")
    if not windowed and group.window:
        raise InputError(f"{where}.window", "only sliding_window and chunked_local groups have a window")
    if group.kind == "mamba":
        if group.mode not in MAMBA_MODES:
            raise InputError(f"{where}.mode", f"must be one of {', '.join(MAMBA_MODES)}, got {shown(group.mode)}")
    elif group.mode:
        raise InputError(f"{where}.mode", "only a mamba group has a mode")
    if group.kind == "shared":
        if isinstance(group.source, bool) or not isinstance(group.source, int) or not 0 <= group.source < index:
            raise InputError(f"{where}.source", f"must name an earlier group, got {shown(group.source)}")
    elif group.source != -1:
        raise InputError(f"{where}.source", "only a shared group has a source")


def check_with_config(groups: tuple[KVGroup, ...], enable_prefix_caching: bool, enable_chunked_prefill: bool) -> None:
    """The rules that tie groups to the rest of the config (vLLM's own, and one spec decision)."""
    for i, group in enumerate(groups):
        if group.kind == "mamba" and group.mode == "align" and not enable_chunked_prefill:
            # Spec decision: "align" splits every prompt at block boundaries (vLLM applies
            # _mamba_block_aligned_split with chunked prefill off too, scheduler.py:1351), which is
            # chunked prefill; the spec's one-step prefill rules (ADM-001, BUD-004) cannot hold.
            raise InputError(f"config.kv_groups[{i}].mode", "a mamba group in mode align splits prompts into "
                                                             "block-aligned chunks, so it needs enable_chunked_prefill")
        if group.kind == "mamba" and group.mode == "none" and enable_prefix_caching:
            # vLLM MambaManager.__init__: "Mamba prefix caching requires mamba_cache_mode='align'"
            raise InputError(f"config.kv_groups[{i}].mode", "a mamba group in mode none keeps no state to share, "
                                                             "so it cannot run with enable_prefix_caching")


def real_entries(group_tables: Mapping[str, tuple[tuple[int, ...], ...]] | None) -> tuple[int, ...]:
    """Every real block entry of the groups beyond group 0, over every sequence (what each block's
    reference count must add to group 0's entries; BLK-003)."""
    if not group_tables:
        return ()
    return tuple(b for tables in group_tables.values() for table in tables for b in table if b != NULL_BLOCK)


def group_key(group: int, key: str) -> str:
    """The prefix-cache key of a block of group ``group`` (group 0's keys are the plain ones)."""
    return key if group == 0 else f"g{group}|{key}"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def first_live_block(group: KVGroup, computed: int, block_size: int) -> int:
    """The lowest position a step from ``computed`` tokens still reads in a windowed group (every
    position below it holds KV no later token attends to); 0 for the other kinds."""
    if group.kind == "sliding_window":
        return max(0, computed - group.window + 1) // block_size
    if group.kind == "chunked_local":
        return (computed // group.window * group.window) // block_size
    return 0


def live_positions(group: KVGroup, computed: int, end: int, block_size: int) -> frozenset[int]:
    """The table positions a step that computes tokens ``computed`` .. ``end`` - 1 reads or writes
    in ``group``: the positions that must hold a real block while it runs (HYB-003)."""
    last = cdiv(end, block_size)
    if group.kind in ("full", "sliding_window", "chunked_local"):
        return frozenset(range(first_live_block(group, computed, block_size), last))
    if group.kind == "mamba":
        if group.mode == "none":
            return frozenset({0})
        if group.mode == "all":
            return frozenset(range(last))
        reads = {cdiv(computed, block_size) - 1} if computed > 0 else set()
        return frozenset(reads | {last - 1}) if last else frozenset(reads)
    return frozenset()


def hit_positions(group: KVGroup, hit: int, block_size: int) -> frozenset[int]:
    """The positions whose cached blocks a prefix hit of ``hit`` tokens must find in ``group`` to
    go on from there (HYB-006): the KV the next token attends to, or the state after ``hit``."""
    if hit <= 0:
        return frozenset()
    if group.kind in ("full", "sliding_window", "chunked_local"):
        return frozenset(range(first_live_block(group, hit, block_size), hit // block_size))
    if group.kind == "mamba":
        return frozenset({hit // block_size - 1})
    return frozenset()


def peak_blocks(group: KVGroup, num_tokens: int, block_size: int, max_chunk: int) -> int:
    """The most real blocks ``group`` ever holds for a sequence of ``num_tokens`` tokens computed
    in chunks of at most ``max_chunk`` tokens: what admission must find free for the whole
    sequence, and what the never-fits check adds up."""
    whole = cdiv(num_tokens, block_size)
    if group.kind == "sliding_window":
        return min(whole, cdiv(group.window - 1 + max_chunk, block_size) + 1)
    if group.kind == "chunked_local":
        return min(whole, cdiv(group.window + max_chunk, block_size) + 1)
    if group.kind == "mamba":
        return {"none": 1, "align": min(whole, 2), "all": whole}[group.mode]
    if group.kind == "shared":
        return 0
    return whole
