"""Mutants of the speculative-decoding reference (`reference_impl.specdec_scheduler`), each the
shape of an upstream bug or of a plain mistake on this path, each with the SPD invariant that
catches it (tests/test_mutants.py searches for the trace)."""

from __future__ import annotations

from conformance.flows import get_flow
from conformance.generation.specdec import (
    depth_one_specdec_traces,
    depth_one_specdec_traces_with_empty,
    specdec_traces_with_empty,
)
from conformance.selftest.mutant_record import mutant
from reference_impl.async_scheduler import AsyncV1Scheduler, InFlightCounters, InFlightStep
from reference_impl.specdec_scheduler import SpecDecScheduler
from reference_impl.v1_scheduler import TrackedRequest
from spec.speculative import NO_DECISION, DraftDecision, committed_tokens
from spec.status import Status
from spec.types import Finished, StepOutcome

_SPECDEC = get_flow("specdec").mutant_fields()


@mutant("specdec-drafts-outside-budget", "draft tokens are not charged to the token budget (TensorRT-LLM#16101)",
        ("SPD-001",), **_SPECDEC)
class DraftsOutsideBudget(SpecDecScheduler):
    """NVIDIA/TensorRT-LLM#16101: the one-model MTP path reserved no budget for the drafts, so
    the batch exceeded max_num_tokens under chunked prefill. Here the budget caps the next
    token only and the drafts come on top."""

    def _running_chunk(self, tracked: TrackedRequest, budget: int, threshold: int) -> int:
        room = self._draft_room(tracked, tracked.num_tokens)
        tokens = tracked.num_tokens - tracked.num_computed
        if 0 < threshold < tokens:
            tokens = threshold
        done = tracked.num_computed + min(tokens, budget) >= tracked.num_tokens
        return min(tokens, budget) + (room if done else 0)  # bug: the drafts come on top of the budget


@mutant("specdec-drafts-on-prefill-chunk", "drafts proposed after a prefill chunk are kept and ride the next chunk "
        "(vllm-project/vllm#30618)", ("SPD-002",), **_SPECDEC)
class DraftsOnPrefillChunk(SpecDecScheduler):
    """vllm-project/vllm#30618: drafts proposed after a non-final prefill chunk were not dropped,
    so the prompt's next chunk carried draft tokens (vLLM now ignores them in
    ``update_draft_token_ids`` for a request still in prefill)."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        chunks = [t for t, n in self._scheduled if t.num_computed + n < t.num_tokens]
        finished = super().update(outcome)
        k = self.config.num_speculative_tokens
        for tracked in chunks:
            if tracked.status is Status.RUNNING:  # bug: the drafter's proposal after a chunk is kept
                tracked.num_proposed = outcome.drafts.get(tracked.seq_id, NO_DECISION).num_proposed(k)
        return finished

    def _num_known(self, tracked: TrackedRequest) -> int:
        return tracked.num_tokens if tracked.num_computed < tracked.num_tokens - 1 else super()._num_known(tracked)


@mutant("specdec-drafts-after-cut-chunk", "drafts proposed after a prefill chunk ride the next chunk even when the "
        "budget or the threshold cuts it short of the prompt's end (vllm-project/vllm#30618)", ("SPD-009",), **_SPECDEC)
class DraftsAfterCutChunk(DraftsOnPrefillChunk):
    """vllm-project/vllm#30618 where it corrupts: the drafts kept after a prefill chunk are appended
    to the next chunk after the budget or the long-prefill threshold has cut it, so they sit after
    a prompt position whose successor is still unknown."""

    def _running_chunk(self, tracked: TrackedRequest, budget: int, threshold: int) -> int:
        left = tracked.num_tokens - tracked.num_computed
        if not tracked.in_prefill or not tracked.num_proposed or left <= 1:
            self._cut.pop(tracked.request_id, None)
            return super()._running_chunk(tracked, budget, threshold)
        drafts = min(tracked.num_proposed, self.config.num_speculative_tokens, max(budget - 1, 0))
        chunk = min(left, threshold if threshold > 0 else left, budget - drafts)
        self._cut[tracked.request_id] = tracked.num_computed + chunk  # bug: the drafts follow the cut chunk
        return chunk + drafts

    def _num_known(self, tracked: TrackedRequest) -> int:
        cut = self._cut.pop(tracked.request_id, None)
        return cut if cut is not None else super()._num_known(tracked)

    @property
    def _cut(self) -> dict[str, int]:
        return self.__dict__.setdefault("_cut_chunks", {})


@mutant("specdec-drafts-past-max-model-len", "drafts are not capped at max_model_len", ("SPD-003",), **_SPECDEC)
class DraftsPastMaxModelLen(SpecDecScheduler):
    """The running chunk's cap at ``max_model_len - num_computed - 1`` forgotten for drafts (vLLM
    applies it "when using spec decoding", scheduler.py:851-857; #53812 is a path that missed it)."""

    def _draft_room(self, tracked: TrackedRequest, num_tokens: int) -> int:
        if not tracked.num_proposed:
            return 0
        generated = num_tokens - tracked.request.prompt_len
        return max(min(tracked.num_proposed, self.config.num_speculative_tokens,
                       tracked.request.max_tokens - generated - 1), 0)  # bug: no max_model_len cap


@mutant("specdec-drafts-past-max-tokens", "drafts are not capped at max_tokens (vLLM 0.33.0's running loop)",
        ("SPD-004",), **_SPECDEC)
class DraftsPastMaxTokens(SpecDecScheduler):
    """vLLM 0.33.0 does not cap drafts at ``max_tokens`` (scheduler.py:838-857): it computes them
    and ``check_stop`` trims the excess. Output stays right; the budget and slots are wasted."""

    def _draft_room(self, tracked: TrackedRequest, num_tokens: int) -> int:
        if not tracked.num_proposed:
            return 0
        return max(min(tracked.num_proposed, self.config.num_speculative_tokens,
                       self.config.max_model_len - num_tokens - 1), 0)  # bug (policy): no max_tokens cap


@mutant("specdec-keeps-rejected-drafts", "rejected drafts stay counted as computed", ("SPD-005",), **_SPECDEC)
class KeepsRejectedDrafts(SpecDecScheduler):
    """The outcome's rejections are never subtracted: every draft counts as computed, accepted or
    not (the rollback of scheduler.py:2356-2362 missing)."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        drafts = dict(self._scheduled_drafts)
        finished = super().update(outcome)
        for rid, d in drafts.items():
            tracked = self.requests[rid]
            decision = outcome.drafts.get(tracked.seq_id, NO_DECISION)
            if tracked.status is Status.RUNNING and not decision.empty:
                tracked.num_computed += d - min(decision.accepted, d)  # bug: the rejected ones stay
        return finished


@mutant("specdec-empty-outcome-keeps-drafts", "an outcome with no token skips the draft rollback "
        "(vllm-project/vllm#42722)", ("SPD-005",), **{**_SPECDEC, "trace_strategy": specdec_traces_with_empty})
class EmptyOutcomeKeepsDrafts(SpecDecScheduler):
    """vllm-project/vllm#42722 (closed unmerged): ``update_from_output`` rolls back rejected drafts
    only ``if scheduled_spec_token_ids and generated_token_ids`` (vLLM 0.33.0
    scheduler.py:2349-2351), so when the model runner returns no token for a request with drafts
    its computed tokens keep the drafts and the step's token."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        drafts = dict(self._scheduled_drafts)
        finished = super().update(outcome)
        for rid, d in drafts.items():
            tracked = self.requests[rid]
            if tracked.status is Status.RUNNING and outcome.drafts.get(tracked.seq_id, NO_DECISION).empty:
                tracked.num_computed += d + 1  # bug: no token came back, so nothing was rolled back
        return finished


@mutant("specdec-delivers-past-stop", "a stop inside an accepted run does not truncate it", ("SPD-006",), **_SPECDEC)
class DeliversPastStop(SpecDecScheduler):
    """The stop check runs once, after the whole accepted run is appended: the tokens after the
    stop reach the client (vLLM checks after each token and trims, scheduler.py:2744-2770)."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        late = {sid: DraftDecision(d.proposed, d.accepted, None, d.empty) for sid, d in outcome.drafts.items()}
        return super().update(StepOutcome(outcome.stopped, late))  # bug: the stop lands on the run's last token


@mutant("specdec-caches-rejected-kv", "blocks are keyed up to the committed tokens, over a rejected draft's KV",
        ("SPD-007",), **_SPECDEC)
class CachesRejectedKv(SpecDecScheduler):
    """After an outcome, blocks are keyed up to every committed token, though the last one (the
    bonus, sampled where a draft was rejected or past the run) has no KV yet: its slot holds the
    rejected draft's (vLLM keys up to the processed frontier, scheduler.py:2402-2415)."""

    def _cache_computed_blocks(self, tracked: TrackedRequest) -> None:
        self._cache_full_blocks(tracked, tracked.num_tokens)  # bug: the bonus token's slot is not computed


@mutant("specdec-schedules-unproposed-drafts", "drafts are scheduled where the drafter proposed none "
        "(vllm-project/vllm#54054)", ("SPD-008",), **_SPECDEC)
class SchedulesUnproposedDrafts(SpecDecScheduler):
    """vllm-project/vllm#54054: when drafting was skipped (the input no longer fit the drafter) the
    runner zero-filled the drafts and the scheduler scheduled that padding as k drafts."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        finished = super().update(outcome)
        for tracked in self.running:
            decision = outcome.drafts.get(tracked.seq_id)
            if decision is not None and decision.proposed == 0 and not tracked.in_prefill:
                tracked.num_proposed = self.config.num_speculative_tokens  # bug: the padding counts as drafts
        return finished


# ------------------------------------------------------------------ with outcomes in flight (depth 1)
# The same bugs in the async reference, caught where the outcome is processed a step after its
# step was scheduled (SPD-005/006/007/008 read it through spec.invariants._views.returned_step).
_PIPELINED = {"reference": AsyncV1Scheduler, "trace_strategy": depth_one_specdec_traces, "profile": "async"}


def _rejected(scheduler: AsyncV1Scheduler, step: InFlightStep) -> dict[str, int]:
    """Per request of ``step`` (running, not stale), the drafts its outcome rejects."""
    rejected = {}
    for tracked, _tokens, position, drafts in step.entries:
        counters = scheduler.counters[tracked.request_id]
        if position is None or not drafts or tracked.status is not Status.RUNNING or counters.num_stale:
            continue
        decision = (step.decisions or {}).get(tracked.seq_id, NO_DECISION)
        committed = committed_tokens(decision, drafts, counters.num_valid_drafts)
        rejected[tracked.request_id] = drafts - max(committed - 1, 0) if committed else 0
    return rejected


@mutant("specdec-async-keeps-rejected-drafts", "with outcomes in flight, rejected drafts stay counted as computed",
        ("SPD-005",), **_PIPELINED)
class AsyncKeepsRejectedDrafts(AsyncV1Scheduler):
    """`KeepsRejectedDrafts` at depth 1: the returned step's rejections are never subtracted, so
    the processed frontier runs past the accepted tokens."""

    def _process(self, step: InFlightStep) -> list[Finished]:
        rejected = _rejected(self, step)
        finished = super()._process(step)
        for rid, count in rejected.items():
            tracked = self.requests[rid]
            if tracked.status is Status.RUNNING:
                tracked.num_computed += count  # bug: the rejected ones stay
        return finished


@mutant("specdec-async-delivers-past-stop", "with outcomes in flight, a stop inside an accepted run does not "
        "truncate it", ("SPD-006",), **_PIPELINED)
class AsyncDeliversPastStop(AsyncV1Scheduler):
    """`DeliversPastStop` at depth 1: the stop lands on the run's last token when the step returns."""

    def update(self, outcome: StepOutcome) -> list[Finished]:
        late = {sid: DraftDecision(d.proposed, d.accepted, None, d.empty) for sid, d in outcome.drafts.items()}
        return super().update(StepOutcome(outcome.stopped, late))  # bug: the stop lands on the run's last token


@mutant("specdec-async-caches-rejected-kv", "with outcomes in flight, blocks are keyed up to the committed tokens "
        "when a step returns", ("SPD-007",), **_PIPELINED)
class AsyncCachesRejectedKv(AsyncV1Scheduler):
    """`CachesRejectedKv` at depth 1: when a step returns, blocks are keyed up to every committed
    token; the last one's slot holds a rejected draft's KV (or none) until a step computes it,
    which only a step already in flight for the sequence would."""

    def _process(self, step: InFlightStep) -> list[Finished]:
        finished = super()._process(step)
        for tracked, *_ in step.entries:
            if tracked.status is Status.RUNNING and not self.counters[tracked.request_id].num_stale:
                self._cache_full_blocks(tracked, tracked.num_tokens)  # bug: past the processed frontier
        return finished


@mutant("specdec-async-accepts-placeholders", "with outcomes in flight, placeholder drafts count as proposed "
        "(vllm-project/vllm#54054 at depth 1)", ("SPD-008",), **_PIPELINED)
class AsyncAcceptsPlaceholders(AsyncV1Scheduler):
    """vllm-project/vllm#54054's padding counted as drafts, where a pipelined scheduler pads: every
    one of the k placeholders scheduled before the proposal existed is treated as a real draft,
    so the model's acceptance reaches drafts the drafter never proposed."""

    def _process(self, step: InFlightStep) -> list[Finished]:
        for tracked, *_ in step.entries:
            self.counters[tracked.request_id].num_valid_drafts = self.config.num_speculative_tokens  # bug
        return super()._process(step)


@mutant("specdec-async-empty-outcome-keeps-drafts", "with outcomes in flight, an outcome with no token skips the "
        "draft rollback (vllm-project/vllm#42722 at depth 1)", ("SPD-005",),
        **{**_PIPELINED, "trace_strategy": depth_one_specdec_traces_with_empty})
class AsyncEmptyOutcomeKeepsDrafts(AsyncV1Scheduler):
    """vllm-project/vllm#42722 as vLLM 0.33.0's AsyncScheduler has it: ``update_from_output`` rolls
    back only ``if scheduled_spec_token_ids and generated_token_ids`` (scheduler.py:2349-2351), so
    an empty outcome for a request with drafts leaves its drafts and its sampled position counted
    as computed, and the step already in flight for it carries on as if the token had come."""

    def _after_empty_outcome(self, tracked: TrackedRequest, counters: InFlightCounters, drafts: int) -> None:
        if drafts:
            tracked.num_computed += drafts + 1  # bug: no token came back, so nothing was rolled back
        else:
            super()._after_empty_outcome(tracked, counters, drafts)
