"""Built-in workloads: the seeds' worked examples and a small tour of every mechanism."""

from __future__ import annotations

from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request


def seed_000_section_3_4() -> Trace:
    """Seed 000 §3.4: 10 GPU blocks of 64 tokens, A = 200 tokens (4 blocks), B = 128 tokens
    (2 blocks), max_num_seqs = 2. The seed starts with blocks 2, 3, 4, 6, 7 taken by other
    work; here that work is request ``X`` (5 blocks), so 5 blocks are free when A and B arrive."""
    config = SchedulerConfig(
        block_size=64, num_gpu_blocks=10, num_cpu_blocks=10, max_num_seqs=2,
        max_num_batched_tokens=2048, max_model_len=2048, watermark=0.0,
    )
    return Trace(
        config,
        (
            Arrival(0, Request("X", prompt_len=5 * 64, max_tokens=3)),
            Arrival(1, Request("A", prompt_len=200, max_tokens=4)),
            Arrival(1, Request("B", prompt_len=128, max_tokens=4)),
        ),
        max_steps=100,
        meta={"name": "seed-000-3.4"},
    )


def seed_003_section_4() -> Trace:
    """Seed 003 §4: three requests ("Hello", "Hi", "Greetings") with token budget 4096 and
    max_num_seqs 32; prompts are 5, 2 and 9 tokens (their characters)."""
    config = SchedulerConfig(
        block_size=16, num_gpu_blocks=64, num_cpu_blocks=64, max_num_seqs=32,
        max_num_batched_tokens=4096, max_model_len=2048, watermark=0.01,
    )
    return Trace(
        config,
        (
            Arrival(0, Request("1", prompt_len=len("Hello"), max_tokens=6)),
            Arrival(0, Request("2", prompt_len=len("Hi"), max_tokens=6)),
            Arrival(0, Request("3", prompt_len=len("Greetings"), max_tokens=6)),
        ),
        max_steps=100,
        meta={"name": "seed-003-4"},
    )


def tour() -> Trace:
    """A small cache under pressure: admission, a fork with copy-on-write, preemption by
    recompute and by swap, a swap-in, an over-long prompt ignored and an abort."""
    config = SchedulerConfig(
        block_size=4, num_gpu_blocks=12, num_cpu_blocks=8, max_num_seqs=4,
        max_num_batched_tokens=48, max_model_len=40, watermark=0.1,
    )
    return Trace(
        config,
        (
            Arrival(0, Request("A", prompt_len=10, max_tokens=10, n=2)),
            Arrival(0, Request("B", prompt_len=7, max_tokens=9)),
            Arrival(1, Request("C", prompt_len=45, max_tokens=3)),
            Arrival(2, Request("D", prompt_len=6, max_tokens=6, n=2)),
            Arrival(3, Request("E", prompt_len=12, max_tokens=8, priority=1)),
        ),
        aborts=((9, "E"),),
        stops=((6, "A#1"),),
        max_steps=200,
        meta={"name": "tour"},
    )


BUILTIN = {
    "tour": tour,
    "seed-000-3.4": seed_000_section_3_4,
    "seed-003-4": seed_003_section_4,
}
