"""vLLM V1's flow (`reference_impl.v1_scheduler`) as batched torch tensors over E engines,
chunked prefill included, prefix caching left out.

This is the torch twin of the token-budget reference: every engine has its own
`SchedulerConfig` (chunked prefill on or off, ``long_prefill_token_threshold``,
``max_num_partial_prefills``, FCFS or priority, a watermark), its state lives in tensors with a
leading engine dimension, and one `schedule()` / `update()` advances all engines. It must agree
with `reference_impl.v1_scheduler.V1Scheduler` step by step: the same requests scheduled with
the same token counts and prefill flags, the same victims in the same order, the same ignored
requests, the same physical block ids, and the same free-queue order (`gpu_impl.lockstep_v1`
checks all of it).

**Left out: speculative decoding** (``num_speculative_tokens`` > 0, refused with a ValueError).
Drafts add per-request state the twin has no column for (the drafter's pending proposal, the
drafts of the step in flight) and a data-dependent outcome (each request commits 1..d + 1
tokens, then a stop may cut the run): a ragged append that the twin's one-token-per-sample
update (a masked ``+1``) does not do, and the rollback touches computed tokens after the sample.
Neither is hard in torch (a ``[E,R]`` proposal column, ``cumsum`` over committed counts), but the
twin's purpose is V1's scheduling throughput, and with k = 0 the reference's drafts code is not
reached, so the twin stays step-for-step equal to the reference on every trace it accepts
(tests/test_gpu_impl_v1.py). The reference (`reference_impl.specdec_scheduler`) is the oracle
for drafts.

**Left out: prefix caching.** A config with ``enable_prefix_caching`` is refused (ValueError).
With caching off no block is shared, a block's reference count is 0 or 1, token ids never
matter to a decision, and V1's free queue (`reference_impl.prefix_cache`, order ``"v1"``)
degenerates into a *stack*: allocation pops the front, and a freed table is put back at the
front tail block first (``release(reversed(table))``), so the next allocation reuses the freed
table's last block first. The twin keeps exactly that stack, ``stk [E,G]`` with ``top [E]``
free blocks (``stk[e, top-1]`` is the queue's front); a table is pushed head block first so its
last block ends on top. Pops and pushes are gathers and scatters at offsets that are prefix sums
over the requests freeing or allocating in one phase. (Also left out, as in the reference: ``n >
1``; reasons, which the twin never produces.)

State (E engines, R request slots in arrival order, B table entries, G blocks; padded)::

    status [E,R]   ABSENT / WAITING / RUNNING / FIN_* (the codes of `gpu_impl.batched`)
    tok, comp      tokens and computed tokens (a recompute victim keeps tok, comp -> 0)
    tlen, tab      table length and table [E,R,B] (-1 = empty); tlen == blocks_for(comp)
    inpf           no token sampled since (re)admission (the ScheduledSeq prefill flag)
    rstamp         running-queue order: a counter stamped at admission (ascending = head first)
    wkey           waiting-queue order: FCFS arrival ordinal, or a decreasing counter for
                   recompute victims (V1 puts them at the front); priority: (priority, arrival)
    pkey           (priority, arrival) packed into one int64: the priority policy's victim order

All state is int64 (indices need it anyway). Slots never move: queue orders are sort keys, and
each phase sorts the keys of one queue once (``argsort`` over [E,R]).

One `schedule()`, as tensor phases (mirroring the reference's docstring):

1. Running requests in head order, compacted to ``[E, M]`` (M = most running requests of any
   engine <= max_num_seqs). Each wants ``u = chunk_clamp(tok - comp, threshold)``; with one
   shared budget the grants are the differences of the clamped prefix sum
   (`budget_prefix`), the blocks each grant needs are ``blocks_for(comp + t) - tlen``, and when
   their total fits the free blocks (monotone prefix sums: then every front fits when reached)
   nothing is preempted and the blocks are popped at prefix-sum offsets in one gather.
2. Engines whose total does not fit preempt. V1's loop is sequential here (under priority a
   victim may be a request already scheduled in this step, which gives its tokens back and
   frees the blocks it was just given), so these engines only run a loop over fronts, at most
   M <= max_num_seqs iterations, vectorised over the engines: the front's grant, then its
   victims at once as the first prefix of the victim order (running tail under FCFS, largest
   (priority, arrival) under priority; `victim_rank`) whose suffix-sum of freed blocks covers
   the need, or that reaches the front itself; victims' tables are pushed in victim order, then
   the front's blocks popped.
3. Waiting requests (engines that preempted nothing), in waiting order, compacted to [E, W]:
   ignorable heads (prompt over the prompt limit, a sequence that never fits) are static;
   over the others, exclusive prefix sums of chunk tokens, seats, mid-prefill chunks and
   blocks give each head's "fails if all before it were admitted"; the first failure (or an
   exhausted budget) is the reference's ``break``. Admitted heads pop their chunk's blocks at
   prefix-sum offsets and join the running tail (new stamps).

`update()` advances computed tokens, samples one token for each request whose tokens are all
computed, applies the trace's stop decisions and the length caps, and pushes finished tables in
scheduled order; all masked tensor updates.

Python loops: the fronts of preempting engines (<= max_num_seqs), never engines or requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gpu_impl.batched import ABSENT, FIN_ABORTED, FIN_IGNORED, FIN_LENGTH, FIN_STOPPED, RUNNING, WAITING, resolve_device
from spec.config import SchedulerConfig

__all__ = [
    "ABSENT", "FIN_ABORTED", "FIN_IGNORED", "FIN_LENGTH", "FIN_STOPPED", "RUNNING", "WAITING",
    "BatchedV1Scheduler", "V1StepOut", "V1UpdateOut",
]

L = torch.long
_BIG = 1 << 40  # larger than any stamp, ordinal or slot
_PRIO_SHIFT = 1 << 32  # pkey = priority * _PRIO_SHIFT + arrival ordinal


def cdiv(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Blocks for ``x`` tokens at block size ``d`` (ceil division, int64)."""
    return torch.div(x + d - 1, d, rounding_mode="floor")


def chunk_clamp(tokens: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """V1's ``long_prefill_token_threshold``: a request's tokens this step are capped at the
    threshold when it is set (> 0) for this step (``threshold`` broadcasts per engine)."""
    return torch.where((threshold > 0) & (tokens > threshold), threshold, tokens)


def budget_prefix(want: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Grants ``[E, K]`` when requests take ``want`` in queue order from one shared ``budget``
    ``[E]`` until it runs out: the differences of the prefix sum clamped at the budget."""
    capped = torch.minimum(want.cumsum(1), budget[:, None])
    return capped - torch.cat([torch.zeros_like(capped[:, :1]), capped[:, :-1]], 1)


def admission_prefix(x: torch.Tensor) -> torch.Tensor:
    """What the waiting heads before each one take, if all of them were admitted (exclusive
    prefix sum along the waiting queue): budget, seats, mid-prefill chunks, blocks."""
    return x.cumsum(1) - x


def victim_rank(head_pos: torch.Tensor, pkey: torch.Tensor, priority: torch.Tensor) -> torch.Tensor:
    """The order in which running requests are preempted (largest first): FCFS takes the
    running tail (largest head position), priority the largest (priority, arrival)."""
    return torch.where(priority, pkey, head_pos)


def given_back(granted: torch.Tensor, victims: torch.Tensor) -> torch.Tensor:
    """Tokens returned to the budget ``[E]`` by this round's victims (priority: a victim may
    have been scheduled earlier in the same step; V1 takes its grant back)."""
    return (granted * victims).sum(1)


def push_columns(j: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """Stack offset of table entry ``j`` when a table of ``lens`` blocks is freed: head block
    first, so the table's last block ends on top and is handed out first (V1 frees a table in
    reverse and puts the blocks at the free queue's front in that order)."""
    return j.expand(lens.shape[0], -1)


class V1Configs:
    """The E engines' configs as int64 columns ``[E]`` (plus the original objects)."""

    def __init__(self, configs: Sequence[SchedulerConfig], device: torch.device) -> None:
        for i, c in enumerate(configs):
            if c.num_speculative_tokens:
                raise ValueError(f"engine {i}: gpu_impl.batched_v1 leaves speculative decoding out "
                                 "(num_speculative_tokens must be 0)")
            if c.enable_prefix_caching:
                raise ValueError(
                    f"engine {i}: gpu_impl.batched_v1 leaves prefix caching out (enable_prefix_caching must be false)"
                )
        self.configs = tuple(configs)

        def col(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=L, device=device)

        cs = self.configs
        self.bs = col([c.block_size for c in cs])
        self.gpu = col([c.num_gpu_blocks for c in cs])
        self.max_seqs = col([c.max_num_seqs for c in cs])
        self.max_tok = col([c.max_num_batched_tokens for c in cs])
        self.max_len = col([c.max_model_len for c in cs])
        self.wm = col([c.watermark_blocks for c in cs])
        self.plimit = col([c.prompt_limit for c in cs])
        self.thr = col([c.long_prefill_token_threshold for c in cs])
        self.partial = col([c.max_num_partial_prefills for c in cs])
        self.chunked = col([c.enable_chunked_prefill for c in cs]).bool()
        self.prio = col([c.policy == "priority" for c in cs]).bool()


@dataclass
class V1StepOut:
    """One `schedule()` for all engines. ``ntok`` [E,R]: tokens scheduled (0: not scheduled);
    ``order`` [E,R]: ascending = the reference's order of ``scheduled`` (running stamps);
    ``prefill`` [E,R]: the prefill flag; ``preempt`` [E,R]: victim ordinal (-1: not);
    ``ignored`` [E,R]: ordinal among the step's ignored requests (-1: not)."""

    step: int
    ntok: torch.Tensor
    order: torch.Tensor
    prefill: torch.Tensor
    preempt: torch.Tensor
    ignored: torch.Tensor


@dataclass
class V1UpdateOut:
    """Finished by `update()`: ``status`` [E,R] (0 or a FIN_* code), ``order`` [E,R] (ascending
    = the reference's order), and the step's ``ignored`` ordinals (reported first)."""

    status: torch.Tensor
    order: torch.Tensor
    ignored: torch.Tensor


class BatchedV1Scheduler:
    """E independent V1 engines (prefix caching off), one tensor state, one step for all."""

    def __init__(self, configs: Sequence[SchedulerConfig], max_requests: int, device: str | torch.device | None = None) -> None:
        if not configs:
            raise ValueError("BatchedV1Scheduler needs at least one engine config")
        self.device = resolve_device(device)
        self.cfg = V1Configs(configs, self.device)
        self.E = len(configs)
        self.R = max(1, int(max_requests))
        self.G = max(c.num_gpu_blocks for c in configs)
        self.B = max(max(1, min(c.num_gpu_blocks, c.blocks_for(c.max_model_len))) for c in configs)
        self.step_count = 0
        self._last: V1StepOut | None = None
        self._alloc_state()
        dev = self.device
        # the free stack: V1's initial free queue is 0..G-1 with 0 at the front (on top)
        pos = torch.arange(self.G, device=dev)[None, :]
        self.stk = (self.cfg.gpu[:, None] - 1 - pos).clamp(min=-1)
        self.top = self.cfg.gpu.clone()
        self.rctr = torch.zeros(self.E, dtype=L, device=dev)
        self.fctr = torch.zeros(self.E, dtype=L, device=dev)

    REQ_FIELDS = ("status", "prompt", "maxtok", "pkey", "arrival", "tok", "comp", "tlen", "inpf", "rstamp",
                  "wkey", "pending")

    def _alloc_state(self) -> None:
        E, R, B, dev = self.E, self.R, self.B, self.device

        def z(dtype: torch.dtype = L) -> torch.Tensor:
            return torch.zeros(E, R, dtype=dtype, device=dev)

        self.status, self.prompt, self.maxtok, self.pkey, self.arrival = z(), z(), z(), z(), z()
        self.tok, self.comp, self.tlen, self.rstamp, self.wkey = z(), z(), z(), z(), z()
        self.inpf = z(torch.bool)
        self.pending = z(torch.bool)  # rejected on arrival (prompt > max_model_len), reported next step
        self.tab = torch.full((E, R, B), -1, dtype=L, device=dev)

    def grow(self, max_requests: int) -> None:
        """Enlarge R keeping the state (the single-engine adapter grows as requests arrive)."""
        if max_requests <= self.R:
            return
        old = {name: getattr(self, name) for name in (*self.REQ_FIELDS, "tab")}
        R = self.R
        self.R = max_requests
        self._alloc_state()
        for name, value in old.items():
            getattr(self, name)[:, :R] = value

    def take(self, rows: Sequence[int]) -> BatchedV1Scheduler:
        """A scheduler of only the given engines (rows, in that order), with their state, between
        steps: a runner drops the engines that are done so a step costs what the live ones need."""
        idx = torch.tensor(list(rows), dtype=L, device=self.device)
        new = object.__new__(BatchedV1Scheduler)
        new.device, new.R, new.G, new.B = self.device, self.R, self.G, self.B
        new.cfg = V1Configs([self.cfg.configs[i] for i in rows], self.device)
        new.E = len(rows)
        new.step_count = self.step_count
        new._last = None
        for name in (*self.REQ_FIELDS, "tab", "stk", "top", "rctr", "fctr"):
            setattr(new, name, getattr(self, name)[idx])
        return new

    def set_requests(self, prompt: torch.Tensor, max_tokens: torch.Tensor, priority: torch.Tensor,
                     arrival: torch.Tensor) -> None:
        """Load every slot's request ([E,R] each); slots stay ABSENT until `arrive_idx`.
        ``arrival`` is the order in which the requests are added (FCFS order)."""
        dev = self.device
        self.prompt.copy_(prompt.to(dev, L))
        self.maxtok.copy_(max_tokens.to(dev, L))
        self.arrival.copy_(arrival.to(dev, L))
        self.pkey.copy_(priority.to(dev, L) * _PRIO_SHIFT + self.arrival)
        self.tok.copy_(self.prompt)

    # ------------------------------------------------------------------ stack helpers
    def _push(self, e: torch.Tensor, slot: torch.Tensor, ordinal: torch.Tensor) -> None:
        """Free the tables of requests (e, slot) onto their engines' stacks, in ``ordinal``
        order within an engine (later ordinals end nearer the top), and empty the tables."""
        if e.numel() == 0:
            return
        idx = (e * _BIG + ordinal).argsort()
        e, slot = e[idx], slot[idx]
        lens = self.tlen[e, slot]
        excl = lens.cumsum(0) - lens
        first = torch.full((self.E,), _BIG, dtype=L, device=self.device).scatter_reduce(0, e, excl, "amin")
        base = excl - first[e] + self.top[e]
        W = int(lens.max())
        if W > 0:
            j = torch.arange(W, device=self.device)[None, :]
            valid = j < lens[:, None]
            pos = base[:, None] + push_columns(j, lens)
            ids = self.tab[e, slot, :W]
            rows = e[:, None].expand_as(pos)
            self.stk[rows[valid], pos[valid]] = ids[valid]
            self.tab[e, slot, :W] = -1
        self.top.index_add_(0, e, lens)
        self.tlen[e, slot] = 0

    def _pop_into(self, e: torch.Tensor, slot: torch.Tensor, count: torch.Tensor, offset: torch.Tensor) -> None:
        """Append ``count`` blocks to each table (e, slot), popped from the engine's stack
        ``offset`` entries below its top (the offsets of earlier allocations in the phase).
        The caller lowers ``top`` by the phase's total."""
        keep = count > 0
        e, slot, count, offset = e[keep], slot[keep], count[keep], offset[keep]
        if e.numel() == 0:
            return
        W = int(count.max())
        j = torch.arange(W, device=self.device)[None, :]
        valid = j < count[:, None]
        src = (self.top[e][:, None] - 1 - offset[:, None] - j).clamp(min=0)
        ids = self.stk[e[:, None], src]
        col = (self.tlen[e, slot][:, None] + j).clamp(max=self.B - 1)
        rows = e[:, None].expand_as(col)
        srow = slot[:, None].expand_as(col)
        self.tab[rows[valid], srow[valid], col[valid]] = ids[valid]
        self.tlen[e, slot] += count

    # ------------------------------------------------------------------ client side
    def arrive_idx(self, e: torch.Tensor, r: torch.Tensor) -> None:
        """Requests at (engine, slot) are added: they wait, or (prompt over max_model_len) are
        refused at once, as V1's input processor does, and reported ignored by the next step."""
        if e.numel() == 0:
            return
        keep = self.status[e, r] == ABSENT
        e, r = e[keep], r[keep]
        reject = self.prompt[e, r] > self.cfg.max_len[e]
        self.status[e, r] = torch.where(reject, FIN_IGNORED, WAITING)
        self.pending[e, r] = reject
        self.inpf[e, r] = True
        self.wkey[e, r] = torch.where(self.cfg.prio[e], self.pkey[e, r], self.arrival[e, r])

    def abort_idx(self, e: torch.Tensor, r: torch.Tensor, ordinal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Abort the unfinished requests among (engine, slot) (distinct pairs, applied in
        ``ordinal`` order within an engine: it decides the free-queue order); returns those
        aborted."""
        if e.numel() == 0:
            return e, r
        code = self.status[e, r]
        keep = (code == WAITING) | (code == RUNNING)
        e, r, ordinal = e[keep], r[keep], ordinal[keep]
        self._push(e, r, ordinal)
        self.status[e, r] = FIN_ABORTED
        return e, r

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> V1StepOut:
        E, R = self.E, self.R
        dev = self.device
        c = self.cfg
        bs = c.bs[:, None]
        st = self.status
        nrun = (st == RUNNING).sum(1)
        nwait = (st == WAITING).sum(1)
        thr = (c.thr * ((nrun + nwait) > 1))[:, None]
        budget = c.max_tok.clone()
        ignored = torch.full((E, R), -1, dtype=L, device=dev)
        if bool(self.pending.any()):
            ignored = torch.where(self.pending, self.arrival, ignored)
            self.pending.zero_()
        ntok = torch.zeros(E, R, dtype=L, device=dev)
        preempt = torch.full((E, R), -1, dtype=L, device=dev)
        preempted = torch.zeros(E, dtype=torch.bool, device=dev)

        # -- phases 1-2: running requests in head order
        M = int(nrun.max())
        if M > 0:
            running = st == RUNNING
            H = torch.where(running, self.rstamp, _BIG).argsort(1)[:, :M]
            hv = torch.arange(M, device=dev)[None, :] < nrun[:, None]
            comp_h, tok_h, tlen_h = self.comp.gather(1, H), self.tok.gather(1, H), self.tlen.gather(1, H)
            u = chunk_clamp(tok_h - comp_h, thr) * hv
            t = budget_prefix(u, budget)
            need = (cdiv(comp_h + t, bs) - tlen_h).clamp(min=0) * hv
            easy = need.sum(1) <= self.top
            em = easy[:, None] & hv & (t > 0)
            if bool(em.any()):
                ne = need * em
                ee, kk = em.nonzero(as_tuple=True)
                off = ne.cumsum(1) - ne
                self._pop_into(ee, H[ee, kk], ne[ee, kk], off[ee, kk])
                self.top -= ne.sum(1)
                ntok[ee, H[ee, kk]] = t[ee, kk]
                budget -= (t * em).sum(1)
            hard = ~easy
            if bool(hard.any()):
                self._running_loop(hard.nonzero(as_tuple=True)[0], H, hv, u, budget, ntok, preempt)
                preempted = hard

        # -- phase 3: waiting requests, in engines that preempted nothing
        waiting = (self.status == WAITING) & ~preempted[:, None]
        nw = waiting.sum(1)
        W = int(nw.max())
        if W > 0:
            arW = torch.arange(W, device=dev)[None, :]
            Ws = torch.where(waiting, self.wkey, _BIG).argsort(1)[:, :W]
            wv = arW < nw[:, None]
            tok_w = self.tok.gather(1, Ws)
            need_all = cdiv(tok_w, bs)
            ign = wv & ((self.prompt.gather(1, Ws) > c.plimit[:, None]) | (need_all > (c.gpu - c.wm)[:, None]))
            cand = wv & ~ign
            u = chunk_clamp(tok_w, thr) * cand
            left = budget[:, None] - admission_prefix(u)
            chunk = torch.minimum(u, left.clamp(min=0))
            nrun1 = (self.status == RUNNING).sum(1)
            seats = nrun1[:, None] + admission_prefix(cand.long())
            blocks = cdiv(chunk, bs) * cand
            bex = admission_prefix(blocks)
            mid = chunk < tok_w - 1
            P0 = ((self.status == RUNNING) & (self.comp + ntok < self.tok - 1)).sum(1)
            limit = c.partial[:, None]
            fail = (wv & (left <= 0)) | (cand & (
                (seats >= c.max_seqs[:, None])
                | (~c.chunked[:, None] & (u > left))
                | ((limit > 0) & mid & (P0[:, None] + admission_prefix((mid & cand).long()) >= limit))
                | (need_all + c.wm[:, None] > self.top[:, None] - bex)
            ))
            brk = torch.where(fail.any(1), fail.long().argmax(1), W)
            before = arW < brk[:, None]
            adm = cand & before
            if bool(adm.any()):
                ae, ak = adm.nonzero(as_tuple=True)
                slots = Ws[ae, ak]
                self._pop_into(ae, slots, blocks[ae, ak], bex[ae, ak])
                self.top -= (blocks * adm).sum(1)
                ai = adm.long()
                self.rstamp[ae, slots] = (self.rctr[:, None] + ai.cumsum(1) - 1)[ae, ak]
                self.rctr += ai.sum(1)
                self.status[ae, slots] = RUNNING
                self.inpf[ae, slots] = True
                ntok[ae, slots] = chunk[ae, ak]
            ig = ign & before
            if bool(ig.any()):
                ie, ik = ig.nonzero(as_tuple=True)
                slots = Ws[ie, ik]
                self.status[ie, slots] = FIN_IGNORED
                ignored[ie, slots] = _BIG + ik

        out = V1StepOut(self.step_count, ntok, self.rstamp.clone(), self.inpf.clone(), preempt, ignored)
        self.step_count += 1
        self._last = out
        return out

    def _running_loop(self, Q: torch.Tensor, H: torch.Tensor, hv: torch.Tensor, u: torch.Tensor,
                      budget: torch.Tensor, ntok: torch.Tensor, preempt: torch.Tensor) -> None:
        """Phase 2 for the engines ``Q`` that preempt: one front per iteration (<= M)."""
        dev = self.device
        c = self.cfg
        q, M = Q.numel(), H.shape[1]
        rows = torch.arange(q, device=dev)
        arM = torch.arange(M, device=dev)[None, :]
        Hq, hvq, uq = H[Q], hv[Q], u[Q]
        Qc = Q[:, None].expand(q, M)
        bs = c.bs[Q]
        vr = torch.where(hvq, victim_rank(arM.expand(q, M), self.pkey[Qc, Hq], c.prio[Q][:, None]), -_BIG)
        V = vr.argsort(1, descending=True)  # victim order, as head positions
        Vslot = Hq.gather(1, V)
        alive = hvq.clone()
        tq = torch.zeros(q, M, dtype=L, device=dev)
        bud = budget[Q].clone()
        cur = torch.zeros(q, dtype=L, device=dev)
        done = torch.zeros(q, dtype=torch.bool, device=dev)
        pcount = torch.zeros(q, dtype=L, device=dev)
        fcfs = ~c.prio[Q]
        for _ in range(M):
            cand = alive & (arM >= cur[:, None])
            act = cand.any(1) & ~done & (bud > 0)
            if not bool(act.any()):
                break
            f = cand.long().argmax(1)
            fslot = Hq[rows, f]
            tf = torch.minimum(uq[rows, f], bud)
            comp_f = self.comp[Q, fslot]
            need = (cdiv(comp_f + tf, bs) - self.tlen[Q, fslot]).clamp(min=0)
            free = self.top[Q]
            aV = alive.gather(1, V)
            cum = (self.tlen[Qc, Vslot] * aV).cumsum(1)
            isf = V == f[:, None]
            ok = aV & ((free[:, None] + cum >= need[:, None]) | isf)
            js = ok.long().argmax(1)
            fits = need <= free
            nv = torch.where(fits | ~act, 0, js + 1)
            vm = aV & (arM < nv[:, None])
            selfp = act & ~fits & (V[rows, js] == f)
            if bool(vm.any()):
                ve, vk = vm.nonzero(as_tuple=True)
                vslot = Vslot[ve, vk]
                eng = Q[ve]
                self._push(eng, vslot, vk)
                bud += given_back(tq.gather(1, V), vm)
                pos = V[ve, vk]
                alive[ve, pos] = False
                tq[ve, pos] = 0
                rank = (vm.long().cumsum(1) - 1)[ve, vk]
                preempt[eng, vslot] = pcount[ve] + rank
                pcount += vm.sum(1)
                self.status[eng, vslot] = WAITING
                self.comp[eng, vslot] = 0
                self.inpf[eng, vslot] = True
                fkey = self.fctr[eng] - 1 - rank
                self.wkey[eng, vslot] = torch.where(c.prio[eng], self.pkey[eng, vslot], fkey)
                self.fctr[Q] -= vm.sum(1)
            go = act & ~selfp
            if bool(go.any()):
                gi = go.nonzero(as_tuple=True)[0]
                eng, gslot = Q[gi], fslot[gi]
                self._pop_into(eng, gslot, need[gi], torch.zeros_like(gi))
                self.top[eng] -= need[gi]
                tq[gi, f[gi]] = tf[gi]
                bud[gi] -= tf[gi]
            cur = torch.where(act, f + 1, cur)
            done |= selfp & fcfs
        sm = alive & (tq > 0)
        se, sk = sm.nonzero(as_tuple=True)
        ntok[Q[se], Hq[se, sk]] = tq[se, sk]
        budget[Q] = bud

    # ------------------------------------------------------------------ update
    def update(self, stopped: torch.Tensor | None = None) -> V1UpdateOut:
        """Feed back the step: ``stopped`` [E,R] marks requests whose sampled token is a stop
        token (ignored for a request that sampled nothing, i.e. is still mid-prefill)."""
        E, R = self.E, self.R
        dev = self.device
        out, self._last = self._last, None
        fstatus = torch.zeros(E, R, dtype=L, device=dev)
        if out is None:
            return V1UpdateOut(fstatus, fstatus, torch.full((E, R), -1, dtype=L, device=dev))
        sched = (out.ntok > 0) & (self.status == RUNNING)
        self.comp = self.comp + out.ntok * sched
        samp = sched & (self.comp >= self.tok)
        self.tok = self.tok + samp
        self.inpf &= ~samp
        stop = samp & stopped if stopped is not None else torch.zeros_like(samp)
        capped = samp & ~stop & (((self.tok - self.prompt) >= self.maxtok) | (self.tok >= self.cfg.max_len[:, None]))
        fin = stop | capped
        if bool(fin.any()):
            fe, fr = fin.nonzero(as_tuple=True)
            self._push(fe, fr, self.rstamp[fe, fr])
            fstatus = stop * FIN_STOPPED + capped * FIN_LENGTH
            self.status = torch.where(fin, fstatus, self.status)
        return V1UpdateOut(fstatus, self.rstamp.clone(), out.ignored)
