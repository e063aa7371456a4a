"""Mutants of the V1 reference's encoder budget and cache, its LoRA slots, its pause, its grammar waits
and its streaming-input sessions (issue 32).

Each breaks one rule of `reference_impl.encoder_budget` or of the V1 reference's `_encoder_*` /
`_lora_*` hooks and names the invariants (spec/invariants/encoder.py) that catch it. Their traces
are `conformance.generation.budgets`' (the deadlock and the carried-over chunk have traces of their
own shape, which random budget traces reach rarely).
"""

from __future__ import annotations

from dataclasses import replace

from conformance.flows import get_flow
from conformance.generation.budgets import (
    budget_traces,
    carried_chunk_lora_traces,
    encoder_deadlock_traces,
    encoder_decode_traces,
    grammar_traces,
    mixed_session_traces,
    paused_arrival_traces,
)
from conformance.generation.sessions import session_deadlock_traces, session_traces
from conformance.selftest.mutant_record import mutant
from reference_impl.encoder_budget import EncoderCache, EncoderPlan
from reference_impl.v1_scheduler import TrackedRequest, V1Scheduler
from spec.config import SchedulerConfig
from spec.encoder import EncoderInput
from spec.status import Status
from spec.types import Request, SchedulerOutput

BUDGETS = {**get_flow("v1").mutant_fields(), "trace_strategy": budget_traces}


@mutant("v1-encoder-ignores-budget", "encoder inputs are planned against the cache only, never the step's "
        "encoder budget", ("ENC-001",), **BUDGETS)
class EncoderIgnoresBudget(V1Scheduler):
    def _encoder_plan(self, tracked: TrackedRequest, computed: int, tokens: int) -> tuple[int, EncoderPlan | None]:
        self._encoder_left = 10**9  # bug: the budget never binds
        return super()._encoder_plan(tracked, computed, tokens)


class _SharedCountedTwice(EncoderCache):
    def _hold(self, request_id: str, digest: str) -> None:
        if self.users[digest] and request_id not in self.users[digest]:
            self.capacity -= self.sizes[digest]  # bug: a second holder pays for the shared output again
        super()._hold(request_id, digest)

    @property
    def num_free(self) -> int:
        return self.capacity - sum(self.sizes.values())


@mutant("v1-encoder-shared-counted-twice", "an encoder output shared by two requests takes its space once per "
        "holder", ("ENC-002",), **BUDGETS)
class EncoderSharedCountedTwice(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.encoder = _SharedCountedTwice(config.encoder_cache_size)


class _LetsGoAtFirstPosition(EncoderCache):
    def release_consumed(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int) -> None:
        for item in inputs:
            if item.position < computed:  # bug: begun is taken for consumed
                self._let_go(request_id, item.content_hash)


@mutant("v1-encoder-frees-begun-input", "a request lets go of an encoder output once its chunk has begun to read it",
        ("ENC-003",), **BUDGETS)
class EncoderFreesBegunInput(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.encoder = _LetsGoAtFirstPosition(config.encoder_cache_size)


class _NeverCuts(EncoderCache):
    def plan(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int, tokens: int,
             budget: int) -> EncoderPlan:
        plan = super().plan(request_id, inputs, computed, tokens, budget)
        return replace(plan, tokens=tokens)  # bug: the chunk is not cut


@mutant("v1-encoder-chunk-without-output", "a chunk is not cut before an encoder input that fits neither the "
        "budget nor the cache: it runs without the input's output", ("ENC-004",), **BUDGETS)
class EncoderChunkWithoutOutput(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.encoder = _NeverCuts(config.encoder_cache_size)


@mutant("v1-encoder-waiting-holds-space", "a waiting request holds the encoder outputs its failed admission "
        "planned (vllm-project/vllm PR #31857)", ("ENC-005",),
        **{**BUDGETS, "trace_strategy": encoder_deadlock_traces})
class EncoderWaitingHoldsSpace(V1Scheduler):
    def _encoder_plan(self, tracked: TrackedRequest, computed: int, tokens: int) -> tuple[int, EncoderPlan | None]:
        tokens, plan = super()._encoder_plan(tracked, computed, tokens)
        if plan is not None and tracked.status is Status.WAITING:
            self.encoder.commit(tracked.request_id, tracked.request.encoder_inputs, plan)  # bug: held before admission
            return tokens, None
        return tokens, plan


@mutant("v1-lora-misses-carried-chunk", "LoRA admission counts the adapters of running requests but not that of "
        "the chunked prefill carried over into the step (sgl-project/sglang #25865, #23141)", ("LORA-001",),
        **{**BUDGETS, "trace_strategy": carried_chunk_lora_traces})
class LoraMissesCarriedChunk(V1Scheduler):
    def _lora_slots_taken(self) -> set[int]:
        return {r.request.lora_id for r in self.running
                if r.request.lora_id and not r.in_prefill}  # bug: the chunk carried over is not counted


@mutant("v1-admits-while-paused", "pause_new is reported but admission goes on", ("PAU-001",), **BUDGETS)
class AdmitsWhilePaused(V1Scheduler):
    def schedule(self) -> SchedulerOutput:
        shown = self.pause_state
        if shown == "paused_new":
            self.pause_state = "unpaused"  # bug: the pause is not consulted
        try:
            return super().schedule()
        finally:
            self.pause_state = shown


@mutant("v1-pause-forgets-arrivals", "requests added while paused are held aside and the resume forgets them "
        "(the shape of vllm-project/vllm #51487 / #51488)", ("QUE-001", "LIV-002"),
        **{**BUDGETS, "trace_strategy": paused_arrival_traces})
class PauseForgetsArrivals(V1Scheduler):
    def add_request(self, request: Request) -> None:
        if self.pause_state == "unpaused":
            super().add_request(request)
            return
        self._track(request)  # bug: tracked as WAITING but queued nowhere, and never after the resume


class _CreditedEveryStep(EncoderCache):
    """An encoder cache whose release credits a consumed input's space again on every later step."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.credit = 0

    def release_consumed(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int) -> None:
        for item in inputs:
            holders = self.users.get(item.content_hash)
            if item.end <= computed and holders is not None and request_id not in holders:
                self.credit += item.length  # bug: freed again, with no check that it was freed already
        super().release_consumed(request_id, inputs, computed)

    @property
    def num_free(self) -> int:
        return self.capacity + self.credit - sum(self.sizes.values())


@mutant("v1-encoder-credited-every-step", "a consumed encoder input's space is credited back to the cache on every "
        "step its request decodes (vllm-project/vllm #55733, fix #51228: the encoder-decoder cache manager)",
        ("ENC-002",), **{**BUDGETS, "trace_strategy": encoder_decode_traces})
class EncoderCreditedEveryStep(V1Scheduler):
    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.encoder = _CreditedEveryStep(config.encoder_cache_size)


GRAMMARS = {**BUDGETS, "trace_strategy": grammar_traces}


@mutant("v1-grammar-not-awaited", "a request waiting for its grammar is admitted as if it had none", ("GRM-001", "GRM-002"),
        **GRAMMARS)
class GrammarNotAwaited(V1Scheduler):
    def _grammar_ready(self, tracked: TrackedRequest) -> bool:
        if tracked.status is Status.WAITING_FOR_GRAMMAR:
            tracked.status = Status.WAITING  # bug: the grammar's compilation is not waited for
            self._grammar_readied.add(tracked.request_id)
        return True


@mutant("v1-grammar-wait-unreported", "a request waits for its grammar but is shown WAITING, so a client cannot "
        "tell a grammar wait from a queue wait", ("GRM-002",), **GRAMMARS)
class GrammarWaitUnreported(V1Scheduler):
    def add_request(self, request: Request) -> None:
        super().add_request(request)
        tracked = self.requests[request.request_id]
        if tracked.status is Status.WAITING_FOR_GRAMMAR:
            tracked.status = Status.WAITING  # bug: the wait is kept aside and the status says WAITING
            self._unreported.add(request.request_id)

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._unreported: set[str] = set()

    def _grammar_ready(self, tracked: TrackedRequest) -> bool:
        if tracked.request_id in self._unreported:
            if self._step < tracked.request.grammar_ready_step:
                return False
            self._unreported.discard(tracked.request_id)
        return super()._grammar_ready(tracked)


SESSIONS = {**BUDGETS, "trace_strategy": session_traces}


@mutant("v1-session-input-early", "a streaming session takes up its next input when its generation stops, "
        "whether the input has arrived or not", ("SES-002",), **SESSIONS)
class SessionInputEarly(V1Scheduler):
    def _next_arrived(self, tracked: TrackedRequest, step: int) -> bool:
        return self._inputs_left(tracked)  # bug: the input's step is not waited for


@mutant("v1-session-input-lost", "an input that arrives while its session still runs is never taken up: the "
        "session waits for input for good", ("SES-001",), **SESSIONS)
class SessionInputLost(V1Scheduler):
    def _next_arrived(self, tracked: TrackedRequest, step: int) -> bool:
        # bug: only an input arriving at this very step is seen; one that came during the run is lost
        return self._inputs_left(tracked) and tracked.request.session[self._sessions[tracked.request_id]].step == step \
            and tracked.status is Status.WAITING_FOR_INPUT


@mutant("v1-session-keeps-kv", "a streaming session waiting for input keeps its KV and its seat while the engine "
        "idles on them (vLLM 0.33.0's rule)", ("SES-003",), **{**BUDGETS, "trace_strategy": session_deadlock_traces})
class SessionKeepsKV(V1Scheduler):
    evicts_idle_sessions = False  # bug: nothing takes an idle session's KV back


@mutant("v1-session-input-encoder-dropped", "a streaming session takes up a later input's tokens but not its encoder "
        "inputs: its chunk over them runs with no encoder output", ("ENC-004",),
        **{**BUDGETS, "trace_strategy": mixed_session_traces})
class SessionInputEncoderDropped(V1Scheduler):
    def _take_input(self, tracked: TrackedRequest) -> None:
        inputs = tracked.request.encoder_inputs
        super()._take_input(tracked)
        tracked.request = replace(tracked.request, encoder_inputs=inputs)  # bug: the input's own are lost
