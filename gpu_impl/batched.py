"""The reference scheduler (vLLM V0's default flow) as batched torch tensors over E engines.

Every engine is independent and has its own `SchedulerConfig`; their state lives in tensors
with a leading engine dimension, and one `schedule()` / `update()` advances all of them. The
cost of a step comes from a small constant number of tensor phases, not from Python loops over
requests or engines. The result must equal the reference's (`reference_impl.scheduler`) bit for
bit: the same sequences scheduled with the same token counts, the same victims and modes, the
same physical block ids (lowest free id first), the same swap and copy maps.

State (E engines, R request slots, N sequence slots per request, B table entries per sequence,
G GPU / C CPU blocks; all padded to the largest engine)::

    status  [E,R]      ABSENT / WAITING / RUNNING / SWAPPED / FIN_*   (per request)
    tok, comp [E,R]    tokens and computed tokens of the request's live sequences (all equal)
    tlen    [E,R]      table length of the live sequences (all equal)
    dblk    [E,R]      distinct blocks held by the live sequences (sharing is position-aligned)
    forked  [E,R]      whether the n - 1 children exist
    alive, exists [E,R,N]; sstat/stok/scomp [E,R,N] (a finished sequence's final view)
    tab     [E,R,N,B]  block tables (GPU ids when RUNNING, CPU ids when SWAPPED, -1 = empty)
    gpu_ref [E,G], cpu_ref [E,C]   reference counts; a block is free iff its count is 0

Queue order. Request slots are kept sorted by the policy key (FCFS: arrival; priority:
(priority, arrival)), so every queue is "the slots with that status, in slot order": the
reference keeps all three queues sorted by that key, and a recompute victim re-enters waiting
at its key's place. Prefix sums along the slot axis are therefore prefix sums over a queue.

One `schedule()`, as tensor phases (mirroring the reference's docstring):

1. Per group: seats (``n`` before the fork, else live sequences), whether its next append
   starts a block (``comp // block_size == tlen``) and which sequences copy-on-write (a live
   sequence whose last block is also the last block of a later live sequence; the last holder
   writes in place). ``a`` = blocks the append allocates. The running groups are compacted into
   a head-order array ``[E, M]`` (M = the most running groups of any engine <= max_num_seqs),
   and read backwards as the *tail order* in which victims are taken.
2. Priority preemption: the candidates are the running tail with keys after the waiting head
   (slots after the head's slot). After k victims the head fits iff
   ``F0 + D_k - need >= watermark`` and ``seats0 - Seat_k + seats_head <= max_num_seqs``, with
   D, Seat suffix sums over the tail; the victim count is the first k that fits (capped at the
   candidates). A victim frees its distinct blocks whatever its mode.
3. Swap or recompute: a victim in swap mode swaps iff the CPU blocks left after the earlier
   swapping victims suffice. This greedy is sequential in the victim order; it is run over tail
   ordinals only up to the largest victim count of any engine this step (<= max_num_seqs).
4. Prefills (engines with nothing swapped): waiting groups (recompute victims included) in
   slot order. Ignorable groups (too long, too many seqs, never fits) are static; over the
   other groups, inclusive prefix sums of blocks, tokens and seats give each group's "fails
   if all before it were admitted"; the first failure is the reference's ``break``. Admitted =
   non-ignorable before it, ignored = ignorable before it.
5. Decodes (engines that admitted no prefill): front f needs ``nlive_f`` free blocks when it
   is reached; with A_f the blocks allocated by earlier fronts and D' the suffix sums of the
   remaining tail, ``k*(f) = searchsorted(D', nlive_f - (F - A_f))`` victims suffice, the
   running victim count is ``S_f = cummax k*``, and front f is scheduled iff
   ``S_f + f <= m' - 1``. That is monotone, so P fronts run and the last ``m' - P`` groups
   are victims (the last of them possibly the front that could not be served).
6. Swap-ins (engines with no preemption): like prefills over the swapped groups, where a
   group reserves ``distinct + nlive`` blocks but consumes ``distinct + a``; exclusive sums of
   the consumption plus the group's own reservation give the failures.
7. Block ids: in a step, CPU blocks are only allocated (swap-outs, in victim order), so the
   k-th CPU allocation is the k-th lowest initially free id. GPU blocks: priority-preemption
   frees come first, then prefills or decodes and swap-ins allocate; without decode victims the
   t-th allocation is the t-th lowest id free after preemption (ranking the free mask with a
   cumsum). An engine with decode victims frees blocks between fronts; for those engines only,
   a loop over fronts (<= max_num_seqs) re-ranks the free mask including the victims released
   so far (``release front = searchsorted(S, victim ordinal + 1)``).

`update()` applies one token per scheduled sequence, forks ``n - 1`` children sharing every
block after a prefill, applies the stop rules and frees finished sequences, all as masked
tensor updates.

Outputs are tensors (`StepOut`, `UpdateOut`); `gpu_impl.materialize` turns them into
`spec.types.SchedulerOutput` objects per engine for comparison. The twin does not produce
reasons (``SchedulerOutput.reasons`` is empty).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from spec.config import SchedulerConfig

ABSENT, WAITING, RUNNING, SWAPPED = 0, 1, 2, 3
FIN_STOPPED, FIN_LENGTH, FIN_ABORTED, FIN_IGNORED = 4, 5, 6, 7
K_PREFILL, K_DECODE, K_SWAPIN = 1, 2, 3
P_RECOMPUTE, P_SWAP = 1, 2
MODES = {"auto": 0, "recompute": 1, "swap": 2}
_BIG = 1 << 40


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        device = default_device()
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but torch.cuda.is_available() is False")
    return device


class EngineConfigs:
    """The E engines' configs as columns ``[E]`` (plus the original objects)."""

    def __init__(self, configs: Sequence[SchedulerConfig], device: torch.device) -> None:
        self.configs = tuple(configs)

        def col(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        cs = self.configs
        self.bs = col([c.block_size for c in cs])
        self.gpu = col([c.num_gpu_blocks for c in cs])
        self.cpu = col([c.num_cpu_blocks for c in cs])
        self.max_seqs = col([c.max_num_seqs for c in cs])
        self.max_tok = col([c.max_num_batched_tokens for c in cs])
        self.max_len = col([c.max_model_len for c in cs])
        self.wm = col([c.watermark_blocks for c in cs])
        self.plimit = col([c.prompt_limit for c in cs])
        self.mode = col([MODES[c.preemption_mode] for c in cs])
        self.prio = col([c.policy == "priority" for c in cs]).bool()

    @staticmethod
    def max_blocks_per_seq(c: SchedulerConfig) -> int:
        return max(1, min(c.num_gpu_blocks, c.blocks_for(c.max_model_len)))


@dataclass
class StepOut:
    """One `schedule()` for all engines, as tensors.

    ``kind`` [E,R]: 0, K_PREFILL, K_DECODE or K_SWAPIN; ``seqs`` [E,R,N]: the sequences in the
    batch; ``ntok`` [E,R]: tokens per scheduled sequence; ``start`` [E,R]: first position each
    scheduled sequence computes (its num_computed); ``preempt`` [E,R]: 0, P_RECOMPUTE or P_SWAP
    (victim order = descending slot); ``ignored`` [E,R]. Maps are flat (engine, order key,
    source, destination) tensors; within an engine, ascending key is the reference's order.
    """

    step: int
    kind: torch.Tensor
    seqs: torch.Tensor
    ntok: torch.Tensor
    start: torch.Tensor
    preempt: torch.Tensor
    ignored: torch.Tensor
    swap_out: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    swap_in: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    copies: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass
class UpdateOut:
    """Requests finished by `update()`: ``status`` [E,R] (0 or a FIN_* code) and ``order`` [E,R]
    (ascending = the reference's order; the step's ignored requests come first)."""

    status: torch.Tensor
    order: torch.Tensor
    ignored: torch.Tensor


def _empty_map(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    z = torch.zeros(0, dtype=torch.long, device=device)
    return (z, z, z, z)


def sorted_free(mask: torch.Tensor) -> torch.Tensor:
    """``[E', X]`` free mask -> the free ids in ascending order per row, padded with X.

    The rank of a free block is the inclusive cumsum of the mask minus one; scattering ids to
    their ranks lists them in order (lowest free id first, as the reference's heap pops them)."""
    rows, width = mask.shape
    pos = torch.where(mask, mask.cumsum(1) - 1, width)
    out = torch.full((rows, width + 1), width, dtype=torch.long, device=mask.device)
    out.scatter_(1, pos, torch.arange(width, device=mask.device).expand(rows, width))
    return out[:, :width]


def admission_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sum along the queue: group i's total *including itself*."""
    return x.cumsum(-1)


def tail_positions(m: torch.Tensor, width: int) -> torch.Tensor:
    """Head position of the v-th victim candidate: the running tail first (the least urgent)."""
    v = torch.arange(width, device=m.device)
    return (m[:, None] - 1 - v).clamp(min=0)


def first_holders(t: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For tables ``t`` [K,N,B]: which entries are the first (lowest live sequence) holder of
    their block, and the pairwise equality ``eq[k, j, j', b]`` (None when N == 1). Sharing is
    position-aligned (forks copy whole tables), so comparing the same column suffices."""
    n = t.shape[1]
    if n == 1:
        return valid.clone(), None
    eq = (t[:, :, None, :] == t[:, None, :, :]) & valid[:, :, None, :] & valid[:, None, :, :]
    lower = torch.ones(n, n, dtype=torch.bool, device=t.device).tril(-1)
    dup = (eq & lower[None, :, :, None]).any(2)
    return valid & ~dup, eq


def map_through_holders(first: torch.Tensor, eq: torch.Tensor | None, new_first: torch.Tensor) -> torch.Tensor:
    """Give every entry the new id of its block's first holder (ids are -1 off ``first``)."""
    if eq is None:
        return new_first
    pick = eq & first[:, None, :, :]
    return torch.where(pick, new_first[:, None, :, :], -1).amax(2)


class BatchedScheduler:
    """E independent engines, one tensor state, one step for all (see the module docstring).

    Capacity is fixed at construction: ``max_requests`` slots per engine (R), ``max_n``
    sequences per request (N); tables hold up to ``min(num_gpu_blocks, blocks_for(max_model_len))``
    entries. Request slots must be kept in policy-key order (see `set_requests`).
    """

    def __init__(
        self,
        configs: Sequence[SchedulerConfig],
        max_requests: int,
        max_n: int = 1,
        device: str | torch.device | None = None,
    ) -> None:
        if not configs:
            raise ValueError("BatchedScheduler needs at least one engine config")
        self.device = resolve_device(device)
        self.cfg = EngineConfigs(configs, self.device)
        self.E = len(configs)
        self.R = max(1, int(max_requests))
        self.N = max(1, int(max_n))
        self.B = max(EngineConfigs.max_blocks_per_seq(c) for c in configs)
        self.G = max(c.num_gpu_blocks for c in configs)
        self.C = max(1, max(c.num_cpu_blocks for c in configs))
        self.step_count = 0
        self._last: StepOut | None = None
        self._alloc_state()

    # ------------------------------------------------------------------ state
    def _alloc_state(self) -> None:
        E, R, N, B, G, C, dev = self.E, self.R, self.N, self.B, self.G, self.C, self.device

        def z(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=dev)

        self.status = z(E, R)
        self.prompt = z(E, R)
        self.maxtok = z(E, R)
        self.n = torch.ones(E, R, dtype=torch.long, device=dev)
        self.prio = z(E, R)
        self.arrival = z(E, R)
        self.forked = z(E, R, dtype=torch.bool)
        self.tok = z(E, R)
        self.comp = z(E, R)
        self.tlen = z(E, R)
        self.dblk = z(E, R)
        self.alive = z(E, R, N, dtype=torch.bool)
        self.exists = z(E, R, N, dtype=torch.bool)
        self.sstat = z(E, R, N)
        self.stok = z(E, R, N)
        self.scomp = z(E, R, N)
        self.tab = torch.full((E, R, N, B), -1, dtype=torch.long, device=dev)
        self.gpu_ref = z(E, G)
        self.cpu_ref = z(E, C)
        self.gvalid = torch.arange(G, device=dev)[None, :] < self.cfg.gpu[:, None]
        self.cvalid = torch.arange(C, device=dev)[None, :] < self.cfg.cpu[:, None]
        self._ar = {}

    REQ_FIELDS = ("status", "prompt", "maxtok", "n", "prio", "arrival", "forked", "tok", "comp", "tlen", "dblk")
    SEQ_FIELDS = ("alive", "exists", "sstat", "stok", "scomp", "tab")

    def _arange(self, n: int) -> torch.Tensor:
        t = self._ar.get(n)
        if t is None:
            t = self._ar[n] = torch.arange(n, device=self.device)
        return t

    def set_requests(
        self, prompt: torch.Tensor, max_tokens: torch.Tensor, n: torch.Tensor, priority: torch.Tensor,
        arrival: torch.Tensor,
    ) -> None:
        """Load every slot's request attributes ([E,R] each); slots stay ABSENT until `arrive`.
        Slots must be in policy-key order within each engine (empty slots last)."""
        for name, value in (("prompt", prompt), ("maxtok", max_tokens), ("n", n), ("prio", priority),
                            ("arrival", arrival)):
            getattr(self, name).copy_(value.to(self.device, torch.long))
        self.tok.copy_(self.prompt)
        self.forked.copy_(self.n == 1)

    def permute_requests(self, perm: torch.Tensor) -> None:
        """Reorder the slots of every engine: new slot i holds old slot ``perm[e, i]``."""
        for name in self.REQ_FIELDS:
            t = getattr(self, name)
            setattr(self, name, t.gather(1, perm))
        for name in self.SEQ_FIELDS:
            t = getattr(self, name)
            idx = perm.view(self.E, self.R, *([1] * (t.dim() - 2))).expand_as(t)
            setattr(self, name, t.gather(1, idx))

    def grow(self, max_requests: int | None = None, max_n: int | None = None) -> None:
        """Enlarge R and/or N, keeping the state (used by the single-engine adapter)."""
        R2 = max(self.R, max_requests or 0)
        N2 = max(self.N, max_n or 0)
        if (R2, N2) == (self.R, self.N):
            return
        old = {name: getattr(self, name) for name in self.REQ_FIELDS + self.SEQ_FIELDS}
        R, N = self.R, self.N
        self.R, self.N = R2, N2
        gpu_ref, cpu_ref = self.gpu_ref, self.cpu_ref
        self._alloc_state()
        self.gpu_ref, self.cpu_ref = gpu_ref, cpu_ref
        for name in self.REQ_FIELDS:
            getattr(self, name)[:, :R] = old[name]
        for name in self.SEQ_FIELDS:
            getattr(self, name)[:, :R, :N] = old[name]

    # ------------------------------------------------------------------ small helpers
    def _add_at(self, ref: torch.Tensor, e: torch.Tensor, idx: torch.Tensor, value: int | torch.Tensor) -> None:
        """``ref[e, idx] += value`` with repeated indices accumulating."""
        if e.numel() == 0:
            return
        flat = e * ref.shape[1] + idx
        if not torch.is_tensor(value):
            value = torch.full_like(flat, value)
        ref.view(-1).index_add_(0, flat, value)

    def _clear_seqs(self, mask: torch.Tensor, code: int | torch.Tensor) -> None:
        """Finish the sequences in ``mask`` [E,R,N]: record their final view, drop their tables."""
        self.sstat = torch.where(mask, code, self.sstat)
        self.stok = torch.where(mask, self.tok[:, :, None], self.stok)
        self.scomp = torch.where(mask, self.comp[:, :, None], self.scomp)
        self.alive &= ~mask
        self.tab.masked_fill_(mask[..., None], -1)

    def _release(self, groups: torch.Tensor, seq_mask: torch.Tensor | None = None) -> None:
        """Drop the references held by live sequences of ``groups`` [E,R] (on the device each
        request lives on: GPU when running, CPU when swapped)."""
        sel = groups[..., None] & self.alive
        if seq_mask is not None:
            sel &= seq_mask
        if not bool(sel.any()):
            return
        e, r, j = sel.nonzero(as_tuple=True)
        t = self.tab[e, r, j]  # [K,B]
        valid = t >= 0
        on_cpu = (self.status[e, r] == SWAPPED)[:, None] & valid
        on_gpu = ~on_cpu & valid
        ee = e[:, None].expand_as(t)
        self._add_at(self.gpu_ref, ee[on_gpu], t[on_gpu], -1)
        self._add_at(self.cpu_ref, ee[on_cpu], t[on_cpu], -1)

    # ------------------------------------------------------------------ client side
    def arrive(self, mask: torch.Tensor) -> None:
        """Requests in ``mask`` [E,R] (ABSENT slots with attributes loaded) join waiting."""
        mask = mask & (self.status == ABSENT)
        self.status = torch.where(mask, WAITING, self.status)
        first = torch.zeros_like(self.alive)
        first[:, :, 0] = True
        new = mask[..., None] & first
        self.alive |= new
        self.exists |= new

    def abort(self, mask: torch.Tensor) -> torch.Tensor:
        """Abort the unfinished requests in ``mask``; returns which were aborted."""
        st = self.status
        mask = mask & (st >= WAITING) & (st <= SWAPPED)
        if not bool(mask.any()):
            return mask
        self._release(mask)
        self._clear_seqs(mask[..., None] & self.alive, FIN_ABORTED)
        self.status = torch.where(mask, FIN_ABORTED, st)
        self.dblk = torch.where(mask, 0, self.dblk)
        self.tlen = torch.where(mask, 0, self.tlen)
        return mask

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepOut:
        E, R, N, B, G = self.E, self.R, self.N, self.B, self.G
        dev = self.device
        cfg = self.cfg
        arR, arB = self._arange(R), self._arange(B)
        st = self.status
        running, waiting, swapped = st == RUNNING, st == WAITING, st == SWAPPED
        alive = self.alive
        nlive = alive.sum(-1)
        seats = torch.where(self.forked, nlive, self.n)
        gfree0 = (self.gpu_ref == 0) & self.gvalid
        F0 = gfree0.sum(-1)
        cfree0 = (self.cpu_ref == 0) & self.cvalid
        C0 = cfree0.sum(-1)
        seats0 = (seats * running).sum(-1)
        has_swapped = swapped.any(-1)
        bs = cfg.bs[:, None]
        wm, max_seqs, max_tok = cfg.wm[:, None], cfg.max_seqs[:, None], cfg.max_tok[:, None]
        want_swap = (cfg.mode[:, None] == 2) | ((cfg.mode[:, None] == 0) & (seats > 1))

        # -- phase 1: the append shape of every group (used by decodes and swap-ins)
        boundary = (self.comp // bs) == self.tlen
        if N > 1:
            last = self.tab.gather(3, (self.tlen - 1).clamp(min=0)[:, :, None, None].expand(E, R, N, 1))[..., 0]
            upper = torch.ones(N, N, dtype=torch.bool, device=dev).triu(1)
            shared_later = ((last[:, :, :, None] == last[:, :, None, :]) & alive[:, :, None, :] & upper).any(-1)
            shared_later &= alive
            x = alive & (boundary[..., None] | shared_later)
        else:
            x = alive & boundary[..., None]
        a = x.sum(-1)

        # -- running groups, compacted in head order; tail ordinal v <-> head position m-1-v
        m = running.sum(-1)
        M = int(m.max()) if E else 0
        rank = running.cumsum(-1) - 1
        tord = torch.where(running, m[:, None] - 1 - rank, _BIG)  # victim ordinal of each running slot
        k_pp = torch.zeros(E, dtype=torch.long, device=dev)
        Kd = torch.zeros(E, dtype=torch.long, device=dev)
        P = torch.zeros(E, dtype=torch.long, device=dev)
        swaps_slot = torch.zeros(E, R, dtype=torch.bool, device=dev)
        F1, seats1 = F0, seats0
        if M > 0:
            arM = self._arange(M)
            hpos = torch.where(running, rank, M)
            head_slot = torch.full((E, M + 1), R, dtype=torch.long, device=dev)
            head_slot.scatter_(1, hpos, arR.expand(E, R))
            head_slot = head_slot[:, :M]
            hvalid = head_slot < R
            hs = head_slot.clamp(max=R - 1)
            d_h = self.dblk.gather(1, hs) * hvalid
            nlive_h = nlive.gather(1, hs) * hvalid
            a_h = a.gather(1, hs) * hvalid
            seats_h = seats.gather(1, hs) * hvalid
            want_h = want_swap.gather(1, hs) & hvalid
            tidx = tail_positions(m, M)
            tvalid = arM[None, :] < m[:, None]
            d_t = d_h.gather(1, tidx) * tvalid
            seats_t = seats_h.gather(1, tidx) * tvalid
            want_t = want_h.gather(1, tidx) & tvalid
            zero = torch.zeros(E, 1, dtype=torch.long, device=dev)
            Dall = torch.cat([zero, d_t.cumsum(1)], 1)  # [E, M+1]: blocks freed by the first k victims
            Sall = torch.cat([zero, seats_t.cumsum(1)], 1)

            # -- phase 2: priority preemption
            pe = cfg.prio & ~has_swapped & waiting.any(-1)
            if bool(pe.any()):
                hslot = waiting.long().argmax(-1)[:, None]
                h_n = nlive.gather(1, hslot)[:, 0]
                h_tok = self.tok.gather(1, hslot)[:, 0]
                h_need = h_n * ((h_tok + cfg.bs - 1) // cfg.bs)
                h_tokens = h_n * h_tok
                h_seats = seats.gather(1, hslot)[:, 0]
                cands = (running & (arR[None, :] > hslot)).sum(-1)
                fits = (
                    ((cfg.gpu - h_need >= cfg.wm) & (h_tokens <= cfg.max_tok))[:, None]
                    & (F0[:, None] + Dall - h_need[:, None] >= wm)
                    & (seats0[:, None] - Sall + h_seats[:, None] <= max_seqs)
                )
                kfit = torch.where(fits, self._arange(M + 1), M + 1).amin(-1)
                k_pp = torch.where(pe, torch.minimum(kfit, cands), 0)

            # -- phase 3 (first part): swap-or-recompute for the priority victims
            swaps_t = torch.zeros(E, M, dtype=torch.bool, device=dev)
            cfree_left = C0.clone()
            v_done = 0
            v_need = int(k_pp.max())
            v_done = self._greedy_swaps(v_done, v_need, want_t, d_t, swaps_t, cfree_left)
            F1 = F0 + Dall.gather(1, k_pp[:, None])[:, 0]
            seats1 = seats0 - Sall.gather(1, k_pp[:, None])[:, 0]
            tord_c = tord.clamp(max=M - 1)
            swaps_slot = swaps_t.gather(1, tord_c) & running
            pp_victim = running & (tord < k_pp[:, None])
        else:
            pp_victim = torch.zeros(E, R, dtype=torch.bool, device=dev)
        pp_recompute = pp_victim & ~swaps_slot

        # -- phase 4: prefills
        pre = ~has_swapped
        w = (waiting | pp_recompute) & pre[:, None]
        nb = (self.tok + bs - 1) // bs
        ptok = nlive * self.tok
        pneed = nlive * nb
        ign = (ptok > cfg.plimit[:, None]) | (seats > max_seqs) | (cfg.gpu[:, None] - pneed < wm)
        cand = w & ~ign
        fail = cand & (
            (F1[:, None] - admission_cumsum(pneed * cand) < wm)
            | (admission_cumsum(ptok * cand) > max_tok)
            | (seats1[:, None] + admission_cumsum(seats * cand) > max_seqs)
        )
        before = arR[None, :] < torch.where(fail, arR, R).amin(-1, keepdim=True)
        admit = cand & before
        ignored = w & ign & before
        pf_any = admit.any(-1)

        # -- phase 5: decodes
        dec = ~pf_any
        dsched = torch.zeros(E, R, dtype=torch.bool, device=dev)
        if M > 0:
            mp = m - k_pp
            A_excl = a_h.cumsum(1) - a_h
            idxD = k_pp[:, None] + self._arange(M + 1)
            Dp = Dall.gather(1, idxD.clamp(max=M)) - Dall.gather(1, k_pp[:, None])
            Dp = torch.where(idxD > m[:, None], _BIG, Dp)
            req = nlive_h - (F1[:, None] - A_excl)
            kstar = torch.searchsorted(Dp.contiguous(), req.contiguous())
            S = kstar.cummax(1).values
            okf = (S + arM[None, :]) <= (mp - 1)[:, None]
            P = torch.where(dec, okf.sum(-1), 0)
            Kd = torch.where(dec, mp - P, 0)
            dsched = running & (rank < P[:, None])
            # -- phase 3 (second part): swap-or-recompute for the decode victims
            v_total = k_pp + Kd
            v_done = self._greedy_swaps(v_done, int(v_total.max()), want_t, d_t, swaps_t, cfree_left)
            swaps_slot = swaps_t.gather(1, tord_c) & running
            victim = running & (tord < v_total[:, None])
        else:
            victim = torch.zeros(E, R, dtype=torch.bool, device=dev)
        vswap = victim & swaps_slot

        # -- phase 6: swap-ins
        swin = torch.zeros(E, R, dtype=torch.bool, device=dev)
        si = dec & (k_pp == 0) & (Kd == 0) & has_swapped
        A_dec = (a * dsched).sum(-1)
        if bool(si.any()):
            sw = swapped & si[:, None]
            sneed = self.dblk + nlive
            scost = self.dblk + a
            s_ign = cfg.gpu[:, None] - sneed < wm
            s_cand = sw & ~s_ign
            tok_dec = (nlive * dsched).sum(-1)
            cost_excl = admission_cumsum(scost * s_cand) - scost * s_cand
            s_fail = s_cand & (
                ((F1 - A_dec)[:, None] - cost_excl - sneed < wm)
                | (tok_dec[:, None] + admission_cumsum(nlive * s_cand) > max_tok)
                | (seats1[:, None] + admission_cumsum(seats * s_cand) > max_seqs)
            )
            s_before = arR[None, :] < torch.where(s_fail, arR, R).amin(-1, keepdim=True)
            swin = s_cand & s_before
            ignored = ignored | (sw & s_ign & s_before)

        # -- phase 7: apply. Victims first (a recompute victim may be re-admitted this step).
        swap_out = _empty_map(dev)
        loop_victims = None
        if bool(victim.any()):
            swap_out, loop_victims = self._apply_victims(victim, vswap, tord, k_pp, Kd, swaps_t, d_t, cfree0, M)
        gfree = (self.gpu_ref == 0) & self.gvalid
        if loop_victims is not None:
            gfree_rank = gfree.clone()
            lve, lvt = loop_victims[0], loop_victims[1]
            gfree_rank.view(-1)[lve * G + lvt] = False  # decode victims' blocks: released mid-phase
        else:
            gfree_rank = gfree
        gsorted = sorted_free(gfree_rank)
        if bool(pf_any.any()):
            self._apply_prefills(admit, nb, pneed, gsorted)

        swap_in = _empty_map(dev)
        copies = _empty_map(dev)
        loop_eng = Kd > 0
        direct = dsched & ~loop_eng[:, None]
        if bool(swin.any()):
            sc = (self.dblk + a) * swin
            base_s = A_dec[:, None] + sc.cumsum(-1) - sc
            swap_in = self._apply_swap_ins(swin, base_s, gsorted)
        else:
            base_s = None
        groups_e, groups_r, groups_ids, groups_key = [], [], [], []
        if bool(direct.any()) or base_s is not None:
            ad = a * direct
            base = ad.cumsum(-1) - ad
            key = arR[None, :].expand(E, R)
            if base_s is not None:
                base = torch.where(swin, base_s + self.dblk, base)
                key = torch.where(swin, key + R, key)
            sel = direct | swin
            ge, gr = sel.nonzero(as_tuple=True)
            xk = x[ge, gr]
            t = base[ge, gr][:, None] + xk.cumsum(1) - xk.long()
            ids = gsorted[ge[:, None], t.clamp(max=G - 1)]
            groups_e.append(ge)
            groups_r.append(gr)
            groups_ids.append(torch.where(xk, ids, -1))
            groups_key.append(key[ge, gr])
        if bool(loop_eng.any()):
            le, lr, lids = self._loop_decode_ids(loop_eng, loop_victims, gfree, head_slot, P, S, x, tord, k_pp)
            groups_e.append(le)
            groups_r.append(lr)
            groups_ids.append(lids)
            groups_key.append(lr)
        if groups_e:
            copies = self._apply_appends(
                torch.cat(groups_e), torch.cat(groups_r), torch.cat(groups_ids), torch.cat(groups_key), boundary, x, a
            )

        # -- ignored requests finish now (they hold no blocks)
        if bool(ignored.any()):
            self._release(ignored)  # a swapped group that can never swap in holds CPU blocks
            self.dblk = torch.where(ignored, 0, self.dblk)
            self.tlen = torch.where(ignored, 0, self.tlen)
            self._clear_seqs(ignored[..., None] & self.alive, FIN_IGNORED)
            self.status = torch.where(ignored, FIN_IGNORED, self.status)

        kind = torch.where(admit, K_PREFILL, torch.where(dsched, K_DECODE, torch.where(swin, K_SWAPIN, 0)))
        out = StepOut(
            step=self.step_count,
            kind=kind,
            seqs=(kind > 0)[..., None] & self.alive,
            ntok=torch.where(admit, self.tok, 1) * (kind > 0),
            start=self.comp.clone(),
            preempt=torch.where(victim, torch.where(vswap, P_SWAP, P_RECOMPUTE), 0),
            ignored=ignored,
            swap_out=swap_out,
            swap_in=swap_in,
            copies=copies,
        )
        self.step_count += 1
        self._last = out
        return out

    def _greedy_swaps(self, v0: int, v1: int, want_t, d_t, swaps_t, cfree_left) -> int:
        """Victim v swaps iff its mode says swap and the CPU blocks left after the earlier
        swapping victims hold its distinct blocks (else it falls back to recompute)."""
        for v in range(v0, v1):
            ok = want_t[:, v] & (cfree_left >= d_t[:, v])
            swaps_t[:, v] = ok
            cfree_left -= d_t[:, v] * ok
        return max(v0, v1)

    def _apply_victims(self, victim, vswap, tord, k_pp, Kd, swaps_t, d_t, cfree0, M):
        E, R, N, B = self.E, self.R, self.N, self.B
        ve, vr = victim.nonzero(as_tuple=True)
        vt = self.tab[ve, vr]  # [K,N,B] GPU ids
        valid = vt >= 0
        ee = ve[:, None, None].expand_as(vt)
        self._add_at(self.gpu_ref, ee[valid], vt[valid], -1)
        is_swap = vswap[ve, vr]
        vord = tord[ve, vr]
        swap_out = _empty_map(self.device)
        if bool(is_swap.any()):
            # CPU offsets: exclusive sum of the distinct blocks of earlier swapping victims
            v_all = torch.arange(M, device=self.device)[None, :] < (k_pp + Kd)[:, None]
            dsw = d_t * (swaps_t & v_all)
            off_t = dsw.cumsum(1) - dsw
            csorted = sorted_free(cfree0)
            se = ve[is_swap]
            st_ = vt[is_swap]
            sv = valid[is_swap]
            first, eq = first_holders(st_, sv)
            rank = first.view(first.shape[0], -1).cumsum(1).view_as(first) - 1
            off = off_t[se, vord[is_swap]]
            cid = csorted[se[:, None, None].expand_as(st_), (off[:, None, None] + rank).clamp(max=self.C - 1)]
            new_first = torch.where(first, cid, -1)
            new = map_through_holders(first, eq, new_first)
            new = torch.where(sv, new, -1)
            self.tab[se, vr[is_swap]] = new
            se3 = se[:, None, None].expand_as(new)
            self._add_at(self.cpu_ref, se3[sv], new[sv], 1)
            keys = vord[is_swap][:, None, None] * (N * B) + torch.arange(N * B, device=self.device).view(1, N, B)
            swap_out = (se3[first], keys[first], st_[first], new_first[first])
        rec = ~is_swap
        if bool(rec.any()):
            re_, rr = ve[rec], vr[rec]
            self.tab[re_, rr] = -1
            self.comp[re_, rr] = 0
            self.tlen[re_, rr] = 0
            self.dblk[re_, rr] = 0
        self.status = torch.where(victim, torch.where(vswap, SWAPPED, WAITING), self.status)
        loop_victims = None
        dv = (vord >= k_pp[ve]) & (Kd[ve] > 0)
        if bool(dv.any()):
            dvm = dv[:, None, None] & valid
            loop_victims = (ee[dvm], vt[dvm], ve, vr, vt, valid, dv)
        return swap_out, loop_victims

    def _apply_prefills(self, admit, nb, pneed, gsorted) -> None:
        B, G = self.B, self.G
        ae, ar_ = admit.nonzero(as_tuple=True)
        pa = pneed * admit
        off = (pa.cumsum(-1) - pa)[ae, ar_]
        nbk = nb[ae, ar_]
        al = self.alive[ae, ar_]  # [K,N]
        jr = al.long().cumsum(1) - 1
        arB = self._arange(B)
        t = off[:, None, None] + jr[:, :, None] * nbk[:, None, None] + arB
        valid = al[:, :, None] & (arB < nbk[:, None, None])
        ae3 = ae[:, None, None].expand_as(t)
        ids = gsorted[ae3, t.clamp(max=G - 1)]
        ids = torch.where(valid, ids, -1)
        self.tab[ae, ar_] = ids
        self._add_at(self.gpu_ref, ae3[valid], ids[valid], 1)
        self.tlen = torch.where(admit, nb, self.tlen)
        self.dblk = torch.where(admit, pneed, self.dblk)
        self.comp = torch.where(admit, 0, self.comp)
        self.status = torch.where(admit, RUNNING, self.status)

    def _apply_swap_ins(self, swin, base_s, gsorted):
        N, B, G = self.N, self.B, self.G
        se, sr = swin.nonzero(as_tuple=True)
        ct = self.tab[se, sr]
        valid = ct >= 0
        se3 = se[:, None, None].expand_as(ct)
        self._add_at(self.cpu_ref, se3[valid], ct[valid], -1)
        first, eq = first_holders(ct, valid)
        rank = first.view(first.shape[0], -1).cumsum(1).view_as(first) - 1
        gid = gsorted[se3, (base_s[se, sr][:, None, None] + rank).clamp(max=G - 1)]
        new_first = torch.where(first, gid, -1)
        new = torch.where(valid, map_through_holders(first, eq, new_first), -1)
        self.tab[se, sr] = new
        self._add_at(self.gpu_ref, se3[valid], new[valid], 1)
        self.status = torch.where(swin, RUNNING, self.status)
        keys = sr[:, None, None] * (N * B) + torch.arange(N * B, device=self.device).view(1, N, B)
        return (se3[first], keys[first], ct[first], new_first[first])

    def _loop_decode_ids(self, loop_eng, loop_victims, gfree, head_slot, P, S, x, tord, k_pp):
        """Decode block ids for engines whose decode phase preempts (frees interleave with
        allocations): one pass per front position, re-ranking the free mask each time."""
        G, R, N = self.G, self.R, self.N
        dev = self.device
        Q = loop_eng.nonzero(as_tuple=True)[0]
        nQ = Q.numel()
        qrow = torch.full((self.E,), -1, dtype=torch.long, device=dev)
        qrow[Q] = torch.arange(nQ, device=dev)
        _, _, ve, vr, vt, valid, dv = loop_victims
        # release front of each decode victim: the first front whose running victim count covers it
        de, dr = ve[dv], vr[dv]
        kdec = tord[de, dr] - k_pp[de]
        tau = torch.searchsorted(S[de].contiguous(), (kdec + 1)[:, None].contiguous())[:, 0]
        rel = torch.full((nQ, G), _BIG, dtype=torch.long, device=dev)
        dvt, dvalid = vt[dv], valid[dv]
        rows = qrow[de][:, None, None].expand_as(dvt)
        taus = tau[:, None, None].expand_as(dvt)
        rel.view(-1)[(rows * G + dvt)[dvalid]] = taus[dvalid]
        base = gfree[Q] & (rel == _BIG)
        taken = torch.zeros(nQ, G + 1, dtype=torch.bool, device=dev)
        PQ = P[Q]
        hsQ = head_slot[Q]
        out_e, out_r, out_ids = [], [], []
        for f in range(int(PQ.max())):
            act = f < PQ
            avail = (base | (rel <= f)) & ~taken[:, :G]
            srt = sorted_free(avail)
            slot = hsQ[:, f].clamp(max=R - 1)
            xs = x[Q, slot] & act[:, None]
            xr = xs.long().cumsum(1) - xs.long()
            ids = srt.gather(1, xr.clamp(max=G - 1))
            ids = torch.where(xs, ids, -1)
            taken.scatter_(1, torch.where(xs, ids, G), True)
            out_e.append(Q[act])
            out_r.append(slot[act])
            out_ids.append(ids[act])
        if not out_e:
            z = torch.zeros(0, dtype=torch.long, device=dev)
            return z, z, torch.zeros(0, N, dtype=torch.long, device=dev)
        return torch.cat(out_e), torch.cat(out_r), torch.cat(out_ids)

    def _apply_appends(self, ge, gr, ids, key, boundary, x, a):
        """One token's slot per live sequence of the given groups: a new block where the append
        starts one, a copy-on-write of a shared last block, else nothing."""
        N, B = self.N, self.B
        bnd = boundary[ge, gr]
        tl = self.tlen[ge, gr]
        pos = torch.where(bnd, tl, tl - 1).clamp(min=0, max=B - 1)
        K = ge.numel()
        jj = self._arange(N)[None, :].expand(K, N)
        ge2, gr2 = ge[:, None].expand(K, N), gr[:, None].expand(K, N)
        pos2 = pos[:, None].expand(K, N)
        old = self.tab[ge2, gr2, jj, pos2]
        xk = ids >= 0
        self.tab[ge2[xk], gr2[xk], jj[xk], pos2[xk]] = ids[xk]
        self._add_at(self.gpu_ref, ge2[xk], ids[xk], 1)
        cow = xk & ~bnd[:, None]
        self._add_at(self.gpu_ref, ge2[cow], old[cow], -1)
        self.tlen[ge, gr] = tl + bnd.long()
        self.dblk[ge, gr] = self.dblk[ge, gr] + xk.sum(1)
        ckey = key[:, None] * N + jj
        return (ge2[cow], ckey[cow], old[cow], ids[cow])

    # ------------------------------------------------------------------ update
    def update(self, stopped: torch.Tensor | None = None) -> UpdateOut:
        """Feed back one token per scheduled sequence; ``stopped`` [E,R,N] marks the sequences
        whose token was a stop token (only scheduled ones count)."""
        E, R, N = self.E, self.R, self.N
        out = self._last
        self._last = None
        zeros = torch.zeros(E, R, dtype=torch.long, device=self.device)
        if out is None:
            return UpdateOut(zeros, zeros, torch.zeros(E, R, dtype=torch.bool, device=self.device))
        if stopped is None:
            stopped = torch.zeros(E, R, N, dtype=torch.bool, device=self.device)
        sched = (out.kind > 0) & (self.status == RUNNING)
        seqs = out.seqs & self.alive & sched[..., None]
        sched = seqs.any(-1)
        pf = sched & (out.kind == K_PREFILL)
        self.comp = torch.where(sched, self.comp + out.ntok, self.comp)
        fk = pf & ~self.forked
        if bool(fk.any()):
            fe, fr = fk.nonzero(as_tuple=True)
            nn = self.n[fe, fr]
            child = (self._arange(N)[None, :] >= 1) & (self._arange(N)[None, :] < nn[:, None])  # [K,N]
            parent = self.tab[fe, fr, 0]  # [K,B]
            self.tab[fe, fr] = torch.where(child[:, :, None], parent[:, None, :], self.tab[fe, fr])
            pvalid = parent >= 0
            fe2 = fe[:, None].expand_as(parent)
            self._add_at(self.gpu_ref, fe2[pvalid], parent[pvalid], (nn - 1)[:, None].expand_as(parent)[pvalid])
            cm = torch.zeros(E, R, N, dtype=torch.bool, device=self.device)
            cm[fe, fr] = child
            self.alive |= cm
            self.exists |= cm
            seqs |= cm
            self.forked |= pf
        self.tok = torch.where(sched, self.tok + 1, self.tok)
        lencap = ((self.tok - self.prompt) >= self.maxtok) | (self.tok >= self.cfg.max_len[:, None])
        fin_stop = seqs & stopped
        fin_len = seqs & ~stopped & lencap[..., None]
        fin = fin_stop | fin_len
        if bool(fin.any()):
            self._release(fin.any(-1), fin)
            self._clear_seqs(fin, torch.where(fin_stop, FIN_STOPPED, FIN_LENGTH))
            # groups that lost some sequences but keep others: recount their distinct blocks
            part = fin.any(-1) & self.alive.any(-1)
            if bool(part.any()):
                pe_, pr_ = part.nonzero(as_tuple=True)
                t = self.tab[pe_, pr_]
                first, _ = first_holders(t, t >= 0)
                self.dblk[pe_, pr_] = first.sum((1, 2))
        done = sched & ~self.alive.any(-1)
        all_len = ((self.sstat == FIN_LENGTH) | ~self.exists).all(-1)
        fstatus = torch.where(done, torch.where(all_len, FIN_LENGTH, FIN_STOPPED), 0)
        self.status = torch.where(done, fstatus, self.status)
        self.dblk = torch.where(done, 0, self.dblk)
        self.tlen = torch.where(done, 0, self.tlen)
        order = out.kind * R + self._arange(R)[None, :]
        return UpdateOut(fstatus, order, out.ignored)
