"""kvsched adapter for kvstream 0.1.0: a wire host in kvstream's own venv (KVSTREAM_PYTHON, or below)."""

import os
from pathlib import Path

from conformance.wire.client import WireAdapter
from spec.domain import ConfigDomain

HOST = Path(__file__).resolve().parent / "kvstream_host.py"
PYTHON = os.environ.get("KVSTREAM_PYTHON", os.path.expanduser("~/.cache/kvsched/stranger/kvstream/bin/python"))
# No max_model_len, no token budget, FCFS, one sequence per request; "auto" means recompute (n = 1).
DOMAIN = ConfigDomain(length_limit=False, token_budget=False, priority=False, max_n=1, watermark=0.0)


def make(domain: ConfigDomain = DOMAIN) -> WireAdapter:
    adapter = WireAdapter("kvstream", [PYTHON, str(HOST)], profiles=("safety", "liveness"), timeout=30.0)
    adapter.domain = domain
    return adapter


def make_roomy() -> WireAdapter:
    """The same, with a CPU pool that holds the GPU pool: past the swap-out crash (STRANGER.md)."""
    return make(ConfigDomain(length_limit=False, token_budget=False, priority=False, max_n=1, watermark=0.0,
                             requires=("num_cpu_blocks >= num_gpu_blocks",)))
