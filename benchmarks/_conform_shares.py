"""Where a conformance worker's CPU time goes on small traces (issue 28, item 3): imports, Hypothesis
trace generation, and running + checking the traces. Run by `bench_scale.py --shares N` in a fresh
process (so that the imports are counted), with the reference adapter in process (the adapter's
own work is the same in a child) and the safety profile, N traces of `kvsched conform`'s default
strategy. Prints one JSON line: CPU seconds (``time.process_time``) per part.

    python benchmarks/_conform_shares.py [N]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

start = time.process_time()
from conformance.commands import cli  # noqa: E402,F401 - what `kvsched conform` imports first
from conformance.flows.profiles import get_profile  # noqa: E402
from conformance.runner.adapter import load_adapter  # noqa: E402
from conformance.runner.fuzz import fuzz  # noqa: E402
from conformance.runner.isolated import LocalRunner  # noqa: E402
from conformance.runner.plan import RunPlan  # noqa: E402

imported = time.process_time() - start


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    runner = LocalRunner(lambda: load_adapter("reference"))
    inside = [0.0]
    run = runner.run

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        t = time.process_time()
        try:
            return run(*args, **kwargs)
        finally:
            inside[0] += time.process_time() - t

    runner.run = timed  # type: ignore[method-assign]
    t = time.process_time()
    with tempfile.TemporaryDirectory() as out:
        result = fuzz(runner, RunPlan(get_profile("safety"), Path(out), max_examples=examples, seed=0))
    searched = time.process_time() - t
    print(json.dumps({"examples": result.examples, "steps": result.steps_checked, "imports": imported,
                      "generation": searched - inside[0], "run_and_check": inside[0]}))


if __name__ == "__main__":
    main()
