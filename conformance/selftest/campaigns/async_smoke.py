"""Smoke run of the ``vllm-v1-async`` wire host (vLLM 0.33.0's AsyncScheduler, one step late).

    python -m conformance.selftest.campaigns.async_smoke [--traces 5] [--seed 1] [--path plain|chunked|preemption]

The registered target ``vllm-v1-async`` (`conformance.targets`, sharing the ``vllm-v1`` venv,
which already holds the AsyncScheduler). Runs a few seeded traces under the ``safety`` profile and prints, per trace,
the steps run, the violations and any fault: what it shows is that the host speaks the protocol
and that vLLM's engine survives the traces, not that anything is correct.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from conformance.targets import HOSTS_DIR, get_target

ASYNC_HOST = "vllm_v1_async_host.py"


def async_adapter():
    """A started `WireAdapter` on the async host (the ``vllm-v1-async`` target)."""
    return get_target("vllm-v1-async").adapter()


def async_installed() -> bool:
    return get_target("vllm-v1-async").installed() and (HOSTS_DIR / ASYNC_HOST).exists()


def main(argv: list[str] | None = None) -> int:
    from conformance.flows.profiles import get_profile
    from conformance.generation.async_paths import PATHS, path_strategy
    from conformance.generation.v0 import sample_traces
    from conformance.runner.driver import run_checked

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--path", choices=PATHS, default="plain")
    ap.add_argument("--out", type=Path, default=None, help="write the summary as JSON here")
    args = ap.parse_args(argv)
    adapter = async_adapter()
    invariants = get_profile("safety").invariants()
    rows = []
    for i, trace in enumerate(sample_traces(path_strategy(args.path), args.traces, args.seed)):
        result = run_checked(adapter, trace, invariants, timeout=60, stop_at_first=False)
        row = {"trace": i, "steps": len(result.records), "drained": result.drained,
               "violations": sorted({v.invariant_id for v in result.violations}),
               "fault": None if result.fault is None else str(result.fault)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    adapter.close()
    if args.out:
        args.out.write_text(json.dumps({"version": 1, "host": ASYNC_HOST, "path": args.path, "rows": rows}, indent=2)
                            + "\n")
    return 1 if any(r["fault"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
