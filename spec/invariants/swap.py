"""Swap maps: bijections between a victim's blocks and fresh blocks on the other device."""

from __future__ import annotations

from collections.abc import Iterator

from spec.invariants._views import tables
from spec.invariants.triggers import swaps, swaps_in, swaps_out
from spec.observation import Capability as C
from spec.observation import Snapshot, StepRecord
from spec.rules import SCHEDULE, CheckContext, invariant
from spec.status import PreemptionMode
from spec.types import request_of


def _bijection(pairs: tuple[tuple[int, int], ...], name: str) -> Iterator[str]:
    srcs = [a for a, _ in pairs]
    dsts = [b for _, b in pairs]
    if len(set(srcs)) != len(srcs):
        yield f"{name} map names a source block twice: {list(pairs)}"
    if len(set(dsts)) != len(dsts):
        yield f"{name} map names a destination block twice: {list(pairs)}"


def _live_blocks(snap: Snapshot, device: str, request_ids: set[str]) -> set[int]:
    """The ``device`` blocks of the unfinished sequences of ``request_ids``: what a swap moves.
    A finished sibling's blocks are not moved; a scheduler that frees lazily frees them later
    (RES-005)."""
    seqs = snap.seqs or {}
    return {b for sid, t in tables(snap, device).items()
            if request_of(sid) in request_ids and not (sid in seqs and seqs[sid].status.is_finished) for b in t}


@invariant(
    "SWP-001", "safety",
    """Swap-out is a bijection from exactly the GPU blocks of the swapped-out requests' unfinished
    sequences onto CPU blocks that no other request holds after schedule() (after the step, when
    that is all there is to see).""",
    """Seed 000 §3.4 step 5 swaps a victim's KV to CPU to free GPU blocks; vLLM's
    blocks_to_swap_out is a block map the cache engine executes. A missing source loses KV, a
    busy destination overwrites another swapped request. Judged when the swap happens: a
    scheduler that frees lazily may free a finished request's CPU blocks in the same schedule()
    and swap into them.""",
    (C.BLOCK_TABLES,),
    about=SCHEDULE, when=swaps_out,
)
def swap_out_bijection(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    pairs = rec.output.swap_out
    victims = {p.request_id for p in rec.output.preempted if p.mode is PreemptionMode.SWAP}
    if not pairs and not victims:
        return  # nothing swapped out: the empty map is the bijection
    yield from _bijection(pairs, "swap-out")
    expected = _live_blocks(rec.before, "gpu", victims)
    if {a for a, _ in pairs} != expected:
        yield f"swap-out sources {sorted(a for a, _ in pairs)} != the victims' GPU blocks {sorted(expected)}"
    seen = rec.mid if rec.mid is not None and rec.mid.seqs is not None else rec.after
    busy = {b for sid, t in tables(seen, "cpu").items() if request_of(sid) not in victims for b in t}
    clash = sorted({b for _, b in pairs} & busy)
    if clash:
        yield f"swap-out writes CPU blocks {clash} that other requests hold"


@invariant(
    "SWP-002", "safety",
    """Swap-in is a bijection from exactly the swapped-in requests' CPU blocks onto GPU blocks
    that no other request holds after schedule() (after the step, when that is all there is to see).""",
    """The reverse of SWP-001 (vLLM's blocks_to_swap_in). A destination still held by a running
    sequence (vLLM PR #8824 under-counted what a swap-in consumes) puts two sequences' KV in one
    block. Judged when the swap happens: a block the swapped-in request frees later in the step
    (it finished) may go to another request at once.""",
    (C.BLOCK_TABLES,),
    about=SCHEDULE, when=swaps_in,
)
def swap_in_bijection(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    pairs = rec.output.swap_in
    group = set(rec.output.swapped_in)
    if not pairs and not group:
        return  # nothing swapped in: the empty map is the bijection
    yield from _bijection(pairs, "swap-in")
    expected = _live_blocks(rec.before, "cpu", group)
    # a request swapped out and back in within this schedule() brings back the CPU blocks the
    # swap-out just gave it (a round trip)
    trip = group & {p.request_id for p in rec.output.preempted if p.mode is PreemptionMode.SWAP}
    if trip:
        sources = _live_blocks(rec.before, "gpu", trip)
        expected |= {cpu for gpu, cpu in rec.output.swap_out if gpu in sources}
    if {a for a, _ in pairs} != expected:
        yield f"swap-in sources {sorted(a for a, _ in pairs)} != the swapped-in CPU blocks {sorted(expected)}"
    seen = rec.mid if rec.mid is not None and rec.mid.seqs is not None else rec.after
    others = {b for sid, t in tables(seen, "gpu").items() if request_of(sid) not in group for b in t}
    clash = sorted({b for _, b in pairs} & others)
    if clash:
        yield f"swap-in writes GPU blocks {clash} held by other requests"


@invariant(
    "SWP-003", "safety",
    """Swapping out preserves a sequence: its new table is its old table mapped through the swap
    map, entry by entry, and its token counts do not change (swapped back in within the same
    schedule(), its table starts with the image through both maps, and it may run on).""",
    """Swap exists to keep KV instead of recomputing it (seed 000 §3.5: swap costs PCIe
    transfers, recompute costs compute); a table that is not the image of the old one resumes
    with someone else's KV, and forked sequences must keep sharing their blocks.""",
    (C.BLOCK_TABLES, C.SEQ_LENGTHS),
    about=SCHEDULE, when=swaps,
)
def swap_preserves(ctx: CheckContext, rec: StepRecord) -> Iterator[str]:
    assert rec.before.seqs is not None and rec.after.seqs is not None
    mapping = dict(rec.output.swap_out)
    victims = {p.request_id for p in rec.output.preempted if p.mode is PreemptionMode.SWAP}
    if not victims:
        return
    back, returning = dict(rec.output.swap_in), set(rec.output.swapped_in)
    for sid, old in rec.before.seqs.items():
        if old.request_id not in victims or old.status.is_finished:
            continue
        new = rec.after.seqs.get(sid)
        if new is None:
            yield f"{sid} vanished when its request was swapped out"
            continue
        image = tuple(mapping.get(b, -1) for b in old.blocks or ())
        if new.device == "cpu" and new.blocks != image:
            yield f"{sid} swapped out: table {list(old.blocks or ())} became {list(new.blocks or ())}, expected {list(image)}"
        if old.request_id in returning:  # swapped out and in again: the round trip's image, then one step on
            trip = tuple(back.get(b, -1) for b in image)
            if new.device == "gpu" and new.blocks[: len(trip)] != trip:
                yield f"{sid} swapped out and in: table {list(old.blocks or ())} became {list(new.blocks or ())}, expected {list(trip)} first"
            continue
        if (new.num_tokens, new.num_computed) != (old.num_tokens, old.num_computed):
            yield f"{sid} swapped out: tokens/computed {old.num_tokens}/{old.num_computed} became {new.num_tokens}/{new.num_computed}"
