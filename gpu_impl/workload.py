"""Seeded random traces for benchmarks and mutant tests (plain `random`, no Hypothesis).

Each engine gets its own config (block sizes 8/16, 24-64 GPU blocks, a CPU swap space that is
sometimes too small, 4-8 sequences, all three preemption modes, both policies) and ``requests``
requests arriving over a few dozen steps, some with ``n = 2``, some with stops and aborts: enough
pressure that admission limits, preemption (both modes, with fallback), swap-in and
copy-on-write all happen.
"""

from __future__ import annotations

import random

from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request, seq_id


def random_trace(rng: random.Random, requests: int = 16, small: bool = False) -> Trace:
    bs = rng.choice([8, 16]) if not small else rng.choice([2, 4])
    config = SchedulerConfig(
        block_size=bs,
        num_gpu_blocks=rng.randint(24, 64) if not small else rng.randint(6, 16),
        num_cpu_blocks=rng.randint(4, 48) if not small else rng.randint(0, 12),
        max_num_seqs=rng.randint(4, 8),
        max_num_batched_tokens=rng.choice([256, 384, 512]) if not small else rng.choice([32, 48, 64]),
        max_model_len=rng.choice([128, 192, 256]) if not small else rng.choice([24, 32, 48]),
        watermark=rng.choice([0.0, 0.01, 0.05]),
        preemption_mode=rng.choice(["auto", "recompute", "swap"]),
        policy=rng.choice(["fcfs", "priority"]),
    )
    arrivals, stops, aborts = [], [], []
    step = 0
    top = config.prompt_limit + 4
    for i in range(requests):
        step += rng.choice([0, 1, 2, 3])
        n = rng.choice([1, 1, 1, 2])
        req = Request(f"r{i}", prompt_len=rng.randint(1, min(120, top)), max_tokens=rng.randint(2, 40), n=n,
                      priority=rng.randint(0, 2))
        arrivals.append(Arrival(step, req))
        for j in range(n):
            if rng.random() < 0.2:
                stops.append((step + rng.randint(1, 30), seq_id(req.request_id, j)))
        if rng.random() < 0.05:
            aborts.append((step + rng.randint(0, 20), req.request_id))
    return Trace(config, tuple(arrivals), tuple(sorted(aborts)), tuple(sorted(stops)), max_steps=2000)
