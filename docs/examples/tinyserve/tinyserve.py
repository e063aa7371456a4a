"""tinyserve: a tiny continuous-batching scheduler that keeps its own block tables.

Written to stand for a stranger's engine (docs/examples/tinyserve/README.md): kvsched's types
appear nowhere here. One sequence per request; a LIFO free list of physical block ids; a block
table per request; FCFS admission of whole prompts under a batch and token budget; a decode that
needs a block it cannot get evicts the newest active request (its blocks are freed and it is
queued again at the front, to be prefilled anew over its prompt and output so far).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Seq:
    rid: str
    prompt_len: int
    max_new: int
    out: int = 0  # tokens generated so far
    table: list[int] = field(default_factory=list)  # physical block ids, logical order
    state: str = "queued"  # queued, active, or done:<why>

    @property
    def length(self) -> int:
        return self.prompt_len + self.out


@dataclass
class Plan:
    prefill: list[tuple[str, int]] = field(default_factory=list)  # (request, tokens)
    decode: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # can never run: too long or too big


class TinyServe:
    def __init__(self, block_size: int, num_blocks: int, max_batch: int, token_budget: int, max_len: int) -> None:
        self.block_size, self.num_blocks = block_size, num_blocks
        self.max_batch, self.token_budget, self.max_len = max_batch, token_budget, max_len
        self.free_blocks = list(range(num_blocks))
        self.seqs: dict[str, Seq] = {}
        self.queue: list[str] = []
        self.active: list[str] = []
        self.plan_: Plan = Plan()

    def _grow(self, s: Seq, tokens: int) -> bool:
        need = -(-tokens // self.block_size) - len(s.table)
        if need > len(self.free_blocks):
            return False
        for _ in range(need):
            s.table.append(self.free_blocks.pop())
        return True

    def _drop(self, s: Seq, state: str) -> None:
        self.free_blocks.extend(reversed(s.table))
        s.table, s.state = [], state

    def submit(self, rid: str, prompt_len: int, max_new: int) -> None:
        self.seqs[rid] = Seq(rid, prompt_len, max_new)
        self.queue.append(rid)

    def cancel(self, rid: str) -> bool:
        s = self.seqs.get(rid)
        if s is None or s.state.startswith("done"):
            return False
        (self.queue if s.state == "queued" else self.active).remove(rid)
        self._drop(s, "done:cancelled")
        return True

    def plan(self) -> Plan:
        p = Plan()
        for rid in list(self.active):
            s = self.seqs[rid]
            while s.state == "active" and not self._grow(s, s.length):
                victim = self.seqs[self.active.pop()]
                self._drop(victim, "queued")
                self.queue.insert(0, victim.rid)
                p.evicted.append(victim.rid)
            if s.state == "active":
                p.decode.append(rid)
        budget = self.token_budget - len(p.decode)
        while self.queue:
            s = self.seqs[self.queue[0]]
            if s.length > min(self.max_len, self.token_budget) or -(-s.length // self.block_size) > self.num_blocks:
                self.queue.pop(0)
                s.state = "done:rejected"
                p.rejected.append(s.rid)
                continue
            if len(self.active) >= self.max_batch or s.length > budget or not self._grow(s, s.length):
                break
            self.queue.pop(0)
            s.state = "active"
            self.active.append(s.rid)
            budget -= s.length
            p.prefill.append((s.rid, s.length))
        self.plan_ = p
        return p

    def commit(self, stopped: set[str]) -> list[tuple[str, str]]:
        """Each planned request sampled one token; returns (request, why) for those that ended."""
        ended = [(rid, "rejected") for rid in self.plan_.rejected]
        for rid in [r for r, _ in self.plan_.prefill] + self.plan_.decode:
            s = self.seqs[rid]
            s.out += 1
            why = "stop" if rid in stopped else "length" if s.out >= s.max_new or s.length >= self.max_len else None
            if why:
                self.active.remove(rid)
                self._drop(s, f"done:{why}")
                ended.append((rid, why))
        self.plan_ = Plan()
        return ended
