"""kvsched adapter for tokasaurus 0.0.4: a wire host run in tokasaurus' own venv.

`kvsched conform --adapter docs/examples/tokasaurus/tokasaurus_adapter.py:make`. The venv is
~/.cache/kvsched/stranger/tokasaurus (README.md here says how to build it); KVSCHED_TOKASAURUS_PYTHON
names another interpreter.
"""

from __future__ import annotations

import os
from pathlib import Path

from conformance.wire.client import WireAdapter
from spec.domain import ConfigDomain

HERE = Path(__file__).resolve().parent
VENV_PYTHON = Path.home() / ".cache" / "kvsched" / "stranger" / "tokasaurus" / "bin" / "python"

# No swap, no CPU pool, FCFS only, its own prefix cache always on, chunked prefill always on
# (a prompt past the step's token budget is split), recompute-only preemption ("bumping").
DOMAIN = ConfigDomain(flow="v1", swap=False, cpu_pool=False, priority=False,
                      chunked_prefill=True, unchunked=False, prefill_caps=False, prefix_caching=True, max_n=1)


def python() -> str:
    return os.environ.get("KVSCHED_TOKASAURUS_PYTHON", str(VENV_PYTHON))


def make(precise_onboard: bool = True) -> WireAdapter:
    """tokasaurus with its defaults (precise onboarding on)."""
    adapter = WireAdapter("tokasaurus", [python(), str(HERE / "tokasaurus_host.py")],
                          profiles=("safety",), timeout=30.0,
                          env={"TOKASAURUS_PRECISE_ONBOARD": "1" if precise_onboard else "0"})
    adapter.domain = DOMAIN
    adapter.reset_timeout = 120.0  # the host imports torch and transformers: 20 s on a loaded machine
    return adapter


def make_coarse() -> WireAdapter:
    """tokasaurus with `enable_precise_onboard=False`: admission by its coarse pass only, which
    steps around the precise pass's crash on max_tokens=1 requests so traces run longer."""
    return make(precise_onboard=False)
