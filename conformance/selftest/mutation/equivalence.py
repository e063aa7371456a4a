"""Mutants of the whole-stack sample read as equivalent: the mutated code behaves as the original
on every input vLLM 0.33.0 can give it, so no judge could kill it.

Each entry is keyed by (file, line, col, operator), holds the start of the source line (checked,
so a descriptor set for another build never inherits a verdict) and a reason a second reader can
check: every caller cited (file:line in the installed package), or the test that shows it. Only
these are left out of the rates, and `summary` counts a mutant any judge kills as not equivalent,
whatever its entry says. The review of all mutants of `descriptors.POPULATION` is in
docs/results/mutation-vllm/equivalence-review.md.
"""

from __future__ import annotations

EQUIVALENT: dict[tuple[str, int, int, str], tuple[str, str]] = {
}
