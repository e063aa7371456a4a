"""Sequences and sequence groups (requests) as the reference scheduler tracks them."""

from __future__ import annotations

from dataclasses import dataclass, field

from spec.status import Status
from spec.types import Request, seq_id


@dataclass
class Sequence:
    """One generated continuation. ``num_computed`` counts tokens whose KV is in the cache."""

    seq_id: str
    request_id: str
    prompt_len: int
    num_tokens: int
    num_computed: int = 0
    status: Status = Status.WAITING

    @property
    def num_generated(self) -> int:
        return self.num_tokens - self.prompt_len

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed


@dataclass
class SequenceGroup:
    """A request: its sequences (one until the prompt is computed, then ``n``), its status and
    its place in arrival order."""

    request: Request
    arrival: int
    status: Status = Status.WAITING
    seqs: list[Sequence] = field(default_factory=list)
    forked: bool = False
    # A plain attribute, not a property of ``request``: snapshots and queue scans read it for
    # every queued group every step.
    request_id: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.request_id = self.request.request_id

    @classmethod
    def new(cls, request: Request, arrival: int) -> SequenceGroup:
        first = Sequence(seq_id(request.request_id, 0), request.request_id, request.prompt_len, request.prompt_len)
        return cls(request=request, arrival=arrival, seqs=[first], forked=request.n == 1)

    def live_seqs(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.status.is_finished]

    def max_running_seqs(self) -> int:
        """Seats this group takes in the sequence budget: ``n`` before its fork, then its live seqs."""
        return self.request.n if not self.forked else len(self.live_seqs())

    def uncomputed_tokens(self) -> int:
        return sum(s.num_uncomputed for s in self.live_seqs())

    def key(self, policy: str) -> tuple[int, ...]:
        """The policy's order: earlier is more urgent. FCFS: arrival. Priority: (priority, arrival)."""
        if policy == "priority":
            return (self.request.priority, self.arrival)
        return (self.arrival,)

    def set_status(self, status: Status) -> None:
        self.status = status
        for s in self.live_seqs():
            s.status = status
