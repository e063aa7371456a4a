"""An engine that asserts preconditions between its config fields at start-up (as vLLM asserts
budget >= max_num_seqs, and a small engine "the pool holds max_num_seqs full sequences").

Its domain states them (``requires=...``): the generator raises the left field until each holds
and the shrinker never leaves them, so reset() never refuses a config. The broken twin is the
same engine declaring only the first, whose own traces (drawn from its domain) break the second:
FAULT-config-rejected.
"""

from __future__ import annotations

from reference_impl.scheduler import Scheduler
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from zoo._adapter import zoo_adapter

REQUIRES = ("max_num_batched_tokens >= max_num_seqs * 2",
            "num_gpu_blocks * block_size >= max_num_seqs * max_model_len")
DOMAIN = ConfigDomain(requires=REQUIRES)
UNDECLARED = ConfigDomain(requires=REQUIRES[:1])  # the second precondition left out


class Preconditioned(Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        if config.max_num_batched_tokens < 2 * config.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be at least twice max_num_seqs")
        if config.num_gpu_blocks * config.block_size < config.max_num_seqs * config.max_model_len:
            raise ValueError("the pool must hold max_num_seqs sequences of max_model_len")
        super().__init__(config)


def traces():
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def broken_traces():
    from conformance.generation.domain import traces_in

    return traces_in(UNDECLARED)


def make():
    return zoo_adapter("zoo-preconditions", Preconditioned, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-preconditions-broken", Preconditioned, domain=UNDECLARED)
