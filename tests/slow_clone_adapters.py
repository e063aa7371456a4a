"""An adapter whose process loads slowly except the first time (a file beside the test marks the
first load): the first worker's child starts at once, every other worker's child takes
``KVSCHED_TEST_SLOW_START`` seconds (tests/test_workers.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from broken_adapters import fork_without_incref

_MARK = Path(os.environ["KVSCHED_TEST_FIRST_LOAD"])
try:
    _MARK.touch(exist_ok=False)
except FileExistsError:
    time.sleep(float(os.environ.get("KVSCHED_TEST_SLOW_START", "0")))

broken = fork_without_incref
