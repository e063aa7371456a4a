"""The bug museum: real scheduler bugs from public issues and pull requests, re-created as small
mutants of the reference scheduler, each of which the conformance runner must catch.

`EXHIBITS` lists them (`conformance.museum.exhibits`); `run_museum` fuzzes every one
(`conformance.museum.run`); `render_markdown` writes docs/MUSEUM.md (`conformance.museum.docs`).
"""

from conformance.museum.exhibits import BY_ID, EXHIBITS, Exhibit, get_exhibit
from conformance.museum.run import MAX_STEPS, ExhibitResult, all_caught, run_exhibit, run_museum

__all__ = [
    "BY_ID", "EXHIBITS", "MAX_STEPS", "Exhibit", "ExhibitResult", "all_caught", "get_exhibit", "run_exhibit",
    "run_museum",
]
