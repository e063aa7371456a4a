"""The zoo: small schedulers that are correct but differ from vLLM V0, each behind an adapter.

Safety must hold for every correct scheduler of this kind, whatever its design (DESIGN.md,
"Safety is engine-neutral"). Each zoo member changes one design decision of the reference
(`reference_impl.scheduler`, or `reference_impl.v1_scheduler` for the token-budget one) and must
conform to the ``safety`` and ``liveness`` profiles with no failure; each has a deliberately
broken twin that the runner must catch. tests/test_zoo.py runs them all through the isolated
child (`conformance.runner.isolated.ChildRunner`), the path `kvsched conform` takes.

| module | design | declares |
| --- | --- | --- |
| whole_request | reserves prompt + max_tokens at admission, never preempts | Reservation(whole_request=True) |
| lookahead | takes the next token's block when a token is sampled | Reservation(lookahead_tokens=1) |
| no_cpu_pool | has no swap space at all; preempts by recompute only | an empty CPU pool |
| door_refusal | refuses an unservable request at add_request | |
| no_computed | keeps no computed-token count | no `computed_tokens` capability |
| lazy_free | frees finished requests' blocks at its next schedule() | |
| no_seq_limit | one token budget and no sequence limit (V1 flow) | |
| early_free | frees a sequence's blocks in the schedule() of the step that samples its last token | the `ordered_steps` claim |
| restart_on_preempt | a recompute victim drops its generated tokens and generates them anew | the `output_at_finish` claim |
| deferred_abort | carries an abort out once the request's prefill is done (V1 flow) | |
| no_length_limit | has no max_model_len | ConfigDomain(length_limit=False) |
| always_cached | prefix caching always on, recompute only (V1 flow) | ConfigDomain(uncached=False, preemption_mode="recompute") |
| fused_step | schedules and samples in one call | ConfigDomain(fused_step=True), no `mid_step` |
| count_only | cannot be told a stop token (a simulator) | ConfigDomain(stops=False) |
| engine_pool | sizes its own GPU pool | ConfigDomain(engine_pool=True), `engine_config` |
| preconditions | asserts preconditions between config fields | ConfigDomain(requires=...) |
| null_block | block ids 1..N, 0 a null block | ConfigDomain(first_block_id=1) |
| cache_holds | a prefix cache that holds a reference on each cached block (V1 flow) | ConfigDomain(cache_holds_refs=True), `Snapshot.gpu_cache_holds` |
| swap_round_trip | swaps a victim back in within the schedule() that swapped it out (smol-vllm, kvstream) | |
| errors_correctly | ends a request it can never serve with an engine_error, not an ignore | |

A member whose domain is declared (the rows above with a ConfigDomain) draws its traces from it
(`conformance.generation.domain.traces_in`), as `kvsched conform` does for such an adapter.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Member:
    module: str  # tests/zoo/<module>.py, with make() and make_broken()
    design: str
    broken: str  # what the broken twin gets wrong
    caught_by: tuple[str, ...]  # the invariants that catch the twin (any one of them will do)
    traces: Callable[[], Any]  # the trace strategy the member accepts
    broken_traces: Callable[[], Any] | None = None  # the twin's, where it declares another domain

    @property
    def spec(self) -> str:
        return f"zoo.{self.module}:make"

    @property
    def broken_spec(self) -> str:
        return f"zoo.{self.module}:make_broken"


def _default() -> Any:
    from conformance.generation.v0 import traces

    return traces()


def _deferred_abort() -> Any:
    from zoo.deferred_abort import traces

    return traces()


def _token_budget_only() -> Any:
    from zoo.no_seq_limit import traces

    return traces()


def _own(module: str, name: str = "traces") -> Callable[[], Any]:
    """The member's own strategy: tests/zoo/<module>.py's ``traces()`` (its domain's)."""
    def strategy() -> Any:
        import importlib

        return getattr(importlib.import_module(f"zoo.{module}"), name)()

    return strategy


ZOO: tuple[Member, ...] = (
    Member("whole_request", "reserve prompt + max_tokens at admission and never preempt",
           "reserves one block too few and writes past its table", ("CAP-005", "RES-001"), _default),
    Member("lookahead", "reserve the next token's block when a token is sampled",
           "reserves further ahead than it declares", ("CAP-006",), _default),
    Member("no_cpu_pool", "no CPU pool: never swaps",
           "delivers a stop token to the next request in the batch", ("REQ-005",), _default),
    Member("door_refusal", "refuse an unservable request at add_request",
           "reports the refusal but keeps the request queued", ("REQ-002", "QUE-001", "REQ-001"), _default),
    Member("no_computed", "no computed-token tracking",
           "admits a prompt with one block too few", ("ADM-003", "RES-001"), _default),
    Member("lazy_free", "free finished requests lazily at the next schedule()",
           "frees them one schedule() later still", ("RES-005",), _default),
    Member("no_seq_limit", "a token budget with no sequence limit",
           "schedules one token past the budget", ("BUD-001",), _token_budget_only),
    Member("early_free", "free the blocks of a sequence's last step when it is scheduled (ordered steps)",
           "frees them one step early and runs the sequence with an empty table", ("RES-001", "CAP-005"), _default),
    Member("restart_on_preempt", "restart a recompute victim's completion (output only at the finish)",
           "drops a prompt token too", ("REQ-004", "CHK-003"), _default),
    Member("deferred_abort", "carry an abort out once the request's prefill is done (live until then)",
           "reports the abort at once while the request keeps running", ("REQ-002", "QUE-001", "RES-005"), _deferred_abort),
    Member("no_length_limit", "no max_model_len at all",
           "caps a request one token short of max_tokens", ("LEN-004",), _own("no_length_limit")),
    Member("always_cached", "prefix caching always on, recompute only",
           "delivers a stop token to the next request in the batch", ("REQ-005",), _own("always_cached")),
    Member("fused_step", "schedule and sample in one call",
           "delivers a stop token to the next request in the batch", ("REQ-005",), _own("fused_step", "traces_of")),
    Member("count_only", "no stop tokens: every request ends by its length",
           "ends a request as stopped on its own", ("REQ-005",), _own("count_only")),
    Member("engine_pool", "an engine-sized GPU pool",
           "reports one block more than its pool has", ("BLK-001",), _own("engine_pool")),
    Member("preconditions", "preconditions between config fields, asserted at start-up",
           "declares one precondition of two", ("FAULT-config-rejected",), _own("preconditions"),
           _own("preconditions", "broken_traces")),
    Member("null_block", "block ids 1..N with 0 a null block",
           "shifts its tables but not its free lists", ("BLK-005", "STR-001"), _own("null_block", "traces_of")),
    Member("cache_holds", "a prefix cache that holds a reference on each cached block",
           "leaves the cache's reference on a shared block unlisted", ("BLK-003",), _own("cache_holds")),
    Member("swap_round_trip", "swap a victim back in within the schedule() that swapped it out",
           "drops the swap-in map of the round trip", ("SWP-002", "SWP-003"), _default),
    Member("errors_correctly", "end an unservable request with an engine_error reason",
           "ends a preemption victim (which fits) with an engine_error", ("LIV-004",), _default),
)
