"""LoRA slots for the SGLang host (issue 32; sgl-project/sglang #25865 and #23141): SGLang's own
admission check and its own adapter-pool bookkeeping, with no model and no adapter weights.

Run inside the ``sglang`` target venv (standard library here; SGLang imported lazily). What runs
unmodified:

* ``Scheduler.can_schedule_lora_req`` (managers/scheduler.py:4416-4443), called unbound on a
  stand-in for the Scheduler that has the three attributes it reads: no drainer
  (``lora_drain_wait_threshold`` 0, scheduler.py:2400-2407), no overlap loading, and the TP
  worker's ``lora_manager``;
* ``LoRAManager.validate_lora_batch`` (lora/lora_manager.py:427-456), which that calls, and
  ``LoRAManager.fetch_new_loras`` (458-478), which ``ForwardBatch.init_new`` calls with the batch's
  set of adapter ids right before the model runs (model_executor/forward_batch_info.py:1286-1294);
  its ``assert len(cur_uids) <= self.max_loras_per_batch`` (lora_manager.py:464) is the crash of
  #23141 and #25865;
* ``LoRAMemoryPool.prepare_lora_batch`` (lora/mem_pool.py:780-862): the slot assignment and the
  LRU eviction (``lora_eviction_policy`` "lru", its default).

Stubbed: the adapters. The manager and the pool are built with ``object.__new__`` and given the
fields their ``__init__`` would set from the model (``lora_manager.py:743-755``: no adapter
registered, none pinned; ``mem_pool.py:197-223``: ``max_loras_per_batch`` empty slots), and the pool's
``load_lora_weight_to_buffer`` (which copies weights into GPU buffers) does nothing.

The spec's adapter ``n > 0`` is SGLang's ``lora_id`` ``"lora-n"``, its base model (0) SGLang's
``None``. SGLang counts the base model as one of ``max_loras_per_batch`` slots (the ``None`` uid
in ``running_loras`` and in the pool, mem_pool.py:820-829), the spec's LORA-001 does not: with base
requests in a batch SGLang takes fewer adapters than the spec allows (stricter, so still safe), and
on a batch of adapters only the two counts are the same.

The step's glue (which ids are in ``running_loras``, when ``can_schedule_lora_req`` is asked, when
an admitted id is added) is replayed in ``sglang_host.py`` from ``_get_new_batch_prefill_raw``
(scheduler.py:4186-4191, 4209-4210, 4276-4277), like the rest of that function.
"""

from __future__ import annotations

from types import SimpleNamespace

# Counterfactuals, for showing that the checks catch the defect when SGLang's fix is taken out
# (never the default): "pre-23179" builds ``running_loras`` from the running batch only, as SGLang
# did before sgl-project/sglang PR #23179 (merged 2026-04-19) added scheduler.py:4190-4191, the code
# that #25865, #25567 and #26029 describe.
COUNTERFACTUALS = ("pre-23179",)


def sglang_lora_id(lora_id: int):
    """The spec's adapter id as SGLang's (``Req.lora_id``): None is the base model."""
    return f"lora-{lora_id}" if lora_id else None


class LoraSlots:
    """SGLang's LoRA admission and adapter pool for one run, with ``max_loras_per_batch`` slots."""

    def __init__(self, max_loras: int, counterfactual: str | None = None) -> None:
        from sglang.srt.lora.eviction_policy import get_eviction_policy
        from sglang.srt.lora.lora_manager import LoRAManager
        from sglang.srt.lora.mem_pool import EMPTY_SLOT, LoRAMemoryPool
        from sglang.srt.managers.scheduler import Scheduler

        if counterfactual not in (None, *COUNTERFACTUALS):
            raise ValueError(f"--lora-counterfactual: one of {', '.join(COUNTERFACTUALS)}, got {counterfactual!r}")
        self.counterfactual = counterfactual
        pool = object.__new__(LoRAMemoryPool)
        pool.max_loras_per_batch = max_loras
        pool.eviction_policy = get_eviction_policy("lru")
        pool.uid_to_buffer_id = {}
        pool.buffer_id_to_uid = [EMPTY_SLOT] * max_loras
        pool.load_lora_weight_to_buffer = lambda *args, **kwargs: None  # the adapter weights: none
        manager = object.__new__(LoRAManager)
        manager.max_loras_per_batch = max_loras
        manager.num_pinned_loras = 0
        manager.lora_refs, manager.loras, manager.configs, manager.lora_modules = {}, {}, {}, []
        manager.embed_tokens_module = manager.lm_head_module = None
        manager.memory_pool = pool
        self.manager, self.pool = manager, pool
        self._scheduler = SimpleNamespace(lora_drainer=None, enable_lora_overlap_loading=False,
                                          tp_worker=SimpleNamespace(model_runner=SimpleNamespace(lora_manager=manager)))
        self._can_schedule = Scheduler.can_schedule_lora_req
        self.overflows: list[dict] = []  # the batches fetch_new_loras refused (step, adapter ids, error)

    def running_loras(self, running_reqs, staged_reqs) -> set:
        """scheduler.py:4186-4191: the ids of the running batch's unfinished requests and of the ones
        already staged in the adder (the chunked request's next chunk)."""
        loras = {req.lora_id for req in running_reqs if not req.finished()}
        if self.counterfactual != "pre-23179":
            loras.update(req.lora_id for req in staged_reqs)
        return loras

    def can_schedule(self, req, running_loras: set) -> bool:
        """scheduler.py:4209: SGLang's own ``can_schedule_lora_req``."""
        return self._can_schedule(self._scheduler, req, running_loras)

    def fetch(self, step: int, reqs) -> None:
        """What ``ForwardBatch.init_new`` does before the model runs (forward_batch_info.py:1294): load
        the batch's adapters into the pool. SGLang's scheduler process dies on the assertion; the host
        records it (`overflows`) and goes on, so that the step reaches the checks (LORA-001)."""
        uids = {req.lora_id for req in reqs}
        try:
            self.manager.fetch_new_loras(uids)
        except (AssertionError, ValueError) as err:
            self.overflows.append({"step": step, "adapters": sorted(uids, key=lambda u: (u is not None, u or "")),
                                   "max_loras_per_batch": self.manager.max_loras_per_batch,
                                   "error": f"{type(err).__name__}: {err}"})

    def resident(self) -> list:
        """The adapters in the pool's slots, by slot (None: the base model; "" an empty slot)."""
        return [uid if isinstance(uid, str) or uid is None else "" for uid in self.pool.buffer_id_to_uid]
