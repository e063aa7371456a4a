"""Strengthening invariants: found by the Z3 induction proofs (``kvsched prove``).

The catalogue's state invariants are not inductive on their own: a state can satisfy all of them
and still be one step from a violation. These two close the gap; with them the conjunction of the
state invariants is inductive for every action (docs/PROOFS.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from spec.catalogue import CheckContext, invariant
from spec.invariants._views import (
    changed_between,
    changed_requests_between,
    checked_with_prior,
    pool_facts,
    seq_ids_by_request,
    with_status,
)
from spec.observation import Capability as C
from spec.observation import StepRecord
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
)
def free_iff_unreferenced(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap, prior in checked_with_prior(ctx, rec):
        for device, refs, free_ids in (
            ("gpu", snap.gpu_ref_counts, snap.gpu_free_ids),
            ("cpu", snap.cpu_ref_counts, snap.cpu_free_ids),
        ):
            if device == "cpu" and refs is None and free_ids is None:
                continue  # no CPU pool: nothing to agree
            assert refs is not None and free_ids is not None
            if prior is not None and refs is getattr(prior, f"{device}_ref_counts") \
                    and free_ids is getattr(prior, f"{device}_free_ids"):
                continue  # the same counts and free list this check passed just before
            facts = pool_facts(snap, device)
            if facts.free_count == facts.unreferenced and not facts.outside(len(refs)) and not facts.referenced_free:
                continue  # every free block is unreferenced and there are as many: the sets are equal
            free = facts.free()
            unreferenced = {b for b, r in enumerate(refs) if r == 0}
            if free != unreferenced:
                odd = sorted(free ^ unreferenced)
                yield f"{label}: {device} blocks {odd[:5]} are free without being unreferenced or the reverse"


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
    unless=(C.NO_SEQ_LIMIT,),
)
def running_seats(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    for label, snap, prior in checked_with_prior(ctx, rec):
        assert snap.statuses is not None and snap.seqs is not None
        if _same_statuses(snap, prior):
            continue  # the seats are those this check passed just before
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


def _same_statuses(snap, prior) -> bool:
    """Whether no request and no sequence changed status between ``prior`` and ``snap`` (a decode
    changes a view's counts, not its status)."""
    if prior is None or prior.seqs is None:
        return False
    requests, seqs = changed_requests_between(snap, prior), changed_between(snap, prior)
    if requests is None or seqs is None or requests:
        return False
    old_seqs, new_seqs = prior.seqs, snap.seqs
    return all((old := old_seqs.get(sid)) is not None and (new := new_seqs.get(sid)) is not None
               and old.status is new.status for sid in seqs)
