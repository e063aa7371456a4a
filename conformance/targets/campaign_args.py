"""The command line every lockstep campaign shares (`lockstep_v1`, `lockstep_async`, ...): how
many traces per path, the seed, where the result JSON and the shrunk traces go."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def campaign_parser(description: str, paths: Sequence[str], *, seed: int, out: str, traces_dir: str,
                    ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--path", choices=(*paths, "all"), default="all")
    parser.add_argument("--traces", type=int, default=1000, help="traces per path")
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--traces-dir", type=Path, default=Path(traces_dir))
    parser.add_argument("--no-shrink", action="store_true")
    return parser


def write_report(report: dict, out: Path, part: str = "paths") -> tuple[int, int]:
    """Write a campaign's result file (versioned JSON) and say how many of its traces agree, over
    ``report[part]`` (paths, or Vidur's spaces); returns (agreeing, total)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    total = sum(p["traces"] for p in report[part].values())
    agree = sum(p["agreeing_traces"] for p in report[part].values())
    print(f"wrote {out}: {agree}/{total} traces agree")
    return agree, total
