"""Strict lockstep: the reference's KV-connector flow against vLLM 0.33.0's V1 scheduler with a
scripted KV connector (conformance/targets/hosts/vllm_kv_connector.py, docs/CONNECTORS.md).

    python -m conformance.selftest.campaigns.lockstep_connector [--path remote-sync|remote-async|offload|
        fail-recompute|fail-fail|delayed-free|PATH+spec|async-PATH|async-PATH+spec|all] [--traces 1000]
        [--seed 20261202] [--out docs/results/lockstep-connector.json]
        [--traces-dir docs/traces/lockstep-connector] [--no-shrink]

Each path is the connector generator's traces (`conformance.generation.connector`) with the
scripts shaped to one connector behaviour:

* ``remote-sync`` / ``remote-async``: the decode side of disaggregated prefill, every script a load
  of external tokens, synchronous or asynchronous (1-4 steps), nothing failing, nothing sent;
* ``offload``: an offloading connector's scheduler side: asynchronous loads past the local prefix
  hit (prefix caching on), also after a preemption, and stores that keep a finished request's
  blocks (delayed frees), in a small pool;
* ``fail-recompute`` / ``fail-fail``: loads, synchronous and asynchronous, of which some blocks
  fail, under each ``kv_load_failure_policy``;
* ``delayed-free``: no loads, finished requests' blocks held for a send of 1-4 steps, with aborts.

The reference is `EngineConnectorV1` (vLLM's watermark rule, failed blocks kept cached under
recompute, a retried load's own blocks in its reservation) behind V1's door, and each step compares
the decisions and then the state (lockstep_v1's `compare_state`). Each ``async-PATH`` is PATH's
traces at pipeline depth 1 on vLLM's ``AsyncScheduler`` (the ``vllm-v1-async`` host) against
`EngineConnectorAsyncV1` (the same knobs on the pipelined, fencing reference), comparing the
delivered token counts too (lockstep_async's `run_one`); a divergence no excuse explains is rerun
against each model of `MODELS` (a counterfactual: the class is the model against which every
decision and state agree). A divergence is classified by
`classify` into `CLASSES`; a trace on which the engine breaks an invariant while agreeing with the
reference (which models vLLM) is counted as agreeing, and its violations are listed: those are the
hunt's findings (docs/CONNECTORS.md, section 6). Each is rerun against the reference with one vLLM
finding fixed (`FINDINGS`: the own-reservation stall); a violation that is then gone is counted as
that finding's, the rest as unexplained (the first trace of each is kept).

Each ``PATH+spec`` (and ``async-PATH+spec``) is PATH's traces with speculative decoding: k in
1..4 drafts and the trace's draft decisions (`conformance.generation.specdec.with_drafts`),
played by the host's n-gram drafter and rejection sampler as on lockstep_specdec's paths, against
the reference with lockstep_specdec's vLLM knobs and vLLM's speculative-step reservation beside
async loads (`RecordingConnectorSpecV1`, `RecordingConnectorAsyncSpec`).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import time
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.connector import connector_traces
from conformance.generation.specdec import with_drafts
from conformance.generation.v0 import sample_traces
from conformance.runner.adapter import load_adapter
from conformance.selftest.campaigns import lockstep_async, lockstep_v1
from conformance.selftest.campaigns.campaign_args import campaign_parser, keep_class_trace, provenance, write_report
from conformance.selftest.campaigns.door import GenerateDoor
from conformance.selftest.campaigns.lockstep_specdec import CLASSES as SPECDEC_CLASSES
from conformance.selftest.campaigns.lockstep_v1 import Outcome
from conformance.selftest.campaigns.recording import RecordsSnapshots
from conformance.targets import get_target
from reference_impl.kv_connector_scheduler import EngineConnectorAsyncV1, EngineConnectorV1
from spec.config import SchedulerConfig
from spec.connector import ConnectorScript
from spec.trace import Trace

BASE_PATHS = ("remote-sync", "remote-async", "offload", "fail-recompute", "fail-fail", "delayed-free")
# Each path with speculative decoding: k in 1..MAX_K drafts and the trace's draft decisions
# (`conformance.generation.specdec.with_drafts`), vLLM's n-gram drafter proposing as the trace says.
SYNC_PATHS = BASE_PATHS + tuple(f"{p}+spec" for p in BASE_PATHS)
# The same paths on vLLM's pipelined AsyncScheduler (the vllm-v1-async host: outcomes one step late)
# against the pipelined connector reference (`EngineConnectorAsyncV1`, depth 1).
ASYNC_PATHS = tuple(f"async-{p}" for p in SYNC_PATHS)
PATHS = SYNC_PATHS + ASYNC_PATHS
# class -> (kind, explanation with the vLLM source location)
CLASSES: dict[str, tuple[str, str]] = {
    "frees-in-set-order": (
        "engine-deviation (nondeterministic)",
        "vLLM 0.33.0 frees several requests of one step in the iteration order of a Python set, which follows the "
        "string hashes of their ids (PYTHONHASHSEED) and so changes from run to run: the requests a failed load "
        "touched under kv_load_failure_policy fail (`finish_requests(error_req_ids, FINISHED_ERROR)`, "
        "vllm/v1/core/sched/scheduler.py:2557-2575, which makes them `set(request_ids)`, :2983), and the requests the "
        "workers report in `KVConnectorOutput.finished_recving` / `finished_sending`, both sets "
        "(`_update_from_kv_xfer_finished`, :3556-3582; vllm/v1/outputs.py:215-218). The reference frees them in a "
        "fixed order (id order; reported transfers in the order they started); the free blocks are the same, their "
        "order in the free queue (the eviction order) is not.",
    ),
    "padded-admission-cut-by-threshold": (
        "vllm-defect",
        "+spec paths only, FAULT-raised (AssertionError at vllm/v1/core/sched/scheduler.py:1579): as on "
        "lockstep_specdec's paths, " + SPECDEC_CLASSES["padded-admission-cut-by-threshold"][1],
    ),
    "failed-load-keeps-drafts": (
        "vllm-deviation",
        "+spec paths only. When a synchronous load fails, vLLM 0.33.0 skips the failed step's sampled token "
        "(vllm/v1/core/sched/scheduler.py:2324-2326) and cuts num_computed_tokens back to the first failed block "
        "(:3660-3661), but keeps the drafts the drafter proposed from that step's sample: update_draft_token_ids "
        "drops drafts only for a request whose `is_prefill_chunk` is set (:2872-2876), and that flag was set when "
        "the failed step was scheduled, as its last prompt chunk. The recompute chunk then schedules them after the "
        "prompt (num_tokens_with_spec, :839-843): a prefill with drafts (SPD-002), verified by the target model, so "
        "the stream is unharmed. The reference drops them with the failed step's output. Recognised structurally "
        "(`keeps_failed_load_drafts`): the first divergence is that request's tokens, by exactly its drafts, in the "
        "step after its failed synchronous load was reported.",
    ),
    "failed-load-pads-admission": (
        "vllm-deviation",
        "+spec paths only. When a synchronous load fails, vLLM 0.33.0 cuts the request's num_computed_tokens back "
        "to the first failed block (vllm/v1/core/sched/scheduler.py:3660-3661) but leaves its `is_prefill_chunk` as "
        "the failed step set it (:1863-1865): False, when that step was its last prompt chunk. In the next step the "
        "running loop schedules its recompute chunk, a prefill, without setting `prefill_scheduled` "
        "(`prefill_scheduled |= request.is_prefill_chunk`, :998), so the waiting loop pads a one-token admission "
        "to 1 + k with placeholder drafts (:1308-1330), which it does only when no prefill runs in the step, or, "
        "when 1 + k does not fit the budget left, does not schedule it (:1326-1328). The "
        "reference counts the recompute as the prefill it is and admits the request with its one token. The "
        "stream is unharmed (placeholder drafts are rejected: SPD-008's finding). Recognised structurally "
        "(`pads_beside_failed_load`): the step after a failed synchronous load was reported, the only differences "
        "are one-token admissions padded to 1 + k (or left out) and, for the failed requests, their kept drafts "
        "(failed-load-keeps-drafts).",
    ),
    "failed-load-keeps-placeholders": (
        "vllm-defect",
        "Pipelined paths only (AsyncScheduler). When a synchronous load fails, vLLM 0.33.0 cuts the request's "
        "`num_computed_tokens` back to the first failed block (`_update_requests_with_invalid_blocks`, "
        "vllm/v1/core/sched/scheduler.py:3660-3661) and skips the step's output (:2324-2326), but leaves "
        "`num_output_placeholders` as they were: the failed step's placeholder and those of its later steps already "
        "in flight, which computed over the failed KV and whose tokens are still delivered when they return "
        "(:2401-2406). The next chunk counts the stale placeholders as tokens to compute "
        "(`num_tokens + num_output_placeholders - num_computed_tokens`, :839-843), a request can then compute past "
        "its tokens, and a placeholder can outlive every step in flight (PIP-003, CHK-002, CHK-004 fire on the "
        "engine). A request that only redoes its step (its failed block is another request's to recompute) is set "
        "back by the processed step's tokens only, while its count also holds its later in-flight step's "
        "(:3631-3633, 3672-3682). vllm-project/vllm#45138 and #49250 (fixes #45146 and #49252 open, #45430 closed unmerged). The "
        "spec's pipelined reference voids the failed step's placeholder and the request's later in-flight steps "
        "(`AsyncV1Scheduler._kv_skip_failed`). Counterfactual: `KeepsPlaceholdersAsync` "
        "(`keeps_failed_load_placeholders`, with vLLM's placeholder-reading max_tokens test, :800-813, and chunk "
        "cap, :851-857; with drafts `KeepsPlaceholdersAsyncSpec`, also with vLLM's rejection rollback only from a "
        "positive count, :2361-2362, and the failed step's draft proposal verified by the kept step after it, "
        "the drafter having run on the failed step), against which every decision and state agree."
        " Upstream report, with standalone reproducers that fail on 0.33.0 and pass with our fix: "
        "[reports/vllm-v1-async-failed-load-keeps-placeholders.md](reports/vllm-v1-async-failed-load-keeps-placeholders.md).",
    ),
}


class RecordingConnectorV1(GenerateDoor, RecordsSnapshots, EngineConnectorV1):
    """The connector reference in vLLM's terms behind V1's door, keeping its snapshot after every step."""


class RecordingConnectorAsync(GenerateDoor, RecordsSnapshots, EngineConnectorAsyncV1):
    """The pipelined connector reference in vLLM's terms at depth 1 (the host runs vLLM at depth 1
    whatever the trace's config says), behind V1's door, keeping its snapshot after every step."""

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(dataclasses.replace(config, pipeline_depth=1))


class KeepsPlaceholdersAsync(RecordingConnectorAsync):
    """With vLLM's kept placeholders after a failed synchronous load
    (`AsyncV1Scheduler.keeps_failed_load_placeholders`). Used only to classify divergences."""

    keeps_failed_load_placeholders = True
    # With placeholders that no in-flight step resolves, vLLM's own tests of the running loop tell
    # apart from the reference's (equal while every placeholder is an in-flight sample): the
    # max_tokens test reads the placeholders (scheduler.py:800-813) and every chunk is capped at
    # ``max_model_len - num_computed_tokens - 1`` (:851-857).
    clamps_chunk_at_max_model_len = True

    def _in_flight_reaches_limit(self, tracked, counters) -> bool:  # type: ignore[no-untyped-def]
        return bool(counters.num_placeholders) and (tracked.num_computed + 2 - counters.num_placeholders
                                                     >= tracked.request.prompt_len + tracked.request.max_tokens)


class RecordingConnectorSpecV1(RecordingConnectorV1):
    """`RecordingConnectorV1` with vLLM's speculative-decoding rules (lockstep_specdec's knobs: drafts
    past max_tokens, a one-token admission padded to 1 + k, the running-chunk clamp) and its
    speculative-step reservation beside async loads (`ConnectorFlow.reserves_spec_steps`)."""

    drafts_past_max_tokens = True
    pads_new_decode_drafts = True
    clamps_chunk_at_max_model_len = True
    reserves_spec_steps = True


class RecordingConnectorAsyncSpec(RecordingConnectorAsync):
    """`RecordingConnectorAsync` with `RecordingConnectorSpecV1`'s speculative-decoding knobs."""

    drafts_past_max_tokens = True
    pads_new_decode_drafts = True
    clamps_chunk_at_max_model_len = True
    reserves_spec_steps = True


class KeepsPlaceholdersAsyncSpec(RecordingConnectorAsyncSpec, KeepsPlaceholdersAsync):
    """`KeepsPlaceholdersAsync` with speculative decoding. Used only to classify divergences."""


# the async paths' counterfactuals: class -> the reference that models the engine's behaviour
MODELS: tuple[tuple[str, type[RecordingConnectorAsync]], ...] = (
    ("failed-load-keeps-placeholders", KeepsPlaceholdersAsync),
)
SPEC_MODELS: tuple[tuple[str, type[RecordingConnectorAsync]], ...] = (
    ("failed-load-keeps-placeholders", KeepsPlaceholdersAsyncSpec),
)


class OwnReservationLeftOut(RecordingConnectorV1):
    """The own-reservation finding fixed (docs/CONNECTORS.md section 6): a retried load's own
    blocks are not in its reservation. Used only to explain the engine's violations."""

    reserves_own_blocks = False


class OwnReservationLeftOutAsync(RecordingConnectorAsync):
    reserves_own_blocks = False


class OwnReservationLeftOutSpec(RecordingConnectorSpecV1):
    reserves_own_blocks = False


class OwnReservationLeftOutAsyncSpec(RecordingConnectorAsyncSpec):
    reserves_own_blocks = False


class CappedDrafts(RecordingConnectorSpecV1):
    """Drafts capped at max_tokens (the spec's SPD-004). Used only to explain the engine's violations."""

    drafts_past_max_tokens = False


class CappedDraftsAsync(RecordingConnectorAsyncSpec):
    drafts_past_max_tokens = False


class UnpaddedAdmission(RecordingConnectorSpecV1):
    """No placeholder drafts on a one-token admission (the spec's SPD-008). Used only to explain
    the engine's violations."""

    pads_new_decode_drafts = False


class UnpaddedAdmissionAsync(RecordingConnectorAsyncSpec):
    pads_new_decode_drafts = False


class NoSpecStepReservation(RecordingConnectorSpecV1):
    """Async loads without vLLM's speculative-step reservation (the spec-step reservation stall,
    docs/CONNECTORS.md section 7). Used only to explain the engine's violations."""

    reserves_spec_steps = False


class NoSpecStepReservationAsync(RecordingConnectorAsyncSpec):
    reserves_spec_steps = False


def _whole_recompute(base: type) -> type:
    """``base`` with the spec's rule for a running recompute without chunked prefill: whole or not
    this step (`ConnectorFlow.chunks_recompute_without_chunked_prefill` off). Used only to explain
    the engine's violations."""
    return type(f"{base.__name__}WholeRecompute", (base,), {"chunks_recompute_without_chunked_prefill": False})


def _dropping_failed_keys(base: type) -> type:
    """``base`` with the spec's rule for a failed load's blocks: their keys leave the prefix cache
    (`ConnectorFlow.keeps_failed_blocks_cached` off). Used only to explain the engine's violations."""
    return type(f"{base.__name__}DroppingFailedKeys", (base,), {"keeps_failed_blocks_cached": False})


def _cutting_sharers(base: type) -> type:
    """``base`` with the spec's rule for a request sharing a failed block: it is cut back to it as its
    owner is (`ConnectorFlow.sharers_keep_failed_blocks` off). Used only to explain the engine's
    violations."""
    return type(f"{base.__name__}CuttingSharers", (base,), {"sharers_keep_failed_blocks": False})


# Findings that explain the engine's violations on a trace where it agrees with the reference in
# vLLM's terms: finding -> the reference with that one vLLM rule fixed, by (pipelined, drafts). A
# violation the fixed reference no longer shows on the trace is the finding's.
FINDINGS: dict[str, dict[tuple[bool, bool], type]] = {
    "own-reservation-stall": {(False, False): OwnReservationLeftOut, (True, False): OwnReservationLeftOutAsync,
                              (False, True): OwnReservationLeftOutSpec, (True, True): OwnReservationLeftOutAsyncSpec},
    # lockstep_specdec's two documented deviations of the spec's draft policies (its CLASSES)
    "drafts-past-max-tokens": {(False, True): CappedDrafts, (True, True): CappedDraftsAsync},
    "pads-new-decode-drafts": {(False, True): UnpaddedAdmission, (True, True): UnpaddedAdmissionAsync},
    "spec-step-reservation-stall": {(False, True): NoSpecStepReservation, (True, True): NoSpecStepReservationAsync},
    # vLLM keeps a failed synchronous load's blocks cached under recompute (scheduler.py:3759-3760),
    # and never collects the blocks a sharer of a failed block computed over it (:3669-3670): with
    # drafts SPD-007 sees them keyed past the sharer's computed tokens (vllm-project/vllm#26813's
    # review, #49250)
    "failed-blocks-stay-cached": {(a, d): _dropping_failed_keys(reference) for (a, d), reference in {
        (False, False): RecordingConnectorV1, (True, False): RecordingConnectorAsync,
        (False, True): RecordingConnectorSpecV1, (True, True): RecordingConnectorAsyncSpec}.items()},
    # vLLM lets a request that hit a failed block in its owner's step keep it as computed
    # (scheduler.py:3644-3651, 3671-3680): KVC-011 once the owner's recompute is chunked (the hunt
    # failed_block_readers); a later request's hit on the still-keyed block is failed-blocks-stay-cached's
    "sharer-keeps-failed-block": {(a, d): _cutting_sharers(reference) for (a, d), reference in {
        (False, False): RecordingConnectorV1, (True, False): RecordingConnectorAsync,
        (False, True): RecordingConnectorSpecV1, (True, True): RecordingConnectorAsyncSpec}.items()},
    # vLLM's running loop chunks a failed load's recompute with chunked prefill off
    # (scheduler.py:838-847, against the waiting loop's :1337-1344): BUD-004 and REQ-004
    "recompute-chunked-without-chunked-prefill": {(a, d): _whole_recompute(reference) for (a, d), reference in {
        (False, False): RecordingConnectorV1, (True, False): RecordingConnectorAsync,
        (False, True): RecordingConnectorSpecV1, (True, True): RecordingConnectorAsyncSpec}.items()},
}


def _shape(path: str, script: ConnectorScript) -> ConnectorScript:
    r = dataclasses.replace
    if path == "remote-sync":
        return r(script, load_async=False, failed_blocks=(), send_steps=0)
    if path == "remote-async":
        return r(script, load_async=True, failed_blocks=(), send_steps=0)
    if path == "offload":
        return r(script, load_async=True, failed_blocks=())
    if path in ("fail-recompute", "fail-fail"):
        return r(script, failed_blocks=script.failed_blocks or (0,), send_steps=0)
    return r(script, external_tokens=0, load_async=False, failed_blocks=(), send_steps=script.send_steps or 2)


def _shaped(path: str, trace: Trace) -> Trace:
    pipelined = path.startswith("async-")
    path = path.removeprefix("async-")
    config = dataclasses.replace(trace.config, pipeline_depth=1) if pipelined else trace.config
    if path == "offload":
        config = dataclasses.replace(config, enable_prefix_caching=True)
    if path.startswith("fail-"):
        config = dataclasses.replace(config, kv_load_failure_policy=path.removeprefix("fail-"))
    aborts = trace.aborts if path in ("delayed-free", "remote-async", "offload") else ()
    return dataclasses.replace(trace, config=config, aborts=aborts,
                               connector={rid: _shape(path, s) for rid, s in trace.connector.items()})


def path_strategy(path: str) -> st.SearchStrategy:
    if path.endswith("+spec"):  # with_drafts rebuilds the trace from its V1 fields: the scripts are put back
        return path_strategy(path.removesuffix("+spec")).flatmap(
            lambda t: with_drafts(t).map(lambda d: dataclasses.replace(d, connector=t.connector)))
    return connector_traces().map(lambda t: _shaped(path, t))


def reference_of(path: str) -> type:
    """The reference in vLLM's terms a path's engine runs in lockstep with."""
    if path.startswith("async-"):
        return RecordingConnectorAsyncSpec if path.endswith("+spec") else RecordingConnectorAsync
    return RecordingConnectorSpecV1 if path.endswith("+spec") else RecordingConnectorV1


def run_one(adapter, trace: Trace, invariants, path: str, reference: type | None = None) -> Outcome:
    """One strict-lockstep run of ``trace`` on ``path``'s engine against its reference (or ``reference``)."""
    if path.startswith("async-"):
        return lockstep_async.run_one(adapter, trace, invariants, reference=reference or reference_of(path))
    return lockstep_v1.run_one(adapter, trace, invariants, reference=reference or reference_of(path))


def explain_violations(trace: Trace, path: str, problems: set[str], invariants) -> dict[str, str]:
    """For a trace on which the engine agrees with the reference in vLLM's terms (so shares its
    violations), which finding explains each violation: the one whose fixed reference
    (`FINDINGS`), run through the same checks on the same trace, no longer shows it."""
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked

    explained: dict[str, str] = {}
    key = (path.startswith("async-"), path.endswith("+spec"))
    models = {finding: by_key[key] for finding, by_key in FINDINGS.items() if key in by_key}

    def gone(name: str, model: type) -> set[str]:
        return problems - run_checked(SchedulerAdapter(name, model), trace, invariants, timeout=60,
                                      stop_at_first=False).problem_ids

    for finding, model in models.items():
        for problem in sorted(gone(finding, model) - set(explained)):
            explained[problem] = finding
    # a violation two findings cause together (either alone still causes it): the smallest set fixed
    groups = [list(pair) for pair in itertools.combinations(models, 2)] + [list(models)] * (len(models) > 2)
    for group in groups:
        if not problems - set(explained):
            break
        together = type("FindingsFixed", tuple(models[f] for f in group), {})
        for problem in sorted(gone("+".join(group), together) - set(explained)):
            explained[problem] = "+".join(group)
    return explained


def run_path(adapter, path: str, count: int, seed_value: int, first: dict, invariants) -> dict[str, Any]:
    traces = sample_traces(path_strategy(path), count, seed_value)
    by_field: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    # on agreeing traces: "FINDING: INVARIANT" -> traces (`explain_violations`), and those no finding explains
    explained: collections.Counter[str] = collections.Counter()
    unexplained: collections.Counter[str] = collections.Counter()
    steps = agreeing = drafted = 0
    started = time.monotonic()
    for done, trace in enumerate(traces, 1):
        if done % 100 == 1 and done > 1:
            print(f"  {path}: {done - 1}/{len(traces)} traces, {agreeing} agree, {dict(by_field)}", flush=True)
        outcome = run_one(adapter, trace, invariants, path)
        steps += len(outcome.result.records)
        drafted += sum(1 for r in outcome.result.records for s in r.output.scheduled if s.num_drafts)
        problems = outcome.result.problem_ids - {"LOCKSTEP"}
        for problem in problems:
            violations[problem] += 1
        cls = classify(outcome)
        if cls == "unclassified" and path.startswith("async-"):
            cls = counterfactual(adapter, trace, invariants, path) or cls
        if cls is None:
            agreeing += 1
            if problems:
                why = explain_violations(trace, path, problems, invariants)
                for problem in sorted(problems):
                    if problem in why:
                        explained[f"{why[problem]}: {problem}"] += 1
                    else:
                        unexplained[problem] += 1
                        first.setdefault((path, f"violation-{problem}"), (trace, outcome))
            continue
        by_field[outcome.field or "?"] += 1
        by_class[cls] += 1
        first.setdefault((path, cls), (trace, outcome))
    return {"traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
            "divergent_by_field": dict(sorted(by_field.items())), "by_class": dict(sorted(by_class.items())),
            "violations": dict(sorted(violations.items())),
            "violations_explained_on_agreeing": dict(sorted(explained.items())),
            "violations_unexplained_on_agreeing": dict(sorted(unexplained.items())),
            **({"scheduled_with_drafts": drafted} if path.endswith("+spec") else {}),
            "seconds": round(time.monotonic() - started, 1)}


def classify(outcome: Outcome) -> str | None:
    """None when the engine and the reference agree on every decision and every state (the
    engine's own invariant violations, which the reference in vLLM's terms shares, are findings,
    not divergences); else the divergence's class, or ``unclassified``."""
    result = outcome.result
    if result.divergence is None and outcome.state is None and result.fault is None:
        return None
    if result.divergence is None and result.fault is None and outcome.state is not None:
        step, field, want, got = outcome.state
        # a pipelined engine's frees of a step may be fenced (gpu_fenced) and come back in the next
        for record in result.records[max(step - 1, 0): step + 1]:
            errors = sum(1 for f in record.finished if f.status.value == "FINISHED_ERROR")
            reported = len(record.after.kv_reported or {})
            if field == "gpu_free_ids" and errors + reported >= 2 and sorted(want) == sorted(got) and (
                    record.step == step or record.after.gpu_fenced):
                return "frees-in-set-order"
    if result.fault is not None and result.fault.kind == "config-rejected":
        return "config-rejected"
    if result.fault is not None and "scheduler.py:1579" in str(result.fault):  # lockstep_specdec's class
        return "padded-admission-cut-by-threshold"
    if keeps_failed_load_drafts(outcome):
        return "failed-load-keeps-drafts"
    if pads_beside_failed_load(outcome):
        return "failed-load-pads-admission"
    return "unclassified"


def _failed_sync_loads(result, step: int) -> set[str]:  # type: ignore[no-untyped-def]
    """The requests whose synchronous load the outcome before ``step`` reported failed."""
    reported = result.records[step - 1].after.kv_reported or {}
    return {rid for rid, t in reported.items() if t.kind == "load" and not t.load_async and t.failed}


def pads_beside_failed_load(outcome: Outcome) -> bool:
    """Whether the first divergence is vLLM padding a one-token admission to 1 + k beside the
    recompute of a failed synchronous load (class ``failed-load-pads-admission``): in the step after
    the failure was reported, every request the two sides schedule differently is either a
    one-token admission the engine pads to 1 + k (k drafts) or leaves out (its 1 + k past the
    budget), or a failed request that the engine schedules with more tokens by exactly the drafts
    it kept (``failed-load-keeps-drafts``); at least one is such an admission, and a failed request
    is scheduled."""
    result = outcome.result
    d = result.divergence
    if d is None or d.field != "scheduled" or outcome.state is not None and outcome.state[0] < d.step \
            or not 0 < d.step < len(result.records):
        return False
    failed = _failed_sync_loads(result, d.step)
    items = {s.seq_id: s for s in result.records[d.step].output.scheduled}
    want = {sid: tokens for sid, tokens, _ in set(d.reference) - set(d.target)}
    got = {sid: tokens for sid, tokens, _ in set(d.target) - set(d.reference)}
    if not failed or not got.keys() <= want.keys() or not any(sid.split("#")[0] in failed for sid in items):
        return False
    # a one-token admission whose 1 + k did not fit the budget left is not scheduled at all
    # ("Prefer to not schedule than schedule un-padded", scheduler.py:1326-1328)
    dropped = want.keys() - got.keys()
    if any(want[sid] != 1 for sid in dropped):
        return False
    padded = len(dropped)
    for sid, tokens in got.items():
        item = items.get(sid)
        if item is None or not item.num_drafts or tokens - want[sid] != item.num_drafts:
            return False
        if sid.split("#")[0] in failed:
            continue  # its kept drafts
        if want[sid] != 1:  # (then the engine's tokens are 1 + its drafts)
            return False
        padded += 1
    return padded > 0


def keeps_failed_load_drafts(outcome: Outcome) -> bool:
    """Whether the first divergence is vLLM scheduling, in the step after a request's synchronous
    load failed, the drafts proposed from that failed step beside its recompute (class
    ``failed-load-keeps-drafts``): the only difference is that request's tokens, by exactly the
    drafts it carries, and the step before reported its failed load."""
    result = outcome.result
    d = result.divergence
    if d is None or d.field != "scheduled" or outcome.state is not None and outcome.state[0] < d.step \
            or not 0 < d.step < len(result.records):
        return False
    want, got = set(d.reference), set(d.target)
    if len(want - got) != 1 or len(got - want) != 1:
        return False
    (sid, ref_tokens, _), (tsid, tokens, _) = next(iter(want - got)), next(iter(got - want))
    item = next((s for s in result.records[d.step].output.scheduled if s.seq_id == tsid), None)
    reported = result.records[d.step - 1].after.kv_reported or {}
    failed = reported.get(tsid.split("#")[0])
    return sid == tsid and item is not None and item.num_drafts > 0 and tokens - ref_tokens == item.num_drafts \
        and failed is not None and failed.kind == "load" and not failed.load_async and bool(failed.failed)


def counterfactual(adapter, trace: Trace, invariants, path: str) -> str | None:
    """The class whose model (`MODELS`) explains the divergence: rerun against the reference with
    that engine behaviour modelled, and every decision and state then agree (or differ only as
    `classify` excuses)."""
    for cls, model in SPEC_MODELS if path.endswith("+spec") else MODELS:
        again = run_one(adapter, trace, invariants, path, reference=model)
        if classify(again) in (None, "frees-in-set-order"):
            return cls
    return None


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser(__doc__.splitlines()[0], PATHS, seed=20261202, out="docs/results/lockstep-connector.json",
                             traces_dir="docs/traces/lockstep-connector")
    args = parser.parse_args(argv)
    started = provenance()
    paths = PATHS if args.path == "all" else (args.path,)
    invariants = get_profile("connector").invariants()
    targets = {"vllm-v1": [p for p in paths if p in SYNC_PATHS], "vllm-v1-async": [p for p in paths if p in ASYNC_PATHS]}
    report: dict[str, Any] = {"version": 1, "target": "vllm-v1", "package": get_target("vllm-v1").version,
                              "reference": "conformance.selftest.campaigns.lockstep_connector:RecordingConnectorV1",
                              "targets": {"vllm-v1": "conformance.selftest.campaigns.lockstep_connector:RecordingConnectorV1",
                                          "vllm-v1-async": "conformance.selftest.campaigns.lockstep_connector:RecordingConnectorAsync"},
                              "seed": args.seed, "paths": {}, "classes": {}}
    if args.out.exists():
        old = json.loads(args.out.read_text())
        if old.get("version") == 1:
            report["paths"] = {p: v for p, v in old.get("paths", {}).items() if p not in paths}
            for cls, entry in old.get("classes", {}).items():  # each class's traces on the paths not rerun
                kept = {p: e for p, e in entry.get("paths", {}).items() if p not in paths}
                if kept:
                    report["classes"][cls] = {**entry, "paths": kept}
    first: dict[tuple[str, str], tuple[Trace, Outcome]] = {}
    for name, run in targets.items():
        if not run:
            continue
        adapter = load_adapter(name)
        for path in run:
            report["paths"][path] = entry = {"target": name, **run_path(adapter, path, args.traces, args.seed, first,
                                                                        invariants)}
            print(json.dumps({"path": path, **entry}), flush=True)
        close = getattr(adapter, "close", None)
        if close is not None:
            close()
    for (path, cls), (trace, outcome) in sorted(first.items()):
        kind, why = CLASSES.get(cls, ("open", "not yet explained"))
        if cls.startswith("violation-"):  # an agreeing trace's violation no finding explains
            kind, why = "open-violation", f"the engine breaks {cls.removeprefix('violation-')} with the reference in vLLM's terms"
        meta = {"adapter": "vllm-v1-async" if path in ASYNC_PATHS else "vllm-v1", "profile": "connector",
                "path": path, "class": cls, "kind": kind,
                "field": outcome.field, "message": outcome.describe(), "steps": len(outcome.result.records)}
        keep_class_trace(report, args.traces_dir, path, cls, kind, why, trace, meta, outcome.describe(),
                         name=f"{path}-{cls}.json")
    write_report(report, args.out, started=started)
    unexplained = any(c not in CLASSES for p in paths for c in report["paths"][p]["by_class"])
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
