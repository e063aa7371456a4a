"""The bug museum: real scheduler bugs from public issues and pull requests, re-created as small
mutants of the reference scheduler, each of which the conformance runner must catch.

`EXHIBITS` lists them (`conformance.selftest.museum.exhibits`); `run_museum` fuzzes every one
(`conformance.selftest.museum.run`); `render_markdown` writes docs/MUSEUM.md (`conformance.selftest.museum.docs`).
"""

from conformance.selftest.museum.exhibits import BY_ID, EXHIBITS, Exhibit, get_exhibit
from conformance.selftest.museum.run import MAX_STEPS, ExhibitResult, all_caught, run_exhibit, run_museum

__all__ = [
    "BY_ID", "EXHIBITS", "MAX_STEPS", "Exhibit", "ExhibitResult", "all_caught", "get_exhibit", "run_exhibit",
    "run_museum",
]
