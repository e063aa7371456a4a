"""E traces as tensors, and a runner that drives one `BatchedScheduler` through all of them.

Slots: each engine's requests are placed in policy-key order (FCFS: arrival order; priority:
(priority, arrival order)), arrival order being the trace's (steps ascending, file order within
a step), which is the order the reference's engine loop adds them in. So slot order is queue
order and a request's slot never changes.

Per step the environment's side is a lookup of precomputed index tensors (engine, slot[, seq])
by step: arrivals, aborts (the first abort of a request at or after its arrival; an abort
naming an unknown, not-yet-arrived or finished request does nothing, as in the reference) and
stops (the sequences that sample a stop token at that step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from gpu_impl.batched import SWAPPED, WAITING, BatchedScheduler, StepOut, UpdateOut, resolve_device, row_any
from spec.trace import Trace

_NEVER = 1 << 30


def _split_seq_id(seq: str) -> tuple[str, int] | None:
    rid, sep, index = seq.rpartition("#")
    if not sep or not index.isdigit():
        return None
    return rid, int(index)


def events_by_step(events: Iterable[tuple[int, ...]], device: torch.device) -> dict[int, tuple[torch.Tensor, ...]]:
    """(step, engine, slot[, ...]) events as step -> one index tensor per column (engine first)."""
    by_step: dict[int, list[tuple[int, ...]]] = {}
    for ev in events:
        by_step.setdefault(ev[0], []).append(ev[1:])
    return {
        step: tuple(torch.tensor(col, dtype=torch.long, device=device) for col in zip(*rows, strict=True))
        for step, rows in by_step.items()
    }


def events_on_rows(events: tuple[torch.Tensor, ...], row_of: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """Event indices (engine first) mapped to the rows of a scheduler that holds only some engines
    (``row_of``: engine -> row, -1 when dropped; None: rows are engines). Events of dropped
    engines are left out: those engines are done."""
    if row_of is None or events[0].numel() == 0:
        return events
    rows = row_of[events[0]]
    keep = rows >= 0
    return (rows[keep], *(col[keep] for col in events[1:]))


class StepEvents:
    """A trace batch's arrivals and aborts per step, as index tensors (engine first) the batched
    scheduler's ``arrive_idx`` / ``abort_idx`` take; ``ABORT_COLUMNS`` of them for an abort."""

    ABORT_COLUMNS = 2
    device: torch.device
    _arrive_ev: dict[int, tuple[torch.Tensor, ...]]
    _abort_ev: dict[int, tuple[torch.Tensor, ...]]

    def _none(self, width: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(0, dtype=torch.long, device=self.device),) * width

    def arrival_idx(self, step: int) -> tuple[torch.Tensor, ...]:
        return self._arrive_ev.get(step) or self._none(2)

    def abort_idx(self, step: int) -> tuple[torch.Tensor, ...]:
        return self._abort_ev.get(step) or self._none(self.ABORT_COLUMNS)


class TraceBatch(StepEvents):
    """E traces encoded for the batched scheduler (see the module docstring)."""

    def __init__(self, traces: Sequence[Trace], device: str | torch.device | None = None) -> None:
        if not traces:
            raise ValueError("TraceBatch needs at least one trace")
        self.traces = tuple(traces)
        self.device = resolve_device(device)
        E = len(traces)
        R = max(1, max(len(t.arrivals) for t in traces))
        N = max([1] + [a.request.n for t in traces for a in t.arrivals])
        self.E, self.R, self.N = E, R, N
        self.names: list[list[str]] = []
        self.slot_of: list[dict[str, int]] = []
        cols = {k: [[0] * R for _ in range(E)] for k in ("prompt", "maxtok", "n", "prio", "arrival")}
        arrival_step = [[_NEVER] * R for _ in range(E)]
        abort_step = [[_NEVER] * R for _ in range(E)]
        stops: dict[tuple[int, int, int], list[int]] = {}
        for e, trace in enumerate(traces):
            arrivals = list(trace.arrivals)
            prio = trace.config.policy == "priority"
            order = sorted(range(len(arrivals)), key=lambda i: (arrivals[i].request.priority if prio else 0, i))
            names = [arrivals[i].request.request_id for i in order]
            slot_of = {rid: s for s, rid in enumerate(names)}
            self.names.append(names)
            self.slot_of.append(slot_of)
            for s, i in enumerate(order):
                req = arrivals[i].request
                cols["prompt"][e][s] = req.prompt_len
                cols["maxtok"][e][s] = req.max_tokens
                cols["n"][e][s] = req.n
                cols["prio"][e][s] = req.priority
                cols["arrival"][e][s] = i
                arrival_step[e][s] = arrivals[i].step
            for step, rid in trace.aborts:
                s = slot_of.get(rid)
                if s is not None and step >= arrival_step[e][s]:
                    abort_step[e][s] = min(abort_step[e][s], step)
            for step, seq in trace.stops:
                parsed = _split_seq_id(seq)
                if parsed is None or parsed[0] not in slot_of:
                    continue
                s = slot_of[parsed[0]]
                if parsed[1] < cols["n"][e][s]:
                    stops.setdefault((e, s, parsed[1]), []).append(step)
        dev = self.device

        def t(x: list) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=dev)

        self.cols = {k: t(v) for k, v in cols.items()}
        self.last_arrival = t([tr.last_arrival_step for tr in traces])
        self.max_steps = t([tr.max_steps for tr in traces])
        # sparse per-step events: step -> (engine, slot[, seq]) index tensors
        self._arrive_ev = events_by_step(((s_, e, r) for e in range(E) for r, s_ in enumerate(arrival_step[e]) if s_ < _NEVER), dev)
        self._abort_ev = events_by_step(((s_, e, r) for e in range(E) for r, s_ in enumerate(abort_step[e]) if s_ < _NEVER), dev)
        self._stop_ev = events_by_step(((s_, e, r, j) for (e, r, j), steps in stops.items() for s_ in set(steps)), dev)

    def make_scheduler(self) -> BatchedScheduler:
        sched = BatchedScheduler([t.config for t in self.traces], self.R, self.N, self.device)
        c = self.cols
        sched.set_requests(c["prompt"], c["maxtok"], c["n"], c["prio"], c["arrival"])
        return sched


@dataclass
class BatchStep:
    step: int
    active: torch.Tensor  # [E] engines that ran this step (not yet drained, under max_steps)
    aborted: tuple[torch.Tensor, torch.Tensor]  # (engine, slot) of the requests aborted
    output: StepOut
    update: UpdateOut
    rows: torch.Tensor | None = None  # engine ids of the output's rows; None: all E, in order


def _expand_step(out: StepOut, rows: torch.Tensor, E: int) -> StepOut:
    """A `StepOut` of the engines ``rows`` as one over all E engines (the others idle)."""

    def full(t: torch.Tensor) -> torch.Tensor:
        z = torch.zeros((E, *t.shape[1:]), dtype=t.dtype, device=t.device)
        z[rows] = t
        return z

    def remap(m):
        return (rows[m[0]], *m[1:])

    return StepOut(out.step, full(out.kind), full(out.seqs), full(out.ntok), full(out.start), full(out.preempt),
                   full(out.ignored), remap(out.swap_out), remap(out.swap_in), remap(out.copies))


def _expand_update(upd: UpdateOut, rows: torch.Tensor, E: int) -> UpdateOut:
    def full(t: torch.Tensor) -> torch.Tensor:
        z = torch.zeros((E, *t.shape[1:]), dtype=t.dtype, device=t.device)
        z[rows] = t
        return z

    return UpdateOut(full(upd.status), full(upd.order), full(upd.ignored))


class BatchedRun:
    """Drive a `BatchedScheduler` through a `TraceBatch`, step by step, with the reference
    engine loop's end rule per engine (every request arrived and finished, or max_steps).

    Engines that are done drop out: once the engines still running are at most 3/4 of those
    being stepped, they are moved into a smaller scheduler (`BatchedScheduler.take`) and only
    it is stepped (engines are independent, so the running engines' steps are unchanged; a
    done engine's state stays as it was when it finished). With ``sync=True`` (the default)
    ``self.scheduler`` keeps the state of all E engines current, after `schedule` (before the
    ``on_schedule`` hook) and after `update`, and every `BatchStep` is over all E engines. With
    ``sync=False`` (the benchmark) the full state is written back only by `sync()` (``run()``
    calls it at the end) and a `BatchStep` is over the engines ``rows``.
    """

    COMPACT = 0.75

    def __init__(self, batch: TraceBatch, scheduler: BatchedScheduler | None = None, sync: bool = True) -> None:
        self.batch = batch
        self.scheduler = scheduler if scheduler is not None else batch.make_scheduler()
        self.active = torch.ones(batch.E, dtype=torch.bool, device=batch.device)
        self.step = 0
        self.engine_steps = 0
        self.sync_state = sync
        self._sub = self.scheduler  # the scheduler being stepped: engines self._rows
        self._rows: torch.Tensor | None = None  # None: all engines, in order
        self._pos: torch.Tensor | None = None  # engine -> row in self._sub, -1 if dropped
        self._n_active = batch.E

    def sync(self) -> None:
        """Write the stepped engines' state back into ``self.scheduler``."""
        if self._rows is not None:
            self.scheduler.put(self._rows, self._sub)

    def _compact(self, keep: torch.Tensor) -> None:
        """Step only the engines ``keep`` (a mask over the current rows) from now on."""
        full, sub = self.scheduler, self._sub
        rows = self._rows if self._rows is not None else torch.arange(self.batch.E, device=self.batch.device)
        if self._rows is not None:  # the dropped engines' final state goes back to the full scheduler
            full.put(rows, sub, (~keep).nonzero(as_tuple=True)[0])
        local = keep.nonzero(as_tuple=True)[0]
        self._sub = sub.take(local)
        self._rows = rows[local]
        self._pos = torch.full((self.batch.E,), -1, dtype=torch.long, device=self.batch.device)
        self._pos[self._rows] = torch.arange(local.numel(), device=self.batch.device)

    def advance(self, on_schedule: Callable[[StepOut], None] | None = None) -> BatchStep:
        """One step of every engine; ``on_schedule(out)`` runs between schedule and update
        (where the model would run: the KV data plane hooks in there)."""
        b, s, step, rows = self.batch, self._sub, self.step, self._rows
        expand = self.sync_state and rows is not None
        s.arrive_idx(*events_on_rows(b.arrival_idx(step), self._pos))
        aborted = s.abort_idx(*events_on_rows(b.abort_idx(step), self._pos))
        out = s.schedule()
        if expand:
            self.sync()
            out_full = _expand_step(out, rows, b.E)
        if on_schedule is not None:
            on_schedule(out_full if expand else out)
        ev = b._stop_ev.get(step)
        stopped = None
        if ev is not None:
            ev = events_on_rows(ev, self._pos)
            stopped = torch.zeros(s.E, b.R, b.N, dtype=torch.bool, device=b.device)
            stopped[ev] = True
        upd = s.update(stopped)
        st = s.status
        unfinished = row_any((st >= WAITING) & (st <= SWAPPED))
        if rows is None:
            active = self.active
            drained = (step >= b.last_arrival) & ~unfinished
            self.active = active & ~drained & (step + 1 < b.max_steps)
            now = self.active
        else:
            active = self.active
            drained = (step >= b.last_arrival[rows]) & ~unfinished
            now = active[rows] & ~drained & (step + 1 < b.max_steps[rows])
            self.active = active.clone()
            self.active[rows] = now
        self.engine_steps += self._n_active
        self._n_active = int(now.sum())
        self.step += 1
        if expand:
            self.sync()
            result = BatchStep(step, active, (rows[aborted[0]], aborted[1]), out_full, _expand_update(upd, rows, b.E))
        else:
            result = BatchStep(step, active, aborted if rows is None else (rows[aborted[0]], aborted[1]), out, upd, rows)
        if 0 < self._n_active <= self.COMPACT * s.E:
            self._compact(now)
        return result

    def run(self) -> int:
        """Run until every engine is done; returns the number of engine-steps executed."""
        while self._n_active:
            self.advance()
        self.sync()
        return self.engine_steps
