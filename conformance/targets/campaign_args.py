"""The command line every lockstep campaign shares (`lockstep_v1`, `lockstep_async`, ...): how
many traces per path, the seed, where the result JSON and the shrunk traces go."""

from __future__ import annotations

import argparse
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
