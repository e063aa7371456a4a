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

_MOD_NONNEGATIVE = ("Python's ``%`` by a positive int is never negative, so ``x % n <= 0`` holds exactly when ``x % n == 0``; "
                    "{n} is a block size, positive wherever it is built ({where})")

EQUIVALENT: dict[tuple[str, int, int, str], tuple[str, str]] = {
    ("vllm/v1/core/block_pool.py", 610, 49, "core/ReplaceComparisonOperator_Eq_LtE"): (
        "assert num_tokens % self.hash_block_size == 0",
        _MOD_NONNEGATIVE.format(n="self.hash_block_size", where="BlockPool.__init__ takes it from the scheduler's "
                                "hash block size, a cache block size (kv_cache_utils.py)")),
    ("vllm/v1/core/kv_cache_coordinator.py", 671, 41, "core/ReplaceComparisonOperator_Eq_LtE"): (
        "block_size % hash_block_size == 0 for block_size in cacheable_block_sizes",
        _MOD_NONNEGATIVE.format(n="hash_block_size", where="the coordinator's hash block size, a cache block size")),
    ("vllm/v1/core/kv_cache_manager.py", 68, 28, "core/ReplaceFalseWithTrue"): (
        "allow_none: Literal[False] = False,",
        "the default of an @typing.overload stub (kv_cache_manager.py:66-72, body `...`): typing.overload replaces the "
        "stub by the implementation defined after it, so the stub's defaults are never evaluated for a call"),
    ("vllm/v1/core/sched/request_queue.py", 181, 41, "core/AddNot"): (
        "requests_to_remove = requests if isinstance(requests, set) else set(requests)",
        "PriorityRequestQueue.remove_requests: its callers pass a set (scheduler.py:2546-2547, stopped_preempted_reqs: "
        "set[Request], 2310), which the mutant copies (same members), or a list (scheduler.py:3010-3011, "
        "waiting_requests_to_remove, 2988), whose membership the mutant tests in the list itself; Request defines no "
        "__eq__ or __hash__ (vllm/v1/request.py: only __lt__, 357), so set and list membership are both identity and "
        "the filtered heap is the same"),
    ("vllm/v1/core/sched/scheduler.py", 1915, 26, "core/ReplaceComparisonOperator_Eq_Is"): (
        "if session.status == RequestStatus.WAITING_FOR_STREAMING_REQ:",
        "RequestStatus is an enum.IntEnum (vllm/v1/request.py:370) and every assignment to a request's status in "
        "vllm/v1 is a member of it (the one assignment from a variable, scheduler.py:3026, takes finish_requests' "
        "finished_status, a member at every caller: engine/core.py:569, 977, 1725, 2209, "
        "fault_tolerance/engine_core_sentinel.py:90, scheduler.py:2565, 2944); enum members are singletons, so `is` "
        "and `==` agree on them"),
}

# Candidates read and found *not* equivalent, with the input that tells them apart (the review's
# record: a second reader sees what was considered, not only what was claimed).
NOT_EQUIVALENT: dict[tuple[str, int, int, str], str] = {
    ("vllm/v1/core/block_pool.py", 114, 31, "core/ReplaceComparisonOperator_Eq_Is"):
        "`is` on block ids: CPython shares int objects only for -5..256, so a pool of more blocks tells them apart",
    ("vllm/v1/core/sched/scheduler.py", 157, 53, "core/ReplaceComparisonOperator_Eq_Is"):
        "`is` on a string read from a config: equal strings need not be one object",
    ("vllm/v1/core/encoder_cache_manager.py", 234, 41, "core/ReplaceComparisonOperator_Eq_LtE"):
        "a weakened assert: equivalent only if cached > requested embeds can never happen, which nothing shows",
    ("vllm/v1/core/kv_cache_manager.py", 145, 30, "core/NumberReplacer"):
        "a constructor default (dcp_world_size) that vLLM's tests rely on: test_kv_cache_utils.py:309 and "
        "test_prefix_caching.py:145 build KVCacheManager without it",
    ("vllm/v1/core/kv_cache_manager.py", 148, 27, "core/NumberReplacer"):
        "a constructor default (watermark) the same tests rely on",
    ("vllm/v1/core/sched/scheduler.py", 296, 36, "core/ReplaceFalseWithTrue"):
        "overwritten only with a speculative config (scheduler.py:331); without one the True reaches "
        "KVCacheManager(use_eagle=...) at 356",
    ("vllm/v1/core/sched/scheduler.py", 345, 40, "core/ReplaceFalseWithTrue"):
        "runs with hash lookahead tokens, where it turns the EAGLE block drop on",
    ("vllm/v1/core/sched/scheduler.py", 425, 34, "core/NumberReplacer"):
        "num_executed_steps is read against last_prefill_step when local_prefill_interval > 1 "
        "(scheduler.py:787): the offset moves the first deferral",
    ("vllm/v1/core/sched/scheduler.py", 741, 28, "core/ReplaceFalseWithTrue"):
        "has_sync_kv_loads reaches the SchedulerOutput (scheduler.py:1744) for every step",
    ("vllm/v1/core/kv_cache_coordinator.py", 500, 37, "core/NumberReplacer"):
        "a constructor default (num_prefill_lookahead) of a coordinator the tests build directly",
}


def equivalence_of(mutant: dict) -> str:
    """The reason ``mutant`` is equivalent (`EQUIVALENT`), or ``""``."""
    known = EQUIVALENT.get((mutant["file"], mutant["line"], mutant["col"], mutant["operator"]))
    if known is None or not mutant.get("source_line", "").startswith(known[0]):
        return ""
    return known[1]


def review(doc: dict) -> str:
    """docs/results/mutation-vllm/equivalence-review.md: every mutant of the population with its
    verdict (equivalent with the reason, or not, with the reason where it was a candidate)."""
    rows = []
    claimed = 0
    for m in doc["mutants"]:
        key = (m["file"], m["line"], m["col"], m["operator"])
        reason = equivalence_of(m)
        claimed += bool(reason)
        verdict = f"**equivalent**: {reason}" if reason else (
            f"not equivalent (a candidate): {NOT_EQUIVALENT[key]}" if key in NOT_EQUIVALENT else "not equivalent")
        rows.append(f"| {m['id']} | `{m['file'].removeprefix('vllm/v1/core/')}:{m['line']}` | "
                    f"{m['operator'].removeprefix('core/')} | {m['area']} | {verdict} |")
    head = [
        "# Equivalence review of the whole-stack mutation population (issue 29)",
        "",
        "Generated by `benchmarks/bench_mutation_vllm.py` from `descriptors.json` and",
        "`conformance/selftest/mutation/equivalence.py`; do not edit by hand.",
        "",
        f"{len(doc['mutants'])} mutants (seed {doc['seed']}), {claimed} read as equivalent. How: every mutant's",
        "line was read in the installed vLLM 0.33.0 with its function; a claim needs a reason a second",
        "reader can check (every caller cited, or a property of the language), and is refuted by any",
        "judge's kill (`summary.py` then counts the mutant). Not claimed, and so counted: mutations of",
        "constructor and keyword defaults (vLLM's tests call these with the defaults), weakened",
        "assertions (an assertion is an internal belief, not a proof that its negation cannot",
        "happen), and identity tests on ints and strings. Rows marked *a candidate* were read as",
        "possibly equivalent and kept, with the input that tells them apart.",
        "",
        "| id | where | operator | area | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    return "\n".join(head + rows) + "\n"
