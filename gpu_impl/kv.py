"""The KV data plane: a real paged KV tensor on the device and a CPU swap tensor.

Each step's maps are carried out as block copies, in vLLM's worker order: swap-out (GPU -> CPU),
swap-in (CPU -> GPU), copy-on-write (GPU -> GPU); then the "model" writes the KV of every
scheduled token into the slot its block table names. A token's KV is a deterministic function of
(request, sequence, position): positions inside the prompt are the request's (shared by its
forks), later positions are the sequence's own. Free blocks are poisoned with NaN after each step,
so reading a block nobody wrote (a missing swap, a missing copy, a wrong table) shows up.

After every step `verify()` checks that each running sequence's KV, gathered through its block
table, equals the expected content for positions ``[0, num_computed)`` (and the same on CPU for
swapped sequences), and that paged attention over the gathered blocks equals dense attention
over the contiguous expected sequence, with torch's ``scaled_dot_product_attention`` as the
reference. A recompute rewrites the content into new blocks; a swap preserves it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from gpu_impl.batched import RUNNING, SWAPPED, BatchedScheduler, StepOut


class KVError(AssertionError):
    """The KV data plane does not hold what the block tables say it should."""

    def __init__(self, message: str, engine: int = -1) -> None:
        super().__init__(message)
        self.engine = engine


class KVPlane:
    def __init__(self, sched: BatchedScheduler, heads: int = 2, head_dim: int = 4) -> None:
        self.s = sched
        self.H, self.D = heads, head_dim
        self.W = 2 * heads * head_dim  # K and V of one token
        self.bsmax = int(sched.cfg.bs.max())
        dev = sched.device
        nan = float("nan")
        self.gpu = torch.full((sched.E, sched.G, self.bsmax, self.W), nan, device=dev)
        self.cpu = torch.full((sched.E, sched.C, self.bsmax, self.W), nan, device="cpu")
        self.freq = torch.linspace(0.5, 3.0, self.W, device=dev)
        self.phase = torch.linspace(0.0, 1.0, self.W, device=dev)
        self.checks = 0

    # ------------------------------------------------------------------ content
    def content(self, e: torch.Tensor, r: torch.Tensor, j: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Expected KV of position ``p`` of sequence ``j`` of request slot ``r`` in engine ``e``."""
        s = self.s
        jeff = torch.where(p < s.prompt[e, r], 0, j)
        rk = (s.arrival[e, r] + 1 + 97 * e).to(torch.float32)
        base = rk * 0.731 + jeff.to(torch.float32) * 1.618 + p.to(torch.float32) * 0.0137
        return torch.sin(base[..., None] * self.freq + self.phase)

    # ------------------------------------------------------------------ one step
    def apply(self, out: StepOut) -> None:
        """Carry out a step's maps and the model's KV writes (call between schedule and update)."""
        self._swap_out(out)
        self._swap_in(out)
        self._copy(out)
        self._write(out)

    def _swap_out(self, out: StepOut) -> None:
        e, _, src, dst = out.swap_out
        if e.numel():
            self.cpu[e.cpu(), dst.cpu()] = self.gpu[e, src].cpu()

    def _swap_in(self, out: StepOut) -> None:
        e, _, src, dst = out.swap_in
        if e.numel():
            self.gpu[e, dst] = self.cpu[e.cpu(), src.cpu()].to(self.gpu.device)

    def _copy(self, out: StepOut) -> None:
        e, _, src, dst = out.copies
        if e.numel():
            self.gpu[e, dst] = self.gpu[e, src]

    def _write(self, out: StepOut) -> None:
        s = self.s
        e, r, j = out.seqs.nonzero(as_tuple=True)
        if e.numel() == 0:
            return
        start, n = out.start[e, r], out.ntok[e, r]
        L = int(n.max())
        ar = torch.arange(L, device=s.device)
        p = start[:, None] + ar
        valid = ar[None, :] < n[:, None]
        bs = s.cfg.bs[e][:, None]
        blk = s.tab[e, r, j].gather(1, (p // bs).clamp(max=s.B - 1))
        if bool((valid & (blk < 0)).any()):
            raise KVError(f"step {out.step}: a scheduled token has no block in its table")
        vals = self.content(e[:, None], r[:, None], j[:, None], p)
        e2 = e[:, None].expand_as(p)
        self.gpu[e2[valid], blk[valid], (p % bs)[valid]] = vals[valid]

    def poison_free(self) -> None:
        s = self.s
        self.gpu[(s.gpu_ref == 0)] = float("nan")
        self.cpu[(s.cpu_ref == 0).cpu()] = float("nan")

    # ------------------------------------------------------------------ checks
    def verify(self, step: int, names: list[list[str]] | None = None) -> None:
        """Raise `KVError` unless every running / swapped sequence's cached KV is right and paged
        attention equals dense attention (call after update)."""
        s = self.s
        self.checks += 1
        self.poison_free()
        st = s.status
        live = s.alive & ((st == RUNNING) | (st == SWAPPED))[..., None]
        e, r, j = live.nonzero(as_tuple=True)
        if e.numel() == 0:
            return
        comp = s.comp[e, r]
        L = max(1, int(comp.max()))
        ar = torch.arange(L, device=s.device)
        p = ar[None, :].expand(e.numel(), L)
        valid = p < comp[:, None]
        bs = s.cfg.bs[e][:, None]
        tab = s.tab[e, r, j]
        blk = tab.gather(1, (p // bs).clamp(max=s.B - 1))
        off = p % bs
        on_gpu = (st[e, r] == RUNNING)[:, None]
        e2 = e[:, None].expand_as(p)
        bc = blk.clamp(min=0)
        got_gpu = self.gpu[e2, bc.clamp(max=s.G - 1), off]
        got_cpu = self.cpu[e2.cpu(), bc.clamp(max=s.C - 1).cpu(), off.cpu()].to(s.device)
        got = torch.where(on_gpu[..., None], got_gpu, got_cpu)
        exp = self.content(e[:, None], r[:, None], j[:, None], p)
        bad = valid & ((blk < 0) | ~(got == exp).all(-1))
        if bool(bad.any()):
            i, pos = (int(x) for x in bad.nonzero()[0])
            ei, ri, ji = int(e[i]), int(r[i]), int(j[i])
            who = names[ei][ri] if names else f"slot {ri}"
            where = "GPU" if bool(on_gpu[i, 0]) else "CPU"
            raise KVError(
                f"step {step}: engine {ei} {who}#{ji} position {pos}: {where} block {int(blk[i, pos])} "
                f"holds {got[i, pos, :3].tolist()}..., expected {exp[i, pos, :3].tolist()}...",
                ei,
            )
        self._check_attention(step, e, r, j, on_gpu[:, 0], comp, tab, exp, valid)

    def _check_attention(self, step, e, r, j, on_gpu, comp, tab, exp, valid) -> None:
        s = self.s
        H, D, bsm = self.H, self.D, self.bsmax
        sel = on_gpu & (comp > 0)
        if not bool(sel.any()):
            return
        e, r, j, comp, tab, exp, valid = e[sel], r[sel], j[sel], comp[sel], tab[sel], exp[sel], valid[sel]
        S = e.numel()
        q = torch.cos(self.content(e, r, j, comp - 1)[:, : H * D] * 1.3).view(S, H, D)
        # paged: gather whole blocks through the table, mask what the table does not cover
        blocks = self.gpu[e[:, None].expand_as(tab), tab.clamp(min=0)]  # [S, B, bsmax, W]
        bs = s.cfg.bs[e]
        ob = torch.arange(bsm, device=s.device)
        pos = torch.arange(s.B, device=s.device)[:, None] * bs[:, None, None] + ob  # [S,B,bsmax]
        pvalid = (tab >= 0)[:, :, None] & (ob < bs[:, None, None]) & (pos < comp[:, None, None])
        kv = blocks.reshape(S, s.B * bsm, 2, H, D)
        pvalid = pvalid.reshape(S, s.B * bsm)
        k, v = kv[:, :, 0], torch.where(pvalid[:, :, None, None], kv[:, :, 1], 0.0)
        scores = torch.einsum("shd,sthd->sht", q, k) / math.sqrt(D)
        scores = scores.masked_fill(~pvalid[:, None, :], float("-inf"))
        paged = torch.einsum("sht,sthd->shd", scores.softmax(-1), v)
        # dense: the contiguous expected sequence through SDPA
        L = exp.shape[1]
        dense_kv = exp.view(S, L, 2, H, D)
        kd = dense_kv[:, :, 0].transpose(1, 2)
        vd = dense_kv[:, :, 1].transpose(1, 2)
        dense = F.scaled_dot_product_attention(q[:, :, None, :], kd, vd, attn_mask=valid[:, None, None, :])[:, :, 0]
        if not torch.allclose(paged, dense, atol=1e-5, rtol=1e-4):
            worst = int((paged - dense).abs().amax((1, 2)).argmax())
            raise KVError(
                f"step {step}: engine {int(e[worst])} slot {int(r[worst])}#{int(j[worst])}: paged attention "
                f"{paged[worst, 0, :3].tolist()} != dense {dense[worst, 0, :3].tolist()}",
                int(e[worst]),
            )
