"""Seeded random traces for the V1 twin (plain `random`, no Hypothesis): tight caches and token
budgets so that chunked prefill, the long-prefill threshold, the partial-prefill limit,
preemption of several victims (FCFS and priority, including victims scheduled earlier in the
same step), ignored and rejected prompts, stops and aborts all happen. Prefix caching is off
(the twin leaves it out); ``n`` is 1 (V1 fans ``n`` out before its scheduler).
"""

from __future__ import annotations

import random

from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request, seq_id


def random_v1_trace(rng: random.Random, requests: int = 16, tight_priority: bool = False) -> Trace:
    """One engine's config and trace. ``tight_priority``: chunked prefill engines run the
    priority policy with a token budget of max_num_seqs, where a preempted request often had
    been scheduled earlier in the step and gives its tokens back."""
    chunked = rng.random() < 0.7
    bs = rng.choice([1, 2, 4])
    max_len = rng.choice([16, 24, 32, 48])
    seqs = rng.randint(2, 8)
    budget = max(seqs, rng.choice([seqs, 8, 16, 32])) if chunked else rng.randint(max_len, 2 * max_len)
    policy = rng.choice(["fcfs", "priority"])
    if tight_priority and chunked:
        policy, budget = "priority", seqs
    config = SchedulerConfig(
        block_size=bs, num_gpu_blocks=-(-max_len // bs) + rng.randint(0, 12), num_cpu_blocks=0,
        max_num_seqs=seqs, max_num_batched_tokens=budget, max_model_len=max_len,
        watermark=rng.choice([0.0, 0.0, 0.1]), preemption_mode="recompute", policy=policy,
        enable_chunked_prefill=chunked,
        max_num_partial_prefills=rng.choice([0, 0, 1, 2]) if chunked else 0,
        long_prefill_token_threshold=rng.choice([0, 0, 2, 5]) if chunked else 0,
    )
    arrivals, stops, aborts = [], [], []
    step = 0
    for i in range(requests):
        step += rng.choice([0, 0, 1, 2])
        req = Request(f"r{i}", prompt_len=rng.randint(1, max_len + 2), max_tokens=rng.randint(1, 24),
                      priority=rng.randint(0, 3))
        arrivals.append(Arrival(step, req))
        if rng.random() < 0.2:
            stops.append((step + rng.randint(1, 20), seq_id(req.request_id, 0)))
        if rng.random() < 0.1:
            aborts.append((step + rng.randint(0, 10), req.request_id))
    return Trace(config, tuple(arrivals), tuple(aborts), tuple(sorted(stops)), max_steps=600)
