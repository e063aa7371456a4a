"""The per-step scheduling budget: tokens in the batch and sequences running."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Budget:
    token_budget: int
    max_num_seqs: int
    tokens: int = 0
    seqs: int = 0

    def can_schedule(self, tokens: int, seqs: int) -> bool:
        return self.tokens + tokens <= self.token_budget and self.seqs + seqs <= self.max_num_seqs

    @property
    def tokens_left(self) -> int:
        return self.token_budget - self.tokens

    @property
    def seqs_left(self) -> int:
        return self.max_num_seqs - self.seqs
