"""Block ids of an engine whose ids start at 1 (block 0 a null block it never hands out), shifted
down to the 0..N-1 the checks read.

An adapter declares ``ConfigDomain(first_block_id=1)`` and reports the engine's ids as they are:
in block tables, free lists, swap and copy maps, fenced and cache holds, and the cache index.
Per-block lists (``gpu_ref_counts``, ``cpu_ref_counts``, ``gpu_block_keys``) hold one entry per
usable block in id order, the null block left out, so they need no shift. The shift runs on the
adapter's answer before it is validated (`conformance.runner.normalize`), so a snapshot or output
that is malformed is still reported as the adapter's fault; a shifted snapshot drops its delta
(``base``), and the runner diffs it with the one before as it does a whole snapshot.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spec.observation import SeqView, Snapshot
from spec.types import SchedulerOutput


def _ids(values: Any, by: int) -> Any:
    if values is None or not isinstance(values, (tuple, list)):
        return values  # validation names what is wrong with it
    return tuple(v - by if isinstance(v, int) and not isinstance(v, bool) else v for v in values)


def _pairs(pairs: Any, by: int) -> Any:
    if not isinstance(pairs, (tuple, list)):
        return pairs
    return tuple(_ids(p, by) if isinstance(p, (tuple, list)) else p for p in pairs)


def shift_snapshot(snap: Any, by: int) -> Any:
    """``snap`` with every block id lowered by ``by`` (anything not a Snapshot is returned as is)."""
    if by == 0 or not isinstance(snap, Snapshot):
        return snap
    seqs = snap.seqs
    if isinstance(seqs, dict):
        seqs = {sid: v._replace(blocks=_ids(v.blocks, by)) if isinstance(v, SeqView) else v for sid, v in seqs.items()}
    index = snap.cache_index
    if isinstance(index, dict):
        index = {key: _ids(blocks, by) for key, blocks in index.items()}
    return replace(snap, seqs=seqs, cache_index=index, gpu_free_ids=_ids(snap.gpu_free_ids, by),
                   cpu_free_ids=_ids(snap.cpu_free_ids, by), gpu_fenced=_ids(snap.gpu_fenced, by),
                   gpu_cache_holds=_ids(snap.gpu_cache_holds, by), base=None, changed_seqs=None,
                   changed_requests=None, gpu_block_changes=None, cpu_block_changes=None, kept_tokens=None)


def shift_output(output: Any, by: int) -> Any:
    """``output`` with the blocks of its swap and copy maps lowered by ``by``."""
    if by == 0 or not isinstance(output, SchedulerOutput):
        return output
    return replace(output, swap_out=_pairs(output.swap_out, by), swap_in=_pairs(output.swap_in, by),
                   copies=_pairs(output.copies, by))
