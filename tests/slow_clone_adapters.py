"""An adapter whose process loads slowly the second time only (files beside the test count the
loads): the first worker's child starts at once, the second worker's child takes
``KVSCHED_TEST_SLOW_START`` seconds, and every later process (the fresh process a shrunk finding
is checked again in, issue 35) starts at once again (tests/test_workers.py). A process that loads
once the test has marked the search over (a ``found`` file beside the mark) starts at once too:
the second worker's child may be ended before it loads, and then the next load is the shrink's
restart, which is not the start being tested."""

from __future__ import annotations

import os
import time
from pathlib import Path

from broken_adapters import fork_without_incref

_MARK = Path(os.environ["KVSCHED_TEST_FIRST_LOAD"])
_SECOND = _MARK.with_name(_MARK.name + ".second")
_FOUND = _MARK.with_name("found")
try:
    _MARK.touch(exist_ok=False)
except FileExistsError:
    try:
        _SECOND.touch(exist_ok=False)
    except FileExistsError:
        pass  # a later process: no delay
    else:
        if not _FOUND.exists():
            time.sleep(float(os.environ.get("KVSCHED_TEST_SLOW_START", "0")))

broken = fork_without_incref
