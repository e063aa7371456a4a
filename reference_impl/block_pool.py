"""The physical blocks of one device: reference counts and the free set.

Deterministic rule (so two implementations can be compared block id for block id): a new
block is always the *lowest-numbered* free block.

The free ids are kept sorted, highest first, so that the next block is popped from the end and
the observed free list is the list reversed, not sorted again each snapshot (a pool of 32k
blocks costs a sort per snapshot otherwise). The containers log the blocks they change for delta
snapshots (`reference_impl.pool_log`, observation only).
"""

from __future__ import annotations

from bisect import insort
from operator import neg

from reference_impl.pool_log import ChangeLog, LoggedCounts, LoggedSortedFree, changed_blocks


class BlockPool:
    def __init__(self, device: str, num_blocks: int) -> None:
        self.device = device
        self.num_blocks = num_blocks
        self._log = ChangeLog()  # observation only: which blocks changed since the last snapshot
        self.ref_counts = LoggedCounts(num_blocks, self._log)
        self._free = LoggedSortedFree(range(num_blocks), self._log)  # highest first: the lowest pops off the end

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_ids(self) -> tuple[int, ...]:
        return tuple(self._free[::-1])  # a slice is a plain list, copied at once (the subclass is iterated)

    def changed_blocks(self) -> dict[int, int] | None:
        """For a delta snapshot: each block whose reference count or free-list entries changed
        since the last call, with how many times the free list names it now (None: unknown)."""
        return changed_blocks(self.ref_counts, self._free, self._log)

    def allocate(self) -> int:
        block = self._free.pop()
        self.ref_counts[block] = 1
        return block

    def _release(self, block: int) -> None:
        """Put ``block`` back on the free list, in order (the caller dropped its last reference)."""
        insort(self._free, block, key=neg)

    def incref(self, block: int) -> None:
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        """Drop one reference; the block returns to the free set when nobody holds it."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._release(block)
