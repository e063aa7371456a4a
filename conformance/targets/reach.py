"""What a target's engine can do, declared as data beside its strategy: the lifecycle edges it
takes and the invariants it never gives anything to check (with the reason). The coverage gate
(`conformance.selftest.campaigns.coverage_gate`) holds a campaign on the target to all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

CORE_EDGES = (
    "WAITING->RUNNING (admit)", "WAITING->FINISHED_IGNORED (ignore)", "WAITING->FINISHED_ABORTED (abort)",
    "RUNNING->RUNNING (decode)", "RUNNING->WAITING (preempt_recompute)", "RUNNING->SWAPPED (swap_out)",
    "RUNNING->FINISHED_STOPPED (finish_stop)", "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)",
    "RUNNING->FINISHED_ABORTED (abort)", "RUNNING->FINISHED_IGNORED (preempt_then_ignore)",
    "SWAPPED->RUNNING (swap_in)", "SWAPPED->FINISHED_IGNORED (ignore)", "SWAPPED->FINISHED_ABORTED (abort)",
)  # the lifecycle without a KV connector, grammar waits or sessions (what V0 and the other engines hosted take)
ALL_EDGES = CORE_EDGES + (
    # a KV connector's (spec.lifecycle.CONNECTOR_EDGES)
    "WAITING->WAITING_FOR_REMOTE_KV (load_async)", "WAITING_FOR_REMOTE_KV->RUNNING (admit_loaded)",
    "WAITING_FOR_REMOTE_KV->WAITING (load_failed_recompute)", "WAITING_FOR_REMOTE_KV->FINISHED_ERROR (load_failed)",
    "WAITING_FOR_REMOTE_KV->FINISHED_ABORTED (abort)", "RUNNING->FINISHED_ERROR (load_failed)",
    # structured output's (spec.lifecycle.GRAMMAR_EDGES)
    "WAITING->WAITING_FOR_GRAMMAR (await_grammar)", "WAITING_FOR_GRAMMAR->WAITING (grammar_ready)",
    "WAITING_FOR_GRAMMAR->FINISHED_ABORTED (abort)",
    # streaming sessions' (spec.lifecycle.SESSION_EDGES)
    "RUNNING->WAITING_FOR_INPUT (await_input)", "RUNNING->WAITING (take_input)",
    "WAITING_FOR_INPUT->WAITING (input_arrived)", "WAITING_FOR_INPUT->FINISHED_ABORTED (abort)",
)  # spec.lifecycle.EDGES as the report prints them (tests/test_targets.py holds the two equal)

# Invariants no engine without a swap space, or without n > 1, has anything for.
NO_SWAP = {i: "no swap space: nothing is swapped out or in"
           for i in ("BLK-002", "BLK-004", "RES-002", "SWP-001", "SWP-002", "SWP-003", "POL-002")}
ONE_SEQUENCE = {i: "one sequence per request: no fork, so no shared block to copy" for i in ("COW-001", "COW-002")}
# What no campaign of a conforming engine of these kinds gives anything to check (each invariant's
# trigger, `spec.rules`, says when it has something to check; the coverage gate asks for it).
ANY_ENGINE = {
    "PIP-005": "a failure rule: it has something to check only when a scheduler call fails, which a conforming "
               "engine's campaign never meets",
}
EAGER_FREE = {"RES-005": "frees a finished request's blocks in the step that finishes it, so no finished sequence "
                         "holds blocks when a step begins"}
NO_DRAFTS = {f"SPD-00{n}": "no speculative decoding: the engine, as hosted, schedules no draft tokens"
             for n in range(1, 10)}
# The campaigns' configs never set a prefill cap (CHK-005's long_prefill_token_threshold) or a limit
# on requests mid-prefill (CHK-006's max_num_partial_prefills): the rules' triggers never hold there.
NO_PREFILL_CAP = {"CHK-005": "the campaign's configs set no long_prefill_token_threshold"}
NO_PARTIAL_LIMIT = {"CHK-006": "the campaign's configs set no max_num_partial_prefills (vLLM has no such limit)"}
NO_ABORTS = {"REQ-007": "no abort API in the host: nothing finishes aborted, so no end is unasked"}
NO_RESET = {i: "the campaign's traces call no reset_prefix_cache" for i in ("PFX-006", "PFX-007")}


@dataclass(frozen=True)
class Reach:
    """What a target's engine can do, so what its campaign must reach."""

    edges: tuple[str, ...]  # the lifecycle edges the engine takes, from ALL_EDGES
    unexercised: Mapping[str, str] = field(default_factory=dict)  # invariant id -> why the engine never exercises it
    # event (conformance.runner.coverage.EVENTS) -> the fewest steps with it per 100 examples: a path
    # reached twice in a campaign is reached, and checked almost never (issue 29, item 7)
    least_steps: Mapping[str, int] = field(default_factory=dict)

    def without(self, *reasons: Mapping[str, str]) -> Reach:
        """The same reach, with more invariants its engine never gives anything to check."""
        merged = dict(self.unexercised)
        for more in reasons:
            merged.update(more)
        return Reach(self.edges, merged, self.least_steps)

    def __post_init__(self) -> None:
        unknown = [e for e in self.edges if e not in ALL_EDGES]
        assert not unknown, f"unknown lifecycle edges {unknown} (known: {', '.join(ALL_EDGES)})"
        known_events = ("fork", "copy_on_write", "swap_in")  # conformance.runner.coverage.EVENTS (targets < runner)
        odd = [e for e in self.least_steps if e not in known_events]
        assert not odd, f"unknown events {odd} (known: {', '.join(known_events)})"


def edge_name(edge: tuple[str, str, str]) -> str:
    src, dst, action = edge
    return f"{src}->{dst} ({action})"
