"""What a scheduler declares it reserves beyond the KV its computed tokens need.

Schedulers differ in *when* they take blocks, and safety must not pick one answer. vLLM V0
takes the block for a token's KV when the decode that writes it is scheduled; another engine
takes it when the token before is sampled (one step earlier), another takes a whole request's
worth (prompt + max_tokens) at admission so that it never has to preempt. All are correct. What
safety keeps (CAP-004..006) is the range every one of them stays inside:

    computed KV          the rest of its tokens     declared reservation
    |====================|xxxxxxxxxxxxxxxxxxxxxxxxxx|rrrrrrrrrrrrrrrrrr|
    ^ at least these blocks (the KV written so far has a place)
    ^ ........................... at most these blocks ...............^

An adapter declares its reservation once, as ``adapter.reservation``; the driver hands it to the
checker (`spec.catalogue.Checker`). No declaration means no reservation: a table covers at most
its sequence's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.errors import InputError
from spec.types import Request


@dataclass(frozen=True)
class Reservation:
    """``lookahead_tokens``: slots a sequence may hold past its last token (a scheduler that
    reserves, when a token is sampled, room for the next one declares 1). ``whole_request``: a
    sequence may hold the blocks of its request's prompt + max_tokens from admission on."""

    lookahead_tokens: int = 0
    whole_request: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.lookahead_tokens, bool) or not isinstance(self.lookahead_tokens, int) \
                or self.lookahead_tokens < 0:
            raise InputError("adapter.reservation.lookahead_tokens",
                             f"must be an int >= 0, got {self.lookahead_tokens!r}")
        if not isinstance(self.whole_request, bool):
            raise InputError("adapter.reservation.whole_request", f"must be true or false, got {self.whole_request!r}")

    def max_tokens_held(self, num_tokens: int, request: Request | None) -> int:
        """The most token slots a sequence with ``num_tokens`` tokens may hold blocks for."""
        most = num_tokens + self.lookahead_tokens
        if self.whole_request and request is not None:
            most = max(most, request.prompt_len + request.max_tokens)
        return most


NONE = Reservation()  # what an adapter that declares nothing gets
