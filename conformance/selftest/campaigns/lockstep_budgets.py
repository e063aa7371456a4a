"""Strict lockstep: the V1 reference against vLLM 0.33.0's V1 scheduler with encoder inputs, LoRA
adapters and pause (issue 32).

    python -m conformance.selftest.campaigns.lockstep_budgets [--path encoder|...|streaming-mixed|async-grammar|async-streaming|async-streaming-mixed|all]
        [--traces 1000] [--seed 20261203] [--out docs/results/lockstep-vllm-v1-budgets.json]
        [--traces-dir docs/traces/lockstep-budgets] [--no-shrink]

The host (`conformance/targets/hosts/vllm_v1_host.py` with `vllm_budgets.py`) gives vLLM's
scheduler the config's encoder budget and ``EncoderCacheManager``, each request's encoder inputs as
``mm_features`` and its adapter as a ``LoRARequest`` under ``LoRAConfig.max_loras``, and the trace's
pause calls as ``Scheduler.set_pause_state``. Each trace runs beside `RecordingBudgets` (the V1
reference behind V1's front door, with V1's watermark rule), comparing every decision
(`conformance.runner.lockstep.compare`), the encoder inputs each step computes, and the state after
every step: `lockstep_v1.state_of` plus the encoder cache (each entry's size and holders), its free
space and the pause state. The paths, each from `conformance.generation.budgets` (chunked prefill
on, prefix caching off; ``max_num_partial_prefills`` 0, which V1 does not have):

* ``encoder``: encoder inputs under the encoder budget and cache, no LoRA, no pause;
* ``lora``: adapter ids under ``max_loras``, no encoder, no pause;
* ``pause``: a ``pause_new`` or ``pause_all`` and its ``resume`` in every trace, encoder and LoRA drawn;
* ``mixed``: `budget_traces` as ``kvsched conform --adapter reference-v1`` draws them;
* ``grammar``: `grammar_traces` (V1 token traces, prefix caching and chunked prefill drawn), about
  half the requests waiting 0-4 steps for their grammar; the host plays the grammar compiler;
* ``streaming``: `session_traces` (V1 token traces, max_model_len 16 or more), about half the
  requests streaming-input sessions of one to three later inputs; the host plays their client;
* ``streaming-pause``: the same, with a ``pause_new`` or ``pause_all`` and its ``resume`` in every trace;
* ``streaming-mixed``: `mixed_session_traces`, sessions beside everything else: the budgets'
  configs (max_model_len 16 or more), grammar waits, encoder inputs in first prompts (a session's
  among them), adapter ids (a session's serving every input), a pause a third of the time; a
  divergence is tried against the session rules, the encoder rules, and each encoder rule with
  each session rule (`session_and_encoder_models`);
* ``async-grammar``, ``async-streaming``, ``async-streaming-mixed``: those paths' traces at pipeline
  depth 1 on vLLM's AsyncScheduler (the ``vllm-v1-async`` host, which plays the grammar compiler
  and the sessions' client as the synchronous host does), beside the reference and each engine
  model pipelined (`pipelined`: their rules over `AsyncV1Scheduler` at depth 1), also comparing
  the delivered streams (`lockstep_async.compare_tokens`); a trace runs whole, under the async
  profile.

A trace runs to its first divergence, listed by field and classified (`classify`: rerun against the
reference with vLLM's behaviour modelled); `CLASSES` explains each class found, with vLLM source
lines, and a divergence no model fits is listed by its field. Needs ``kvsched targets install vllm-v1``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import time
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.budgets import budget_configs, grammar_traces, mixed_session_traces, with_budgets
from conformance.generation.sessions import session_traces
from conformance.generation.v0 import sample_traces
from conformance.generation.v1 import token_traces
from conformance.runner.adapter import load_adapter
from conformance.runner.driver import run_checked
from conformance.selftest.campaigns.campaign_args import campaign_parser, keep_other_paths, provenance, write_report
from conformance.selftest.campaigns.door import GenerateDoor
from conformance.selftest.campaigns.lockstep_async import compare_tokens
from conformance.selftest.campaigns.lockstep_v1 import Outcome, state_of
from conformance.selftest.campaigns.recording import RecordsSnapshots
from conformance.targets import get_target
from reference_impl.async_scheduler import AsyncV1Scheduler
from reference_impl.encoder_budget import EncoderCache, EncoderPlan
from reference_impl.v1_scheduler import EngineWatermarkV1
from spec.config import SchedulerConfig
from spec.encoder import EncoderInput
from spec.observation import Snapshot
from spec.trace import Trace

SYNC_PATHS = ("encoder", "lora", "pause", "mixed", "grammar", "streaming", "streaming-pause", "streaming-mixed")
# The same traces at pipeline depth 1 on vLLM's AsyncScheduler (the vllm-v1-async host).
ASYNC_PATHS = ("async-mixed", "async-grammar", "async-streaming", "async-streaming-mixed")
PATHS = (*SYNC_PATHS, *ASYNC_PATHS)

# class -> (kind, explanation with the vLLM source location); filled from what the runs found.
CLASSES: dict[str, tuple[str, str]] = {
    "session-kv-held-deadlock": (
        "engine defect",
        "A streaming session waiting for its next input keeps its KV blocks and its seat, and nothing can take "
        "them back: vLLM 0.33.0 re-queues a stopped resumable request, KV and all, in kv_holding_waiting "
        "(vllm/v1/core/sched/scheduler.py:2709-2715 _enqueue_waiting_request, 2717-2741 _handle_stopped_request), "
        "counts every WAITING_FOR_STREAMING_REQ session as running against max_num_seqs (1070-1074), and its waiting "
        "pass never preempts: a request that needs those blocks or that seat breaks the pass (1454-1461) with "
        "nothing running, so the engine idles until the session's client sends more, and for good once the resumed "
        "session (served first from kv_holding_waiting, 1063-1068) or a second session needs what the other holds. "
        "SES-003, LIV-001 and LIV-003 fire. Confirmed by rerunning against `KeepsSessionKV` (the reference without "
        "its eviction of idle sessions' KV, reference_impl/sessions.py): every decision and state agree to the end "
        "of the trace, and vLLM violates only SES-003 and the stall's liveness echoes."
        " Upstream report, with a standalone reproducer that fails on 0.33.0 and passes with our fix: "
        "[reports/vllm-v1-session-kv-held-deadlock.md](reports/vllm-v1-session-kv-held-deadlock.md).",
    ),
    "paused-new-admits-held-session": (
        "engine deviation by design (PAU-001 is stricter than vLLM's documented PAUSE_NEW)",
        "Under pause_new vLLM 0.33.0 admits a streaming session that took up an input while holding its KV: its "
        "waiting pass serves kv_holding_waiting even when paused (vllm/v1/core/sched/scheduler.py:1063-1068, 'Requests "
        "holding KV blocks are always drained first, and are the only ones admitted under PAUSED_NEW (e.g. async KV "
        "loads)'), and a stopped session re-enters that queue with its KV (2709-2715). The session's new input is new "
        "work, which a pause for new work is meant to hold back: PAU-001 fires. Confirmed by rerunning against "
        "`AdmitsHeldSessionsWhilePaused` (reference_impl/sessions.py admits_held_sessions_while_paused): every "
        "decision and state agree to the end, and vLLM violates only PAU-001."
        " Reclassified (issue 33): a deviation by design, not a vLLM defect, so no upstream report. vLLM documents "
        "it: PauseState's docstring says 'PAUSE_NEW: No new requests are scheduled, requests already in running "
        "state or holding KV blocks are scheduled' (vllm/v1/core/sched/interface.py:28-29), and a waiting session "
        "holds its KV. PAU-001's 'no waiting request is admitted' is stricter than that contract; whether it should "
        "except requests that hold KV blocks is a spec decision.",
    ),
    "session-kv-held-deadlock+session-arrival-renewed": (
        "engine defect with a noted policy deviation",
        "Both: a held session's stall and a resumed session queued by its input's arrival (`KeepsKVAndRenewsArrival`).",
    ),
    "paused-new-admits-held-session+vllm-sessions": (
        "engine deviation (PAU-001) with the other session classes",
        "The three rules above together (`VLLMSessions`): a trace where the pause admission and a held session's "
        "stall or a renewed arrival meet.",
    ),
    "session-arrival-renewed": (
        "policy (noted deviation)",
        "Under the priority policy a streaming session that takes up its next input queues by the input's arrival, "
        "not its request's: vLLM 0.33.0 sets session.arrival_time = update.arrival_time "
        "(vllm/v1/core/sched/scheduler.py:1912, _update_request_as_session), and its priority queue orders by "
        "(priority, arrival_time) (vllm/v1/request.py:357-367, Request.__lt__), so a preempted session goes "
        "behind requests that arrived after it. The spec keeps a request's arrival (POL-001, POL-003, POL-004 read "
        "it); a turn-by-turn arrival is defensible too. Confirmed by rerunning against `RenewsSessionArrival` "
        "(reference_impl/sessions.py renews_arrival_on_input): every decision and state agree to the end, and vLLM "
        "violates only the policy-order rules.",
    ),
    "lets-go-between-same-hash-inputs": (
        "policy (noted deviation)",
        "A request with two encoder inputs of one content hash lets go of the output once the first is consumed "
        "and the second not yet begun: vLLM 0.33.0 frees an input once start_pos + num_tokens <= "
        "num_computed_tokens (vllm/v1/core/sched/scheduler.py:2828-2853, Scheduler._free_encoder_inputs, called "
        "after each step at 2388-2389) and drops the request from cached[mm_hash] when it holds no other cached "
        "input with that hash (vllm/v1/core/encoder_cache_manager.py:260-298, free_encoder_input: "
        "request_hash_refs counts only inputs already scheduled); the later input takes it again, or computes it "
        "again if it was evicted meanwhile. The reference keeps it held until every input with the hash is "
        "consumed (reference_impl/encoder_budget.py release_consumed). ENC-003 allows both. Confirmed by rerunning "
        "against `LetsGoAtConsumedV1` (that release rule modelled): every decision and state agree.",
    ),
    "evicts-while-planning": (
        "deviation (both safe; vLLM may compute an evicted output again)",
        "vLLM 0.33.0 evicts unheld encoder-cache entries while it plans a chunk: EncoderCacheManager.can_allocate "
        "pops the freeable queue until the input fits (vllm/v1/core/encoder_cache_manager.py:147-194, called from "
        "Scheduler._try_schedule_encoder_inputs, scheduler.py:2154), and check_and_update_cache holds a cached entry "
        "at once (encoder_cache_manager.py:100-125). When the request is then not scheduled (its KV allocation "
        "fails, scheduler.py:1453-1461, which untouches only the holds and puts them at the back of the freeable "
        "queue), the evicted entries stay gone. The reference plans purely and evicts at commit, so it keeps an "
        "unheld entry vLLM has dropped and a later request finds it cached there and computes it in vLLM. Both are "
        "safe (ENC-002 and ENC-004 hold on both sides); vLLM wastes encoder compute. Confirmed by rerunning against "
        "`EvictsWhilePlanningV1`.",
    ),
}

CLASSES["lets-go-between-same-hash-inputs+evicts-while-planning"] = (
    CLASSES["evicts-while-planning"][0],
    "Both encoder-cache rules at once (`BothRulesV1`): `lets-go-between-same-hash-inputs` and `evicts-while-planning`.")
# streaming-mixed: an encoder rule and a session rule at once (`session_and_encoder_models`)
_ENCODER_CLASSES = ("lets-go-between-same-hash-inputs", "evicts-while-planning",
                    "lets-go-between-same-hash-inputs+evicts-while-planning")
_SESSION_CLASSES = ("session-kv-held-deadlock", "session-arrival-renewed", "session-kv-held-deadlock+session-arrival-renewed",
                    "paused-new-admits-held-session", "paused-new-admits-held-session+vllm-sessions")
CLASSES.update({
    f"{encoder}+{session}": (f"{CLASSES[encoder][0]}; {CLASSES[session][0]}",
                             f"Both at once on a trace with sessions and encoder inputs (streaming-mixed): `{encoder}` "
                             f"and `{session}`, each explained above; the reference with both rules agrees to the end.")
    for encoder in _ENCODER_CLASSES for session in _SESSION_CLASSES})


class RecordingBudgets(GenerateDoor, RecordsSnapshots, EngineWatermarkV1):
    """The V1 reference behind V1's front door, with V1's watermark rule, keeping its snapshot after
    every step's update and its output of every step."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.outputs: list = []

    def schedule(self, *outcome):
        output = super().schedule(*outcome)
        self.outputs.append(output)
        return output


@dataclasses.dataclass(frozen=True)
class ChunkPlan(EncoderPlan):
    """An encoder plan that also names every input its chunk overlaps: vLLM's request_cached_ids
    takes each of them, a duplicate of one planned in the same step too (scheduler.py:2011-2016)."""

    overlapped: tuple[int, ...] = ()


class LetsGoAtConsumed(EncoderCache):
    """vLLM 0.33.0's release rule: a request holds each input its scheduled chunks overlapped
    (request_cached_ids, encoder_cache_manager.py:236-249); after a step an input held and consumed
    is dropped (scheduler.py:2828-2853, past the placeholders), and the request lets go of the
    output once it holds no other input with that hash (request_hash_refs, 260-298). An input not
    yet scheduled does not count, so the output is let go of between two such inputs; one
    scheduled but in flight does (the pipelined flow: its chunk went out before the count moved)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.held_inputs: dict[str, set[int]] = {}

    def plan(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int, tokens: int, budget: int):
        plan = super().plan(request_id, inputs, computed, tokens, budget)
        overlapped = tuple(i for i, item in enumerate(inputs) if item.overlaps(computed, computed + plan.tokens))
        return ChunkPlan(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(EncoderPlan)},
                         overlapped=overlapped)

    def commit(self, request_id: str, inputs: tuple[EncoderInput, ...], plan) -> None:
        super().commit(request_id, inputs, plan)
        self.held_inputs.setdefault(request_id, set()).update(getattr(plan, "overlapped", ()))

    def release_consumed(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int) -> None:
        held = self.held_inputs.get(request_id, set())
        consumed = {index for index in held if inputs[index].end <= computed}
        held -= consumed
        still = {inputs[index].content_hash for index in held}
        for index in sorted(consumed):
            if inputs[index].content_hash not in still:
                self._let_go(request_id, inputs[index].content_hash)

    def release(self, request_id: str, inputs: tuple[EncoderInput, ...]) -> None:
        self.held_inputs.pop(request_id, None)
        super().release(request_id, inputs)


class EvictsWhilePlanning(EncoderCache):
    """vLLM 0.33.0's planning: ``check_and_update_cache`` holds a cached input at once and
    ``can_allocate`` evicts unheld entries as soon as an input fits only by evicting them
    (encoder_cache_manager.py:100-125 and 147-194), whether or not the request is then scheduled; a
    waiting request whose KV allocation then fails lets go of what it holds (scheduler.py:1453-1461),
    which puts those entries at the back of the freeable queue."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.planned: set[str] = set()

    def plan(self, request_id: str, inputs: tuple[EncoderInput, ...], computed: int, tokens: int, budget: int):
        plan = super().plan(request_id, inputs, computed, tokens, budget)
        for evicted in plan.evict:
            del self.freeable[evicted], self.sizes[evicted], self.users[evicted]
        for index in plan.cached:
            self._hold(request_id, inputs[index].content_hash)
        self.planned.add(request_id)
        return dataclasses.replace(plan, evict=())


class LetsGoAtConsumedAndEvictsWhilePlanning(LetsGoAtConsumed, EvictsWhilePlanning):
    """Both of vLLM's rules."""


class _DepthOne(AsyncV1Scheduler):
    """The pipelined flow at depth 1, whatever the trace's config says (the host runs vLLM so)."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(dataclasses.replace(config, pipeline_depth=1))


@functools.cache
def pipelined(model: type) -> type:
    """``model`` (`RecordingBudgets` or one of its engine models) on the pipelined flow: its rules
    over `AsyncV1Scheduler`'s steps at depth 1, V1's watermark rule still before them."""
    return type(f"{model.__name__}Async", (model, _DepthOne), {})


class EvictsWhilePlanningV1(RecordingBudgets):
    """The reference with vLLM's planning (`EvictsWhilePlanning`); used only to classify divergences."""

    cache_class: type[EncoderCache] = EvictsWhilePlanning

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.encoder = self.cache_class(config.encoder_cache_size)

    def schedule(self, *outcome):
        self.encoder.planned = set()
        output = super().schedule(*outcome)
        scheduled = {s.request_id for s in output.scheduled}
        running = {t.request_id for t in self.running}
        for rid in sorted(self.encoder.planned - scheduled - running):  # a waiting request refused its blocks
            self.encoder.release(rid, self.requests[rid].request.encoder_inputs)
        return output


class LetsGoAtConsumedV1(RecordingBudgets):
    """The reference with vLLM's release rule (`LetsGoAtConsumed`); used only to classify divergences."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.encoder = LetsGoAtConsumed(config.encoder_cache_size)


class BothRulesV1(EvictsWhilePlanningV1):
    cache_class = LetsGoAtConsumedAndEvictsWhilePlanning


class KeepsSessionKV(RecordingBudgets):
    """The reference with vLLM's sessions: one waiting for input keeps its KV and its seat whatever
    stalls (reference_impl/sessions.py ``evicts_idle_sessions``); used only to classify divergences."""

    evicts_idle_sessions = False


class RenewsSessionArrival(RecordingBudgets):
    """The reference with vLLM's arrival of a resumed session: its input's (reference_impl/sessions.py
    ``renews_arrival_on_input``); used only to classify divergences."""

    renews_arrival_on_input = True


class KeepsKVAndRenewsArrival(KeepsSessionKV):
    renews_arrival_on_input = True


class AdmitsHeldSessionsWhilePaused(RecordingBudgets):
    """The reference admitting, under pause_new, the sessions that hold their KV in waiting (vLLM's
    kv_holding_waiting; reference_impl/sessions.py ``admits_held_sessions_while_paused``)."""

    admits_held_sessions_while_paused = True


class VLLMSessions(AdmitsHeldSessionsWhilePaused):
    """All three of vLLM's session rules."""

    evicts_idle_sessions = False
    renews_arrival_on_input = True


# What a session's held KV makes the engine violate once it stalls on it (SES-003 and the stall's echoes),
# and what the spec's policy order says of a session queued by its input's arrival.
STALL = frozenset({"SES-003", "LIV-001", "LIV-002", "LIV-003"})
ORDER = frozenset({"POL-001", "POL-003", "POL-004"})

# streaming sessions' (a trace with a session is tried against these): (class, model, the violations
# vLLM may show where it agrees with the model, the one it must show)
SESSION_MODELS: tuple[tuple[str, type[RecordingBudgets], frozenset[str], str | None], ...] = (
    ("session-kv-held-deadlock", KeepsSessionKV, STALL, "SES-003"),
    ("session-arrival-renewed", RenewsSessionArrival, ORDER, None),
    ("session-kv-held-deadlock+session-arrival-renewed", KeepsKVAndRenewsArrival, STALL | ORDER, "SES-003"),
    ("paused-new-admits-held-session", AdmitsHeldSessionsWhilePaused, frozenset({"PAU-001"}), "PAU-001"),
    ("paused-new-admits-held-session+vllm-sessions", VLLMSessions, STALL | ORDER | {"PAU-001"}, None),
)

# the engine behaviours a divergence is tried against, smallest first (`classify`)
MODELS: tuple[tuple[str, type[RecordingBudgets]], ...] = (
    ("lets-go-between-same-hash-inputs", LetsGoAtConsumedV1),
    ("evicts-while-planning", EvictsWhilePlanningV1),
    ("lets-go-between-same-hash-inputs+evicts-while-planning", BothRulesV1),
)


def _path_config(path: str, config: SchedulerConfig) -> SchedulerConfig:
    # V1 has no max_num_partial_prefills (lockstep_v1's partial-prefills-not-applied) and refuses a
    # long_prefill_token_threshold over max_model_len (vllm/config/scheduler.py, SchedulerConfig checks)
    config = dataclasses.replace(config, max_num_partial_prefills=0,
                                 long_prefill_token_threshold=min(config.long_prefill_token_threshold,
                                                                  config.max_model_len))
    if path == "encoder":
        return dataclasses.replace(config, max_loras=0)
    if path == "lora":
        return dataclasses.replace(config, encoder_compute_budget=0, encoder_cache_size=0)
    return config


def path_strategy(path: str) -> st.SearchStrategy:
    if path.startswith("async-"):  # the path's traces at depth 1
        return path_strategy(path.removeprefix("async-")).map(
            lambda t: dataclasses.replace(t, config=dataclasses.replace(t.config, pipeline_depth=1)))
    if path == "streaming-mixed":
        return mixed_session_traces().map(lambda t: dataclasses.replace(t, config=_path_config(path, t.config)))
    if path in ("grammar", "streaming", "streaming-pause"):
        traces = grammar_traces() if path == "grammar" else session_traces()
        if path == "streaming-pause":  # a pause and its resume (with_budgets draws no inputs or adapters here)
            traces = traces.flatmap(lambda t: with_budgets(t, pause=True))
        return traces.map(lambda t: dataclasses.replace(t, config=_path_config(path, t.config)))
    configs = budget_configs()
    if path == "encoder":
        configs = configs.filter(lambda c: c.encoder_cache_size > 0)
    elif path == "lora":
        configs = configs.filter(lambda c: c.max_loras > 0)
    pause = {"encoder": False, "lora": False, "pause": True, "mixed": None}[path]
    return configs.map(lambda c: _path_config(path, c)).flatmap(
        lambda config: token_traces("v1", config=config)).flatmap(lambda t: with_budgets(t, pause=pause))


def budgets_state_of(snap: Snapshot, priority: bool) -> dict[str, Any]:
    state = state_of(snap, priority)
    state["encoder_cache"] = {h: (e.size, tuple(sorted(e.users))) for h, e in sorted((snap.encoder_cache or {}).items())}
    state["encoder_free"] = snap.encoder_free
    state["pause_state"] = snap.pause_state
    return state


def compare_state(result, reference: RecordingBudgets) -> tuple[int, str, Any, Any] | None:
    """The first step whose encoder inputs or state after the step differ: (step, field, reference, target)."""
    priority = result.trace.config.policy == "priority"
    for record, ref, ref_output in zip(result.records, reference.after, reference.outputs, strict=False):
        want, got = sorted(ref_output.encoder_inputs), sorted(record.output.encoder_inputs)
        if want != got:
            return record.step, "encoder_inputs", want, got
        want_state, got_state = budgets_state_of(ref, priority), budgets_state_of(record.after, priority)
        for key, value in want_state.items():
            if got_state[key] != value:
                if isinstance(value, dict):
                    diff = sorted(k for k in set(value) | set(got_state[key]) if value.get(k) != got_state[key].get(k))
                    return record.step, key, {k: value.get(k) for k in diff}, {k: got_state[key].get(k) for k in diff}
                return record.step, key, value, got_state[key]
    return None


def run_one(adapter, trace: Trace, invariants, timeout: float = 60, reference: type = RecordingBudgets,
            stop_at_first: bool = True) -> Outcome:
    """One lockstep run against ``reference``; ``stop_at_first=False`` runs on past an invariant
    violation, as the mutation benchmark's judges need (lockstep_v1's `run_one`)."""
    holder: list = []
    if trace.config.pipeline_depth:  # an async path: the model pipelined, the trace run whole (lockstep_async)
        reference, stop_at_first = pipelined(reference), False

    def factory(config: SchedulerConfig):
        holder.append(reference(config))
        return holder[-1]

    result = run_checked(adapter, trace, invariants, timeout=timeout, lockstep=True, reference_factory=factory,
                         stop_at_first=stop_at_first)
    state = compare_state(result, holder[0]) if holder else None
    if holder and trace.config.pipeline_depth:  # the delivered streams too
        tokens = compare_tokens(result, holder[0])
        if tokens is not None and (state is None or tokens[0] < state[0]):
            state = tokens
    return Outcome(result, state)


def session_and_encoder_models() -> list[tuple[str, type[RecordingBudgets], frozenset[str], str | None]]:
    """Each encoder rule of `MODELS` alone, then with each session rule of `SESSION_MODELS`: the
    models a divergence of a trace with sessions and encoder inputs is tried against (a class
    ``ENCODER+SESSION`` is both vLLM behaviours at once)."""
    models = [(name, model, frozenset(), None) for name, model in MODELS]
    for encoder_name, encoder_model in MODELS:
        for session_name, session_model, allowed, required in SESSION_MODELS:
            both = type(f"{encoder_model.__name__}With{session_model.__name__}", (encoder_model, session_model), {})
            models.append((f"{encoder_name}+{session_name}", both, allowed, required))
    return models


def agrees_to_the_end(adapter, trace: Trace, invariants, model: type, allowed: frozenset[str],
                      required: str | None) -> bool:
    """Whether vLLM agrees with ``model`` to the end of the trace, every decision and state, and
    violates only invariants in ``allowed``, ``required`` among them."""
    outcome = run_one(adapter, trace, invariants, reference=model, stop_at_first=False)
    problems = outcome.result.problem_ids - {"LOCKSTEP"}
    return (outcome.result.divergence is None and outcome.state is None and outcome.result.fault is None
            and problems <= allowed and (required is None or required in problems))


def has_encoder_inputs(request) -> bool:  # type: ignore[no-untyped-def]
    """Whether the request, or a later input of its session, has encoder inputs."""
    return bool(request.encoder_inputs) or any(piece.encoder_inputs for piece in request.session)


def classify(adapter, trace: Trace, outcome: Outcome, invariants) -> str | None:
    """The divergence's class (a key of `CLASSES`), the field it was found in when no model fits,
    or None when the trace agrees. A class is confirmed by a counterfactual, as in `lockstep_v1`:
    rerun against the reference with vLLM's behaviour modelled; it must then agree to the end."""
    if outcome.divergence_step is None:
        return None
    if trace.config.pipeline_depth and outcome.result.divergence is None and outcome.state is None \
            and outcome.result.fault is None:
        return None  # pipelined: the engine's violations the reference shares are findings (lockstep_async)
    if outcome.result.fault is not None:
        return outcome.field or "?"
    if any(a.request.session for a in trace.arrivals):
        for name, model, allowed, required in SESSION_MODELS:
            if agrees_to_the_end(adapter, trace, invariants, model, allowed, required):
                return name
        if any(has_encoder_inputs(a.request) for a in trace.arrivals):  # streaming-mixed: an encoder rule, or both
            for name, model, allowed, required in session_and_encoder_models():
                if agrees_to_the_end(adapter, trace, invariants, model, allowed, required):
                    return name
        return outcome.field or "?"
    if not any(has_encoder_inputs(a.request) for a in trace.arrivals):
        return outcome.field or "?"
    for name, model in MODELS:
        if run_one(adapter, trace, invariants, reference=model).divergence_step is None:
            return name
    return outcome.field or "?"


def sessions_drawn(traces: list[Trace]) -> dict[str, int]:
    """How many traces hold a streaming session, and one with each other feature beside it: what a
    path with sessions drew (so that a combination it claims to cover is seen to be there)."""
    counts: collections.Counter[str] = collections.Counter()
    for trace in traces:
        sessions = [a.request for a in trace.arrivals if a.request.session]
        counts["session"] += bool(sessions)
        counts["session with encoder inputs"] += any(r.encoder_inputs for r in sessions)
        counts["session with encoder inputs in a later input"] += any(p.encoder_inputs for r in sessions for p in r.session)
        counts["session with an adapter"] += any(r.lora_id for r in sessions)
        counts["session waiting for its grammar"] += any(r.grammar_ready_step is not None for r in sessions)
        counts["session and a pause"] += bool(sessions) and any(op != "resume" for _, op in trace.admin)
        counts["session with all four"] += any(r.encoder_inputs and r.lora_id and r.grammar_ready_step is not None
                                               for r in sessions) and any(op != "resume" for _, op in trace.admin)
    return dict(counts)


def run_path(adapter, path: str, count: int, seed_value: int, first: dict, invariants) -> dict[str, Any]:
    traces = sample_traces(path_strategy(path), count, seed_value)
    by_field: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    steps = agreeing = 0
    started = time.monotonic()
    for done, trace in enumerate(traces, 1):
        if done % 100 == 1 and done > 1:
            print(f"  {path}: {done - 1}/{len(traces)} traces, {agreeing} agree, {dict(by_field)}", flush=True)
        outcome = run_one(adapter, trace, invariants)
        steps += len(outcome.result.records)
        for problem in outcome.result.problem_ids - {"LOCKSTEP"}:
            violations[problem] += 1
        cls = classify(adapter, trace, outcome, invariants)
        if cls is None:
            agreeing += 1
            continue
        by_field[outcome.field or "?"] += 1
        by_class[cls] += 1
        first.setdefault((path, cls), (trace, outcome))
    return {"traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
            "divergent_by_field": dict(sorted(by_field.items())), "by_class": dict(sorted(by_class.items())),
            "violations": dict(sorted(violations.items())),
            **({"drawn": sessions_drawn(traces)} if path.removeprefix("async-").startswith("streaming") else {}),
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser(__doc__.splitlines()[0], PATHS, seed=20261203,
                             out="docs/results/lockstep-vllm-v1-budgets.json", traces_dir="docs/traces/lockstep-budgets")
    args = parser.parse_args(argv)
    started = provenance()
    paths = PATHS if args.path == "all" else (args.path,)
    adapters = {name: load_adapter(name) for name in
                {"vllm-v1-async" if p in ASYNC_PATHS else "vllm-v1" for p in paths}}
    # the pipelined paths: the async profile (its liveness and SES-003 too; at depth 1 several
    # synchronous statements fire on both sides, docs/ASYNC.md)
    profiles = {"vllm-v1": get_profile("vllm-v1").invariants(), "vllm-v1-async": get_profile("async").invariants()}
    report: dict[str, Any] = {"version": 1, "target": "vllm-v1", "package": get_target("vllm-v1").version,
                              "reference": "conformance.selftest.campaigns.lockstep_budgets:RecordingBudgets",
                              "seed": args.seed, "paths": {}, "classes": {}, "first_divergences": {}}
    if args.out.exists():
        old = json.loads(args.out.read_text())
        keep_other_paths(report, old, paths)
        report["first_divergences"] = {k: v for k, v in old.get("first_divergences", {}).items()
                                       if k.split(":", 1)[0] not in paths}
    first: dict[tuple[str, str], tuple[Trace, Outcome]] = {}
    for path in paths:
        target = "vllm-v1-async" if path in ASYNC_PATHS else "vllm-v1"
        report["paths"][path] = entry = run_path(adapters[target], path, args.traces, args.seed, first, profiles[target])
        print(json.dumps({"path": path, **entry}), flush=True)
    for (path, cls), (trace, outcome) in sorted(first.items()):
        report["first_divergences"][f"{path}:{cls}"] = {"message": outcome.describe(), "trace": trace.to_dict()}
    report["classes"] = {cls: {"kind": kind, "explanation": why} for cls, (kind, why) in CLASSES.items()}
    write_report(report, args.out, started=started)
    return 0 if all(report["paths"][p]["agreeing_traces"] == report["paths"][p]["traces"] for p in paths) else 1


if __name__ == "__main__":
    raise SystemExit(main())
