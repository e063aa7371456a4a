"""How often a vllm-v0 campaign reaches fork, copy-on-write and swap-in (issue 29, item 7).

    nice -n 10 python benchmarks/bench_v0_reach.py [--seeds 20261130 1 3] [--examples 100]

Runs the coverage gate's campaign (`tests/test_targets.py::test_a_small_campaign_reaches_every_path_the_engine_has`:
the target's own strategy in its own process, with its expectations file) once per seed and prints,
per seed, the steps with each event of `conformance.runner.coverage.EVENTS`, the gate's gaps
(`Reach.least_steps` asks for 50 steps of each per 100 examples) and the wall time. Needs
``kvsched targets install vllm-v0``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.flows.profiles import get_profile  # noqa: E402
from conformance.runner.expectations import target_expectations  # noqa: E402
from conformance.runner.fuzz import fuzz  # noqa: E402
from conformance.runner.isolated import ChildRunner, Limits  # noqa: E402
from conformance.selftest.campaigns.coverage_gate import gaps  # noqa: E402
from conformance.targets import get_target  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[20261130, 1, 3])
    ap.add_argument("--examples", type=int, default=100)
    args = ap.parse_args(argv)
    target = get_target("vllm-v0")
    if not target.installed():
        print("vllm-v0 target not installed: run `kvsched targets install vllm-v0`", file=sys.stderr)
        return 2
    for seed in args.seeds:
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as out:
            result = fuzz(ChildRunner("vllm-v0", Limits(timeout=60)), get_profile(target.profiles[0]),
                          max_examples=args.examples, seed_value=seed, out_dir=Path(out), timeout=60,
                          expectations=target_expectations("vllm-v0"))
        events = " ".join(f"{name} {n}" for name, n in sorted(result.coverage.events.items()))
        print(f"seed {seed}: {result.examples} examples, {result.steps_checked} steps; steps with {events}; "
              f"gaps {gaps(result, target.reach) or 'none'}; unexpected {sorted(result.unexpected) or 'none'}; "
              f"{time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
