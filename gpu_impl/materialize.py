"""Turn the batched scheduler's tensors into the spec's plain objects, engine by engine.

This is the slow, Python-level view used for comparison (the lockstep harness, the adapter);
the batched step itself never calls it. Reasons are not produced by the twin:
``SchedulerOutput.reasons`` is always empty and ``Finished.reason`` is ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_impl.batched import (
    K_DECODE,
    K_PREFILL,
    K_SWAPIN,
    P_SWAP,
    RUNNING,
    SWAPPED,
    WAITING,
    BatchedScheduler,
    StepOut,
    UpdateOut,
)
from spec.observation import SeqView, Snapshot
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput, seq_id

STATUS_OF_CODE = {
    1: Status.WAITING,
    2: Status.RUNNING,
    3: Status.SWAPPED,
    4: Status.FINISHED_STOPPED,
    5: Status.FINISHED_LENGTH_CAPPED,
    6: Status.FINISHED_ABORTED,
    7: Status.FINISHED_IGNORED,
}


def _maps_by_engine(m: tuple[torch.Tensor, ...], E: int) -> list[tuple[tuple[int, int], ...]]:
    e, key, src, dst = (t.tolist() for t in m)
    rows: list[list[tuple[int, int, int]]] = [[] for _ in range(E)]
    for ei, k, s, d in zip(e, key, src, dst, strict=True):
        rows[ei].append((k, s, d))
    return [tuple((s, d) for _, s, d in sorted(r)) for r in rows]


def step_outputs(out: StepOut, names: Sequence[Sequence[str]], engines: Sequence[int] | None = None) -> list[SchedulerOutput]:
    """One `SchedulerOutput` per engine (or per engine in ``engines``)."""
    E = out.kind.shape[0]
    kind, seqs, ntok = out.kind.tolist(), out.seqs.tolist(), out.ntok.tolist()
    preempt, ignored = out.preempt.tolist(), out.ignored.tolist()
    so, si, cp = (_maps_by_engine(m, E) for m in (out.swap_out, out.swap_in, out.copies))
    result = []
    for e in engines if engines is not None else range(E):
        nm = names[e]
        scheduled: dict[int, list[ScheduledSeq]] = {K_PREFILL: [], K_DECODE: [], K_SWAPIN: []}
        swapped_in = []
        for r, k in enumerate(kind[e]):
            if not k:
                continue
            rid = nm[r]
            for j, on in enumerate(seqs[e][r]):
                if on:
                    scheduled[k].append(ScheduledSeq(seq_id(rid, j), rid, ntok[e][r], k == K_PREFILL))
            if k == K_SWAPIN:
                swapped_in.append(rid)
        preempted = tuple(
            Preempted(nm[r], PreemptionMode.SWAP if p == P_SWAP else PreemptionMode.RECOMPUTE)
            for r, p in reversed(list(enumerate(preempt[e])))
            if p
        )
        result.append(
            SchedulerOutput(
                step=out.step,
                scheduled=tuple(scheduled[K_PREFILL] + scheduled[K_DECODE] + scheduled[K_SWAPIN]),
                preempted=preempted,
                swapped_in=tuple(swapped_in),
                swap_out=so[e],
                swap_in=si[e],
                copies=cp[e],
                ignored=tuple(nm[r] for r, g in enumerate(ignored[e]) if g),
            )
        )
    return result


def finished_lists(upd: UpdateOut, names: Sequence[Sequence[str]], engines: Sequence[int] | None = None) -> list[list[Finished]]:
    """What `update()` reports per engine: the step's ignored requests, then the finished ones."""
    E = upd.status.shape[0]
    status, order, ignored = upd.status.tolist(), upd.order.tolist(), upd.ignored.tolist()
    result = []
    for e in engines if engines is not None else range(E):
        nm = names[e]
        items = [Finished(nm[r], Status.FINISHED_IGNORED) for r, g in enumerate(ignored[e]) if g]
        done = sorted((order[e][r], r) for r, s in enumerate(status[e]) if s)
        items += [Finished(nm[r], STATUS_OF_CODE[status[e][r]]) for _, r in done]
        result.append(items)
    return result


def snapshots(sched: BatchedScheduler, names: Sequence[Sequence[str]], engines: Sequence[int] | None = None) -> list[Snapshot]:
    """The full `Snapshot` (every capability) of each engine."""
    st, tok, comp, tlen = (t.tolist() for t in (sched.status, sched.tok, sched.comp, sched.tlen))
    alive, exists, sstat, stok, scomp = (t.tolist() for t in (sched.alive, sched.exists, sched.sstat, sched.stok, sched.scomp))
    tab = sched.tab.tolist()
    gref, cref = sched.gpu_ref.tolist(), sched.cpu_ref.tolist()
    result = []
    for e in engines if engines is not None else range(sched.E):
        cfg = sched.cfg.configs[e]
        nm = names[e]
        statuses: dict[str, Status] = {}
        seqs: dict[str, SeqView] = {}
        queues: dict[int, list[str]] = {WAITING: [], RUNNING: [], SWAPPED: []}
        for r, code in enumerate(st[e]):
            if code == 0 or r >= len(nm):
                continue
            rid = nm[r]
            statuses[rid] = STATUS_OF_CODE[code]
            if code in queues:
                queues[code].append(rid)
            for j in range(sched.N):
                if not exists[e][r][j]:
                    continue
                sid = seq_id(rid, j)
                if alive[e][r][j]:
                    blocks = tuple(b for b in tab[e][r][j] if b >= 0)
                    device = None if not blocks else ("cpu" if code == SWAPPED else "gpu")
                    seqs[sid] = SeqView(sid, rid, STATUS_OF_CODE[code], tok[e][r], comp[e][r], blocks, device)
                else:
                    seqs[sid] = SeqView(sid, rid, STATUS_OF_CODE[sstat[e][r][j]], stok[e][r][j], scomp[e][r][j], (), None)
        g = gref[e][: cfg.num_gpu_blocks]
        c = cref[e][: cfg.num_cpu_blocks]
        result.append(
            Snapshot(
                statuses=statuses,
                seqs=seqs,
                waiting=tuple(queues[WAITING]),
                running=tuple(queues[RUNNING]),
                swapped=tuple(queues[SWAPPED]),
                gpu_ref_counts=tuple(g),
                cpu_ref_counts=tuple(c),
                gpu_free=sum(1 for x in g if x == 0),
                cpu_free=sum(1 for x in c if x == 0),
                gpu_free_ids=tuple(i for i, x in enumerate(g) if x == 0),
                cpu_free_ids=tuple(i for i, x in enumerate(c) if x == 0),
            )
        )
    return result
