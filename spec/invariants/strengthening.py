"""Strengthening invariants: found by the Z3 induction proofs (``kvsched prove``).

The catalogue's state invariants are not inductive on their own: a state can satisfy all of them
and still be one step from a violation. These two close the gap; with them the conjunction of the
state invariants is inductive for every action (docs/PROOFS.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._evaluation import PoolAt
from spec.invariants._views import pool_facts, seq_ids_by_request, snapshots, with_status
from spec.invariants.triggers import pool_in_use, runs
from spec.observation import Capability as C
from spec.observation import StepRecord
from spec.rules import POOL, STEP, CheckContext, invariant
from spec.status import Status


@invariant(
    "STR-001", "safety",
    "Block by block, a block is on the free list exactly when its reference count is zero (GPU and CPU).",
    """Found by the Z3 induction proof: BLK-001 only counts (free + in use = total), so a state
    where a block with references is listed free and a block without references is not passes it;
    the next allocation then hands out a live block (BLK-003 breaks after admit/decode) and the
    next decref to zero frees a block twice. Per-block agreement is what makes conservation
    inductive (vLLM's allocator keeps the free list and ref counts in one structure for this).""",
    (C.REF_COUNTS, C.FREE_LISTS),
    about=POOL, when=pool_in_use,
)
def free_iff_unreferenced(ctx: CheckContext, rec: StepRecord, pool: PoolAt) -> Iterator[str]:
    refs, free_ids = pool.refs, pool.free_ids
    if pool.device == "cpu" and refs is None and free_ids is None:
        return  # no CPU pool: nothing to agree
    assert refs is not None and free_ids is not None
    facts = pool_facts(pool.snap, pool.device)
    if facts.free_count == facts.unreferenced and not facts.outside(len(refs)) and not facts.referenced_free:
        return  # every free block is unreferenced and there are as many: the sets are equal
    free = facts.free()
    unreferenced = {b for b, r in enumerate(refs) if r == 0}
    if free != unreferenced:
        odd = sorted(free ^ unreferenced)
        yield f"{pool.where}: {pool.device} blocks {odd[:5]} are free without being unreferenced or the reverse"


@invariant(
    "STR-002", "policy",
    """The seats of the running requests fit max_num_seqs: a request counts n seats before it
    forks and its live sequences after.""",
    """Found by the Z3 induction proof: BUD-003 (running sequences <= max_num_seqs) is not
    inductive, because a running request that has not forked yet holds one sequence but will hold
    n after its first update. vLLM budgets max_running_seqs() for exactly this reason (PR #1068);
    the seat count is the invariant that makes BUD-003 inductive. Policy with BUD-003, for the
    same reason: it bounds the resident set, which only engines that batch every running
    sequence (vLLM, nano-vllm) tie to max_num_seqs.""",
    (C.STATUSES,),
    about=STEP, when=runs,
    unless=(C.NO_SEQ_LIMIT,),
)
def running_seats(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap in snapshots(rec):
        assert snap.statuses is not None and snap.seqs is not None
        seqs, by_request = snap.seqs, seq_ids_by_request(snap)
        seats = 0
        for rid in with_status(snap, Status.RUNNING):
            if rid not in ctx.requests:
                continue
            n = ctx.requests[rid].n
            sids = by_request.get(rid, ())
            forked = n == 1 or len(sids) >= n
            seats += sum(1 for sid in sids if not seqs[sid].status.is_finished) if forked else n
        if seats > ctx.config.max_num_seqs:
            yield f"{label}: running requests take {seats} seats, max_num_seqs {ctx.config.max_num_seqs}"

