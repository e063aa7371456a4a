"""The exhibits: real scheduler bugs from public issues and pull requests, each re-created as the
smallest change to the reference scheduler that shows the same class of bug.

An exhibit names its public source (repository, issue or PR, URL; the facts about each source
are in ``sources.json`` beside this module, collected from the threads themselves), the symptom
users saw, the bug class, the invariant(s) that must catch it, and the mutant: a factory from a
config to a broken scheduler. The museum runner (`conformance.selftest.museum.run`) fuzzes every exhibit
with the conformance runner and checks that an expected invariant catches it with a short trace.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from conformance.generation.specdec import specdec_traces, specdec_traces_with_empty
from conformance.generation.v0 import configs, traces
from conformance.selftest import mutants as lib
from conformance.selftest import mutants_async as async_mutants
from conformance.selftest import mutants_budgets as budget_mutants
from conformance.selftest import mutants_connector as connector_mutants
from conformance.selftest import mutants_hybrid as hybrid_mutants
from conformance.selftest import mutants_specdec as specdec_mutants
from conformance.selftest.museum import mutants as new
from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.hybrid_scheduler import HybridV1Scheduler
from reference_impl.kv_connector_scheduler import ConnectorScheduler
from reference_impl.scheduler import Scheduler
from reference_impl.specdec_scheduler import SpecDecScheduler
from reference_impl.v1_scheduler import V1Scheduler
from spec.config import SchedulerConfig
from spec.reservation import Reservation
from spec.trace import Trace

SOURCES_FILE = Path(__file__).with_name("sources.json")


@cache
def sources() -> dict[str, dict[str, Any]]:
    """The research notes on every public bug considered for the museum, by source id."""
    return {entry["id"]: entry for entry in json.loads(SOURCES_FILE.read_text())}


def _swap_traces() -> st.SearchStrategy:
    """Traces under preemption by swap: swapped requests, swap-ins and aborts of swapped requests."""
    return configs(modes=("swap",)).flatmap(lambda config: traces(config=config))


def _swap_watermark_traces() -> st.SearchStrategy:
    """Swap traces with a watermark of at least a quarter of the GPU blocks (vLLM's default is 1 %;
    a larger one makes a watermark breach visible in caches of a few blocks)."""
    return (
        configs(modes=("swap",))
        .map(lambda c: SchedulerConfig(**{**c.to_dict(), "watermark": max(c.watermark, 0.25)}))
        .flatmap(lambda config: traces(config=config))
    )


def _recompute_traces() -> st.SearchStrategy:
    """Traces under preemption by recompute, with parallel sampling (n > 1 groups preempted whole)."""
    return configs(modes=("recompute",)).flatmap(lambda config: traces(config=config))


def _fcfs_recompute_traces() -> st.SearchStrategy:
    """FCFS, preemption by recompute: victims wait between steps before they are re-admitted."""
    return configs(policies=("fcfs",), modes=("recompute",)).flatmap(lambda config: traces(config=config))


def _priority_recompute_traces() -> st.SearchStrategy:
    """Priority policy, preemption by recompute, single-sequence requests: an urgent late arrival
    preempts several running requests in one step."""
    return configs(policies=("priority",), modes=("recompute",)).flatmap(
        lambda config: traces(config=config, max_n=1, allow_aborts=False)
    )


@st.composite
def _swap_abort_traces(draw: st.DrawFn) -> Trace:
    """Swap traces where requests are often aborted a few steps after they arrive (so some are
    aborted while swapped out)."""
    trace = draw(configs(modes=("swap",)).flatmap(lambda config: traces(config=config, allow_aborts=False)))
    aborts = tuple(sorted(
        (a.step + draw(st.integers(1, 6)), a.request.request_id) for a in trace.arrivals if draw(st.booleans())
    ))
    return Trace(trace.config, trace.arrivals, aborts, trace.stops, trace.max_steps, trace.meta)


@dataclass(frozen=True)
class Exhibit:
    id: str
    title: str
    source_id: str  # key into sources.json
    bug_class: str  # the class of bug, in one sentence, as the reference shows it
    expected: tuple[str, ...]  # invariant IDs (or FAULT-<kind>) any of which counts as caught
    profile: str  # conformance profile the runner uses: safety, liveness or vllm-v0
    factory: Callable[[SchedulerConfig], Scheduler]
    minimal_change: str  # the change to the reference, in words
    code: tuple[Any, ...]  # the classes/functions holding the changed line(s), marked "# bug:"
    mutant: str  # the mutant's name (from conformance.selftest.mutants when reused)
    reused: bool = False  # the mutant comes from conformance.selftest.mutants
    note: str = ""  # what differs from the original bug (transfers between engines, caveats)
    strategy: Callable[[], st.SearchStrategy] | None = field(default=None, compare=False)
    # Another flow's exhibit: the unbroken scheduler it is compared with (None: the V0 reference)
    # and what that scheduler reserves past a sequence's last token (CAP-006).
    reference: Callable[[SchedulerConfig], Any] | None = field(default=None, compare=False)
    reservation: Any = None

    @property
    def source(self) -> dict[str, Any]:
        return sources()[self.source_id]

    @property
    def url(self) -> str:
        return self.source["url"]

    @property
    def repo(self) -> str:
        return self.source["repo"]

    @property
    def kind(self) -> str:
        return self.source["kind"]

    @property
    def number(self) -> int:
        return int(self.source["number"])

    @property
    def symptom(self) -> str:
        return self.source["symptom"]

    @property
    def source_label(self) -> str:
        return f"{self.repo} {'PR' if self.kind == 'pr' else 'issue'} #{self.number}"


def _async_traces(path: str) -> Callable[[], st.SearchStrategy]:
    """The async flow's traces on one path of `conformance.selftest.campaigns.lockstep_async` (depth 1)."""

    def strategy() -> st.SearchStrategy:
        from conformance.generation.async_paths import path_strategy

        return path_strategy(path)

    return strategy


def _reused(name: str) -> Callable[[SchedulerConfig], Scheduler]:
    return lib.MUTANTS[name].factory


EXHIBITS: tuple[Exhibit, ...] = (
    Exhibit(
        id="fork-double-free",
        title="Double free with parallel sampling",
        source_id="fork-cow-double-free",
        bug_class="A block's reference count differs from the number of sequences holding it after a fork, "
        "so freeing the siblings frees it twice.",
        expected=("BLK-003",),
        profile="safety",
        factory=_reused("fork-without-incref"),
        mutant="fork-without-incref",
        reused=True,
        code=(lib._ForkWithoutIncref.fork,),
        minimal_change="BlockManager.fork copies the parent's block table to the child without raising the "
        "reference counts of the shared blocks.",
        note="vLLM's bookkeeping went wrong on a table listing a block twice and in copy-on-write; the reference "
        "has no sliding window, so the same mismatch (reference count != holders) is re-created at the fork.",
    ),
    Exhibit(
        id="best-of-seats",
        title="best_of > 1 admitted past max_num_seqs",
        source_id="best-of-over-max-num-seqs",
        bug_class="Admission counts a waiting parallel-sampling group as one seat although it will run n sequences.",
        expected=("BUD-003", "STR-002"),
        profile="vllm-v0",
        factory=_reused("best-of-one-seat"),
        mutant="best-of-one-seat",
        reused=True,
        code=(lib._OneSeatPerGroup.max_running_seqs,),
        minimal_change="SequenceGroup.max_running_seqs returns 1 for a group with n > 1 until it forks.",
    ),
    Exhibit(
        id="admission-ignores-running",
        title="Admission counts only this step's seats",
        source_id="admit-ignores-running-count",
        bug_class="The seat check for new prefills counts only requests admitted in this step, not those "
        "already running, so the running set grows past max_num_seqs.",
        expected=("BUD-003", "STR-002", "BUD-002"),
        profile="vllm-v0",
        factory=new.AdmissionCountsOnlyThisStep,
        mutant="admission-counts-only-this-step",
        code=(new.AdmissionCountsOnlyThisStep._schedule_prefills,),
        minimal_change="_schedule_prefills starts from budget.seqs = 0 instead of the seats of the running groups.",
        note="The nano-vllm PR was closed (resubmitted as #271); vllm-ascend PR #822 reports the same symptom.",
    ),
    Exhibit(
        id="swap-in-undercount",
        title="Swap-in admitted by a check that undercounts the allocation",
        source_id="swap-in-undercount",
        bug_class="can_swap_in counts only the group's full blocks; swap_in and the append that follows take "
        "the partial last block and a new slot as well, so the swap-in eats into the watermark (or runs the "
        "free list dry).",
        expected=("ADM-002",),
        profile="vllm-v0",
        factory=new.SwapInUndercount,
        mutant="swap-in-counts-full-blocks",
        code=(new.SwapInCountsFullBlocks.blocks_to_swap_in,),
        minimal_change="BlockManager.blocks_to_swap_in returns the number of distinct full CPU blocks, instead of "
        "every distinct CPU block plus one slot per sequence.",
        note="With a watermark, ADM-002 sees the swap-in leave fewer than the watermark free before anything "
        "crashes; with no watermark the same bug ends in an allocation from an empty free list (FAULT-raised).",
        strategy=_swap_watermark_traces,
    ),
    Exhibit(
        id="never-fits-hang",
        title="A prompt that fits max_model_len but never fits the KV cache hangs the queue",
        source_id="never-fits-hang",
        bug_class="can_allocate answers LATER instead of NEVER for a prompt larger than the whole cache above "
        "the watermark, so it waits at the head of waiting forever and blocks everything behind it.",
        expected=("LIV-003", "LIV-001", "LIV-002"),
        profile="liveness",
        factory=_reused("never-fits-waits-forever"),
        mutant="never-fits-waits-forever",
        reused=True,
        code=(lib._NeverFitsWaits.__init__,),
        minimal_change="can_allocate's NEVER answer is turned into LATER.",
    ),
    Exhibit(
        id="swap-space-exhausted",
        title="Swap preemption without CPU space aborts the engine",
        source_id="swap-space-exhausted-abort",
        bug_class="A victim that must be swapped (a multi-sequence group) is swapped out with no check of the "
        "free CPU blocks and no fallback to recompute.",
        expected=("FAULT-raised",),
        profile="safety",
        factory=new.SwapWithoutCpuSpace,
        mutant="swap-out-without-check",
        code=(new.SwapOutWithoutCheck.can_swap_out,),
        minimal_change="BlockManager.can_swap_out always answers True, so _preempt never falls back to recompute.",
        note="Caught as an adapter fault (the CPU allocator raises on an empty free list in the step that "
        "swaps out), which is what vLLM users saw: 'Aborted due to the lack of CPU swap space'. No invariant "
        "can catch it earlier: the state is sound until the swap-out that cannot succeed.",
        strategy=_swap_traces,
    ),
    Exhibit(
        id="recompute-loses-output",
        title="Preemption by recompute loses the generated tokens",
        source_id="recompute-keeps-output-state",
        bug_class="Recompute resets the computed count but not the prompt/output split correctly: the tokens "
        "generated before the preemption are dropped instead of being recomputed as part of the prompt.",
        expected=("REQ-004",),
        profile="safety",
        factory=_reused("recompute-drops-tokens"),
        mutant="recompute-drops-tokens",
        reused=True,
        code=(lib._RecomputeDropsTokens._preempt_by_recompute,),
        minimal_change="_preempt_by_recompute sets each sequence's token count back to its prompt length.",
        note="PR #5349 was closed; issue #16832 reports the same symptom ('the preempted output is incomplete').",
    ),
    Exhibit(
        id="preempted-left-in-running",
        title="A preempted request left in running",
        source_id="preempted-left-in-running",
        bug_class="A recompute victim is queued in waiting but stays in the running queue as well, holding no "
        "blocks; the scheduler later stops on it every step.",
        expected=("QUE-001",),
        profile="safety",
        factory=_reused("victim-stays-in-running"),
        mutant="victim-stays-in-running",
        reused=True,
        code=(lib._VictimStaysInRunning._preempt,),
        minimal_change="_preempt appends a recompute victim back onto running after queueing it in waiting.",
    ),
    Exhibit(
        id="abort-swapped-leak",
        title="Aborting a swapped request leaks its CPU blocks",
        source_id="abort-swapped-leak",
        bug_class="The abort path assumes a request that is not running owns no KV memory, so a swapped-out "
        "request is finished with its CPU blocks still held.",
        expected=("RES-005",),
        profile="safety",
        factory=new.AbortSwappedKeepsBlocks,
        mutant="abort-swapped-keeps-blocks",
        code=(new.AbortSwappedKeepsBlocks.abort_request,),
        minimal_change="abort_request for a swapped group sets its status to FINISHED_ABORTED without "
        "_finish(), which would free its sequences' blocks.",
        note="SGLang's retracted requests keep their KV on the CPU, V0's swapped state.",
        strategy=_swap_abort_traces,
    ),
    Exhibit(
        id="decode-over-token-budget",
        title="Token budget exceeded when prefills and decodes share a step",
        source_id="decode-over-token-budget",
        bug_class="Decodes are charged to the step's token budget without a can_schedule check, so a step that "
        "also runs prefills schedules more tokens than max_num_batched_tokens.",
        expected=("BUD-001",),
        profile="safety",
        factory=new.DecodesJoinPrefillSteps,
        mutant="decodes-join-prefill-steps",
        code=(new.DecodesJoinPrefillSteps._schedule_prefills,),
        minimal_change="After the prefills, _schedule_running also runs in the same step on the groups that were "
        "already running; it adds their decode tokens to the budget without checking it.",
        note="The original is in V0's chunked-prefill scheduler, which the reference does not have yet; the class "
        "(decodes mixed with prefill work, charged without a budget check) is re-created in the V0 default flow. "
        "PR #7391 was closed unmerged; the assertion it hits is real V0 code.",
    ),
    Exhibit(
        id="prefill-before-swapped",
        title="New prefills admitted while requests are swapped",
        source_id="prefill-before-swapped",
        bug_class="Admission order running > swapped > waiting is not enforced: new prompts are admitted while "
        "swapped requests wait, so swapped requests starve and the swap space fills up.",
        expected=("POL-002",),
        profile="vllm-v0",
        factory=_reused("prefill-while-swapped"),
        mutant="prefill-while-swapped",
        reused=True,
        code=(lib._PrefillWhileSwapped.schedule,),
        minimal_change="schedule() runs _schedule_prefills first, as if nothing were swapped.",
        strategy=_swap_traces,
    ),
    Exhibit(
        id="recompute-keeps-computed",
        title="Preemption that does not reset the derived counters",
        source_id="stale-cached-count-after-preempt",
        bug_class="After a preemption by recompute, a derived counter (tokens already computed) keeps its "
        "pre-preemption value, so the re-admitted prefill schedules a token range that does not match its "
        "block table.",
        expected=("CAP-003", "BUD-004"),
        profile="safety",
        factory=_reused("recompute-keeps-computed"),
        mutant="recompute-keeps-computed",
        reused=True,
        code=(lib._RecomputeKeepsComputed._preempt_by_recompute,),
        strategy=_fcfs_recompute_traces,
        minimal_change="_preempt_by_recompute frees the blocks but leaves num_computed at a stale non-zero value.",
        note="nano-vllm's stale counter is num_cached_tokens, read before allocate() changes it; the reference has "
        "no prefix cache, so the stale derived counter is the computed-token count itself.",
    ),
    Exhibit(
        id="partial-allocation-no-rollback",
        title="A failed admission that does not roll back what it took",
        source_id="partial-alloc-no-rollback",
        bug_class="Allocation of a prompt's blocks is not atomic: when the free blocks run out part-way, the "
        "blocks already taken stay with a request that keeps waiting.",
        expected=("ADM-003", "RES-003"),
        profile="safety",
        factory=_reused("partial-allocation"),
        mutant="partial-allocation",
        reused=True,
        code=(lib._PartialAllocation.can_allocate,),
        minimal_change="When can_allocate answers LATER, it first takes the blocks that are free into the "
        "waiting sequence's table and keeps them.",
        note="The vLLM PR was closed; the same class was fixed in kvcached (issue #364, PR #430).",
    ),
    Exhibit(
        id="block-freed-while-referenced",
        title="A block freed while still referenced",
        source_id="cache-ref-on-wrong-block",
        bug_class="Reference-count bookkeeping lands on the wrong block: a block a live table still names "
        "reaches zero and returns to the free list, while another keeps a reference nobody holds.",
        expected=("BLK-005", "BLK-003", "STR-001"),
        profile="safety",
        factory=new.CowWrongReference,
        mutant="cow-drops-wrong-reference",
        code=(new.CowDropsWrongReference.append_slot,),
        minimal_change="In append_slot's copy-on-write branch, the reference is dropped from the writer's new "
        "private block instead of from the shared block it leaves.",
        note="atlas takes a prefix-cache reference on the wrong block; the reference has no prefix cache, so the "
        "wrong-block decrement is re-created in copy-on-write, the other place blocks change hands.",
    ),
    Exhibit(
        id="requeue-reversed",
        title="Requests put back at the head of waiting in reversed order",
        source_id="fcfs-skipped-reorder",
        bug_class="Requests taken out of the schedule in one step go back to the head of waiting in the order "
        "they were taken, which reverses them: the queue's arrival order inverts.",
        expected=("POL-006", "POL-004"),
        profile="vllm-v0",
        factory=new.VictimsRequeuedReversed,
        mutant="victims-requeued-reversed",
        code=(new.VictimsRequeuedReversed._preempt_by_recompute,),
        minimal_change="_preempt_by_recompute inserts each victim after the victims already put back in this "
        "step (at the head of waiting) instead of at its place in policy order (_enqueue).",
        note="vLLM V1 re-queued skipped waiting requests with extendleft (which reverses); in V0 the requests "
        "put back at the head in one step are the recompute victims, taken least urgent first. Under FCFS "
        "two victims in one step are rare, so the exhibit is fuzzed under the priority policy, where an urgent "
        "arrival preempts several running requests at once.",
        strategy=_priority_recompute_traces,
    ),
    Exhibit(
        id="last-group-stalls",
        title="The last running sequence cannot get a block and the step schedules nothing",
        source_id="sole-seq-cannot-append-crash",
        bug_class="When the only (or last) running group cannot append and there is no other victim, it is "
        "neither preempted nor scheduled: the step makes no progress, and neither does the next.",
        expected=("LIV-001",),
        profile="liveness",
        factory=new.LastGroupNeitherRunNorPreempted,
        mutant="last-group-neither-run-nor-preempted",
        code=(new.LastGroupNeitherRunNorPreempted._schedule_running,),
        minimal_change="In _schedule_running, when no other victim is left, break out instead of preempting the "
        "group itself.",
        note="nano-vllm asserts that a step schedules something and crashes; without the assertion the step is "
        "empty forever, which LIV-001 reports.",
    ),
    Exhibit(
        id="double-release",
        title="A finished request's block released on two paths",
        source_id="double-release-two-paths",
        bug_class="Two release paths each free the last block of a finished sequence, so its count goes below "
        "zero or a block still shared by a sibling is freed.",
        expected=("STR-001", "BLK-001", "BLK-003", "BLK-005"),
        profile="safety",
        factory=new.FinishReleasesLastBlockTwice,
        mutant="finish-releases-last-block-twice",
        code=(new.FinishReleasesLastBlockTwice._check_stop,),
        minimal_change="After a stopped sequence's table is freed, its last block is released once more.",
    ),
    Exhibit(
        id="token-after-pause",
        title="A token appended to a request already preempted",
        source_id="pause-token-count-drift",
        bug_class="Preemption snapshots the token history, but the step's sampled token is still appended to "
        "the victim afterwards, so the resumed request's counts disagree with its tokens.",
        expected=("REQ-004",),
        profile="safety",
        factory=new.TokenAppendedAfterPause,
        mutant="token-appended-after-pause",
        code=(new.TokenAppendedAfterPause.update,),
        minimal_change="update() appends a token to every sequence of a group preempted by recompute in the step.",
        note="TensorRT-LLM's pause is V0's preemption by recompute.",
    ),
    Exhibit(
        id="paused-keeps-blocks",
        title="A preemption that never releases the victim's blocks",
        source_id="pause-never-releases",
        bug_class="The victim leaves running for waiting but keeps its KV blocks, so the memory pressure that "
        "caused the preemption never eases.",
        expected=("RES-003",),
        profile="safety",
        factory=_reused("recompute-keeps-blocks"),
        mutant="recompute-keeps-blocks",
        reused=True,
        code=(lib._RecomputeKeepsBlocks._preempt_by_recompute,),
        minimal_change="_preempt_by_recompute resets the computed count and moves the group to waiting, but "
        "never calls block_manager.free.",
    ),
    Exhibit(
        id="swapped-hold-seats",
        title="Seats counted for requests that hold none: admission stops for good",
        source_id="deferred-seats-deadlock",
        bug_class="The max_num_seqs check counts requests that are not running (here: swapped ones), so once "
        "they fill the cap nothing is ever resumed or admitted, although memory is free.",
        expected=("LIV-001", "LIV-002"),
        profile="liveness",
        factory=new.SwappedHoldSeats,
        mutant="swapped-hold-seats",
        code=(new.SwappedHoldSeats._schedule_swapped,),
        minimal_change="_schedule_swapped adds the seats of every swapped group to the budget before swapping in.",
        note="vLLM V1 counted deferred (skipped) waiting requests; V0 defers swapped requests, so they are the "
        "ones counted here.",
        strategy=_swap_traces,
    ),
    Exhibit(
        id="budget-from-estimate",
        title="Token budget charged with an estimate, not what the prefill computes",
        source_id="estimate-vs-actual-budget",
        bug_class="Admission charges the step's token budget with an estimate of a prefill's tokens that "
        "differs from what the prefill really computes, so the batch exceeds max_num_batched_tokens.",
        expected=("BUD-001", "LEN-002"),
        profile="safety",
        factory=new.BudgetChargedWithEstimate,
        mutant="budget-charged-with-estimate",
        code=(new._EstimatedTokens.uncomputed_tokens,),
        minimal_change="SequenceGroup.uncomputed_tokens returns the original prompt length, which undercounts "
        "a recompute victim's prefill (prompt plus generated tokens).",
        note="TensorRT-LLM's estimate is the expected prefix-cache reuse; the reference has no prefix cache, so "
        "the estimate re-created is the prompt length of a request preempted by recompute.",
        strategy=_recompute_traces,
    ),
    Exhibit(
        id="recompute-keeps-second-table",
        title="Preemption by recompute frees only one of a group's block tables",
        source_id="recompute-keeps-second-table",
        bug_class="A recompute victim frees some of its block tables and forgets the others, so a waiting "
        "request still holds GPU blocks (and re-admission finds a table already there).",
        expected=("RES-003",),
        profile="safety",
        factory=new.RecomputeFreesFirstTableOnly,
        mutant="recompute-frees-first-table-only",
        code=(new.RecomputeFreesFirstTableOnly._preempt_by_recompute,),
        minimal_change="_preempt_by_recompute frees the block table of the group's first live sequence only.",
        note="vLLM forgot an encoder-decoder group's cross-attention table; the reference has no cross-attention, "
        "so the forgotten tables are those of the group's other (forked) sequences.",
        strategy=_recompute_traces,
    ),
)

# ------------------------------------------------------------------ the async flow (docs/ASYNC.md)
_ASYNC = {"profile": "async", "reference": AsyncV1Scheduler, "reservation": Reservation(lookahead_tokens=1),
          "reused": True}
EXHIBITS += (
    Exhibit(
        id="async-preempt-placeholder-underflow",
        title="Preemption with a step in flight: the placeholder count underflows and the engine dies",
        source_id="async-preempt-placeholder-underflow",
        bug_class="Preemption resets the victim's counters while its in-flight step still returns; the returning "
        "token drains a placeholder that is no longer there and update() fails on the assert.",
        expected=("PIP-003", "PIP-005", "FAULT-raised"),
        factory=async_mutants.ForgetsInFlightOnPreempt,
        mutant="forgets_in_flight_on_preempt",
        code=(async_mutants.ForgetsInFlightOnPreempt._preempt,),
        minimal_change="_preempt resets computed tokens and placeholders but leaves the victim's stale share at 0.",
        note="PIP-003 sees it first, mid-step: a preempted (waiting) sequence with in-flight tokens none of which "
        "is stale; the assert then fails on the returning outcome, the FAULT that PIP-005 names.",
        strategy=_async_traces("preemption"), **_ASYNC,
    ),
    Exhibit(
        id="async-final-chunk-no-placeholder",
        title="A final prompt chunk reserves no placeholder: the engine dies when its token returns",
        source_id="async-final-chunk-no-placeholder",
        bug_class="The last chunk of a chunked prompt samples a token but reserves no placeholder for it, so the "
        "returning token drives the count below zero and update() fails on the assert.",
        expected=("PIP-003", "FAULT-raised"),
        factory=async_mutants.FinalChunkWithoutPlaceholder,
        mutant="final_chunk_without_placeholder",
        code=(async_mutants.FinalChunkWithoutPlaceholder.schedule,),
        minimal_change="schedule() takes back the placeholder of a sampling chunk that continues a prompt.",
        note="Upstream the final chunk comes from streaming input (_update_request_as_session), which the wire "
        "protocol does not have; here it is the last chunk of an ordinary chunked prefill. PIP-003 sees it a step "
        "before the assert: the chunk in flight samples a position, but no placeholder stands for it.",
        strategy=_async_traces("chunked"), **_ASYNC,
    ),
    Exhibit(
        id="async-stale-frames-delay-stop",
        title="Outcomes taken up a step late: a request's stop reaches the client late",
        source_id="async-stale-frames-delay-stop",
        bug_class="Steps are processed one step later than the declared pipeline depth, so a finished request is "
        "reported a step after its outcome could have been known.",
        expected=("PIP-003", "PIP-006", "PIP-007"),
        factory=async_mutants.OneStepLater,
        mutant="one_step_later",
        code=(async_mutants.OneStepLater.update,),
        minimal_change="update() keeps depth + 1 steps in flight instead of depth.",
        note="Upstream the extra step comes from placeholders inflated by discarded stale frames after "
        "reset_prefix_cache (not a wire method); the symptom, a stop delivered 1-2 steps late, is the same. "
        "PIP-003 sees it first: counters still held for a step that is past the declared depth.",
        strategy=_async_traces("plain"), **_ASYNC,
    ),
    Exhibit(
        id="async-resumed-request-repeats-token",
        title="A preempted request's in-flight token is kept and sampled again: the client sees it twice",
        source_id="async-resumed-request-repeats-token",
        bug_class="When a preempted request's stale step returns, its token is kept and the position sampled again, "
        "so one token is delivered twice.",
        expected=("PIP-001",),
        factory=async_mutants.ResamplesAfterPreemption,
        mutant="resamples_after_preemption",
        code=(async_mutants.ResamplesAfterPreemption._process,),
        minimal_change="_process appends a preempted request's returning token, then the kept token again.",
        note="vLLM 0.33.0 cannot repeat at depth 1 (the stale token lands before readmission, docs/ASYNC.md); "
        "the mutant re-creates the repeat the PR describes.",
        strategy=_async_traces("preemption"), **_ASYNC,
    ),
)

# ------------------------------------------------------------------ the specdec flow (docs/SPECDEC.md)
# The reservation is the scheduler's own (k draft slots, per config: `SchedulerAdapter`).
_SPECDEC = {"profile": "specdec", "reference": SpecDecScheduler, "reused": True}
EXHIBITS += (
    Exhibit(
        id="specdec-empty-output-skips-rollback",
        title="An outcome with no token for a request with drafts: computed tokens run past the tokens",
        source_id="specdec-empty-output-skips-rollback",
        bug_class="The draft rollback runs only when the outcome has tokens, so an empty outcome leaves the drafts "
        "(and the step's token) counted as computed; the request can never be scheduled again.",
        expected=("SPD-005", "CHK-002"),
        factory=specdec_mutants.EmptyOutcomeKeepsDrafts,
        mutant="specdec-empty-outcome-keeps-drafts",
        code=(specdec_mutants.EmptyOutcomeKeepsDrafts.update,),
        minimal_change="update() adds back the drafts and the step's token of a request whose outcome was empty.",
        note="vLLM 0.33.0 still has the condition (scheduler.py:2349-2351); through the host it reproduces "
        "(docs/SPECDEC.md). Traces with empty outcomes: conformance.generation.specdec.specdec_traces_with_empty.",
        strategy=specdec_traces_with_empty, **_SPECDEC,
    ),
    Exhibit(
        id="specdec-draft-budget-not-reserved",
        title="Draft tokens not charged to the token budget: the batch exceeds max_num_batched_tokens",
        source_id="specdec-draft-budget-not-reserved",
        bug_class="The budget caps a decode's next token only; its drafts come on top, so a step schedules more "
        "tokens than the budget.",
        expected=("SPD-001", "BUD-001"),
        factory=specdec_mutants.DraftsOutsideBudget,
        mutant="specdec-drafts-outside-budget",
        code=(specdec_mutants.DraftsOutsideBudget._running_chunk,),
        minimal_change="_running_chunk caps the next token by the budget and adds the drafts on top.",
        note="TensorRT-LLM's overlap scheduler and one-model MTP are not modelled; the accounting gap is.",
        strategy=specdec_traces, **_SPECDEC,
    ),
    Exhibit(
        id="specdec-prefill-chunk-drafts",
        title="Drafts proposed after a prefill chunk ride the prompt's next chunk",
        source_id="specdec-prefill-chunk-drafts",
        bug_class="The drafter's proposal after a non-final prefill chunk is kept, so the chunk that completes the "
        "prompt also carries drafts.",
        expected=("SPD-002",),
        factory=specdec_mutants.DraftsOnPrefillChunk,
        mutant="specdec-drafts-on-prefill-chunk",
        code=(specdec_mutants.DraftsOnPrefillChunk.update,),
        minimal_change="update() keeps the drafter's proposal after a prefill chunk.",
        note="Upstream the harm was a hybrid (Mamba) model's state; the model has full attention only. SPD-002 is a "
        "policy (a prompt-lookup drafter could verify drafts on a final chunk correctly), caught here in the specdec "
        "profile; drafts after a chunk cut short of the prompt's end break SPD-009, a safety invariant (mutant "
        "specdec-drafts-after-cut-chunk).",
        strategy=specdec_traces, **_SPECDEC,
    ),
    Exhibit(
        id="specdec-padding-counted-as-drafts",
        title="Padding scheduled as drafts where the drafter proposed none",
        source_id="specdec-padding-counted-as-drafts",
        bug_class="A request whose drafting was skipped is scheduled with k drafts anyway: padding that is always "
        "rejected and counted as drafts.",
        expected=("SPD-008",),
        factory=specdec_mutants.SchedulesUnproposedDrafts,
        mutant="specdec-schedules-unproposed-drafts",
        code=(specdec_mutants.SchedulesUnproposedDrafts.update,),
        minimal_change="update() gives a request k drafts where the drafter proposed none.",
        note="A policy invariant: vLLM's own placeholder and CUDA-graph padding drafts break it by design.",
        strategy=specdec_traces, **_SPECDEC,
    ),
)

_HYBRID = {"profile": "hybrid", "reference": HybridV1Scheduler, "reused": True}
EXHIBITS += (
    Exhibit(
        id="hybrid-aligned-split-zero",
        title="The Mamba-aligned split rounds a capped prefill chunk to 0 tokens on every step",
        source_id="hybrid-aligned-split-zero",
        bug_class="A chunk that a cap holding every step keeps below one block is floored to a block boundary, "
        "which is its start: the request is scheduled nothing, for ever.",
        expected=("HYB-008", "LIV-001", "LIV-002"),
        factory=hybrid_mutants.AlignedSplitToZero,
        mutant="hybrid-aligned-split-to-zero",
        code=(hybrid_mutants.AlignedSplitToZero._aligned_chunk,),
        minimal_change="_aligned_chunk floors every non-final chunk without vLLM's guard.",
        note="The encoder cache is not modelled; a long-prefill threshold below the block size is the cap that "
        "holds on every step.",
        strategy=hybrid_mutants.mamba_traces, **_HYBRID,
    ),
    Exhibit(
        id="hybrid-mamba-eagle-drop",
        title="MambaManager.find_longest_cache_hit ignores drop_eagle_block: the hybrid hit serves the EAGLE block",
        source_id="hybrid-mamba-eagle-drop",
        bug_class="The reconciled prefix hit is full attention's undropped chain because the Mamba finder returns a "
        "state there, so the block the EAGLE/MTP drafter must recompute is served from the cache.",
        expected=("HYB-006",),
        factory=hybrid_mutants.MambaIgnoresEagleDrop,
        mutant="hybrid-mamba-ignores-eagle-drop",
        code=(hybrid_mutants.MambaIgnoresEagleDrop._cache_hits,),
        minimal_change="_cache_hits takes the undropped chain when the Mamba group has a state at that length.",
        note="vLLM 0.33.0 keeps the margin away from Mamba groups (kv_cache_coordinator.py:870-874), so the hit "
        "stays at full attention's dropped length; the parameter is still unread in MambaManager.",
        strategy=hybrid_mutants.eagle_mamba_traces, **_HYBRID,
    ),
    Exhibit(
        id="hybrid-mtp-unaligned-state",
        title="Prefix caching with MTP on a hybrid model caches a Mamba state that is not at its block boundary",
        source_id="hybrid-mtp-unaligned-state",
        bug_class="Under the EAGLE/MTP path a prefill chunk ends inside a Mamba block; the state block is cached under "
        "its boundary's key while it holds the state after the chunk.",
        expected=("HYB-007",),
        factory=hybrid_mutants.UnalignedChunksUnderEagle,
        mutant="hybrid-unaligned-chunks-under-eagle",
        code=(hybrid_mutants.UnalignedChunksUnderEagle._aligned_chunk,),
        minimal_change="_aligned_chunk skips the aligned split when drop_eagle_block is set.",
        note="#53912's scheduler/manager part only; the model's MTP state handling is not modelled.",
        strategy=hybrid_mutants.eagle_mamba_traces, **_HYBRID,
    ),
    Exhibit(
        id="sglang-mamba-slot-leak",
        title="A Mamba state slot leaks when admission fails with the radix cache",
        source_id="sglang-mamba-slot-leak",
        bug_class="The state slot taken for a request whose admission then fails is never released: a block is held "
        "by nobody.",
        expected=("BLK-003", "BLK-001"),
        factory=hybrid_mutants.StateSlotLeaks,
        mutant="hybrid-state-slot-leaks-on-failed-admission",
        code=(hybrid_mutants.StateSlotLeaks._whole_sequence_fits,),
        minimal_change="A failed whole-sequence admission check takes a state block and keeps it.",
        note="SGLang's flow, page size 1 and radix tree are not modelled; the V1 hybrid reference plays the "
        "scheduler and its one pool the Mamba pool.",
        strategy=hybrid_mutants.mamba_traces, **_HYBRID,
    ),
)


def _budget_traces(name: str) -> Callable[[], st.SearchStrategy]:
    def strategy() -> st.SearchStrategy:
        from conformance.generation import budgets

        return getattr(budgets, name)()

    return strategy


# Issue 32: the encoder cache and LoRA slots of the V1 flow (conformance/selftest/mutants_budgets.py).
_BUDGETS = {"profile": "vllm-v1", "reference": V1Scheduler, "reused": True}
EXHIBITS += (
    Exhibit(
        id="vllm-encoder-cache-waiting-leak",
        title="Waiting requests hold the encoder cache: no step schedules a token",
        source_id="vllm-encoder-cache-waiting-leak",
        bug_class="A waiting request keeps the encoder cache space its failed admission took; the running request "
        "whose next chunk needs an encoder output gets 0 tokens, and the waiting one waits for its KV blocks.",
        expected=("ENC-005",),
        factory=budget_mutants.EncoderWaitingHoldsSpace,
        mutant="v1-encoder-waiting-holds-space",
        code=(budget_mutants.EncoderWaitingHoldsSpace._encoder_plan,),
        minimal_change="_encoder_plan commits a waiting request's encoder plan before its KV blocks are allocated.",
        note="The encoder-decoder variant (#55733) and the EC connector are not modelled. Traces of the deadlock's "
        "shape: conformance.generation.budgets.encoder_deadlock_traces.",
        strategy=_budget_traces("encoder_deadlock_traces"), **_BUDGETS,
    ),
    Exhibit(
        id="sglang-lora-carried-chunk",
        title="LoRA admission misses the chunked request carried over: max_loras + 1 adapters in a batch",
        source_id="sglang-lora-carried-chunk",
        bug_class="Admission counts the adapters of running requests that decode, not the one mid-prefill that is "
        "carried into the step, and admits one adapter too many.",
        expected=("LORA-001",),
        factory=budget_mutants.LoraMissesCarriedChunk,
        mutant="v1-lora-misses-carried-chunk",
        code=(budget_mutants.LoraMissesCarriedChunk._lora_slots_taken,),
        minimal_change="_lora_slots_taken leaves out running requests still mid-prefill.",
        note="Transferred from SGLang to the V1 reference, which counts every running request's adapter as vLLM "
        "0.33.0 does (scheduler.py:1040-1047). Traces: conformance.generation.budgets.carried_chunk_lora_traces.",
        strategy=_budget_traces("carried_chunk_lora_traces"), **_BUDGETS,
    ),
    Exhibit(
        id="vllm-encdec-encoder-slots-credited",
        title="Encoder cache space credited again on every decode step: the cache budget stops binding",
        source_id="vllm-encdec-encoder-slots-credited",
        bug_class="Releasing a consumed encoder input is not idempotent: each decode step after the input was freed "
        "adds its embeddings to the free space again, until the cache admits more than it holds.",
        expected=("ENC-002",),
        factory=budget_mutants.EncoderCreditedEveryStep,
        mutant="v1-encoder-credited-every-step",
        code=(budget_mutants._CreditedEveryStep.release_consumed,),
        minimal_change="release_consumed credits a consumed input's space whenever its request no longer holds it, "
        "every step, not once.",
        note="Transferred from the encoder-decoder manager (EncoderDecoderCacheManager, which the V1 reference does "
        "not model) to the decoder-only cache's release path: the accounting fault is the same, a free counted on "
        "every step. Traces: conformance.generation.budgets.encoder_decode_traces.",
        strategy=_budget_traces("encoder_decode_traces"), **_BUDGETS,
    ),
    Exhibit(
        id="vllm-pause-arrivals-invisible",
        title="Requests added while the engine is paused are in no queue: invisible, and gone after the resume",
        source_id="vllm-pause-arrivals-invisible",
        bug_class="A request that arrives while the scheduler is paused is accepted but kept where neither the "
        "queues nor the counts show it, and the resume does not bring it back.",
        expected=("QUE-001", "LIV-002"),
        factory=budget_mutants.PauseForgetsArrivals,
        mutant="v1-pause-forgets-arrivals",
        code=(budget_mutants.PauseForgetsArrivals.add_request,),
        minimal_change="add_request tracks a request that arrives while paused but puts it in no queue.",
        note="vLLM 0.33.0 queues such a request and schedules it after the resume; #51487 is about it being invisible "
        "to the counts meanwhile (get_num_unfinished_requests), which kvsched shows as a request in no queue "
        "(QUE-001). Traces: conformance.generation.budgets.paused_arrival_traces.",
        strategy=_budget_traces("paused_arrival_traces"), **_BUDGETS,
    ),
)


def _pressure_traces() -> st.SearchStrategy:
    from conformance.generation.connector import pressure_traces

    return pressure_traces()


_CONNECTOR = {"profile": "connector", "reference": ConnectorScheduler, "reused": True, "strategy": _pressure_traces}
EXHIBITS += (
    Exhibit(
        id="connector-lookahead-after-load",
        title="A landed KV load needs lookahead blocks it never gets",
        source_id="connector-lookahead-after-load",
        bug_class="A request promoted out of WAITING_FOR_REMOTE_KV needs blocks past what its load holds; under KV "
        "pressure the allocation fails every step and nothing changes.",
        expected=("KVC-009", "LIV-003"),
        factory=connector_mutants.LookaheadAfterLoad,
        mutant="connector-lookahead-after-load",
        code=(connector_mutants.LookaheadAfterLoad._kv_whole_need,),
        minimal_change="_kv_whole_need asks one block more for a promoted request (the lookahead).",
        note="Upstream the lookahead was MTP's speculative slots; the model has no drafts with a connector, so the "
        "extra need is one block. vLLM 0.33.0 allocates no lookahead while loading (KVC-004 states that policy).",
        **_CONNECTOR,
    ),
    Exhibit(
        id="connector-holder-behind-head",
        title="A request holding loaded KV waits behind a head that cannot fit",
        source_id="connector-holder-behind-head",
        bug_class="The waiting scan stops at a head that needs more blocks than are free while a request behind it "
        "holds loaded KV and needs only a few: nothing runs, for ever.",
        expected=("KVC-009", "LIV-003"),
        factory=connector_mutants.HolderBehindHead,
        mutant="connector-holder-behind-head",
        code=(connector_mutants.HolderBehindHead._kv_hold, connector_mutants.HolderBehindHead._kv_members),
        minimal_change="_kv_hold leaves a loading request in arrival order instead of the KV-holding front of waiting.",
        note="vLLM 0.33.0 drains kv_holding_waiting before waiting (scheduler.py:1062-1068), the reference's order.",
        **_CONNECTOR,
    ),
    Exhibit(
        id="connector-loading-takes-a-seat",
        title="Requests waiting for their KV count against max_num_seqs",
        source_id="connector-loading-takes-a-seat",
        bug_class="Requests whose KV load is in flight take seats, so admission stops with the KV cache mostly free.",
        expected=("KVC-008",),
        factory=connector_mutants.LoadingTakesASeat,
        mutant="connector-loading-takes-a-seat",
        code=(connector_mutants.LoadingTakesASeat._kv_seats_taken,),
        minimal_change="_kv_seats_taken counts requests whose load is in flight as running.",
        note="In #53130 the deferred requests stay deferred; here the loads land, so the stall lasts while they are in "
        "flight, which KVC-008 names at once. vLLM 0.33.0 counts running requests only (scheduler.py:1070-1073).",
        **_CONNECTOR,
    ),
)

BY_ID: dict[str, Exhibit] = {e.id: e for e in EXHIBITS}


def get_exhibit(exhibit_id: str) -> Exhibit:
    from spec.errors import InputError

    if exhibit_id not in BY_ID:
        raise InputError("--exhibit", f"unknown exhibit {exhibit_id!r} (known: {', '.join(BY_ID)})")
    return BY_ID[exhibit_id]
