"""A toy engine that stands for "your scheduler" in docs/ADAPTERS.md's worked example.

It knows nothing of kvsched: its own names, its own step API, string statuses. One sequence per
request, a GPU pool counted in blocks, FCFS admission of whole prompts, preemption by recompute
of the latest running request when a decode needs a block. No swap space, no watermark, no
priorities: its adapter declares exactly that as its config domain.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Req:
    rid: str
    prompt_len: int
    max_new: int
    generated: int = 0
    blocks: int = 0
    status: str = "WAITING"

    @property
    def length(self) -> int:
        return self.prompt_len + self.generated


@dataclass
class Batch:
    items: list[tuple[str, int, bool]] = field(default_factory=list)  # (seq id, tokens, is prompt)
    preempted: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


class Scheduler:
    def __init__(self, block_size: int, num_blocks: int, max_seqs: int, max_tokens: int, max_len: int) -> None:
        self.block_size, self.num_blocks, self.free = block_size, num_blocks, num_blocks
        self.max_seqs, self.max_tokens, self.max_len = max_seqs, max_tokens, max_len
        self.reqs: dict[str, _Req] = {}
        self.waiting: list[str] = []
        self.running: list[str] = []
        self._last = Batch()

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _release(self, r: _Req, status: str) -> None:
        self.free += r.blocks
        r.blocks, r.status = 0, status

    def add(self, rid: str, prompt_len: int, max_new: int) -> None:
        self.reqs[rid] = _Req(rid, prompt_len, max_new)
        self.waiting.append(rid)

    def abort(self, rid: str) -> bool:
        r = self.reqs.get(rid)
        if r is None or r.status.startswith("FINISHED"):
            return False
        (self.waiting if r.status == "WAITING" else self.running).remove(rid)
        self._release(r, "FINISHED_ABORTED")
        return True

    def schedule(self) -> Batch:
        batch = Batch()
        for rid in list(self.running):  # 1. decodes, preempting from the tail for a new block
            if rid not in self.running:
                continue  # preempted below for an earlier request
            r = self.reqs[rid]
            need = self._blocks(r.length) - r.blocks
            while need > self.free and self.running:
                victim = self.reqs[self.running.pop()]
                self._release(victim, "WAITING")
                self.waiting.insert(0, victim.rid)
                batch.preempted.append(victim.rid)
                if victim is r:
                    break
            if r.status == "RUNNING":
                self.free -= need
                r.blocks += need
                batch.items.append((f"{rid}#0", 1, False))
        limit = min(self.max_len, self.max_tokens)
        tokens = len(batch.items)
        while self.waiting:  # 2. FCFS admission of whole prompts
            r = self.reqs[self.waiting[0]]
            if r.length > limit or self._blocks(r.length) > self.num_blocks:
                self.waiting.pop(0)
                r.status = "FINISHED_IGNORED"
                batch.ignored.append(r.rid)
                continue
            need = self._blocks(r.length)
            if len(self.running) >= self.max_seqs or tokens + r.length > self.max_tokens or need > self.free:
                break
            self.waiting.pop(0)
            self.free -= need
            r.blocks, r.status = need, "RUNNING"
            self.running.append(r.rid)
            tokens += r.length
            batch.items.append((f"{r.rid}#0", r.length, True))
        self._last = batch
        return batch

    def step_done(self, stopped: frozenset[str] | set[str]) -> list[tuple[str, str]]:
        """Every scheduled sequence sampled a token; returns (request id, why) for each finish."""
        done = [(rid, "ignored") for rid in self._last.ignored]
        for seq_id, _, _ in self._last.items:
            r = self.reqs[seq_id.split("#")[0]]
            r.generated += 1
            why = "stop" if seq_id in stopped else "length" if r.generated >= r.max_new or r.length >= self.max_len else None
            if why:
                self.running.remove(r.rid)
                self._release(r, "FINISHED_STOPPED" if why == "stop" else "FINISHED_LENGTH_CAPPED")
                done.append((r.rid, why))
        self._last = Batch()
        return done

    def statuses(self) -> dict[str, str]:
        return {rid: r.status for rid, r in self.reqs.items()}
