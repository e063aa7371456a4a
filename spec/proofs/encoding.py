"""The Z3 encoding of the reference scheduler's state and of one transition per action.

The symbolic state mirrors what the reference keeps (``reference_impl``; this module does not
import it, the tests check the two agree):

- per device (GPU, CPU): a reference count and a free flag per physical block;
- per sequence slot: its request (``grp``, fixed, slots of a request are contiguous and in
  sequence-index order), status, the device its table lives on, the table's length and entries,
  and its token and computed-token counts;
- per request: status, membership of the waiting / running / swapped queues, and whether it has
  forked its ``n - 1`` extra sequences (``n`` is the number of slots the request owns; a slot
  whose sequence does not exist yet has status ``NONE``).

Actions are the reference's transitions of one request between two steps (``schedule()`` and
``update()`` together, since the catalogue's state invariants are stated between steps):
``add``, ``admit`` (prefill of a request that already forked, or has n = 1), ``fork`` (prefill of
an n > 1 request, then the fork), ``decode`` (append a slot, copy-on-write, then one token),
``preempt_recompute``, ``swap_out``, ``swap_in`` (move back, append, one token), ``finish``
(the environment stops one running sequence), ``abort`` and ``ignore``. Blocks are taken
lowest-free-id first, as the reference does, so a post-state is the reference's block for block.

Queue *order* is not modelled: any waiting request may be admitted, any running one preempted.
That over-approximates the reference (whose policy picks one), so what is proved holds for
every policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import z3

from spec.proofs.bound import Bound
from spec.status import Status

NONE, WAIT, RUN, SWAP, FIN = range(5)
NODEV, GPU, CPU = range(3)
STATUS_NAMES = ("NONE", "WAITING", "RUNNING", "SWAPPED", "FINISHED")


def status_code(status: Status) -> int:
    """A scheduler status as the encoding's code (every finished status is FIN)."""
    return FIN if status.is_finished else {Status.WAITING: WAIT, Status.RUNNING: RUN, Status.SWAPPED: SWAP,
                                                    Status.WAITING_FOR_GRAMMAR: WAIT, Status.WAITING_FOR_INPUT: WAIT}[status]
DEVICE_NAMES = (None, "gpu", "cpu")

ACTIONS = (
    "add", "admit", "fork", "decode", "preempt_recompute", "swap_out", "swap_in", "finish", "abort", "ignore",
)

# Mutated transitions (for the teeth tests): each names one deliberate bug.
MUTANTS = {
    "fork-no-incref": "fork shares the parent's blocks without raising their reference counts",
    "swapin-busy-block": "swap-in writes into the lowest GPU block ids whether free or not",
    "admit-ignores-watermark": "admission only checks that the blocks fit, not the watermark",
    "decode-no-cow": "a decode writes into a shared last block instead of copying it",
    "recompute-keeps-computed": "preemption by recompute frees the blocks but keeps the computed count",
    "abort-no-free": "abort finishes the request without freeing its blocks",
}


@dataclass
class Pool:
    ref: list[Any]
    free: list[Any]

    def copy(self) -> Pool:
        return Pool(list(self.ref), list(self.free))


@dataclass
class State:
    gpu: Pool
    cpu: Pool
    sstat: list[Any]
    dev: list[Any]
    tlen: list[Any]
    tab: list[list[Any]]
    ntok: list[Any]
    ncomp: list[Any]
    gstat: list[Any]
    in_w: list[Any]
    in_r: list[Any]
    in_s: list[Any]
    forked: list[Any]
    plen: list[Any]  # per request: prompt length and max_tokens (set when it arrives)
    mtok: list[Any]

    def copy(self) -> State:
        return State(
            self.gpu.copy(), self.cpu.copy(), list(self.sstat), list(self.dev), list(self.tlen),
            [list(t) for t in self.tab], list(self.ntok), list(self.ncomp), list(self.gstat),
            list(self.in_w), list(self.in_r), list(self.in_s), list(self.forked), list(self.plen), list(self.mtok),
        )

    def pool(self, device: int) -> Pool:
        return self.gpu if device == GPU else self.cpu

    def set_pool(self, device: int, pool: Pool) -> None:
        if device == GPU:
            self.gpu = pool
        else:
            self.cpu = pool


@dataclass
class ActionEncoding:
    """One action, encoded: ``guard`` and ``defs`` relate ``pre`` to ``post``."""

    action: str
    enc: Encoder
    pre: State
    post: State
    guard: Any
    mid: State | None = None  # after the appends of a decode / swap-in (what the model writes)
    written: list[tuple[Any, Any]] = field(default_factory=list)  # (condition, gpu block) written in place
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def defs(self) -> list[Any]:
        return self.enc.defs


def _ite_chain(index: Any, values: list[Any]) -> Any:
    out = values[-1]
    for j in range(len(values) - 2, -1, -1):
        out = z3.If(index == j, values[j], out)
    return out


def _count(conds: list[Any]) -> Any:
    return z3.Sum([z3.If(c, 1, 0) for c in conds]) if conds else z3.IntVal(0)


class Encoder:
    """Builds symbolic states and transitions for one bound (and optionally one mutant)."""

    def __init__(self, bound: Bound, mutant: str | None = None) -> None:
        if mutant is not None and mutant not in MUTANTS:
            raise ValueError(f"unknown mutant {mutant!r}")
        self.bound = bound
        self.mutant = mutant
        self.defs: list[Any] = []
        self.alloc_ok: list[Any] = []
        self._n = 0
        b = bound
        self.S, self.G, self.L, self.bs = b.seqs, b.groups, b.table_len, b.block_size
        self.nblocks = {GPU: b.gpu_blocks, CPU: b.cpu_blocks}
        # The config, symbolic: watermark blocks, max_num_seqs, max_model_len, token budget.
        self.W, self.M, self.ML, self.T = z3.Ints("cfg_watermark_blocks cfg_max_num_seqs cfg_max_model_len cfg_token_budget")
        self.grp = [z3.Int(f"grp_{s}") for s in range(self.S)]

    def read_config(self, model: Any) -> dict[str, Any]:
        return read_config(model, self)

    def pin_config(self, config: dict[str, Any]) -> list[Any]:
        return pin_config(self, config)

    def read_state(self, model: Any, st: State) -> dict[str, Any]:
        """A concrete state from a model (a flow with more state reads it too)."""
        return read_state(model, self, st)

    # ------------------------------------------------------------------ building blocks
    def fresh(self, sort: Any, hint: str = "t") -> Any:
        self._n += 1
        return z3.Const(f"_{hint}{self._n}", sort)

    def let(self, expr: Any, hint: str = "t") -> Any:
        if isinstance(expr, (bool, int)):
            return expr
        v = self.fresh(expr.sort(), hint)
        self.defs.append(v == expr)
        return v

    def state(self, prefix: str) -> State:
        S, G, L = self.S, self.G, self.L
        ints = lambda name, n: [z3.Int(f"{prefix}_{name}_{i}") for i in range(n)]  # noqa: E731
        bools = lambda name, n: [z3.Bool(f"{prefix}_{name}_{i}") for i in range(n)]  # noqa: E731
        return State(
            Pool(ints("gref", self.nblocks[GPU]), bools("gfree", self.nblocks[GPU])),
            Pool(ints("cref", self.nblocks[CPU]), bools("cfree", self.nblocks[CPU])),
            ints("sstat", S), ints("dev", S), ints("tlen", S),
            [[z3.Int(f"{prefix}_tab_{s}_{i}") for i in range(L)] for s in range(S)],
            ints("ntok", S), ints("ncomp", S),
            ints("gstat", G), bools("inw", G), bools("inr", G), bools("ins", G), bools("forked", G),
            ints("plen", G), ints("mtok", G),
        )

    def initial(self) -> State:
        """The empty scheduler: every block free, no request arrived."""
        st = self.state("init")
        zero = {
            GPU: Pool([z3.IntVal(0)] * self.nblocks[GPU], [z3.BoolVal(True)] * self.nblocks[GPU]),
            CPU: Pool([z3.IntVal(0)] * self.nblocks[CPU], [z3.BoolVal(True)] * self.nblocks[CPU]),
        }
        st.gpu, st.cpu = zero[GPU], zero[CPU]
        st.sstat = [z3.IntVal(NONE)] * self.S
        st.dev = [z3.IntVal(NODEV)] * self.S
        st.tlen = [z3.IntVal(0)] * self.S
        st.gstat = [z3.IntVal(NONE)] * self.G
        st.in_w = st.in_r = st.in_s = [z3.BoolVal(False)] * self.G
        return st

    def config_ok(self) -> Any:
        B = self.nblocks[GPU]
        return z3.And(self.W >= 0, self.W <= B - 1, self.M >= 1, self.ML >= 1, self.T >= self.M)

    def ceil_blocks(self, tokens: Any) -> Any:
        return (tokens + (self.bs - 1)) / self.bs

    # ------------------------------------------------------------------ views
    def is_first(self, s: int) -> Any:
        return z3.BoolVal(True) if s == 0 else self.grp[s - 1] != self.grp[s]

    @staticmethod
    def live(st: State, s: int) -> Any:
        return z3.Or(st.sstat[s] == WAIT, st.sstat[s] == RUN, st.sstat[s] == SWAP)

    def in_group(self, s: int, g: Any) -> Any:
        return self.grp[s] == g

    def gsel(self, values: list[Any], g: Any) -> Any:
        return _ite_chain(g, values)

    def nslots(self, g: Any) -> Any:
        return _count([self.in_group(s, g) for s in range(self.S)])

    def live_count(self, st: State, g: Any) -> Any:
        return _count([z3.And(self.in_group(s, g), self.live(st, s)) for s in range(self.S)])

    def seats(self, st: State, g: Any) -> Any:
        """vLLM's max_running_seqs: n before the fork, the live sequences after it."""
        return z3.If(self.gsel(st.forked, g), self.live_count(st, g), self.nslots(g))

    def running_seats(self, st: State) -> Any:
        return z3.Sum([z3.If(st.gstat[j] == RUN, self.seats(st, j), 0) for j in range(self.G)])

    @staticmethod
    def free_count(pool: Pool) -> Any:
        return _count(list(pool.free))

    def entry(self, st: State, s: int, i: int, device: int) -> Any:
        return z3.And(st.dev[s] == device, i < st.tlen[s])

    def holders(self, st: State, device: int, b: int) -> Any:
        return _count([
            z3.And(self.entry(st, s, i, device), st.tab[s][i] == b) for s in range(self.S) for i in range(self.L)
        ])

    # ------------------------------------------------------------------ pool operations
    def alloc(self, pool: Pool, cond: Any, device: int, busy_ok: bool = False, taken: list[Any] | None = None) -> tuple[Pool, Any]:
        """Take the lowest-numbered free block when ``cond`` holds (reference's BlockPool.allocate).

        ``busy_ok`` (a mutant): take the lowest block not yet ``taken`` in this move, free or not."""
        n = len(pool.free)
        avail = [z3.Not(taken[b]) for b in range(n)] if busy_ok and taken is not None else pool.free
        idx: Any = z3.IntVal(-1)
        for b in reversed(range(n)):
            idx = z3.If(avail[b], b, idx)
        idx = self.let(idx, "id")
        self.alloc_ok.append(z3.Implies(cond, idx >= 0))
        hit = [z3.And(cond, idx == b) for b in range(n)]
        if taken is not None:
            for b in range(n):
                taken[b] = self.let(z3.Or(taken[b], hit[b]), "tk")
        return Pool(
            [self.let(z3.If(hit[b], 1, pool.ref[b]), "r") for b in range(n)],
            [self.let(z3.If(hit[b], False, pool.free[b]), "f") for b in range(n)],
        ), idx

    def incref(self, pool: Pool, cond: Any, block: Any, k: int = 1) -> Pool:
        n = len(pool.ref)
        return Pool(
            [self.let(z3.If(z3.And(cond, block == b), pool.ref[b] + k, pool.ref[b]), "r") for b in range(n)],
            list(pool.free),
        )

    def decref(self, pool: Pool, cond: Any, block: Any) -> Pool:
        """Drop one reference; the block is free again when nobody holds it (BlockPool.decref)."""
        n = len(pool.ref)
        ref = [self.let(z3.If(z3.And(cond, block == b), pool.ref[b] - 1, pool.ref[b]), "r") for b in range(n)]
        free = [
            self.let(z3.If(z3.And(cond, block == b, ref[b] == 0), True, pool.free[b]), "f") for b in range(n)
        ]
        return Pool(ref, free)

    def free_seq(self, st: State, s: int, cond: Any) -> None:
        """BlockManager.free: drop every reference the sequence holds, wherever its table lives."""
        for device in (GPU, CPU):
            pool = st.pool(device)
            for i in range(self.L):
                pool = self.decref(pool, z3.And(cond, self.entry(st, s, i, device)), st.tab[s][i])
            st.set_pool(device, pool)
        st.tlen[s] = self.let(z3.If(cond, 0, st.tlen[s]), "tl")
        st.dev[s] = self.let(z3.If(cond, NODEV, st.dev[s]), "dv")

    # ------------------------------------------------------------------ sequence steps
    def append_slot(self, st: State, s: int, cond: Any, written: list[tuple[Any, Any]]) -> Any:
        """BlockManager.append_slot for the token at position ``ncomp``; returns the in-bound condition."""
        pos = st.ncomp[s]
        tlen = st.tlen[s]
        new_block = z3.And(cond, pos / self.bs == tlen)
        last = self.let(_ite_chain(tlen - 1, st.tab[s]), "last")
        shared = _ite_chain(last, st.gpu.ref) > 1
        cow = z3.And(cond, z3.Not(pos / self.bs == tlen), shared)
        if self.mutant == "decode-no-cow":
            cow = z3.BoolVal(False)
        pool, fresh = self.alloc(st.gpu, z3.Or(new_block, cow), GPU)
        pool = self.decref(pool, cow, last)
        st.gpu = pool
        for i in range(self.L):
            st.tab[s][i] = self.let(
                z3.If(z3.And(new_block, i == tlen), fresh, z3.If(z3.And(cow, i == tlen - 1), fresh, st.tab[s][i])), "tb"
            )
        st.tlen[s] = self.let(z3.If(new_block, tlen + 1, tlen), "tl")
        written.append((cond, _ite_chain(pos / self.bs, st.tab[s])))
        return z3.Implies(new_block, tlen < self.L)

    def update_seq(self, st: State, s: int, cond: Any, computed: Any) -> None:
        """Scheduler.update for one scheduled sequence: the computed count, one sampled token,
        and the length cap (past max_model_len the sequence finishes and frees its blocks)."""
        st.ncomp[s] = self.let(z3.If(cond, computed, st.ncomp[s]), "nc")
        st.ntok[s] = self.let(z3.If(cond, st.ntok[s] + 1, st.ntok[s]), "nt")
        generated = st.ntok[s] - self.gsel(st.plen, self.grp[s])
        capped = z3.And(cond, z3.Or(generated >= self.gsel(st.mtok, self.grp[s]), st.ntok[s] >= self.ML))
        st.sstat[s] = self.let(z3.If(capped, FIN, st.sstat[s]), "ss")
        self.free_seq(st, s, capped)

    def finish_group_if_done(self, st: State, g: Any, cond: Any) -> None:
        """A touched running request with no live sequence left finishes and leaves running."""
        done = z3.And(cond, self.live_count(st, g) == 0)
        self.set_g(st.gstat, g, FIN, done)
        self.set_g(st.in_r, g, False, done)

    def set_g(self, values: list[Any], g: Any, value: Any, cond: Any = True) -> None:
        for j in range(len(values)):
            values[j] = self.let(z3.If(z3.And(cond, g == j), value, values[j]), "g")

    def set_s(self, values: list[Any], s: int, value: Any, cond: Any) -> None:
        values[s] = self.let(z3.If(cond, value, values[s]), "s")

    def distinct_entries(self, st: State, members: list[Any], device: int) -> tuple[list[tuple[int, int, Any, Any]], Any]:
        """The group's table entries on ``device`` in order; for each: (s, i, holds, first appearance)."""
        entries = []
        for s in range(self.S):
            for i in range(self.L):
                holds = z3.And(members[s], self.entry(st, s, i, device))
                earlier = [
                    z3.And(h, st.tab[s2][i2] == st.tab[s][i]) for (s2, i2, h, _) in entries
                ]
                first = z3.And(holds, z3.Not(z3.Or(earlier))) if earlier else holds
                entries.append((s, i, holds, first))
        return entries, _count([e[3] for e in entries])

    def move(self, st: State, g: Any, src: int, dst: int) -> None:
        """BlockManager._move: each distinct block of the group gets one fresh block on the other
        device in order of first appearance; tables are mapped entry by entry."""
        members = [z3.And(self.in_group(s, g), self.live(st, s)) for s in range(self.S)]
        entries, _ = self.distinct_entries(st, members, src)
        dst_pool, src_pool = st.pool(dst), st.pool(src)
        busy = self.mutant == "swapin-busy-block" and dst == GPU
        taken = [z3.BoolVal(False)] * self.nblocks[dst] if busy else None
        target: dict[tuple[int, int], Any] = {}
        for (s, i, _holds, first) in entries:
            dst_pool, fresh = self.alloc(dst_pool, first, dst, busy_ok=busy, taken=taken)
            # zero before counting the entries that point at it (allocate's own ref is dropped)
            dst_pool = Pool([self.let(z3.If(z3.And(first, fresh == b), 0, r), "r") for b, r in enumerate(dst_pool.ref)], dst_pool.free)
            mapped: Any = fresh
            for (s2, i2, _h2, f2) in entries:
                if (s2, i2) == (s, i):
                    break
                mapped = z3.If(z3.And(f2, st.tab[s2][i2] == st.tab[s][i]), target[(s2, i2)], mapped)
            target[(s, i)] = self.let(z3.If(first, fresh, mapped), "mp")
        for (s, i, holds, _first) in entries:
            dst_pool = self.incref(dst_pool, holds, target[(s, i)])
            src_pool = self.decref(src_pool, holds, st.tab[s][i])
        st.set_pool(dst, dst_pool)
        st.set_pool(src, src_pool)
        for s in range(self.S):
            for i in range(self.L):
                st.tab[s][i] = self.let(z3.If(z3.And(members[s], i < st.tlen[s]), target[(s, i)], st.tab[s][i]), "tb")
            st.dev[s] = self.let(z3.If(z3.And(members[s], st.dev[s] == src), dst, st.dev[s]), "dv")

    # ------------------------------------------------------------------ actions
    actions = ACTIONS  # what `encode` accepts; action a is encoded by the method `{action_prefix}{a}`
    action_prefix = "_"

    def encode(self, action: str, pre: State | None = None) -> ActionEncoding:
        if action not in self.actions:
            raise ValueError(f"unknown action {action!r}")
        self.defs, self.alloc_ok = [], []
        pre = pre if pre is not None else self.state("pre")
        st = pre.copy()
        ae = ActionEncoding(action, self, pre, st, z3.BoolVal(True))
        g = z3.Int("act_group")
        ae.params["group"] = g
        getattr(self, f"{self.action_prefix}{action}")(ae, pre, st, g)
        ae.post = st
        ae.guard = z3.And(ae.guard, g >= 0, g < self.G)
        return ae

    def _members(self, st: State, g: Any) -> list[Any]:
        return [z3.And(self.in_group(s, g), self.live(st, s)) for s in range(self.S)]

    def _admission_guard(self, pre: State, g: Any, seats: Any) -> tuple[Any, Any, Any]:
        members = self._members(pre, g)
        need = z3.Sum([z3.If(members[s], self.ceil_blocks(pre.ntok[s]), 0) for s in range(self.S)])
        tokens = z3.Sum([z3.If(members[s], pre.ntok[s] - pre.ncomp[s], 0) for s in range(self.S)])
        B = self.nblocks[GPU]
        free = self.free_count(pre.gpu)
        if self.mutant == "admit-ignores-watermark":
            blocks_ok = free >= need
        else:
            blocks_ok = z3.And(B - need >= self.W, free - need >= self.W)
        nothing_swapped = z3.And([pre.gstat[j] != SWAP for j in range(self.G)])
        limit = z3.If(self.ML < self.T, self.ML, self.T)
        in_bound = z3.And([z3.Implies(members[s], self.ceil_blocks(pre.ntok[s]) <= self.L) for s in range(self.S)])
        guard = z3.And(
            self.gsel(pre.gstat, g) == WAIT, nothing_swapped, tokens <= limit, seats <= self.M,
            blocks_ok, self.running_seats(pre) + seats <= self.M, in_bound,
        )
        return guard, need, tokens

    def _allocate_prompt(self, pre: State, st: State, s: int, cond: Any) -> None:
        need = self.let(self.ceil_blocks(pre.ntok[s]), "nd")
        pool = st.gpu
        for i in range(self.L):
            c = z3.And(cond, i < need)
            pool, blk = self.alloc(pool, c, GPU)
            st.tab[s][i] = self.let(z3.If(c, blk, st.tab[s][i]), "tb")
        st.gpu = pool
        st.tlen[s] = self.let(z3.If(cond, need, st.tlen[s]), "tl")
        st.dev[s] = self.let(z3.If(cond, GPU, st.dev[s]), "dv")
        st.sstat[s] = self.let(z3.If(cond, RUN, st.sstat[s]), "ss")

    def _enter_running(self, st: State, g: Any, from_queue: list[Any]) -> None:
        self.set_g(st.gstat, g, RUN)
        self.set_g(from_queue, g, False)
        self.set_g(st.in_r, g, True)

    def _add(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        p, m = z3.Int("act_prompt_len"), z3.Int("act_max_tokens")
        ae.params["prompt_len"] = p
        ae.params["max_tokens"] = m
        ae.guard = z3.And(self.gsel(pre.gstat, g) == NONE, self.nslots(g) >= 1, p >= 1, m >= 1)
        self.set_g(st.plen, g, p)
        self.set_g(st.mtok, g, m)
        for s in range(self.S):
            c = z3.And(self.in_group(s, g), self.is_first(s))
            self.set_s(st.sstat, s, WAIT, c)
            self.set_s(st.ntok, s, p, c)
            self.set_s(st.ncomp, s, 0, c)
        self.set_g(st.gstat, g, WAIT)
        self.set_g(st.in_w, g, True)
        self.set_g(st.forked, g, self.nslots(g) == 1)

    def _admit(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        guard, _, _ = self._admission_guard(pre, g, self.seats(pre, g))
        ae.guard = z3.And(guard, self.gsel(pre.forked, g))
        members = self._members(pre, g)
        for s in range(self.S):
            self._allocate_prompt(pre, st, s, members[s])
        self._enter_running(st, g, st.in_w)
        for s in range(self.S):
            self.update_seq(st, s, members[s], pre.ntok[s])
        self.finish_group_if_done(st, g, True)

    def _fork(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        guard, _, _ = self._admission_guard(pre, g, self.nslots(g))
        ae.guard = z3.And(guard, z3.Not(self.gsel(pre.forked, g)), self.nslots(g) >= 2)
        parent = [z3.And(self.in_group(s, g), self.is_first(s)) for s in range(self.S)]
        child = [z3.And(self.in_group(s, g), z3.Not(self.is_first(s))) for s in range(self.S)]
        for s in range(self.S):
            self._allocate_prompt(pre, st, s, parent[s])
            self.set_s(st.ncomp, s, pre.ntok[s], parent[s])
        self._enter_running(st, g, st.in_w)

        def of_parent(values: list[Any]) -> Any:
            out = values[0]
            for s in range(1, self.S):
                out = z3.If(parent[s], values[s], out)
            return self.let(out, "pv")

        ptab = [of_parent([st.tab[s][i] for s in range(self.S)]) for i in range(self.L)]
        ptlen, pntok, pncomp = of_parent(st.tlen), of_parent(pre.ntok), of_parent(st.ncomp)
        for s in range(self.S):  # BlockManager.fork, child by child
            c = child[s]
            for i in range(self.L):
                if self.mutant != "fork-no-incref":
                    st.gpu = self.incref(st.gpu, z3.And(c, i < ptlen), ptab[i])
                st.tab[s][i] = self.let(z3.If(c, ptab[i], st.tab[s][i]), "tb")
            self.set_s(st.tlen, s, ptlen, c)
            self.set_s(st.dev, s, GPU, c)
            self.set_s(st.sstat, s, RUN, c)
            self.set_s(st.ntok, s, pntok, c)
            self.set_s(st.ncomp, s, pncomp, c)
        self.set_g(st.forked, g, True)
        for s in range(self.S):  # parent first, then the children: one token each, length cap
            self.update_seq(st, s, self.in_group(s, g), st.ncomp[s])
        self.finish_group_if_done(st, g, True)

    def _decode_all(self, ae: ActionEncoding, st: State, members: list[Any]) -> None:
        in_bound = []
        for s in range(self.S):
            in_bound.append(self.append_slot(st, s, members[s], ae.written))
        ae.mid = st.copy()
        ae.guard = z3.And(ae.guard, *in_bound)
        for s in range(self.S):
            self.update_seq(st, s, members[s], st.ncomp[s] + 1)

    def _decode(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        members = self._members(pre, g)
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == RUN, self.free_count(pre.gpu) >= self.live_count(pre, g)
        )
        self._decode_all(ae, st, members)
        self.finish_group_if_done(st, g, True)

    def _preempt_recompute(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        members = self._members(pre, g)
        ae.guard = self.gsel(pre.gstat, g) == RUN
        for s in range(self.S):
            self.free_seq(st, s, members[s])
            if self.mutant != "recompute-keeps-computed":
                self.set_s(st.ncomp, s, 0, members[s])
            self.set_s(st.sstat, s, WAIT, members[s])
        self.set_g(st.gstat, g, WAIT)
        self.set_g(st.in_r, g, False)
        self.set_g(st.in_w, g, True)

    def _swap_out(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        members = self._members(pre, g)
        _, distinct = self.distinct_entries(pre, members, GPU)
        ae.guard = z3.And(self.gsel(pre.gstat, g) == RUN, self.free_count(pre.cpu) >= distinct)
        self.move(st, g, GPU, CPU)
        for s in range(self.S):
            self.set_s(st.sstat, s, SWAP, members[s])
        self.set_g(st.gstat, g, SWAP)
        self.set_g(st.in_r, g, False)
        self.set_g(st.in_s, g, True)

    def swap_in_need(self, pre: State, g: Any) -> Any:
        """BlockManager.blocks_to_swap_in (vLLM's _can_swap): the group's distinct FULL CPU blocks
        (entry ``i`` of sequence ``s`` is full iff ``(i + 1) * bs <= ncomp[s]``) plus one per live
        sequence."""
        members = self._members(pre, g)
        entries, _ = self.distinct_entries(pre, members, CPU)
        full: list[tuple[int, int, Any]] = []
        firsts = []
        for (s, i, holds, _first) in entries:
            fh = z3.And(holds, (i + 1) * self.bs <= pre.ncomp[s])
            earlier = [z3.And(h2, pre.tab[s2][i2] == pre.tab[s][i]) for (s2, i2, h2) in full]
            firsts.append(z3.And(fh, z3.Not(z3.Or(earlier))) if earlier else fh)
            full.append((s, i, fh))
        return _count(firsts) + self.live_count(pre, g)

    def _swap_in(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        members = self._members(pre, g)
        need = self.swap_in_need(pre, g)
        B = self.nblocks[GPU]
        ae.guard = z3.And(
            self.gsel(pre.gstat, g) == SWAP,
            B - need >= self.W, self.free_count(pre.gpu) - need >= self.W,
            self.live_count(pre, g) <= self.T,
            self.running_seats(pre) + self.seats(pre, g) <= self.M,
        )
        self.move(st, g, CPU, GPU)
        for s in range(self.S):
            self.set_s(st.sstat, s, RUN, members[s])
        self._enter_running(st, g, st.in_s)
        self._decode_all(ae, st, members)
        self.finish_group_if_done(st, g, True)

    def _finish(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        s_act = z3.Int("act_seq")
        ae.params["seq"] = s_act
        ae.guard = z3.And(s_act >= 0, s_act < self.S, _ite_chain(s_act, pre.sstat) == RUN,
                          _ite_chain(s_act, self.grp) == g)
        for s in range(self.S):
            c = s_act == s
            self.set_s(st.sstat, s, FIN, c)
            self.free_seq(st, s, c)
        self.finish_group_if_done(st, g, True)

    def _end(self, pre: State, st: State, g: Any, free: bool = True) -> None:
        members = self._members(pre, g)
        for s in range(self.S):
            if free:
                self.free_seq(st, s, members[s])
            self.set_s(st.sstat, s, FIN, members[s])
        self.set_g(st.gstat, g, FIN)
        for q in (st.in_w, st.in_r, st.in_s):
            self.set_g(q, g, False)

    def _abort(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        gs = self.gsel(pre.gstat, g)
        ae.guard = z3.Or(gs == WAIT, gs == RUN, gs == SWAP)
        self._end(pre, st, g, free=self.mutant != "abort-no-free")

    def _ignore(self, ae: ActionEncoding, pre: State, st: State, g: Any) -> None:
        members = self._members(pre, g)
        need = z3.Sum([z3.If(members[s], self.ceil_blocks(pre.ntok[s]), 0) for s in range(self.S)])
        tokens = z3.Sum([z3.If(members[s], pre.ntok[s] - pre.ncomp[s], 0) for s in range(self.S)])
        B = self.nblocks[GPU]
        limit = z3.If(self.ML < self.T, self.ML, self.T)
        gs = self.gsel(pre.gstat, g)
        waiting_never = z3.And(gs == WAIT, z3.Or(tokens > limit, self.seats(pre, g) > self.M, B - need < self.W))
        swapped_never = z3.And(gs == SWAP, B - self.swap_in_need(pre, g) < self.W)
        ae.guard = z3.Or(waiting_never, swapped_never)
        self._end(pre, st, g)


# ---------------------------------------------------------------------- concrete states
def read_state(model: Any, enc: Encoder, st: State) -> dict[str, Any]:
    """A concrete state (plain JSON-able data) from a Z3 model."""

    def iv(e: Any) -> int:
        return model.eval(e, model_completion=True).as_long()

    def bv(e: Any) -> bool:
        return z3.is_true(model.eval(e, model_completion=True))

    seqs = []
    for s in range(enc.S):
        tlen = iv(st.tlen[s])
        seqs.append({
            "group": iv(enc.grp[s]), "status": STATUS_NAMES[iv(st.sstat[s])] if 0 <= iv(st.sstat[s]) < 5 else iv(st.sstat[s]),
            "device": DEVICE_NAMES[iv(st.dev[s])] if 0 <= iv(st.dev[s]) < 3 else iv(st.dev[s]),
            "table": [iv(st.tab[s][i]) for i in range(min(max(tlen, 0), enc.L))],
            "tokens": iv(st.ntok[s]), "computed": iv(st.ncomp[s]),
        })
    groups = []
    for j in range(enc.G):
        queues = [q for q, arr in (("waiting", st.in_w), ("running", st.in_r), ("swapped", st.in_s)) if bv(arr[j])]
        code = iv(st.gstat[j])
        groups.append({"status": STATUS_NAMES[code] if 0 <= code < 5 else code, "queues": queues, "forked": bv(st.forked[j]),
                       "prompt_len": iv(st.plen[j]), "max_tokens": iv(st.mtok[j])})
    return {
        "gpu_ref": [iv(r) for r in st.gpu.ref], "gpu_free": [bv(f) for f in st.gpu.free],
        "cpu_ref": [iv(r) for r in st.cpu.ref], "cpu_free": [bv(f) for f in st.cpu.free],
        "seqs": seqs, "groups": groups,
    }


def read_config(model: Any, enc: Encoder) -> dict[str, int]:
    def iv(e: Any) -> int:
        return model.eval(e, model_completion=True).as_long()

    return {"watermark_blocks": iv(enc.W), "max_num_seqs": iv(enc.M), "max_model_len": iv(enc.ML),
            "max_num_batched_tokens": iv(enc.T)}


def pin_state(enc: Encoder, st: State, concrete: dict[str, Any]) -> list[Any]:
    """Constraints that fix ``st`` to a concrete state (as `read_state` writes it)."""
    out: list[Any] = []
    code = {name: i for i, name in enumerate(STATUS_NAMES)}
    dev = {name: i for i, name in enumerate(DEVICE_NAMES)}
    for key, pool in (("gpu", st.gpu), ("cpu", st.cpu)):
        out += [r == v for r, v in zip(pool.ref, concrete[f"{key}_ref"], strict=True)]
        out += [f == z3.BoolVal(v) for f, v in zip(pool.free, concrete[f"{key}_free"], strict=True)]
    for s, q in enumerate(concrete["seqs"]):
        out += [enc.grp[s] == q["group"], st.sstat[s] == code[q["status"]], st.dev[s] == dev[q["device"]],
                st.tlen[s] == len(q["table"]), st.ntok[s] == q["tokens"], st.ncomp[s] == q["computed"]]
        out += [st.tab[s][i] == b for i, b in enumerate(q["table"])]
    for j, grp in enumerate(concrete["groups"]):
        out += [st.gstat[j] == code[grp["status"]], st.forked[j] == z3.BoolVal(grp["forked"]),
                st.plen[j] == grp["prompt_len"], st.mtok[j] == grp["max_tokens"]]
        for q, arr in (("waiting", st.in_w), ("running", st.in_r), ("swapped", st.in_s)):
            out.append(arr[j] == z3.BoolVal(q in grp["queues"]))
    return out


def pin_config(enc: Encoder, config: dict[str, int]) -> list[Any]:
    return [enc.W == config["watermark_blocks"], enc.M == config["max_num_seqs"],
            enc.ML == config["max_model_len"], enc.T == config["max_num_batched_tokens"]]


Builder = Callable[[Encoder], ActionEncoding]
