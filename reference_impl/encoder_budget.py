"""The encoder cache and the per-step encoder budget of the V1 reference (spec/encoder.py).

Modelled on vLLM 0.33.0 ``v1/core/encoder_cache_manager.py`` (EncoderCacheManager) and
``Scheduler._try_schedule_encoder_inputs``. The cache holds one entry per content hash; an entry
knows the requests holding it. An entry nobody holds is kept for reuse (``freeable``, oldest
first) and evicted only when an allocation needs its space. One step, for each request the
scheduler gives a chunk of positions ``[computed, computed + tokens)``:

1. `EncoderCache.plan` walks the request's encoder inputs that overlap the chunk, in position
   order. An input whose output is cached (or planned by this request already: two inputs with one
   hash are computed once) costs nothing. Any other must fit the step's encoder budget and the
   cache (free space plus what evicting unheld entries would give); the first that does not cuts
   the chunk just before the input's first position (0 tokens if the chunk starts inside it).
   An input that fits only by evicting unheld entries names them (oldest first) in the plan, so a
   later input of the same chunk cannot read one of them as cached: vLLM's ``can_allocate``
   evicts as it goes (encoder_cache_manager.py:147-194), so its next input misses and is computed.
2. Only once the chunk's KV blocks are allocated does the scheduler `commit` the plan: the request
   holds every cached input it reads and the new ones are allocated (evicting unheld entries,
   oldest first). A plan for a request that is then not scheduled changes nothing: the fix of
   vllm-project/vllm PR #31857, where a waiting request that failed admission kept holding entries.
3. `release_consumed` after the outcome lets go of the inputs a request has computed past; a
   preempted or finished request lets go of all of them (`release`).

Where this differs from vLLM: vLLM's plan marks cached entries held at once
(``check_and_update_cache``) and undoes it when the KV allocation fails, and evicts while it plans
(``can_allocate``) even when the request is then not scheduled; a plan here is pure until
committed, so an entry vLLM evicted for a request it then did not schedule is kept here (the
lockstep class evicts-while-planning, conformance/selftest/campaigns/lockstep_budgets.py). Encoder-decoder models, the chunked-mm-input switch and the
EC connector are not modelled. One embedding per position (spec/encoder.py says why).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from spec.encoder import EncoderEntry, EncoderInput


@dataclass(frozen=True)
class EncoderPlan:
    """What one request's chunk needs of the encoder: the tokens it may compute, the inputs to
    compute (indices into its encoder inputs) and the cached ones it reads."""

    tokens: int
    compute: tuple[int, ...] = ()
    cached: tuple[int, ...] = ()
    cost: int = 0  # encoder embeddings computed: what the step's budget pays
    evict: tuple[str, ...] = ()  # unheld entries to evict for the computed ones, oldest first


@dataclass
class EncoderCache:
    capacity: int
    sizes: dict[str, int] = field(default_factory=dict)  # hash -> embeddings, held or freeable
    users: dict[str, set[str]] = field(default_factory=dict)  # hash -> requests holding it
    freeable: OrderedDict[str, int] = field(default_factory=OrderedDict)  # unheld entries, oldest first

    @property
    def num_free(self) -> int:
        return self.capacity - sum(self.sizes.values())

    def plan(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int, tokens: int,
             budget: int) -> EncoderPlan:
        """Step 1 above; ``budget``: the step's encoder budget left. Changes nothing."""
        compute: list[int] = []
        cached: list[int] = []
        planned: set[str] = set()
        unheld = OrderedDict(self.freeable)  # what may still be evicted, oldest first
        evict: list[str] = []
        free = self.num_free  # grows with each eviction; what is planned is allocated at commit
        need = 0
        for index, item in enumerate(inputs):
            if not item.overlaps(computed, computed + tokens):
                continue
            digest = item.content_hash
            if digest in planned:
                continue  # the same output, computed once for both (vLLM's duplicate_encoder_inputs)
            if digest in self.sizes and digest not in evict:
                unheld.pop(digest, None)  # reading it takes it off the freeable list
                cached.append(index)
                planned.add(digest)
                continue
            fits_budget = need + item.length <= budget
            fits_cache = need + item.length <= free + sum(unheld.values())
            if not (fits_budget and fits_cache):
                tokens = max(0, item.position - computed)  # stop before the input (0: it started already)
                break
            while need + item.length > free:  # evicted for this input: a later input cannot read it
                evicted, size = unheld.popitem(last=False)
                evict.append(evicted)
                free += size
            need += item.length
            compute.append(index)
            planned.add(digest)
        compute = [i for i in compute if inputs[i].position < computed + tokens]
        cached = [i for i in cached if inputs[i].position < computed + tokens]
        return EncoderPlan(tokens, tuple(compute), tuple(cached), sum(inputs[i].length for i in compute), tuple(evict))

    def commit(self, request_id: str, inputs: tuple[EncoderInput, ...], plan: EncoderPlan) -> None:
        """Step 2 above: evict what the plan evicts, hold the cached inputs, allocate the computed ones."""
        for evicted in plan.evict:
            del self.freeable[evicted], self.sizes[evicted], self.users[evicted]
        for index in plan.cached:
            self._hold(request_id, inputs[index].content_hash)
        for index in plan.compute:
            item = inputs[index]
            assert self.num_free >= item.length, f"{item.content_hash} planned without room"
            assert item.content_hash not in self.sizes, f"{item.content_hash} planned for computing but cached"
            self.sizes[item.content_hash] = item.length
            self.users[item.content_hash] = set()
            self._hold(request_id, item.content_hash)

    def release_consumed(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int) -> None:
        """Step 3: let go of every output whose inputs' last positions are all computed (vLLM's
        _free_encoder_inputs). Where this differs from vLLM 0.33.0: vLLM lets go of a content hash at
        the first of a request's inputs with it that is consumed (encoder_cache_manager.py
        free_encoder_input, ``cached[mm_hash].discard(req_id)``), while a later input with the same
        hash still needs it: the spec keeps it held (ENC-003, a policy)."""
        pending = {item.content_hash for item in inputs if item.end > computed}
        for item in inputs:
            if item.end <= computed and item.content_hash not in pending:
                self._let_go(request_id, item.content_hash)

    def release(self, request_id: str, inputs: tuple[EncoderInput, ...]) -> None:
        """A preempted, aborted or finished request holds nothing (vLLM EncoderCacheManager.free)."""
        for item in inputs:
            self._let_go(request_id, item.content_hash)

    def forget(self, request_id: str, digest: str) -> None:
        """Undo the allocation of an output that was never computed (its request was preempted in
        the step that planned it): no other request may find it cached."""
        self._let_go(request_id, digest)
        if not self.users.get(digest, True):
            del self.sizes[digest], self.users[digest]
            self.freeable.pop(digest, None)

    def _hold(self, request_id: str, digest: str) -> None:
        self.freeable.pop(digest, None)
        self.users[digest].add(request_id)

    def _let_go(self, request_id: str, digest: str) -> None:
        holders = self.users.get(digest)
        if holders is None or request_id not in holders:
            return
        holders.discard(request_id)
        if not holders:
            self.freeable[digest] = self.sizes[digest]

    def view(self) -> Mapping[str, EncoderEntry]:
        """The cache as a snapshot shows it (Capability.ENCODER)."""
        return {digest: EncoderEntry(size, frozenset(self.users[digest])) for digest, size in self.sizes.items()}
