"""The physical blocks of one device: reference counts and the free set.

Deterministic rule (so two implementations can be compared block id for block id): a new
block is always the *lowest-numbered* free block.
"""

from __future__ import annotations

import heapq


class BlockPool:
    def __init__(self, device: str, num_blocks: int) -> None:
        self.device = device
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free = list(range(num_blocks))  # a min-heap of free ids

    @property
    def num_free(self) -> int:
        return len(self._free)

    def free_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._free))

    def allocate(self) -> int:
        block = heapq.heappop(self._free)
        self.ref_counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        self.ref_counts[block] += 1

    def decref(self, block: int) -> None:
        """Drop one reference; the block returns to the free set when nobody holds it."""
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            heapq.heappush(self._free, block)
