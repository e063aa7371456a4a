"""Block ids 1..N with 0 a null block (vLLM V1's null block, many small engines): the engine's
pool has N usable blocks whose ids start at 1.

The adapter reports the engine's ids as they are (tables, free lists, swap and copy maps) and
per-block lists without the null block; its domain's ``first_block_id=1`` makes the runner shift
the ids down to the 0..N-1 the checks read.
"""

from __future__ import annotations

from dataclasses import replace

from reference_impl.scheduler import Scheduler
from spec.domain import ConfigDomain
from spec.observation import Snapshot
from spec.types import SchedulerOutput
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(first_block_id=1)


def _up(ids):
    return None if ids is None else tuple(b + 1 for b in ids)


class NullBlockZero(Scheduler):
    shift_free_lists = True

    def schedule(self) -> SchedulerOutput:
        out = super().schedule()
        return replace(out, swap_out=tuple((g + 1, c + 1) for g, c in out.swap_out),
                       swap_in=tuple((c + 1, g + 1) for c, g in out.swap_in),
                       copies=tuple((a + 1, b + 1) for a, b in out.copies))

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        seqs = {sid: v._replace(blocks=_up(v.blocks)) for sid, v in (snap.seqs or {}).items()}
        free = (_up(snap.gpu_free_ids), _up(snap.cpu_free_ids)) if self.shift_free_lists else \
            (snap.gpu_free_ids, snap.cpu_free_ids)
        return replace(snap, seqs=seqs, gpu_free_ids=free[0], cpu_free_ids=free[1], base=None, changed_seqs=None,
                       changed_requests=None, gpu_block_changes=None, cpu_block_changes=None)


class FreeListUnshifted(NullBlockZero):
    shift_free_lists = False  # bug: the free lists name ids from 0, the tables from 1


def traces_of():
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-null-block", NullBlockZero, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-null-block-broken", FreeListUnshifted, domain=DOMAIN)
