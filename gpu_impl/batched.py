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
   group reserves ``full + nlive`` blocks (``full``: its distinct full blocks, vLLM's
   get_num_full_blocks_touched) but consumes ``distinct + a``; exclusive sums of
   the consumption plus the group's own reservation give the failures. Off a block boundary
   the distinct partial last blocks number ``nlive - a`` (phase 1's copy-on-write count), so
   ``full = distinct - (nlive - a)`` needs no look at the tables.
7. Block ids: in a step, CPU blocks are only allocated (swap-outs, in victim order), so the
   k-th CPU allocation is the k-th lowest initially free id. GPU blocks: priority-preemption
   frees come first, then prefills or decodes and swap-ins allocate; without decode victims the
   t-th allocation is the t-th lowest id free after preemption (ranking the free mask with a
   cumsum, only for the engines that allocate this step: `FreeIds` scatters each free id to
   its rank once and reads allocations by a gather, or, over a few engines, binary-searches
   the cumsum per allocation as `nth_free` does). An engine with decode victims frees blocks between fronts; for those
   engines only, a loop over the fronts that allocate (<= max_num_seqs) re-ranks the free mask
   including the victims released so far (``release front = searchsorted(S, victim ordinal + 1)``).

`update()` applies one token per scheduled sequence, forks ``n - 1`` children sharing every
block after a prefill, applies the stop rules and frees finished sequences, all as masked
tensor updates.

Cost notes. State is int32, except the status codes and the reference counts (int8: an int8
comparison yields bool without a widening pass, and the counts are a quarter of the bytes;
counts are int32 when N >= 127). ``torch.where`` is replaced by arithmetic blends (`blend`),
several times faster on CPU, and so are ``Tensor.any`` (`any_`, `row_any`: the mask read as
bytes or wide integers) and ``== 0`` (``~x.bool()``). Over large tensors (>= `_WIDE_OP`
elements) int32 comparisons write an int32 0/1 output (`cmp`, ~4x cheaper than a bool
output), and ops between ``[E, R, N]`` flags and ``[E, R]`` masks read each row's N flags as
one integer (`seq_and`, `seq_count`, `seq_nonzero`: a bool op broadcast over a short last
dimension is ~20x slower); below that size the plain op is used (fewer calls). Work that touches block tables is sparse: only the
groups with an event this step (admitted, allocating an append, copy-on-write candidates,
victims, swap-ins, finished sequences) are gathered, and only the used columns of their tables
(through flat indices where it is hot; a prefill writes only the entries that get a block).
Free ids come from the free mask's cumsum (`FreeIds`, `nth_free`), only for the engines that
allocate (GPU) and per swapping victim (CPU); the CPU free counts only when some engine takes a victim; each admission phase takes one
stacked prefix sum. Engines that are done cost nothing: `gpu_impl.encode.BatchedRun` moves the
running ones into a smaller scheduler (`take` / `put`) once at most 3/4 of the stepped engines
still run. What remains is ~1,400 aten calls per busy step (views and indexing included), a
few hundred of them over whole ``[E, R]`` / ``[E, G]`` tensors: on one CPU core a busy step at
E = 4096 takes ~12-15 ms, one at E = 5 ~1.5 ms (BENCHMARKS.md, issue 4); in place, the large
ops cost several times their hot-cache timings (the step's working set, block tables
included, is far larger than the L2 cache). The Python loops are the
phases above, the greedy swap decision (at most the step's largest victim count), the pairwise
copy-on-write check (N - 1 iterations) and, for engines with decode victims, one pass per front
that allocates (at most max_num_seqs) — never over engines or requests.

Outputs are tensors (`StepOut`, `UpdateOut`); `gpu_impl.materialize` turns them into
`spec.types.SchedulerOutput` objects per engine for comparison. The twin does not produce
reasons (``SchedulerOutput.reasons`` is empty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spec.config import SchedulerConfig

ABSENT, WAITING, RUNNING, SWAPPED = 0, 1, 2, 3
FIN_STOPPED, FIN_LENGTH, FIN_ABORTED, FIN_IGNORED = 4, 5, 6, 7
K_PREFILL, K_DECODE, K_SWAPIN = 1, 2, 3
P_RECOMPUTE, P_SWAP = 1, 2
MODES = {"auto": 0, "recompute": 1, "swap": 2}
I32 = torch.int32
I64 = torch.long
REF = torch.int8  # reference counts (gpu_ref, cpu_ref)
STATUS = torch.int8  # request status codes (0-7): an int8 comparison is ~10x cheaper than int32's
_BIG = 1 << 30


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or device == "auto":
        device = default_device()
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda requested but torch.cuda.is_available() is False")
    return device


def blend(m: torch.Tensor, a: torch.Tensor | int, b: torch.Tensor | int) -> torch.Tensor:
    """``torch.where(m, a, b)`` for int32 values, as arithmetic (several times faster on CPU)."""
    if not torch.is_tensor(a) and not torch.is_tensor(b):
        return m.to(I32).mul_(a - b).add_(b)
    d = a - b
    if d.shape != m.shape:
        return b + d * m
    return d.mul_(m).add_(b)  # in place: no new [E, R] buffers


def any_(m: torch.Tensor) -> bool:
    """``any_(m)`` for a bool tensor, read as bytes (``any`` is ~30x slower on CPU)."""
    return m.numel() > 0 and bool(m.view(torch.uint8).max())


_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def row_any(m: torch.Tensor) -> torch.Tensor:
    """``m.any(-1)`` for a bool tensor, reading 8 / 4 / 2 flags at a time as one integer
    (several times faster on CPU than the reduction over a short last dimension)."""
    w = m.shape[-1]
    if m.is_contiguous() and m.numel():
        for k, dt in _WIDE:
            if w % k == 0 and m.storage_offset() % k == 0:
                v = m.view(dt)
                if w // k > 4:  # long rows: a reduction over 8x fewer elements
                    return v.bool().any(-1)
                r = v[..., 0]
                for i in range(1, w // k):
                    r = r | v[..., i]
                return r.bool()
    return m.any(-1)


_PACK = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _packed(m: torch.Tensor) -> torch.Tensor | None:
    """A bool tensor's last dimension (2, 4 or 8 flags) read as one integer per row, or None."""
    dt = _PACK.get(m.shape[-1]) if m.dim() else None
    if dt is None or not m.is_contiguous() or m.storage_offset() % m.shape[-1]:
        return None
    return m.view(dt)[..., 0]


def seq_and(m: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``m & r[..., None]`` for bool ``m`` [..., N] and ``r`` [...]: each row's N flags are
    read as one integer and multiplied by ``r`` (broadcasting a bool op over a short last
    dimension is ~20x slower on CPU: 180 µs vs 9 µs at [4096, 16, 2])."""
    p = _packed(m) if m.numel() >= _WIDE_OP else None
    if p is None or r.shape != p.shape or r.dtype != torch.bool:
        return m & r[..., None]
    return (p * r)[..., None].view(torch.bool)


def seq_count(m: torch.Tensor) -> torch.Tensor:
    """``m.sum(-1, dtype=int32)`` for bool ``m`` [..., 2] (the two flags are the low and the high
    byte of an int16; 25 µs vs 90 µs at [4096, 16, 2]); other widths reduce as usual."""
    if m.shape[-1] == 2 and m.numel() >= _WIDE_OP:
        p = _packed(m)
        if p is not None:
            return ((p & 1) + (p >> 8)).to(I32)
    return m.sum(-1, dtype=I32)


_WIDE_OP = 1 << 13  # elements; below this a tensor op costs its call overhead, whatever the dtype


def cmp(op, a: torch.Tensor, b: torch.Tensor | int) -> torch.Tensor:
    """``op(a, b)`` (``torch.lt``, ``torch.eq``, ...) as a 0/1 mask of ``a``'s shape (``b``
    broadcasts to it): int32 for a large ``a`` (a comparison written into an int32 output is
    ~4x cheaper on CPU than one producing bool: 7 µs vs 26-38 µs at [4096, 16]), else bool (no
    extra call where the call overhead dominates). Use it where the mask is arithmetic,
    or-ed / and-ed with another such mask, or ``.bool()``-ed."""
    if a.numel() < _WIDE_OP:
        return op(a, b)
    return op(a, b, out=torch.empty_like(a, dtype=I32))


def seq_nonzero(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``m.nonzero(as_tuple=True)`` for a sparse bool ``m`` [E, R, N], in the same (row-major)
    order: the rows with any flag first, then the flags of those rows (cheaper than one
    ``nonzero`` over E * R * N flags)."""
    if m.numel() < _WIDE_OP:
        return m.nonzero(as_tuple=True)
    e, r = row_any(m).nonzero(as_tuple=True)
    k, j = m[e, r].nonzero(as_tuple=True)
    return e[k], r[k], j


class EngineConfigs:
    """The E engines' configs as int32 columns ``[E]`` (plus the original objects)."""

    def __init__(self, configs: Sequence[SchedulerConfig], device: torch.device) -> None:
        self.configs = tuple(configs)

        def col(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=I32, device=device)

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

    COLUMNS = ("bs", "gpu", "cpu", "max_seqs", "max_tok", "max_len", "wm", "plimit", "mode", "prio")

    def take(self, rows: torch.Tensor) -> EngineConfigs:
        """The configs of engines ``rows`` (a long tensor of engine indices), in that order."""
        sub = EngineConfigs.__new__(EngineConfigs)
        sub.configs = tuple(self.configs[i] for i in rows.tolist())
        for name in self.COLUMNS:
            setattr(sub, name, getattr(self, name).index_select(0, rows))
        return sub

    @staticmethod
    def max_blocks_per_seq(c: SchedulerConfig) -> int:
        return max(1, min(c.num_gpu_blocks, c.blocks_for(c.max_model_len)))


Map = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


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
    swap_out: Map
    swap_in: Map
    copies: Map


@dataclass
class UpdateOut:
    """Requests finished by `update()`: ``status`` [E,R] (0 or a FIN_* code) and ``order`` [E,R]
    (ascending = the reference's order; the step's ``ignored`` requests come first)."""

    status: torch.Tensor
    order: torch.Tensor
    ignored: torch.Tensor


def _empty_map(device: torch.device) -> Map:
    z = torch.zeros(0, dtype=I64, device=device)
    return (z, z, z, z)


def nth_free(mask: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """For a free mask ``[K, X]`` and ranks ``t`` ``[K, ...]`` (from 0): the t-th lowest free id
    of each row (int32; X where the row has fewer free ids).

    The rank of a free block is the inclusive cumsum of the mask minus one, so the t-th free id
    is the first position where the cumsum reaches t + 1 (a binary search per query: the lowest
    free id first, as the reference's heap pops them)."""
    cs = mask.cumsum(1, dtype=I32)
    q = (t.reshape(t.shape[0], -1) + 1).to(I32).contiguous()
    return torch.searchsorted(cs, q, out_int32=True).view(t.shape)


class FreeIds:
    """The free ids of only the rows ``need`` [E] of a free mask [E, X]: ``ids(e, t)`` = the
    t-th lowest free ids of engines ``e`` [K] (needed rows), for ranks ``t`` [K, ...] in
    [0, X) (X where the row has fewer free ids), as `nth_free` answers them. Over many rows the
    sorted lists are built once by a scatter (free block b goes to position rank(b) =
    cumsum - 1), so a lookup is a gather instead of a binary search per rank (searchsorted
    costs ~40-90 ns per rank here, and a busy step at E = 4096 asks ~40,000); over a few rows
    (< `LISTS`) the cumsum and a binary search per rank, which take fewer calls."""

    LISTS = 256

    def __init__(self, mask: torch.Tensor, need: torch.Tensor) -> None:
        dev = mask.device
        rows = need.nonzero(as_tuple=True)[0]
        m = mask.index_select(0, rows)
        n, X = m.shape
        self.look = torch.zeros(mask.shape[0], dtype=I64, device=dev)
        self.lists = None
        if n < self.LISTS:
            self.cs = m.cumsum(1, dtype=I32)
            self.look[rows] = torch.arange(n, device=dev)
            return
        # rank of a free id, else X (int16 while X fits: the cheapest cumsum here)
        dt = torch.int16 if X < (1 << 15) - 1 else I32
        pos = m.cumsum(1, dtype=dt).sub_(X + 1).mul_(m).add_(X).long()
        self.lists = torch.full((n, X + 1), X, dtype=I32, device=dev)
        self.lists.scatter_(1, pos, torch.arange(X, dtype=I32, device=dev).expand(n, X))
        self.lists[:, X] = X  # the non-free ids' dump column (read by no rank < X)
        self.look[rows] = torch.arange(n, device=dev) * (X + 1)

    def ids(self, e: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        if self.lists is None:
            q = (t.reshape(t.shape[0], -1) + 1).to(I32).contiguous()
            return torch.searchsorted(self.cs[self.look[e]], q, out_int32=True).view(t.shape)
        base = self.look[e].view(-1, *([1] * (t.dim() - 1)))
        return self.lists.view(-1)[base + t]


def admission_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Inclusive prefix sum along the queue: group i's total *including itself*."""
    return x.cumsum(-1, dtype=I32)


def tail_positions(m: torch.Tensor, width: int) -> torch.Tensor:
    """Head position of the v-th victim candidate: the running tail first (the least urgent)."""
    v = torch.arange(width, device=m.device, dtype=I32)
    return (m[:, None] - 1 - v).clamp(min=0).long()


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
    """Give every entry the new id of its block's first holder (``new_first`` is -1 off ``first``)."""
    if eq is None:
        return new_first
    pick = eq & first[:, None, :, :]
    return ((new_first[:, None, :, :] + 1) * pick).amax(2) - 1


class BatchedScheduler:
    """E independent engines, one tensor state, one step for all (see the module docstring).

    Capacity is fixed at construction: ``max_requests`` slots per engine (R), ``max_n``
    sequences per request (N); tables hold up to ``min(num_gpu_blocks, blocks_for(max_model_len))``
    entries. Request slots must be kept in policy-key order (see `set_requests`). Blocks past an
    engine's own ``num_gpu_blocks`` (padding up to the largest engine) carry a permanent
    sentinel reference, so "free" is simply "reference count 0".
    """

    REQ_FIELDS = ("status", "prompt", "maxtok", "n", "prio", "arrival", "forked", "tok", "comp", "tlen", "dblk")
    SEQ_FIELDS = ("alive", "exists", "sstat", "stok", "scomp", "tab")

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
        self._ar: dict[tuple[int, torch.dtype], torch.Tensor] = {}
        self._alloc_state()

    # ------------------------------------------------------------------ state
    def _alloc_state(self) -> None:
        E, R, N, B, G, C, dev = self.E, self.R, self.N, self.B, self.G, self.C, self.device

        def z(*shape: int, dtype: torch.dtype = I32) -> torch.Tensor:
            return torch.zeros(*shape, dtype=dtype, device=dev)

        self.status = z(E, R, dtype=STATUS)
        self.prompt = z(E, R)
        self.maxtok = z(E, R)
        self.n = torch.ones(E, R, dtype=I32, device=dev)
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
        self.tab = torch.full((E, R, N, B), -1, dtype=I32, device=dev)
        # a count is at most the N sequences of one request (plus the padding sentinel 1)
        ref = REF if N < torch.iinfo(REF).max else I32
        self.gpu_ref = (torch.arange(G, device=dev)[None, :] >= self.cfg.gpu[:, None]).to(ref)
        self.cpu_ref = (torch.arange(C, device=dev)[None, :] >= self.cfg.cpu[:, None]).to(ref)

    def _arange(self, n: int, dtype: torch.dtype = I32) -> torch.Tensor:
        t = self._ar.get((n, dtype))
        if t is None:
            t = self._ar[(n, dtype)] = torch.arange(n, device=self.device, dtype=dtype)
        return t

    def set_requests(
        self, prompt: torch.Tensor, max_tokens: torch.Tensor, n: torch.Tensor, priority: torch.Tensor,
        arrival: torch.Tensor,
    ) -> None:
        """Load every slot's request attributes ([E,R] each); slots stay ABSENT until `arrive`.
        Slots must be in policy-key order within each engine (empty slots last)."""
        for name, value in (("prompt", prompt), ("maxtok", max_tokens), ("n", n), ("prio", priority),
                            ("arrival", arrival)):
            getattr(self, name).copy_(value.to(self.device, I32))
        self.tok.copy_(self.prompt)
        self.forked.copy_(self.n == 1)

    def permute_requests(self, perm: torch.Tensor) -> None:
        """Reorder the slots of every engine: new slot i holds old slot ``perm[e, i]``."""
        perm = perm.long()
        for name in self.REQ_FIELDS:
            setattr(self, name, getattr(self, name).gather(1, perm))
        for name in self.SEQ_FIELDS:
            t = getattr(self, name)
            idx = perm.view(self.E, self.R, *([1] * (t.dim() - 2))).expand_as(t)
            setattr(self, name, t.gather(1, idx).contiguous())

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

    STATE_FIELDS = REQ_FIELDS + SEQ_FIELDS + ("gpu_ref", "cpu_ref")

    def take(self, rows: torch.Tensor) -> BatchedScheduler:
        """A new scheduler over engines ``rows`` only (long tensor of engine indices), with a copy
        of their state; its engine i is engine ``rows[i]`` here. Engines are independent, so
        stepping it steps exactly those engines (`gpu_impl.encode.BatchedRun` drops finished
        engines this way); `put` writes its state back."""
        sub = BatchedScheduler.__new__(BatchedScheduler)
        sub.device, sub.cfg, sub.E = self.device, self.cfg.take(rows), int(rows.numel())
        sub.R, sub.N, sub.B, sub.G, sub.C = self.R, self.N, self.B, self.G, self.C
        sub.step_count, sub._last, sub._ar = self.step_count, None, self._ar
        for name in self.STATE_FIELDS:
            setattr(sub, name, getattr(self, name).index_select(0, rows))
        return sub

    def put(self, rows: torch.Tensor, sub: BatchedScheduler, local: torch.Tensor | None = None) -> None:
        """Write back the state of a scheduler made by ``take(rows)`` (only its engines ``local``
        when given, which are engines ``rows[local]`` here)."""
        if local is not None:
            rows = rows[local]
        for name in self.STATE_FIELDS:
            value = getattr(sub, name)
            getattr(self, name)[rows] = value if local is None else value.index_select(0, local)
        self.step_count = sub.step_count

    # ------------------------------------------------------------------ small helpers
    @staticmethod
    def _add_masked(ref: torch.Tensor, e: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor,
                    value: int | torch.Tensor) -> None:
        """``ref[e, idx] += value`` where ``mask`` (all broadcast to idx's shape), without
        selecting the masked entries first (the others add 0 at a clamped index)."""
        if idx.numel() == 0:
            return
        width = ref.shape[1]
        # int32 indices (E * G < 2**31); e broadcasts to idx's shape, so the add is in place
        flat = idx.to(I32).clamp(0, width - 1).add_(e.to(I32) * width)
        v = mask.to(ref.dtype)
        if not (isinstance(value, int) and value == 1):
            v = (v * value).to(ref.dtype)
        ref.view(-1).index_add_(0, flat.expand(idx.shape).reshape(-1), v.expand(idx.shape).reshape(-1))

    def _release_seqs(self, e: torch.Tensor, r: torch.Tensor, j: torch.Tensor) -> None:
        """Drop the references held by the given sequences (GPU when their request is running,
        CPU when it is swapped)."""
        if e.numel() == 0:
            return
        g = e * self.R + r
        t = self.tab.view(-1, self.B)[g * self.N + j]  # [K,B]
        valid = t >= 0
        on_cpu = (self.status.view(-1)[g] == SWAPPED)[:, None] & valid
        on_gpu = valid & ~on_cpu
        self._add_masked(self.gpu_ref, e[:, None], t, on_gpu, -1)
        self._add_masked(self.cpu_ref, e[:, None], t, on_cpu, -1)

    def _finish_seqs(self, e: torch.Tensor, r: torch.Tensor, j: torch.Tensor, code: int | torch.Tensor) -> None:
        """Record the final view of the given sequences and drop their tables."""
        g = e * self.R + r  # flat (engine, slot) and (engine, slot, seq) indices
        gj = g * self.N + j
        self.sstat.view(-1)[gj] = code if torch.is_tensor(code) else torch.tensor(code, dtype=I32, device=self.device)
        self.stok.view(-1)[gj] = self.tok.view(-1)[g]
        self.scomp.view(-1)[gj] = self.comp.view(-1)[g]
        self.alive.view(-1)[gj] = False
        self.tab.view(-1, self.B)[gj] = -1

    def _finish_groups(self, e: torch.Tensor, r: torch.Tensor, code: int) -> None:
        """Finish whole requests (abort, ignore): free what their live sequences hold."""
        k, j = self.alive[e, r].nonzero(as_tuple=True)
        se, sr = e[k], r[k]
        self._release_seqs(se, sr, j)
        self._finish_seqs(se, sr, j, code)
        self.status[e, r] = code
        self.dblk[e, r] = 0
        self.tlen[e, r] = 0

    # ------------------------------------------------------------------ client side
    def arrive_idx(self, e: torch.Tensor, r: torch.Tensor) -> None:
        """Requests at (engine, slot) (ABSENT slots with attributes loaded) join waiting."""
        if e.numel() == 0:
            return
        keep = self.status[e, r] == ABSENT
        e, r = e[keep], r[keep]
        self.status[e, r] = WAITING
        self.alive[e, r, 0] = True
        self.exists[e, r, 0] = True

    def arrive(self, mask: torch.Tensor) -> None:
        self.arrive_idx(*mask.nonzero(as_tuple=True))

    def abort_idx(self, e: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Abort the unfinished requests among (engine, slot) (distinct pairs); returns those aborted."""
        if e.numel() == 0:
            return e, r
        code = self.status[e, r]
        keep = (code >= WAITING) & (code <= SWAPPED)
        e, r = e[keep], r[keep]
        self._finish_groups(e, r, FIN_ABORTED)
        return e, r

    def abort(self, mask: torch.Tensor) -> torch.Tensor:
        """Abort the unfinished requests in ``mask`` [E,R]; returns which were aborted."""
        e, r = self.abort_idx(*mask.nonzero(as_tuple=True))
        out = torch.zeros_like(mask)
        out[e, r] = True
        return out

    # ------------------------------------------------------------------ schedule
    def schedule(self) -> StepOut:
        E, R, N, G = self.E, self.R, self.N, self.G
        dev = self.device
        cfg = self.cfg
        arR = self._arange(R)
        st = self.status
        running, waiting, swapped = st == RUNNING, st == WAITING, st == SWAPPED
        alive = self.alive
        nlive = seq_count(alive)
        seats = blend(self.forked, nlive, self.n)
        gfree0 = ~self.gpu_ref.bool()  # (== 0 is ~5x slower on CPU)
        F0 = gfree0.view(torch.uint8).sum(1, dtype=I32)
        seats0 = (seats * running).sum(1, dtype=I32)
        has_swapped = row_any(swapped)
        bs = cfg.bs[:, None]
        wm, max_seqs, max_tok = cfg.wm[:, None], cfg.max_seqs[:, None], cfg.max_tok[:, None]
        zE = torch.zeros(E, dtype=I32, device=dev)

        # -- phase 1: the append shape of every group (used by decodes and swap-ins)
        # (a table always covers the computed tokens, so comp // bs == tlen iff comp == tlen * bs)
        bi = cmp(torch.eq, self.tlen * bs, self.comp)
        boundary = bi.bool()
        x = seq_and(alive, boundary)
        a = nlive * bi
        if N > 1:  # copy-on-write is possible only off a block boundary, with >= 2 live sequences
            ce, cr = ((running | swapped) & ~boundary & (nlive > 1)).nonzero(as_tuple=True)
            if ce.numel():
                arN = self._arange(N, I64)
                g = ce * R + cr
                tl = self.tlen.view(-1)[g].long()
                last = self.tab.view(-1)[(g * (N * self.B) + tl - 1)[:, None] + arN * self.B]
                al = alive[ce, cr]
                cow = torch.zeros_like(al)
                for j in range(N - 1):
                    cow[:, j] = ((last[:, j + 1:] == last[:, j: j + 1]) & al[:, j + 1:]).any(-1) & al[:, j]
                x[ce, cr] = cow
                a[ce, cr] = cow.sum(1, dtype=I32)

        # -- running groups, compacted in head order; tail ordinal v <-> head position m-1-v
        m = running.view(torch.uint8).sum(1, dtype=I32)
        M = int(m.max())
        k_pp, Kd, P = zE, zE, zE
        F1, seats1 = F0, seats0
        pp_recompute = None
        dsched = victim = vswap = None
        head_slot = S = tord = swaps_t = d_t = None
        cfree0 = None
        if M > 0:
            arM = self._arange(M)
            arM1 = self._arange(M + 1)
            rank = running.cumsum(1, dtype=I32) - 1
            tord = m[:, None] - 1 - rank  # victim ordinal of each running slot
            hpos = blend(running, rank, M).long()
            head_slot = torch.full((E, M + 1), R, dtype=I64, device=dev)
            head_slot.scatter_(1, hpos, self._arange(R, I64).expand(E, R))
            head_slot = head_slot[:, :M]
            hvalid = head_slot < R
            hs = head_slot.clamp(max=R - 1)
            d_h = self.dblk.gather(1, hs) * hvalid
            nlive_h = nlive.gather(1, hs) * hvalid
            a_h = a.gather(1, hs) * hvalid
            seats_h = seats.gather(1, hs) * hvalid
            tidx = tail_positions(m, M)
            tvalid = arM[None, :] < m[:, None]
            d_t = d_h.gather(1, tidx) * tvalid
            seats_t = seats_h.gather(1, tidx) * tvalid
            mode = cfg.mode[:, None]
            want_t = ((mode == 2) | ((mode == 0) & (seats_t > 1))) & tvalid
            zcol = torch.zeros(E, 1, dtype=I32, device=dev)
            Dall = torch.cat([zcol, d_t.cumsum(1, dtype=I32)], 1)  # blocks freed by the first k victims
            Sall = torch.cat([zcol, seats_t.cumsum(1, dtype=I32)], 1)

            # -- phase 2: priority preemption
            pe = cfg.prio & ~has_swapped & row_any(waiting)
            if any_(pe):  # only over those engines (rows Qp)
                Qp = pe.nonzero(as_tuple=True)[0]

                def g(t: torch.Tensor) -> torch.Tensor:
                    return t.index_select(0, Qp)

                # the first waiting slot (every row has one); argmax over [E, R] costs ~10x an amin
                hslot = blend(g(waiting), self._arange(R), R).amin(1, keepdim=True).long()
                h_n = g(nlive).gather(1, hslot)[:, 0]
                h_tok = g(self.tok).gather(1, hslot)[:, 0]
                bsq = g(cfg.bs)
                h_need = h_n * torch.div(h_tok + bsq - 1, bsq, rounding_mode="floor")
                h_seats = g(seats).gather(1, hslot)[:, 0]
                cands = (g(running) & (arR[None, :] > hslot)).sum(1, dtype=I32)
                fits = (
                    ((g(cfg.gpu) - h_need >= g(cfg.wm)) & (h_n * h_tok <= g(cfg.max_tok)))[:, None]
                    & (g(F0)[:, None] + g(Dall) - h_need[:, None] >= g(wm))
                    & (g(seats0)[:, None] - g(Sall) + h_seats[:, None] <= g(max_seqs))
                )
                kfit = blend(fits, arM1, M + 1).amin(1)
                k_pp = torch.zeros(E, dtype=I32, device=dev)
                k_pp[Qp] = torch.minimum(kfit, cands)

            # -- phase 3 (first part): swap-or-recompute of the priority victims
            swaps_t = torch.zeros(E, M, dtype=torch.bool, device=dev)
            k_max = int(k_pp.max())
            cfree_left = None
            if k_max:  # CPU free counts only when some engine takes a victim
                cfree0 = ~self.cpu_ref.bool()
                cfree_left = cfree0.view(torch.uint8).sum(1, dtype=I32)
            v_done = self._greedy_swaps(0, k_max, want_t, d_t, swaps_t, cfree_left)
            tord_c = tord.clamp(0, M - 1).long()
            if v_done:
                kl = k_pp[:, None].long()
                F1 = F0 + Dall.gather(1, kl)[:, 0]
                seats1 = seats0 - Sall.gather(1, kl)[:, 0]
                pp_recompute = running & cmp(torch.lt, tord, k_pp[:, None]).bool() & ~swaps_t.gather(1, tord_c)

        # -- phase 4: prefills
        w = waiting if pp_recompute is None else waiting | pp_recompute
        w = w & ~has_swapped[:, None]
        # ceil(tok / bs) by a float64 division (exact for int32 operands; 85 µs vs 120 µs for
        # the integer floor division at [4096, 16])
        nb = ((self.tok + bs - 1).double() / bs.double()).to(I32)
        pneed = nlive * nb
        if any_(w):
            ptok = nlive * self.tok
            ign = (cmp(torch.gt, ptok, cfg.plimit[:, None]) | cmp(torch.gt, seats, max_seqs)
                   | cmp(torch.lt, cfg.gpu[:, None] - pneed, wm)).bool()
            cand = w & ~ign
            # one stacked prefix sum of blocks, tokens and seats; each limit moved to the
            # per-engine side: F1 - blocks < wm, tokens > max_tok, seats1 + seats > max_seqs
            cs = admission_cumsum(torch.stack((pneed, ptok, seats)) * cand.to(I32))
            over = (cmp(torch.gt, cs[0], F1[:, None] - wm) | cmp(torch.gt, cs[1], max_tok)
                    | cmp(torch.gt, cs[2], max_seqs - seats1[:, None]))
            fail = cand & over.bool()
            before = cmp(torch.lt, arR.expand(E, R), blend(fail, arR, R).amin(1, keepdim=True)).bool()
            admit = cand & before
            ignored = w & ign & before
        else:
            admit = ignored = w
        pf_any = row_any(admit)

        # -- phase 5: decodes
        dec = ~pf_any
        if M > 0:
            mp = m - k_pp
            A_excl = a_h.cumsum(1, dtype=I32) - a_h
            idxD = k_pp[:, None] + arM1[None, :]
            Dp = Dall.gather(1, idxD.clamp(max=M).long()) - Dall.gather(1, k_pp[:, None].long())
            Dp = blend(idxD > m[:, None], _BIG, Dp)
            req = nlive_h - (F1[:, None] - A_excl)
            kstar = torch.searchsorted(Dp, req)
            S = kstar.cummax(1).values
            okf = (S + arM[None, :]) <= (mp - 1)[:, None]
            P = okf.view(torch.uint8).sum(1, dtype=I32) * dec
            Kd = (mp - P) * dec
            dsched = running & cmp(torch.lt, rank, P[:, None]).bool()
            # -- phase 3 (second part): swap-or-recompute of the decode victims
            v_total = k_pp + Kd
            v_max = int(v_total.max())
            if v_max:
                if cfree_left is None:
                    cfree0 = ~self.cpu_ref.bool()
                    cfree_left = cfree0.view(torch.uint8).sum(1, dtype=I32)
                self._greedy_swaps(v_done, v_max, want_t, d_t, swaps_t, cfree_left)
                victim = running & (tord < v_total[:, None])
                vswap = victim & swaps_t.gather(1, tord_c)
        else:
            dsched = torch.zeros_like(running)

        # -- phase 6: swap-ins
        swin = None
        si = dec & (k_pp == 0) & (Kd == 0) & has_swapped
        A_dec = (a * dsched).sum(1, dtype=I32)
        base_s = None
        if any_(si):  # only over the engines that may swap in (rows Qs)
            Qs = si.nonzero(as_tuple=True)[0]

            def g(t: torch.Tensor) -> torch.Tensor:
                return t.index_select(0, Qs)

            sw, nl, db, sts = g(swapped), g(nlive), g(self.dblk), g(seats)
            aa = g(a)
            # vLLM counts the distinct FULL blocks plus one per live sequence (_can_swap): off a
            # block boundary the distinct partial last blocks are covered by the per-sequence term.
            # Off a boundary, a = the live sequences whose last block a later live one also holds
            # (phase 1), so the distinct last blocks number nlive - a.
            dpart = (nl - aa) * ~g(boundary)
            sneed = db - dpart + nl
            scost = (db + aa) * sw
            wq = g(wm)
            s_ign = g(cfg.gpu)[:, None] - sneed < wq
            s_cand = sw & ~s_ign
            tok_dec = (nl * g(dsched)).sum(1, dtype=I32)
            sc_ = scost * s_cand
            cs = admission_cumsum(torch.stack((sc_, nl * s_cand, sts * s_cand)))
            # F1 - A_dec - (consumed before) - sneed < wm; tokens, seats as for prefills
            s_fail = s_cand & (
                (cs[0] - sc_ + sneed > g(F1 - A_dec)[:, None] - wq)
                | (cs[1] > g(max_tok) - tok_dec[:, None])
                | (cs[2] > g(max_seqs) - g(seats1)[:, None])
            )
            s_before = arR[None, :] < blend(s_fail, arR, R).amin(1, keepdim=True)
            swin_q = s_cand & s_before
            ign_q = sw & s_ign & s_before
            if any_(ign_q):
                ignored = ignored.clone()
                ignored[Qs] |= ign_q
            if any_(swin_q):
                swin = torch.zeros_like(running)
                swin[Qs] = swin_q
                # GPU blocks taken before each swap-in: the decodes', then earlier swap-ins'
                sc = (db + aa) * swin_q
                base_s = torch.zeros(E, R, dtype=I32, device=dev)
                base_s[Qs] = g(A_dec)[:, None] + sc.cumsum(1, dtype=I32) - sc

        # -- phase 7: apply. Victims first (a recompute victim may be re-admitted this step).
        swap_out = swap_in = copies = _empty_map(dev)
        loop_victims = None
        if victim is not None:
            swap_out, loop_victims = self._apply_victims(victim, vswap, tord, k_pp, Kd, swaps_t, d_t, cfree0, M)
        gfree = ~self.gpu_ref.bool() if victim is not None else gfree0
        if loop_victims is not None:
            gfree_rank = gfree.clone()
            gfree_rank.view(-1)[loop_victims[0].long() * G + loop_victims[1].long()] = False
        else:
            gfree_rank = gfree
        loop_eng = Kd > 0
        direct = dsched & ~loop_eng[:, None]
        sel = direct & (a > 0)
        if swin is not None:
            sel |= swin
        gsorted = FreeIds(gfree_rank, pf_any | row_any(sel))
        if any_(pf_any):
            self._apply_prefills(admit, nb, pneed, gsorted)
        if swin is not None:
            swap_in = self._apply_swap_ins(swin, base_s, gsorted)
        parts = []
        if any_(sel):
            ad = a * direct
            base = ad.cumsum(1, dtype=I32) - ad
            ge, gr = sel.nonzero(as_tuple=True)
            bg, kg = base[ge, gr], gr.to(I32)
            if swin is not None:  # a swap-in appends after its own blocks, keyed after the decodes
                swg = swin[ge, gr]
                bg = blend(swg, base_s[ge, gr] + self.dblk[ge, gr], bg)
                kg = kg + R * swg
            xk = x[ge, gr]
            xi = xk.to(I32)
            t = bg[:, None] + xi.cumsum(1, dtype=I32) - xi
            ids = gsorted.ids(ge, t.clamp(max=G - 1))
            parts.append((ge, gr, blend(xk, ids, -1), kg))
        if any_(loop_eng):
            le, lr, lids = self._loop_decode_ids(loop_eng, loop_victims, gfree, head_slot, P, S, x, tord, k_pp)
            parts.append((le, lr, lids, lr.to(I32)))
        if parts:
            copies = self._apply_appends(*(torch.cat(p) for p in zip(*parts, strict=True)), boundary)

        # -- ignored requests finish now (a swapped one releases its CPU blocks)
        if any_(ignored):
            self._finish_groups(*ignored.nonzero(as_tuple=True), FIN_IGNORED)

        # the kinds are exclusive: summed as bytes, widened once
        U8 = torch.uint8
        kind = admit.view(U8) + dsched.view(U8) * K_DECODE
        if swin is not None:
            kind = kind + swin.view(U8) * K_SWAPIN
        running_k = kind.bool()
        kind = kind.to(I32)
        out = StepOut(
            step=self.step_count,
            kind=kind,
            seqs=seq_and(self.alive, running_k),
            ntok=blend(admit, self.tok, 1) * running_k,
            start=self.comp,
            preempt=(victim.view(U8) + vswap.view(U8)).to(I32) if victim is not None else torch.zeros_like(kind),
            ignored=ignored,
            swap_out=swap_out,
            swap_in=swap_in,
            copies=copies,
        )
        self.step_count += 1
        self._last = out
        return out

    @staticmethod
    def _greedy_swaps(v0: int, v1: int, want_t, d_t, swaps_t, cfree_left) -> int:
        """Victim v swaps iff its mode says swap and the CPU blocks left after the earlier
        swapping victims hold its distinct blocks (else it falls back to recompute)."""
        for v in range(v0, v1):
            ok = want_t[:, v] & (cfree_left >= d_t[:, v])
            swaps_t[:, v] = ok
            cfree_left -= d_t[:, v] * ok
        return max(v0, v1)

    def _apply_victims(self, victim, vswap, tord, k_pp, Kd, swaps_t, d_t, cfree0, M):
        N, B = self.N, self.B
        dev = self.device
        ve, vr = victim.nonzero(as_tuple=True)
        W = max(1, int(self.tlen[ve, vr].max()))  # only the used columns of the tables
        vt = self.tab[ve, vr, :, :W]  # [K,N,W] GPU ids
        valid = vt >= 0
        ee = ve[:, None, None].expand_as(vt)
        self._add_masked(self.gpu_ref, ee, vt, valid, -1)
        is_swap = vswap[ve, vr]
        vord = tord[ve, vr]
        swap_out = _empty_map(dev)
        if any_(is_swap):
            # CPU offsets: exclusive sum of the distinct blocks of earlier swapping victims
            v_all = self._arange(M)[None, :] < (k_pp + Kd)[:, None]
            dsw = d_t * (swaps_t & v_all)
            off_t = dsw.cumsum(1, dtype=I32) - dsw
            se, sr, so = ve[is_swap], vr[is_swap], vord[is_swap]
            st_, sv = vt[is_swap], valid[is_swap]
            first, eq = first_holders(st_, sv)
            fi = first.to(I32)
            rank = fi.view(fi.shape[0], -1).cumsum(1, dtype=I32).view_as(fi) - 1
            off = off_t[se, so.long()]
            se3 = se[:, None, None].expand_as(st_)
            cpos = (off[:, None, None] + rank).clamp(0, self.C - 1)
            cid = nth_free(cfree0[se], cpos)  # one row per swapping victim
            new_first = blend(first, cid, -1)
            new = blend(sv, map_through_holders(first, eq, new_first), -1)
            self.tab[se, sr, :, :W] = new
            self._add_masked(self.cpu_ref, se3, new, sv, 1)
            keys = so[:, None, None].long() * (N * B) + (self._arange(N, I64)[:, None] * B + self._arange(W, I64))
            swap_out = (se3[first], keys[first], st_[first].long(), new_first[first].long())
            self.status[se, sr] = SWAPPED
        rec = ~is_swap
        if any_(rec):
            re_, rr = ve[rec], vr[rec]
            self.tab[re_, rr, :, :W] = -1
            self.comp[re_, rr] = 0
            self.tlen[re_, rr] = 0
            self.dblk[re_, rr] = 0
            self.status[re_, rr] = WAITING
        loop_victims = None
        dv = (vord >= k_pp[ve]) & (Kd[ve] > 0)
        if any_(dv):
            dvm = dv[:, None, None] & valid
            loop_victims = (ee[dvm], vt[dvm], ve, vr, vt, valid, dv)
        return swap_out, loop_victims

    def _apply_prefills(self, admit, nb, pneed, gsorted) -> None:
        G = self.G
        ae, ar_ = admit.nonzero(as_tuple=True)
        pa = pneed * admit
        off = (pa.cumsum(1, dtype=I32) - pa)[ae, ar_]
        nbk = nb[ae, ar_]
        W = int(nbk.max())
        al = self.alive[ae, ar_]  # [K,N]
        jr = al.cumsum(1, dtype=I32) - 1
        # only the table entries that get a block (a waiting group's table is empty, -1)
        k, j, b = seq_and(cmp(torch.lt, self._arange(W)[None, None, :].expand(len(ae), self.N, W),
                              nbk[:, None, None]).bool(), al).nonzero(as_tuple=True)
        ek = ae[k]
        ids = gsorted.ids(ek, (off[k] + jr[k, j] * nbk[k] + b).clamp(0, G - 1))
        self.tab.view(-1)[((ek * self.R + ar_[k]) * self.N + j) * self.B + b] = ids
        self.gpu_ref.view(-1).index_add_(0, ek * G + ids, torch.ones_like(ids, dtype=self.gpu_ref.dtype))
        self.tlen[ae, ar_] = nbk
        self.dblk[ae, ar_] = pneed[ae, ar_]
        self.comp[ae, ar_] = 0
        self.status[ae, ar_] = RUNNING

    def _apply_swap_ins(self, swin, base_s, gsorted):
        N, B, G = self.N, self.B, self.G
        se, sr = swin.nonzero(as_tuple=True)
        W = max(1, int(self.tlen[se, sr].max()))
        ct = self.tab[se, sr, :, :W]
        valid = ct >= 0
        se3 = se[:, None, None].expand_as(ct)
        self._add_masked(self.cpu_ref, se3, ct, valid, -1)
        first, eq = first_holders(ct, valid)
        fi = first.to(I32)
        rank = fi.view(fi.shape[0], -1).cumsum(1, dtype=I32).view_as(fi) - 1
        gid = gsorted.ids(se, (base_s[se, sr][:, None, None] + rank).clamp(0, G - 1))
        new_first = blend(first, gid, -1)
        new = blend(valid, map_through_holders(first, eq, new_first), -1)
        self.tab[se, sr, :, :W] = new
        self._add_masked(self.gpu_ref, se3, new, valid, 1)
        self.status[se, sr] = RUNNING
        keys = sr[:, None, None] * (N * B) + (self._arange(N, I64)[:, None] * B + self._arange(W, I64))
        return (se3[first], keys[first], ct[first].long(), new_first[first].long())

    def _loop_decode_ids(self, loop_eng, loop_victims, gfree, head_slot, P, S, x, tord, k_pp):
        """Decode block ids for engines whose decode phase preempts (frees interleave with
        allocations): one pass per front position where some of them allocates, re-ranking the
        free mask of those engines each time."""
        G, R, N = self.G, self.R, self.N
        dev = self.device
        Q = loop_eng.nonzero(as_tuple=True)[0]
        nQ = Q.numel()
        qrow = torch.full((self.E,), -1, dtype=I64, device=dev)
        qrow[Q] = torch.arange(nQ, device=dev)
        _, _, ve, vr, vt, valid, dv = loop_victims
        # release front of a decode victim: the first front whose running victim count covers it
        de, dr = ve[dv], vr[dv]
        kdec = (tord[de, dr] - k_pp[de]).long()
        tau = torch.searchsorted(S[de].contiguous(), (kdec + 1)[:, None].contiguous())[:, 0]
        rel = torch.full((nQ, G), _BIG, dtype=I64, device=dev)
        dvt, dvalid = vt[dv], valid[dv]
        rows = qrow[de][:, None, None].expand_as(dvt)
        taus = tau[:, None, None].expand_as(dvt)
        rel.view(-1)[(rows * G + dvt.long())[dvalid]] = taus[dvalid]
        base = gfree[Q] & (rel == _BIG)
        taken = torch.zeros(nQ, G + 1, dtype=torch.bool, device=dev)
        PQ = P[Q]
        Pm = int(PQ.max())
        out_e, out_r, out_ids = [], [], []
        if Pm:
            slots = head_slot[Q, :Pm].clamp(max=R - 1)  # [nQ, Pm] the fronts' slots
            xq = x[Q[:, None], slots] & (self._arange(Pm)[None, :] < PQ[:, None])[..., None]
            # only fronts where some engine allocates matter (elsewhere the append is a no-op)
            fronts = row_any(xq.transpose(0, 1).reshape(Pm, -1)).nonzero(as_tuple=True)[0].tolist()
            for f in fronts:
                xf = xq[:, f]
                hit = row_any(xf).nonzero(as_tuple=True)[0]  # engines allocating at front f
                avail = (base[hit] | (rel[hit] <= f)) & ~taken[hit, :G]
                xs = xf[hit]
                xi = xs.to(I32)
                xr = xi.cumsum(1, dtype=I32) - xi
                ids = blend(xs, nth_free(avail, xr), -1)
                taken.view(-1)[hit[:, None] * (G + 1) + blend(xs, ids, G).long()] = True
                out_e.append(Q[hit])
                out_r.append(slots[hit, f])
                out_ids.append(ids)
        if not out_e:
            z = torch.zeros(0, dtype=I64, device=dev)
            return z, z, torch.zeros(0, N, dtype=I32, device=dev)
        return torch.cat(out_e), torch.cat(out_r), torch.cat(out_ids)

    def _apply_appends(self, ge, gr, ids, key, boundary):
        """One token's slot per live sequence of the given groups: a new block where the append
        starts one, a copy-on-write of a shared last block, else nothing."""
        N, B = self.N, self.B
        bnd = boundary[ge, gr]
        tl = self.tlen[ge, gr]
        pos = blend(bnd, tl, tl - 1).clamp(0, B - 1).long()
        K = ge.numel()
        jj = self._arange(N, I64)[None, :].expand(K, N)
        ge2 = ge[:, None].expand(K, N)
        flat = ((ge * self.R + gr) * (N * B) + pos)[:, None] + jj * B  # into tab.view(-1)
        tabf = self.tab.view(-1)
        old = tabf[flat]
        xk = ids >= 0
        tabf[flat[xk]] = ids[xk]
        self._add_masked(self.gpu_ref, ge2, ids, xk, 1)
        cow = xk & ~bnd[:, None]
        self._add_masked(self.gpu_ref, ge2, old, cow, -1)
        self.tlen[ge, gr] = tl + bnd
        self.dblk[ge, gr] = self.dblk[ge, gr] + xk.sum(1, dtype=I32)
        ckey = key.long()[:, None] * N + jj
        return (ge2[cow], ckey[cow], old[cow].long(), ids[cow].long())

    # ------------------------------------------------------------------ update
    def update(self, stopped: torch.Tensor | None = None) -> UpdateOut:
        """Feed back one token per scheduled sequence; ``stopped`` [E,R,N] marks the sequences
        whose token was a stop token (only scheduled ones count)."""
        E, R, N = self.E, self.R, self.N
        dev = self.device
        out = self._last
        self._last = None
        fstatus = torch.zeros(E, R, dtype=I32, device=dev)
        if out is None:
            return UpdateOut(fstatus, fstatus, torch.zeros(E, R, dtype=torch.bool, device=dev))
        kind = out.kind
        seqs = seq_and(out.seqs & self.alive, self.status == RUNNING)
        sched = row_any(seqs)
        self.comp = self.comp + out.ntok * sched  # a new tensor: StepOut.start keeps the old one
        fk = sched & (kind == K_PREFILL) & ~self.forked
        if any_(fk):
            fe, fr = fk.nonzero(as_tuple=True)
            nn = self.n[fe, fr]
            arN = self._arange(N)[None, :]
            child = (arN >= 1) & (arN < nn[:, None])  # [K,N]
            parent = self.tab[fe, fr, 0]  # [K,B]
            rows = self.tab[fe, fr]
            self.tab[fe, fr] = blend(child[:, :, None], parent[:, None, :], rows)
            pvalid = parent >= 0
            fe2 = fe[:, None].expand_as(parent)
            self._add_masked(self.gpu_ref, fe2, parent, pvalid, (nn - 1)[:, None])
            self.alive[fe, fr] |= child
            self.exists[fe, fr] |= child
            seqs[fe, fr] |= child
            self.forked[fe, fr] = True
        self.tok = self.tok + sched
        lencap = (cmp(torch.ge, self.tok - self.prompt, self.maxtok)
                  | cmp(torch.ge, self.tok, self.cfg.max_len[:, None])).bool()
        fin = seq_and(seqs, lencap)
        if stopped is not None:
            fin = fin | (seqs & stopped)
        if any_(fin):
            fe, fr, fj = seq_nonzero(fin)
            if stopped is None:
                codes = torch.full(fe.shape, FIN_LENGTH, dtype=I32, device=dev)
            else:
                codes = blend(stopped[fe, fr, fj], FIN_STOPPED, FIN_LENGTH)
            self._release_seqs(fe, fr, fj)
            self._finish_seqs(fe, fr, fj, codes)
            # per finished sequence: does its request keep others? (a request may repeat;
            # every write below is the same for each repeat)
            still = row_any(self.alive[fe, fr])
            if any_(still):  # lost some sequences, kept others: recount distinct blocks
                pe_, pr_ = fe[still], fr[still]
                t = self.tab[pe_, pr_]
                first, _ = first_holders(t, t >= 0)
                self.dblk[pe_, pr_] = first.sum((1, 2), dtype=I32)
            de, dr = fe[~still], fr[~still]
            if de.numel():
                all_len = ((self.sstat[de, dr] == FIN_LENGTH) | ~self.exists[de, dr]).all(-1)
                code = blend(all_len, FIN_LENGTH, FIN_STOPPED)
                fstatus[de, dr] = code
                self.status[de, dr] = code.to(STATUS)
                self.dblk[de, dr] = 0
                self.tlen[de, dr] = 0
        order = kind * R + self._arange(R)[None, :]
        return UpdateOut(fstatus, order, out.ignored)
