"""Lockstep for the V1 twin: E traces through E reference V1 schedulers and one `BatchedV1Scheduler`.

Every step, for every engine still running, it compares the whole step: the requests the
step's aborts finished, the `SchedulerOutput` (scheduled requests with token counts and
prefill flags in order, preempted victims in order, ignored; reasons are not compared, the twin
has none), the finished requests `update()` reports, and the full snapshot after the step
(statuses, queues in order, every sequence's tokens, token ids, computed tokens and block
table, reference counts, the free queue in order, block keys and the cache index, which are
empty with prefix caching off). The first divergence is reported with engine index, step, what
differed and both sides.

Also here: the trace encoding (`V1TraceBatch`: slots in arrival order, aborts per step in the
trace's order, since the order in which tables are freed decides V1's free queue), the runner
(`V1Run`) and the materialisation of the twin's tensors into the spec's objects (slow, for
comparison and for the adapter; never on the fast path).

This module imports only `spec` (and the twin): the reference is passed in as a factory
``make_reference(config) -> SchedulerLike`` (the tests pass `reference_impl.v1_scheduler.V1Scheduler`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gpu_impl.batched import resolve_device
from gpu_impl.batched_v1 import RUNNING, WAITING, BatchedV1Scheduler, V1StepOut, V1UpdateOut
from gpu_impl.encode import StepEvents, events_by_step, events_on_rows
from gpu_impl.lockstep import LockstepResult, TwinSteps, aborted_slots_by_engine, drive_lockstep
from gpu_impl.materialize import STATUS_OF_CODE
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import SeqView, Snapshot
from spec.protocol import SchedulerLike
from spec.status import PreemptionMode, Status
from spec.trace import Trace
from spec.types import Finished, Preempted, Request, ScheduledSeq, SchedulerOutput, generated_token, seq_id

_NEVER = 1 << 30


def check_trace(trace: Trace, where: str = "trace") -> None:
    """What the V1 twin models: prefix caching off, one sequence per request."""
    if trace.config.enable_prefix_caching:
        raise InputError(f"{where}.config.enable_prefix_caching", "the V1 torch twin leaves prefix caching out")
    for i, a in enumerate(trace.arrivals):
        if a.request.n != 1:
            raise InputError(f"{where}.requests[{i}].n", f"must be 1 for the V1 flow, got {a.request.n}")


class V1TraceBatch(StepEvents):
    """E traces encoded for `BatchedV1Scheduler` (slots in arrival order: steps ascending, file
    order within a step, the order the reference's engine loop adds them in)."""

    ABORT_COLUMNS = 3  # engine, slot, the abort's rank among the engine's aborts this step

    def __init__(self, traces: Sequence[Trace], device: str | torch.device | None = None) -> None:
        if not traces:
            raise ValueError("V1TraceBatch needs at least one trace")
        for e, t in enumerate(traces):
            check_trace(t, f"traces[{e}]")
        self.traces = tuple(traces)
        self.device = resolve_device(device)
        E = len(traces)
        R = max(1, max(len(t.arrivals) for t in traces))
        self.E, self.R = E, R
        self.names: list[list[str]] = []
        self.slot_of: list[dict[str, int]] = []
        self.requests: list[list[Request]] = []
        cols = {k: [[0] * R for _ in range(E)] for k in ("prompt", "maxtok", "prio", "arrival")}
        arrivals: dict[int, list[tuple[int, int]]] = {}
        aborts: dict[int, list[tuple[int, int, int]]] = {}
        stops: dict[int, list[tuple[int, int]]] = {}
        for e, trace in enumerate(traces):
            order = sorted(range(len(trace.arrivals)), key=lambda i, tr=trace: tr.arrivals[i].step)
            reqs = [trace.arrivals[i].request for i in order]
            self.requests.append(reqs)
            self.names.append([r.request_id for r in reqs])
            slot_of = {r.request_id: s for s, r in enumerate(reqs)}
            self.slot_of.append(slot_of)
            for s, i in enumerate(order):
                req = trace.arrivals[i].request
                cols["prompt"][e][s] = req.prompt_len
                cols["maxtok"][e][s] = req.max_tokens
                cols["prio"][e][s] = req.priority
                cols["arrival"][e][s] = s
                arrivals.setdefault(trace.arrivals[i].step, []).append((e, s))
            per_step: dict[int, list[int]] = {}
            for step, rid in trace.aborts:
                s = slot_of.get(rid)
                if s is not None and s not in per_step.setdefault(step, []):
                    per_step[step].append(s)
            for step, slots in per_step.items():
                aborts.setdefault(step, []).extend((e, s, k) for k, s in enumerate(slots))
            for step, sid in trace.stops:
                rid, sep, index = sid.rpartition("#")
                if sep and index == "0" and rid in slot_of:
                    stops.setdefault(step, []).append((e, slot_of[rid]))
        dev = self.device
        self.cols = {k: torch.tensor(v, dtype=torch.long, device=dev) for k, v in cols.items()}


        def index(events: dict[int, list[tuple[int, ...]]]) -> dict[int, tuple[torch.Tensor, ...]]:
            return events_by_step(((step, *ev) for step, evs in events.items() for ev in evs), dev)

        self._arrive_ev, self._abort_ev, self._stop_ev = index(arrivals), index(aborts), index(stops)
        self.last_arrival = torch.tensor([t.last_arrival_step for t in traces], dtype=torch.long, device=dev)
        self.max_steps = torch.tensor([t.max_steps for t in traces], dtype=torch.long, device=dev)

    def make_scheduler(self) -> BatchedV1Scheduler:
        sched = BatchedV1Scheduler([t.config for t in self.traces], self.R, self.device)
        c = self.cols
        sched.set_requests(c["prompt"], c["maxtok"], c["prio"], c["arrival"])
        return sched

    def stopped_mask(self, step: int) -> torch.Tensor | None:
        ev = self._stop_ev.get(step)
        if ev is None:
            return None
        mask = torch.zeros(self.E, self.R, dtype=torch.bool, device=self.device)
        mask[ev] = True
        return mask


@dataclass
class V1BatchStep:
    step: int
    active: torch.Tensor  # [E] engines (trace indices) that ran this step
    engines: list[int]  # the trace index of each row of ``scheduler`` (and of the output tensors)
    scheduler: BatchedV1Scheduler  # the scheduler that ran the step (state after the step)
    aborted: tuple[torch.Tensor, torch.Tensor]  # (row, slot) of the requests aborted
    output: V1StepOut
    update: V1UpdateOut


class V1Run:
    """Drive a `BatchedV1Scheduler` through a `V1TraceBatch` with the reference engine loop's end
    rule per engine (every request arrived and finished, or max_steps).

    Engines that are done stop costing: once at most half of the scheduler's rows are live, the
    run continues on a scheduler of the live rows only (`BatchedV1Scheduler.take`); ``engines``
    maps rows to trace indices, and the step's events are mapped through it."""

    def __init__(self, batch: V1TraceBatch, scheduler: BatchedV1Scheduler | None = None, compact: bool = True) -> None:
        self.batch = batch
        self.scheduler = scheduler if scheduler is not None else batch.make_scheduler()
        self.active = torch.ones(batch.E, dtype=torch.bool, device=batch.device)
        self.engines = list(range(batch.E))
        self._rows_t = torch.arange(batch.E, device=batch.device)  # ``engines`` as a tensor
        self.compact = compact
        self.step = 0
        self.engine_steps = 0
        self._row_of: torch.Tensor | None = None  # trace index -> row (-1: dropped); None: identity

    def advance(self) -> V1BatchStep:
        b, s, step = self.batch, self.scheduler, self.step
        s.arrive_idx(*events_on_rows(b.arrival_idx(step), self._row_of))
        aborted = s.abort_idx(*events_on_rows(b.abort_idx(step), self._row_of))
        out = s.schedule()
        stopped = b.stopped_mask(step)
        if stopped is not None and self._row_of is not None:
            stopped = stopped[self._rows_t]
        upd = s.update(stopped)
        unfinished = torch.zeros_like(self.active)
        unfinished[self._rows_t] = ((s.status == WAITING) | (s.status == RUNNING)).any(1)
        active, engines, rows_t = self.active, self.engines, self._rows_t
        drained = (step >= b.last_arrival) & ~unfinished
        self.active = active & ~drained & (step + 1 < b.max_steps)
        self.engine_steps += int(active.sum())
        self.step += 1
        live = self.active[rows_t]
        n_live = int(live.sum())
        if self.compact and 0 < n_live <= len(engines) // 2:
            keep = live.nonzero(as_tuple=True)[0]
            self.scheduler = s.take(keep.tolist())
            self._rows_t = rows_t[keep]
            self.engines = self._rows_t.tolist()
            row_of = torch.full((b.E,), -1, dtype=torch.long, device=b.device)
            row_of[self._rows_t] = torch.arange(n_live, device=b.device)
            self._row_of = row_of
        return V1BatchStep(step, active, engines, s, aborted, out, upd)

    def run(self) -> int:
        while bool(self.active.any()):
            self.advance()
        return self.engine_steps


# ---------------------------------------------------------------------- materialisation
def step_outputs_v1(out: V1StepOut, names: Sequence[Sequence[str]], engines: Sequence[int] | None = None) -> list[SchedulerOutput]:
    """One `SchedulerOutput` per engine (no reasons: the twin has none)."""
    ntok, order, prefill = out.ntok.tolist(), out.order.tolist(), out.prefill.tolist()
    preempt, ignored = out.preempt.tolist(), out.ignored.tolist()
    result = []
    for e in engines if engines is not None else range(len(ntok)):
        nm = names[e]
        sched = sorted((order[e][r], r) for r, n in enumerate(ntok[e]) if n > 0)
        result.append(SchedulerOutput(
            step=out.step,
            scheduled=tuple(ScheduledSeq(seq_id(nm[r], 0), nm[r], ntok[e][r], bool(prefill[e][r])) for _, r in sched),
            preempted=tuple(Preempted(nm[r], PreemptionMode.RECOMPUTE)
                            for _, r in sorted((p, r) for r, p in enumerate(preempt[e]) if p >= 0)),
            ignored=tuple(nm[r] for _, r in sorted((g, r) for r, g in enumerate(ignored[e]) if g >= 0)),
        ))
    return result


def finished_lists_v1(upd: V1UpdateOut, names: Sequence[Sequence[str]], engines: Sequence[int] | None = None) -> list[list[Finished]]:
    """What `update()` reports per engine: the step's ignored requests, then the finished ones."""
    status, order, ignored = upd.status.tolist(), upd.order.tolist(), upd.ignored.tolist()
    result = []
    for e in engines if engines is not None else range(len(status)):
        nm = names[e]
        items = [Finished(nm[r], Status.FINISHED_IGNORED) for _, r in sorted((g, r) for r, g in enumerate(ignored[e]) if g >= 0)]
        items += [Finished(nm[r], STATUS_OF_CODE[status[e][r]]) for _, r in sorted((order[e][r], r) for r, s in enumerate(status[e]) if s)]
        result.append(items)
    return result


def token_ids(request: Request, num_tokens: int) -> tuple[int, ...]:
    """A request's token ids: its prompt, then the fixed `generated_token` of each output position."""
    prompt = tuple(request.prompt_token_ids())
    return prompt + tuple(generated_token(request.request_id, 0, p) for p in range(len(prompt), num_tokens))


def snapshots_v1(sched: BatchedV1Scheduler, names: Sequence[Sequence[str]], requests: Sequence[Sequence[Request]],
                 engines: Sequence[int] | None = None) -> list[Snapshot]:
    """The full `Snapshot` of each engine, as `reference_impl.v1_scheduler.snapshot_of` builds it."""
    st, tok, comp, tlen = (t.tolist() for t in (sched.status, sched.tok, sched.comp, sched.tlen))
    rstamp, wkey, tab = sched.rstamp.tolist(), sched.wkey.tolist(), sched.tab.tolist()
    stk, top = sched.stk.tolist(), sched.top.tolist()
    result = []
    for e in engines if engines is not None else range(sched.E):
        cfg = sched.cfg.configs[e]
        nm = names[e]
        statuses: dict[str, Status] = {}
        seqs: dict[str, SeqView] = {}
        waiting, running = [], []
        for r, code in enumerate(st[e]):
            if code == 0 or r >= len(nm):
                continue
            rid = nm[r]
            status = STATUS_OF_CODE[code]
            statuses[rid] = status
            if code == WAITING:
                waiting.append((wkey[e][r], rid))
            elif code == RUNNING:
                running.append((rstamp[e][r], rid))
            blocks = tuple(tab[e][r][: tlen[e][r]])
            seqs[seq_id(rid, 0)] = SeqView(seq_id(rid, 0), rid, status, tok[e][r], comp[e][r], blocks,
                                           "gpu" if blocks else None, token_ids(requests[e][r], tok[e][r]))
        free_ids = tuple(reversed(stk[e][: top[e]]))
        free = set(free_ids)
        G, C = cfg.num_gpu_blocks, cfg.num_cpu_blocks
        result.append(Snapshot(
            statuses=statuses,
            seqs=seqs,
            waiting=tuple(rid for _, rid in sorted(waiting)),
            running=tuple(rid for _, rid in sorted(running)),
            swapped=(),
            gpu_ref_counts=tuple(0 if b in free else 1 for b in range(G)),
            cpu_ref_counts=(0,) * C,
            gpu_free=len(free_ids),
            cpu_free=C,
            gpu_free_ids=free_ids,
            cpu_free_ids=tuple(range(C)),
            gpu_block_keys=(None,) * G,
            cache_index={},
        ))
    return result


# ---------------------------------------------------------------------- the harness
def run_lockstep_v1(
    traces: Sequence[Trace],
    make_reference: Callable[[SchedulerConfig], SchedulerLike],
    device: str | torch.device | None = "cpu",
    compare_state: bool = True,
) -> LockstepResult:
    """Run E traces through E references and the twin at once; stop at the first divergence."""
    batch = V1TraceBatch(traces, device)
    run = V1Run(batch)

    def step_twin(step: int, live: list[int]) -> tuple[TwinSteps, list[bool]]:
        bstep = run.advance()
        row_of = {e: row for row, e in enumerate(bstep.engines)}
        rows = [row_of[e] for e in live]
        names = [batch.names[e] for e in bstep.engines]
        requests = [batch.requests[e] for e in bstep.engines]
        steps = TwinSteps(
            step_outputs_v1(bstep.output, names, rows), finished_lists_v1(bstep.update, names, rows),
            snapshots_v1(bstep.scheduler, names, requests, rows) if compare_state else None,
            aborted_slots_by_engine(bstep.aborted, bstep.engines))
        return steps, run.active.tolist()

    return drive_lockstep(traces, make_reference, compare_state, batch.slot_of, step_twin)


__all__ = [
    "V1Run", "V1TraceBatch", "check_trace", "finished_lists_v1", "run_lockstep_v1",
    "snapshots_v1", "step_outputs_v1", "token_ids",
]
