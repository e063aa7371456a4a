"""gpu_impl: the reference scheduler's state machine as batched torch tensors, plus a KV data plane.

- `gpu_impl.batched.BatchedScheduler` — E independent engines in one set of tensors; one
  `schedule()` / `update()` for all of them (CUDA when available, CPU otherwise).
- `gpu_impl.encode.TraceBatch` — E traces encoded as tensors (arrivals, aborts, stops) and a
  runner that drives a `BatchedScheduler` through them.
- `gpu_impl.materialize` — turns one step's tensors into `spec.types.SchedulerOutput` /
  `spec.observation.Snapshot` per engine (for comparison; never on the fast path).
- `gpu_impl.adapter.make(config)` — one engine behind `spec.protocol.SchedulerLike`.
- `gpu_impl.kv.KVPlane` — a paged KV tensor on the device and a CPU swap tensor, moved by
  each step's swap / copy maps and checked after every step.
- `gpu_impl.lockstep` — the differential harness (reference schedulers are passed in).
- `gpu_impl.batched_v1.BatchedV1Scheduler` — vLLM V1's flow (`reference_impl.v1_scheduler`) the
  same way: chunked prefill, one token budget, recompute-only preemption; prefix caching left out.
  `gpu_impl.lockstep_v1` is its harness (trace encoding, materialisation, lockstep),
  `gpu_impl.adapter_v1.make(config)` one engine of it (the ``gpu-v1`` adapter),
  `gpu_impl.workload_v1` seeded pressure traces for it.

Dependency rule: this package imports only `spec` (and torch).
"""

from gpu_impl.batched import BatchedScheduler

__all__ = ["BatchedScheduler"]
