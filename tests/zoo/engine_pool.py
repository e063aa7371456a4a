"""An engine-sized pool: the engine decides how many GPU blocks it has (from its own memory
formula), whatever the config asks for.

1. Its pool is the config's num_gpu_blocks halved (at least 2): the engine's own formula.
2. It says so: ``engine_config`` is the config as it runs it, with its own num_gpu_blocks, and
   its domain's ``engine_pool=True`` makes the adapter's reset() return it, so the checks read
   the pool the engine has.
"""

from __future__ import annotations

from dataclasses import replace

from reference_impl.scheduler import Scheduler
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from zoo._adapter import zoo_adapter

DOMAIN = ConfigDomain(engine_pool=True)


class EnginePool(Scheduler):
    reported_extra = 0

    def __init__(self, config: SchedulerConfig) -> None:
        own = replace(config, num_gpu_blocks=max(2, config.num_gpu_blocks // 2))
        super().__init__(own)
        self.engine_config = replace(own, num_gpu_blocks=own.num_gpu_blocks + self.reported_extra)


class MisreportsPool(EnginePool):
    reported_extra = 1  # bug: says it has one block more than it does


def traces():
    from conformance.generation.domain import traces_in

    return traces_in(DOMAIN)


def make():
    return zoo_adapter("zoo-engine-pool", EnginePool, domain=DOMAIN)


def make_broken():
    return zoo_adapter("zoo-engine-pool-broken", MisreportsPool, domain=DOMAIN)
