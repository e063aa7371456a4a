"""The defects kvsched found in current releases, as data an upstream report is drafted from.

One `Finding` per defect (a deviation by design is not here: docs/CONFORMANCE.md explains those).
A trace is matched to its finding by its target and its lockstep class (``meta.class``) or the
problem it was saved for (``meta.problem``). The source lines are the installed release's; ``fix``
is the minimal change the report proposes, and ``fix_patch`` names a descriptor in
docs/reports/fixes/ (`conformance.export.patching`) that applies it, or the upstream PR's, to a
copy of the engine, where the check both ways was run.
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.trace import Trace


@dataclass(frozen=True)
class Reproducer:
    """A committed trace exported for the report, and what its run on the release must say. A
    finding no kvsched host reaches (vLLM's encoder-decoder cache: no host builds that scheduler)
    has a reproducer written by hand instead: ``trace`` is "" and ``handwritten`` the committed
    file, run the same way (a plain script, its engine line, exit 1 and one FAILED line)."""

    trace: str  # path from the repository root ("" for a hand-written reproducer)
    target: str
    fails_with: str  # a piece of the FAILED line on the release: it fails for the reason reported
    with_fix: bool = True  # also run against the fix (when the finding has one)
    property: str | None = None  # None: the trace's own (`conformance.export.exporter.trace_property`)
    note: str = ""
    handwritten: str = ""  # a committed standalone file, path from the repository root
    fix_patch: str = ""  # this reproducer's engine has its own descriptor (default: the finding's)


@dataclass(frozen=True)
class Finding:
    slug: str
    targets: tuple[str, ...]
    title: str
    property: str  # the property the exported test asserts
    breaks: str  # what breaks, for whom
    expected: str
    actual: str
    source: tuple[str, ...]  # file:line(s) in the installed release, each with what it does
    fix: str
    upstream: str  # an existing issue or PR, or "none found"
    classes: tuple[str, ...] = ()  # meta.class values
    problems: tuple[str, ...] = ()  # meta.problem values (counterexamples saved by `kvsched conform`)
    fix_patch: str = ""  # docs/reports/fixes/<name>.json
    fix_is_upstream: bool = False
    reproducers: tuple[Reproducer, ...] = ()


FINDINGS: tuple[Finding, ...] = (
    Finding(
        "vllm-v1-padded-admission-cut-by-threshold", ("vllm-v1", "vllm-v1-async"),
        "vLLM V1 EngineCore dies on `assert num_new_tokens == 1 + self.num_spec_tokens` when "
        "long_prefill_token_threshold < 1 + k cuts a padded admission",
        "FAULT-raised",
        "With speculative decoding (k drafts) and chunked prefill, a waiting request with one token left to compute "
        "(a prefix-cache hit on all but its last prompt token, or a resumed request) is padded to 1 + k tokens to keep "
        "the decode batch uniform; the long-prefill threshold then cuts it below 1 + k while the padding flag stays "
        "set, and the assert kills EngineCore, ending every request in it. Sync and async schedulers alike.",
        "schedule() admits the request (padded, or with its one real token) and returns",
        "AssertionError at vllm/v1/core/sched/scheduler.py:1579 in schedule",
        ("vllm/v1/core/sched/scheduler.py:1308-1330 (the waiting loop pads a one-token admission to 1 + k and sets "
         "pad_spec_decode)",
         "vllm/v1/core/sched/scheduler.py:1332-1333 (`if 0 < long_prefill_token_threshold < num_new_tokens:` cuts it)",
         "vllm/v1/core/sched/scheduler.py:1578-1579 (`if pad_spec_decode: assert num_new_tokens == 1 + "
         "self.num_spec_tokens`)"),
        "Do not pad when the threshold cannot hold the padded width: add "
        "`and not 0 < long_prefill_token_threshold < 1 + self.num_spec_tokens` to the padding condition "
        "(scheduler.py:1311-1317), so the request keeps its one real token and no placeholder drafts. This is what "
        "vllm-project/vllm#54028 does.",
        "vllm-project/vllm#54028 \"[Bugfix][Core] Skip spec padding below prefill threshold\" (open): the same defect, "
        "reported as a worker-side divergence (two scheduled tokens, four sampling positions) on a GPU; the assert "
        "this trace trips is its scheduler-side face.",
        classes=("padded-admission-cut-by-threshold",),
        fix_patch="vllm-54028-skip-padding-below-threshold.json", fix_is_upstream=True,
        reproducers=(Reproducer("docs/traces/specdec/sync-padded-admission-cut-by-threshold.json", "vllm-v1",
                                "scheduler.py:1579"),
                     Reproducer("docs/traces/specdec/async-padded-admission-cut-by-threshold.json", "vllm-v1-async",
                                "scheduler.py:1579")),
    ),
    Finding(
        "aphrodite-padded-admission-cut-by-threshold", ("aphrodite",),
        "Aphrodite's V1 scheduler dies on `assert num_new_tokens == 1 + self.num_spec_tokens` when "
        "long_prefill_token_threshold < 1 + k cuts a padded admission (vLLM's #54028 defect, in the fork)",
        "FAULT-raised",
        "Aphrodite 0.24.1's scheduler is vLLM's V1 scheduler under another package name, and carries vLLM 0.33.0's "
        "padded-admission defect line for line: with speculative decoding (k drafts) and chunked prefill, a waiting "
        "request with one token left to compute is padded to 1 + k tokens, the long-prefill threshold then cuts it "
        "below 1 + k while the padding flag stays set, and the assert kills the engine core with every request in it. "
        "Found by exporting vLLM's reproducer for Aphrodite; the Aphrodite host replays the same trace to the same "
        "assert.",
        "schedule() admits the request (padded, or with its one real token) and returns",
        "AssertionError at aphrodite/v1/core/sched/scheduler.py:1102 in schedule",
        ("aphrodite/v1/core/sched/scheduler.py:902-922 (the waiting loop pads a one-token admission to 1 + k and "
         "sets pad_spec_decode)",
         "aphrodite/v1/core/sched/scheduler.py:924-926 (`if 0 < threshold < num_new_tokens: num_new_tokens = "
         "threshold`)",
         "aphrodite/v1/core/sched/scheduler.py:1101-1102 (`if pad_spec_decode: assert num_new_tokens == 1 + "
         "self.num_spec_tokens`)"),
        "As vllm-project/vllm#54028 proposes for vLLM: do not pad when the threshold cannot hold the padded width "
        "(add `and not 0 < self.scheduler_config.long_prefill_token_threshold < 1 + self.num_spec_tokens` to the "
        "padding condition, scheduler.py:905-911).",
        "vllm-project/vllm#54028 (open, in vLLM) is the same defect; none found for Aphrodite (searched GitHub issues and "
        "PRs for the assert and the padding).",
        classes=("padded-admission-cut-by-threshold",),
        fix_patch="aphrodite-skip-padding-below-threshold.json",
        reproducers=(Reproducer("docs/reports/traces/aphrodite-padded-admission-cut-by-threshold.json", "aphrodite",
                                "scheduler.py:1102"),),
    ),
    Finding(
        "vllm-v1-padded-admission-over-budget-stalls", ("vllm-v1", "vllm-v1-async"),
        "vLLM V1 idles for ever with a request waiting when max_num_batched_tokens < 1 + k and the head of waiting "
        "is a padded admission",
        "LIV-001",
        "With speculative decoding (k drafts), a waiting request with one token left to compute is padded to 1 + k "
        "tokens; when 1 + k exceeds the step's token budget the waiting loop 'prefers to not schedule than schedule "
        "un-padded' and breaks. With max_num_batched_tokens < 1 + k (accepted by VllmConfig) the budget never grows: "
        "with nothing running, every later step schedules nothing and the request waits until it is aborted.",
        "a step with a request waiting and nothing running admits it (un-padded when the pad cannot fit)",
        "schedule() returns an empty SchedulerOutput at every step; the request stays WAITING",
        ("vllm/v1/core/sched/scheduler.py:1310-1328 (pad to 1 + k; `if padded_num_tokens > request_token_budget: "
         "break`)",
         "vllm/v1/core/sched/scheduler.py:1316 (`scheduled_running_reqs or num_computed_tokens > 0`: the pad applies "
         "with nothing running)",
         "vllm/config/vllm.py:2370-2376 (`_set_max_num_scheduled_tokens` requires only max_num_batched_tokens > "
         "num_lookahead_tokens, 0 for the n-gram drafter)"),
        "Schedule the request un-padded instead of breaking when the pad does not fit: replace the `break` by leaving "
        "num_new_tokens at 1 (no placeholder drafts), or refuse max_num_batched_tokens < 1 + num_speculative_tokens "
        "in VllmConfig.",
        "none found (searched vllm-project/vllm issues and PRs for the padding break and the budget).",
        classes=("padded-admission-over-budget-stalls",),
        fix_patch="vllm-schedule-unpadded-over-budget.json",
        reproducers=(Reproducer("docs/traces/specdec/hunt/sync-padded-admission-over-budget-stalls.json", "vllm-v1",
                                "idles with work queued"),
                     Reproducer("docs/traces/specdec/hunt/async-padded-admission-over-budget-stalls.json",
                                "vllm-v1-async", "idles with work queued")),
    ),
    Finding(
        "aphrodite-padded-admission-over-budget-stalls", ("aphrodite",),
        "Aphrodite's V1 scheduler idles for ever with a request waiting when max_num_batched_tokens < 1 + k and the "
        "head of waiting is a padded admission (vLLM 0.33.0's stall, in the fork)",
        "LIV-001",
        "Aphrodite 0.24.1 carries vLLM 0.33.0's padding break line for line: a waiting request with one token left to "
        "compute is padded to 1 + k tokens, and when 1 + k exceeds the step's token budget the waiting loop 'prefers "
        "to not schedule than schedule un-padded' and breaks; with max_num_batched_tokens < 1 + k (accepted by "
        "AphroditeConfig, which warns only) and nothing running, every later step schedules nothing and the request "
        "waits until it is aborted. Found by exporting vLLM's reproducer for Aphrodite; the Aphrodite host replays "
        "the trace to the same stall (LIV-001, LIV-003 at step 1).",
        "a step with a request waiting and nothing running admits it (un-padded when the pad cannot fit)",
        "schedule() returns an empty SchedulerOutput at every step; the request stays WAITING",
        ("aphrodite/v1/core/sched/scheduler.py:905-922 (pad to 1 + k; `if padded_num_tokens > request_token_budget: "
         "break`)",
         "aphrodite/v1/core/sched/scheduler.py:910 (`scheduled_running_reqs or num_computed_tokens > 0`: the pad "
         "applies with nothing running)",
         "aphrodite/config/aphrodite.py:1762 (`_set_max_num_scheduled_tokens`: a budget below 1 + k is kept, with a "
         "warning)"),
        "As for vLLM: schedule the request un-padded instead of breaking when the pad does not fit and nothing else "
        "was scheduled this step (docs/reports/fixes/aphrodite-schedule-unpadded-over-budget.json), or refuse "
        "max_num_batched_tokens < 1 + num_speculative_tokens in AphroditeConfig.",
        "none found (the vLLM report, vllm-v1-padded-admission-over-budget-stalls, found none either).",
        classes=("padded-admission-over-budget-stalls",),
        fix_patch="aphrodite-schedule-unpadded-over-budget.json",
        reproducers=(Reproducer("docs/reports/traces/aphrodite-padded-admission-over-budget-stalls.json", "aphrodite",
                                "idles with work queued"),),
    ),
    Finding(
        "vllm-v1-empty-output-skips-draft-rollback", ("vllm-v1", "vllm-v1-async"),
        "vLLM V1 keeps rejected draft positions computed when the model returns no token for a request with drafts "
        "(#42722 still there)",
        "CHK-002",
        "update_from_output rolls a request's rejected drafts back only when the model returned tokens for it; for "
        "an empty output (the case of vllm-project/vllm#42722) num_computed_tokens keeps the draft positions, ends "
        "above num_tokens, and the request is never scheduled again (it holds its seat and blocks for ever).",
        "after the outcome the request's computed tokens are at most its tokens (the step rolled back)",
        "request A has 6 tokens and num_computed_tokens 8 after step 1",
        ("vllm/v1/core/sched/scheduler.py:2349-2351 (`if scheduled_spec_token_ids and (generated_token_ids or "
         "self.num_sampled_tokens_per_step == 0):` guards the rollback)",),
        "Roll back whenever the step scheduled drafts: with no generated token, treat every scheduled draft as "
        "rejected and also un-count the step's bonus position (num_computed_tokens -= len(scheduled_spec_token_ids) "
        "+ 1), as the reference does (reference_impl/specdec_scheduler.py).",
        "vllm-project/vllm#42722 (closed unmerged): the reviewer asked for a real trigger. kvsched did not find one in "
        "0.33.0's default GPU model runner (docs/SPECDEC.md); the scheduler defect stands for any runner or "
        "connector that returns no token.",
        classes=("empty-output-skips-rollback",), fix_patch="vllm-roll-back-empty-output.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-empty-output-skips-rollback.json", "vllm-v1",
                                "num_computed_tokens is 8"),
                     Reproducer("docs/reports/traces/vllm-v1-async-empty-output-skips-rollback.json", "vllm-v1-async",
                                "step 2: after update_from_output(), request A has 6 tokens but num_computed_tokens "
                                "is 8", with_fix=False,
                                note="our fix covers the synchronous scheduler only: with it the async reproducer "
                                     "still fails, at step 4 (10 computed of 8 tokens), because the step scheduled "
                                     "while the empty outcome was in flight counted from the unrolled positions")),
    ),
    Finding(
        "aphrodite-empty-output-skips-draft-rollback", ("aphrodite",),
        "Aphrodite's V1 scheduler keeps rejected draft positions computed when the model returns no token for a "
        "request with drafts (vLLM's #42722 defect, in the fork)",
        "CHK-002",
        "Aphrodite 0.24.1's update_from_output rolls a request's rejected drafts back only when the model returned "
        "tokens for it, as vLLM 0.33.0 does: for an empty output num_computed_tokens keeps the draft positions, ends "
        "above num_tokens, and the request is never scheduled again. Found by exporting vLLM's reproducer for "
        "Aphrodite; the Aphrodite host replays the trace to the same state (CHK-002, 8 computed of 6 tokens).",
        "after the outcome the request's computed tokens are at most its tokens (the step rolled back)",
        "request A has 6 tokens and num_computed_tokens 8 after step 1",
        ("aphrodite/v1/core/sched/scheduler.py:1751-1752 (`if scheduled_spec_token_ids and (generated_token_ids or "
         "self.num_sampled_tokens_per_step == 0):` guards the rollback)",),
        "Roll back whenever the step scheduled drafts: with no generated token, treat every scheduled draft as "
        "rejected and also un-count the step's bonus position, as for vLLM "
        "(docs/reports/fixes/aphrodite-roll-back-empty-output.json).",
        "vllm-project/vllm#42722 (closed unmerged, in vLLM); none found for Aphrodite. As in vLLM, no trigger in the "
        "default GPU model runner was shown; the scheduler defect stands for any runner or connector that returns "
        "no token.",
        classes=("empty-output-skips-rollback",), fix_patch="aphrodite-roll-back-empty-output.json",
        reproducers=(Reproducer("docs/reports/traces/aphrodite-empty-output-skips-rollback.json", "aphrodite",
                                "num_computed_tokens is 8"),),
    ),
    Finding(
        "vllm-v1-connector-own-reservation-stall", ("vllm-v1",),
        "vLLM V1 idles for ever with a request waiting when its asynchronous KV load failed and its retry must fit "
        "beside its own reservation",
        "LIV-001",
        "With a KV connector (kv_role kv_consumer, kv_load_failure_policy 'recompute'), a request whose asynchronous "
        "load fails on its first block keeps no valid token: when the failure is reported vLLM frees its blocks but "
        "leaves it in _inflight_prefills (it is discarded only when scheduled or finished). When the connector offers "
        "the load again and it is asynchronous, the waiting loop admits it only if it fits beside "
        "_inflight_prefill_reserved_blocks(), which sums the remaining blocks of every request in _inflight_prefills: "
        "the request itself among them. With fewer free blocks than twice its sequence, allocate_slots returns None "
        "at every step, the waiting loop breaks, and nothing else changes: the engine idles with the request waiting "
        "and free blocks (in the reproducer 4 free blocks, 3 needed, 3 reserved for itself).",
        "a step with a request waiting, nothing running and no transfer in flight admits it (loads, or computes it)",
        "from step 1 on, schedule() returns an empty SchedulerOutput and starts no load; the request stays WAITING",
        ("vllm/v1/core/sched/scheduler.py:1420-1431 (`if load_kv_async: reserved_blocks = "
         "self._inflight_prefill_reserved_blocks() + self._spec_decode_step_blocks`)",
         "vllm/v1/core/sched/scheduler.py:3432-3436 (_inflight_prefill_reserved_blocks: the remaining blocks of every "
         "request in _inflight_prefills, the one being admitted included)",
         "vllm/v1/core/sched/scheduler.py:3490-3495 (_update_waiting_for_remote_kv: a load with no valid computed "
         "token frees the request's blocks; it stays in _inflight_prefills, discarded only at :1871 and :3038)",
         "vllm/v1/core/sched/scheduler.py:1454-1461 (`if new_blocks is None: ... break`)"),
        "Leave the request out of its own reservation: _inflight_prefill_reserved_blocks(exclude=request) at the "
        "async-load admission (scheduler.py:1428), skipping `exclude` in the sum (or discard the request from "
        "_inflight_prefills when its failed load frees its blocks).",
        "none open; vllm-project/vllm#48433 \"[Bugfix][KV Connector] Preserve async load reservations\" (closed "
        "unmerged) proposed the same exclusion ('excludes the request that owns the reservation when it resumes') "
        "among wider changes. The reservation itself is #44560's deadlock fix (merged).",
        classes=("own-reservation-stall",),
        fix_patch="vllm-connector-leave-own-reservation-out.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-connector-own-reservation-stall.json", "vllm-v1",
                                "step 1: waiting=['A'] running=[]"),),
    ),
    Finding(
        "vllm-v1-connector-spec-step-reservation-stall", ("vllm-v1",),
        "vLLM V1 never admits an asynchronous KV load that fits the pool but not beside its own speculative step's "
        "reservation",
        "LIV-001",
        "With speculative decoding (k drafts) and a KV connector, an asynchronous load is admitted only if its blocks "
        "fit beside the reservations of the prefills in flight plus its own speculative step's blocks "
        "(_spec_decode_step_blocks, cdiv(1 + k + lookahead, block_size)), a guard of vllm-project/vllm#57104. When "
        "the pool holds the request but not the request and that step, allocate_slots returns None at every step, "
        "the waiting loop breaks, and nothing ignores the request or loads it otherwise: the engine idles with the "
        "request waiting, nothing running and nothing in flight (in the reproducer a pool of 2 blocks of 2 tokens, "
        "k = 2, a 3-token prompt loading 2 tokens asynchronously). Only in pools smaller than one sequence plus one "
        "speculative step: a corner, not a deployment's stall, but the request is never answered.",
        "a step with a request waiting, nothing running and no transfer in flight admits it, or refuses it as never "
        "fitting",
        "schedule() returns an empty SchedulerOutput at every step from step 0; the request stays WAITING",
        ("vllm/v1/core/sched/scheduler.py:1420-1431 (`reserved_blocks = self._inflight_prefill_reserved_blocks() + "
         "self._spec_decode_step_blocks` for an async load)",
         "vllm/v1/core/sched/scheduler.py:372-380 (_spec_decode_step_blocks)",
         "vllm/v1/core/sched/scheduler.py:1454-1461 (`if new_blocks is None: ... break`)"),
        "Admit the load without its speculative step's reservation when nothing else runs or loads (the guard "
        "protects the load against other requests, and there are none; later admissions still reserve its remaining "
        "blocks with its speculative step): `+ (self._spec_decode_step_blocks if self.running or "
        "self._inflight_prefills else 0)` at scheduler.py:1429. Or refuse (finish as ignored) a request whose load can "
        "never fit beside its own step's reservation in the whole pool.",
        "none found (searched vllm-project/vllm for the speculative step reservation of async loads); the reservation "
        "is from vllm-project/vllm#57104 (merged), which fixed the deadlock of KV connectors with MTP under KV "
        "pressure.",
        classes=("spec-step-reservation-stall",),
        fix_patch="vllm-connector-spec-step-reservation-when-others.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-connector-spec-step-reservation-stall.json", "vllm-v1",
                                "step 0: waiting=['r1'] running=[]"),),
    ),
    Finding(
        "vllm-v1-async-failed-load-keeps-placeholders", ("vllm-v1-async",),
        "vLLM V1's AsyncScheduler keeps a failed KV load's output placeholders: the recompute is scheduled past the "
        "request's last token (vllm-project/vllm#45138 and #49250 still in 0.33.0)",
        "CHK-002",
        "With async scheduling, a KV connector and kv_load_failure_policy 'recompute', a request whose synchronous load "
        "fails is cut back to its first failed block (_update_requests_with_invalid_blocks) and the failed step's "
        "output is skipped, but its num_output_placeholders stay: the failed step's placeholder and those of its "
        "later steps already in flight, which ran over the failed KV and whose tokens are still delivered when they "
        "return. The recompute counts the stale placeholders as tokens to compute (num_tokens_with_spec + "
        "num_output_placeholders - num_computed_tokens), so a step is scheduled past the request's last token, and "
        "the client gets a token sampled over KV that never loaded (in the reproducer: one 5-token request loading 4 "
        "tokens synchronously, its load failing on block 0; it has 6 tokens after step 3, the sixth sampled over "
        "the failed KV, and step 6 schedules a 7th position with all 6 computed).",
        "no step schedules a request past its tokens: the recompute computes the tokens the request has, and the "
        "outputs of steps that ran over the failed KV are dropped",
        "step 6: schedule() gives r0 1 token to compute with 6 of its 6 tokens computed",
        ("vllm/v1/core/sched/scheduler.py:3630-3633 and 3662 (_update_requests_with_invalid_blocks: "
         "`req_num_computed_tokens = request.num_computed_tokens - num_scheduled_tokens.get(req_id, 0)`, then "
         "`request.num_computed_tokens = idx * self.block_size`; num_output_placeholders, num_in_flight_tokens and "
         "the later in-flight steps are left as they were)",
         "vllm/v1/core/sched/scheduler.py:2324-2326 (update_from_output skips the failed step's output, `skip failed "
         "or rescheduled requests from KV load failure`)",
         "vllm/v1/core/sched/scheduler.py:839-843 (`num_new_tokens = request.num_tokens_with_spec + "
         "request.num_output_placeholders - request.num_computed_tokens`: the stale placeholders are scheduled)",
         "vllm/v1/core/sched/scheduler.py:1824-1836 (_preempt_request: the handling a preemption gets, "
         "num_stale_output_tokens and num_output_placeholders = 0, which the failed load does not)"),
        "Treat the failed request's steps in flight as a preemption does: in _update_requests_with_invalid_blocks, "
        "for an affected request with later steps in flight or placeholders, count none of the later steps' tokens "
        "as computed (`num_computed_tokens = min(num_computed_tokens, req_num_computed_tokens - later)`), set "
        "`num_output_placeholders = 0`, and mark the in-flight output stale and dropped (`num_stale_output_tokens = "
        "num_in_flight_tokens`, `drop_stale_output = True`), so the outputs computed over the failed KV are "
        "discarded when they return (docs/reports/fixes/vllm-connector-failed-load-drops-in-flight-steps.json). "
        "vllm-project/vllm#45146 and #49252 (part 2) reset the placeholders only. Measured against the spec's "
        "pipelined reference (which voids those steps) on 200 traces of the connector lockstep's async-fail-recompute "
        "path (`python -m conformance.selftest.campaigns.lockstep_connector --path async-fail-recompute --traces 200 "
        "--no-shrink`, 2026-12-02): on the release 130 agree and 70 diverge as failed-load-keeps-placeholders "
        "(CHK-002 x53, PIP-003 x62, LIV-002 x63); with the fix on PYTHONPATH 195 agree, none breaks CHK-002 or "
        "PIP-003, the 17 liveness violations left are the own-reservation stall's (KVC-009 x17, its own report), and "
        "5 traces diverge at step 2 on computed tokens (CHK-004 x5), not examined.",
        "vllm-project/vllm#45138 \"[load failure] request could not finish when load failure happens\" (open) and "
        "#49250 part 2 (open) report it; fixes #45146 and #49252 are open (they roll the placeholders back), #45430 "
        "(also counting older in-flight outputs as tokens to discard) was closed unmerged.",
        classes=("failed-load-keeps-placeholders",),
        fix_patch="vllm-connector-failed-load-drops-in-flight-steps.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-async-failed-load-keeps-placeholders.json",
                                "vllm-v1-async", "step 6: schedule() gives request r0 1 token(s)"),
                     Reproducer("docs/traces/lockstep-connector/async-fail-recompute-failed-load-keeps-placeholders"
                                ".json", "vllm-v1-async", "step 6: schedule() gives request r0 1 token(s)")),
    ),
    Finding(
        "vllm-v1-session-kv-held-deadlock", ("vllm-v1",),
        "vLLM V1 idles with a request waiting while a streaming session that only waits for its "
        "client's next input keeps its KV blocks",
        "SES-003",
        "A streaming-input session (a resumable request) whose generation stops before its next input has come is "
        "re-queued, KV and all, in kv_holding_waiting as WAITING_FOR_STREAMING_REQ (_handle_stopped_request). "
        "Nothing can take those blocks back: the session is not in running, so no preemption reaches it, and the "
        "waiting pass never preempts. A request that needs the blocks breaks the pass at allocate_slots with "
        "nothing running, so the engine idles until the session's client sends more, which may be never (an idle "
        "chat turn, a closed tab that keeps its socket); and for good once the resumed session, served first from "
        "kv_holding_waiting, itself needs what the other request then holds. In the reproducer a pool of 8 blocks "
        "of 4 tokens: session A (26 tokens) stops holding 7 blocks and waits for its input at step 12; B (17 "
        "tokens, 5 blocks) arrives at step 2 and waits with nothing running until step 12.",
        "a step with nothing running and a request waiting admits it, taking the KV of a session that only waits for "
        "its client (to be recomputed, or hit in the prefix cache, when the input comes)",
        "steps 2 to 11 schedule nothing; B stays WAITING and A keeps 7 of the 8 blocks",
        ("vllm/v1/core/sched/scheduler.py:2717-2741 (_handle_stopped_request: a resumable request with no queued "
         "input becomes WAITING_FOR_STREAMING_REQ and keeps its blocks; 2709-2715 _enqueue_waiting_request files it in "
         "kv_holding_waiting)",
         "vllm/v1/core/sched/scheduler.py:1063-1068 (the waiting pass drains kv_holding_waiting first) and 1070-1074 "
         "(a waiting session counts against max_num_seqs)",
         "vllm/v1/core/sched/scheduler.py:1435-1461 (allocate_slots for the waiting request; `if new_blocks is None: "
         "... break`, with no preemption on the waiting path)"),
        "When an admission's allocate_slots fails and nothing is running, free the KV blocks of the sessions that "
        "wait for their next input (num_computed_tokens = 0: the session recomputes, or hits the prefix cache, when "
        "its input comes) and try the allocation again (docs/reports/fixes/vllm-session-idle-kv-freed-when-idle.json). "
        "The seats such sessions hold (num_waiting_for_streaming_input, 1070-1074) starve admission the same way with "
        "max_num_seqs sessions waiting; the fix leaves them as they are, so it is partial. Measured on the budgets "
        "lockstep's streaming path (`python -m conformance.selftest.campaigns.lockstep_budgets --path streaming "
        "--traces 1000 --no-shrink`, 2026-12-02) with the fix on PYTHONPATH: SES-003 fires on 37 traces (the "
        "release: 86) and 930 agree with the spec's reference (the release: 910); the stalls left are the seats' and "
        "resumed sessions starving each other (vllm-project/vllm#49439's case).",
        "vllm-project/vllm#49439 \"[Bugfix][Core] Prevent streaming session deadlock under KV pressure\" (open) reclaims "
        "KV from another resumable *waiting* session when allocation fails with nothing running: resumed sessions "
        "starving each other, the second half of this report; the first, a session waiting for input that starves "
        "a plain request, is not covered there. Streaming input is #28973 (merged).",
        classes=("session-kv-held-deadlock",),
        fix_patch="vllm-session-idle-kv-freed-when-idle.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-session-kv-held-deadlock.json", "vllm-v1",
                                "step 2: nothing is running and ['B'] wait(s) to be admitted"),),
    ),
    Finding(
        "vllm-v1-session-input-past-max-model-len", ("vllm-v1",),
        "vLLM V1 takes a streaming session past max_model_len: its next input is validated alone, and the chunk "
        "then runs with no KV slots for the positions past the limit",
        "CAP-005",
        "The front end validates each streaming input alone (InputProcessor._validate_prompt_len of the one chunk), "
        "and the scheduler appends it to the session whatever the session's length (_update_request_as_session). "
        "The renewed session is admitted past max_model_len; allocate_slots caps the slots it allocates at "
        "max_model_len, so the step computes tokens whose KV has no slot in the request's block table. In the "
        "reproducer max_model_len is 16: session s (10 prompt tokens, max_tokens 4) takes an input of 8 tokens and "
        "is scheduled for 8 tokens at positions 13..20 with 16 slots. On a GPU the slot mapping of positions 16..20 "
        "reads past the table (vllm-project/vllm#42489 saw the input batch's NumPy broadcast error; #40072 an "
        "AssertionError that kills EngineCore).",
        "a session whose next input would take it past max_model_len is ended (FINISHED_LENGTH_CAPPED, as the stop "
        "checker does at max_model_len) or the input refused; no step computes a token without a KV slot",
        "step 4: schedule() gives s 8 tokens at positions 13..20 with 16 KV slots in its table",
        ("vllm/v1/engine/input_processor.py:557-575 (_validate_prompt_len: the one chunk against max_model_len) and "
         "vllm/v1/engine/async_llm.py:656-662 (each input chunk processed alone, resumable=True)",
         "vllm/v1/core/sched/scheduler.py:1879-1921 (_update_request_as_session: the kept output and the new chunk "
         "are appended, no length check), called from add_request (2939-2941) and _handle_stopped_request (2732-2737)",
         "vllm/v1/core/kv_cache_manager.py:551-553 (`num_tokens_need_slot = min(..., self.max_model_len)`)"),
        "Check the renewed length where the input is taken up: `session.num_tokens - 1 + len(update.prompt_token_ids) "
        "< max_model_len`, else end the session as FINISHED_LENGTH_CAPPED, in add_request and in "
        "_handle_stopped_request (docs/reports/fixes/vllm-session-input-past-max-model-len-capped.json). This is the "
        "rule of vllm-project/vllm#42502 (open).",
        "vllm-project/vllm#42489 (open) and #42502 \"[v1] Guard resumable streaming updates against max_model_len "
        "overflow\" (open; the same check and outcome at both call sites; a reviewer asked for a recoverable outcome "
        "instead of FINISHED_LENGTH_CAPPED, RFC #51948); #40072 \"prevent streaming sessions from exceeding "
        "max_model_len\" (open) and #51900 (open, realtime sessions) are the same defect from the realtime API.",
        classes=("session-past-max-model-len",),
        fix_patch="vllm-session-input-past-max-model-len-capped.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-session-past-max-model-len.json", "vllm-v1",
                                "step 4: schedule() gives request s 8 tokens"),),
    ),
    Finding(
        "vllm-v1-async-eagle-drop-mamba-self-preemption", ("vllm-v1-async",),
        "vLLM V1's AsyncScheduler livelocks a hybrid (attention + Mamba) model with EAGLE's block drop in a small "
        "pool: the only running request preempts itself for blocks its own in-flight step holds, for ever",
        "LIV-002",
        "With async scheduling, a full-attention + Mamba ('align') model, EAGLE's prefix-hit block drop and prefix "
        "caching, a request whose prompt needs two chunks is admitted with a prefix hit, computes its first chunk with "
        "that step in flight, and at the next schedule() its allocation for the second chunk fails: the Mamba state "
        "blocks are freed on the processed-token basis, so the in-flight chunk's state is still held. It is the only "
        "running request, so it preempts itself ('No more request to preempt'), is readmitted with the same hit "
        "(EAGLE's drop backs the cacheable Mamba state off a block, so the state after its first chunk is never a "
        "hit) and repeats. In the reproducer (5 blocks of 4 tokens, max_model_len 12, budget 5) r5 is preempted 329 "
        "times in 667 steps and r0, r2 and r4 wait behind it for ever. Without the drop the same trace finishes in 36 "
        "steps; the synchronous scheduler, with no step in flight, has no such stall. A corner of small pools (5 to 8 "
        "blocks here), but a pool vLLM accepts: it holds one max_model_len sequence.",
        "every request finishes: a request whose allocation fails for want of what its own in-flight step holds "
        "waits for that step instead of preempting itself",
        "from step 9 on, r5 is preempted at every other step (9, 11, 13, ...); after 667 steps r0, r2, r4 and r5 are "
        "unfinished",
        ("vllm/v1/core/sched/scheduler.py:913-980 (the running loop: allocate_slots fails, the victim is the request "
         "itself, `if preempted_req == request: ... break`)",
         "vllm/v1/core/kv_cache_manager.py:556-568 (remove_skipped_blocks on the processed-token basis: "
         "`total_computed_tokens - request.num_in_flight_tokens`, so the in-flight chunk's blocks stay held)",
         "vllm/v1/core/sched/scheduler.py:572-583 (with EAGLE the last cacheable Mamba position backs off a block) and "
         "vllm/v1/core/kv_cache_coordinator.py:866-905 (the hit drops its last block)",
         "vllm/v1/core/kv_cache_manager.py:531-548 (the admission check counts the whole sequence, not the chunk in "
         "flight beside the next one)"),
        "Do not let a request preempt itself while a step of it is in flight: in the running loop, after the victim is "
        "chosen, `if preempted_req is request and request.num_in_flight_tokens > 0: break` (it stays running, "
        "unscheduled for a step; its in-flight output frees the state it lacks), "
        "docs/reports/fixes/vllm-async-no-self-preemption-with-step-in-flight.json. The synchronous scheduler never "
        "has a step in flight at schedule() and is unchanged. Measured on the hybrid lockstep's async-mamba-align+eagle "
        "path (`python -m conformance.selftest.campaigns.lockstep_hybrid --path async-mamba-align+eagle --traces 1000 "
        "--no-shrink`, 2026-12-02) with the fix on PYTHONPATH: no invariant violated in 1000 traces (the release: 15 "
        "LIV-002 livelocks); 196 traces now diverge from the spec's reference, which models vLLM's self-preemption "
        "(190 at the preemption the fix removes, 6 in what is scheduled after it).",
        "none found for this path; related: vllm-project/vllm#52520 (open), a hybrid Mamba 'align' request near the "
        "pool's ceiling admitted, prefilled, requeued and re-prefilled for ever (a fork build, reported without "
        "preemptions counted), and #33997 (merged), which enabled Mamba 'align' prefix caching with async "
        "scheduling. vllm-project/vllm#50630 (EAGLE with Mamba) is another defect, not reproduced on 0.33.0 "
        "(docs/HYBRID.md).",
        classes=("eagle-drop-mamba-self-preemption",),
        fix_patch="vllm-async-no-self-preemption-with-step-in-flight.json",
        reproducers=(Reproducer("docs/reports/traces/vllm-v1-async-eagle-drop-mamba-self-preemption.json",
                                "vllm-v1-async", "r5 was preempted 329 times"),),
    ),
    Finding(
        "vllm-v1-encdec-encoder-slots-credited", ("vllm-v1",),
        "vLLM V1's encoder-decoder encoder cache credits a request's encoder slots again on every decode step, so "
        "can_allocate admits more encoder inputs than the cache holds (vllm-project/vllm#55733 still in 0.33.0)",
        "ENC-002",
        "For encoder-decoder models (Whisper-class ASR), Scheduler._free_encoder_inputs runs for every request with "
        "encoder inputs after every step and, once the request has computed a token, frees every input "
        "EncoderDecoderCacheManager.get_cached_input_ids returns; that is every input of the request, every step, "
        "and free_encoder_input adds the input's embeddings to num_free_slots unconditionally. The free space grows "
        "by the input's size at each decode step, so can_allocate stops bounding the encoder outputs held at once: in "
        "the reproducer a cache of 100 embeddings admits two 100-embedding inputs in one step (num_free_slots reads "
        "300 before them, the cache's size being 100).",
        "an encoder input is admitted only where the cache has room for it: each input's embeddings are freed once, "
        "so the free space is the cache size less the embeddings of the inputs admitted and not yet freed",
        "num_free_slots grows by 100 at each decode step of request A (100, 200, 300) and step 3 admits B and C, "
        "200 embeddings in a cache of 100",
        ("vllm/v1/core/sched/scheduler.py:2828-2846 (_free_encoder_inputs: `if self.is_encoder_decoder and "
         "request.num_computed_tokens > 0: self._free_encoder_input(request, input_id)` for every cached input, each "
         "step)",
         "vllm/v1/core/sched/scheduler.py:2388-2389 (update_from_output calls it for every request with encoder "
         "inputs)",
         "vllm/v1/core/encoder_cache_manager.py:430-431 (EncoderDecoderCacheManager.get_cached_input_ids: "
         "`set(range(len(request.mm_features)))`, whatever was freed)",
         "vllm/v1/core/encoder_cache_manager.py:443-445 (free_encoder_input: `self.num_free_slots += "
         "num_encoder_embeds`, no guard)"),
        "Make the release idempotent, as vllm-project/vllm#51228 does: EncoderDecoderCacheManager keeps the inputs "
        "it allocated per request, get_cached_input_ids returns those not yet freed, and free_encoder_input credits "
        "an input's embeddings only if it is still allocated.",
        "vllm-project/vllm#51228 \"[Bugfix][Core] Make EncoderDecoderCacheManager slot release idempotent\" (open); "
        "issue vllm-project/vllm#55733 (closed in favour of #51228; its duplicate fix #55734 closed).",
        fix_patch="vllm-51228-encdec-free-once.json", fix_is_upstream=True,
        reproducers=(Reproducer("", "vllm-v1", "step 3: can_allocate admitted C's 100 encoder embeddings",
                                property="ENC-002",
                                handwritten="docs/reports/vllm-v1-encdec-encoder-slots-credited/"
                                            "test_vllm_v1__encdec_encoder_slots_credited.py"),),
    ),
    Finding(
        "nano-vllm-seats-overfilled", ("nano-vllm",),
        "nano-vllm runs more than max_num_seqs sequences: the prefill loop counts only this step's admissions",
        "BUD-003",
        "Scheduler.schedule starts num_seqs at 0 each step and counts only the sequences it admits now, so with "
        "sequences already running it admits (prefills) up to max_num_seqs more: the running queue grows past "
        "max_num_seqs. The decode loop still schedules at most max_num_seqs a step, so the extra sequences hold "
        "their KV blocks without being scheduled (in the reproducer r1 is prefilled at step 1 and then waits in "
        "running until r0 finishes), taking blocks that force preemptions of the sequences that do run; "
        "max_num_seqs no longer bounds the resident sequences. kvsched states the bound as BUD-003, which the "
        "nano-vllm profile claims (it is policy for engines that rotate more resident requests than they batch).",
        "after schedule(), len(running) <= max_num_seqs",
        "2 sequences running with max_num_seqs 1",
        ("nanovllmnpu/engine/scheduler.py:27-29 (`num_seqs = 0`; `while self.waiting and num_seqs < "
         "self.max_num_seqs:`)",),
        "Count the running sequences: `while self.waiting and len(self.running) < self.max_num_seqs:` (admitted "
        "sequences are appended to running, line 39).",
        "none found; upstream nano-vllm (GeeeekExplorer/nano-vllm) has the same loop.",
        classes=("seats-overfilled",), problems=("BUD-003",),
        fix_patch="nano-vllm-count-running-seats.json",
        reproducers=(Reproducer("docs/reports/traces/nano-vllm-seats-overfilled.json", "nano-vllm", "max_num_seqs=1"),
                     Reproducer("docs/traces/nano-vllm/handmade/seats-overfilled.json", "nano-vllm", "max_num_seqs=1"),
                     Reproducer("docs/traces/lockstep-nano/seats-overfilled.json", "nano-vllm", "max_num_seqs=1")),
    ),
    Finding(
        "nano-vllm-nothing-schedulable-assert", ("nano-vllm", "nano-vllm-fork"),
        "nano-vllm crashes on `assert scheduled_seqs` when a waiting prompt can never fit and nothing runs",
        "FAULT-raised",
        "A waiting request whose prompt needs more blocks than the whole cache (or more tokens than the budget) is "
        "never admitted and never refused; once nothing runs, schedule() has scheduled nothing and the closing assert "
        "kills the engine.",
        "schedule() refuses (finishes) a request that can never fit, and returns",
        "AssertionError at nanovllmnpu/engine/scheduler.py:57 in schedule",
        ("nanovllmnpu/engine/scheduler.py:29-33 (the head that does not fit ends the prefill loop: no ignore path)",
         "nanovllmnpu/engine/scheduler.py:57 (`assert scheduled_seqs`)"),
        "Refuse at the door a prompt that can never be admitted (longer than max_num_batched_tokens, or needing more "
        "blocks than num_kvcache_blocks): a ValueError from Scheduler.add, which LLMEngine.add_request passes to the "
        "caller, as vLLM's input processor does for a prompt over its limit. (Finishing it in schedule() instead "
        "would need an 'ignored' output, which nano-vllm's LLMEngine has not.)",
        "none found.",
        classes=("nothing-schedulable-assert",), problems=("FAULT-raised",),
        fix_patch="nano-vllm-refuse-never-fitting-prompt.json",
        reproducers=(Reproducer("docs/reports/traces/nano-vllm-nothing-schedulable-assert.json", "nano-vllm",
                                "AssertionError at scheduler.py:57"),
                     Reproducer("docs/traces/nano-vllm/counterexamples/FAULT-raised.json", "nano-vllm",
                                "AssertionError at scheduler.py:57"),
                     Reproducer("docs/traces/nano-vllm-fork/counterexamples/FAULT-raised.json", "nano-vllm-fork",
                                "AssertionError at scheduler.py:",
                                fix_patch="nano-vllm-fork-refuse-never-fitting-prompt.json")),
    ),
    Finding(
        "nano-vllm-fork-preempted-victim-stays-running", ("nano-vllm-fork",),
        "nano-vllm-fork leaves a preempted sequence in `running`: it is in two queues and is scheduled twice",
        "QUE-001",
        "In the decode loop the fork preempts `temp_running.pop(0)`, and preempt() never removes the victim from "
        "self.running: it is in waiting and running at once, is re-admitted, is scheduled twice in one step (two "
        "tokens in one step) and a later may_append raises IndexError on its empty block table.",
        "after schedule(), every request is in exactly one queue",
        "the victim is in ['waiting', 'running']",
        ("nanovllm/engine/scheduler.py: Scheduler.schedule, the decode loop over temp_running (preempts "
         "temp_running.pop(0))", "nanovllm/engine/scheduler.py: Scheduler.preempt (appends to waiting, leaves running)"),
        "Remove the victim from self.running in preempt() (or preempt from the list that is scheduled).",
        "none found.",
        problems=("QUE-001", "QUE-002", "REQ-004", "OUT-001", "CHK-004"),
        fix_patch="nano-vllm-fork-preempt-leaves-running.json",
        reproducers=(Reproducer("docs/traces/nano-vllm-fork/counterexamples/QUE-001.json", "nano-vllm-fork",
                                "is in 2 queues"),
                     Reproducer("docs/traces/nano-vllm-fork/counterexamples/REQ-004.json", "nano-vllm-fork",
                                "tokens in one step")),
    ),
    Finding(
        "tokasaurus-one-token-request-precise-onboard-assert", ("tokasaurus",),
        "tokasaurus' manager dies on `assert additional_blocks_needed == 0` when precise onboarding considers a "
        "max_tokens=1 request whose prompt is not cached",
        "FAULT-raised",
        "With precise onboarding (tokasaurus' default), a waiting request that does not fit coarsely is "
        "soft-allocated (soft_allocate: kv_indices is its cached prefix only) and try_onboarding_seqs simulates the "
        "block usage over time; calc_block_usage_over_time asserts that a sequence whose expected completion is one "
        "token needs no additional blocks, but a soft-allocated prompt still needs its uncached blocks, so the "
        "assert fails and the manager process dies (error_propogation_decorator), ending every request. max_tokens=1 "
        "is an ordinary request (classification, scoring) and passes the server's length check.",
        "schedule_steps onboards (or defers) the request and returns",
        "AssertionError at tokasaurus/manager/scheduler.py:180 in calc_block_usage_over_time",
        ("tokasaurus/manager/scheduler.py:156-180 (calc_block_usage_over_time: the additional blocks are counted, "
         "then `else: assert additional_blocks_needed == 0` for a one-token completion)",
         "tokasaurus/manager/manager.py:426-440 (soft_allocate: `seq.kv_indices = cached_block_ids`, the cached "
         "prefix only)",
         "tokasaurus/manager/scheduler.py:408-417 (try_onboarding_seqs calls calc_block_usage_over_time with the "
         "soft-allocated candidates)"),
        "Drop the assertion (scheduler.py:179-180): the sequence's additional blocks are already added to "
        "num_used_decode_blocks (line 170), so a one-token completion that needs blocks is planned for like any "
        "other; only its last-page bookkeeping is skipped, as now.",
        "none found (searched GitHub issues for tokasaurus and the assert).",
        problems=("FAULT-raised",), fix_patch="tokasaurus-count-one-token-completion-blocks.json",
        reproducers=(Reproducer("docs/examples/tokasaurus/traces/FAULT-raised.json", "tokasaurus",
                                "AssertionError at scheduler.py:180"),),
    ),
    Finding(
        "vllm-v0-swap-in-never-leaks-cpu-blocks", ("vllm-v0",),
        "vLLM V0 leaks a swapped group's CPU blocks for good when its swap-in can never fit",
        "RES-004",
        "A swapped group whose swap-in can never fit (can_swap_in answers NEVER) is marked FINISHED_IGNORED and "
        "dropped from the swapped queue without free_seq; free_finished_seq_groups visits only running, so its CPU "
        "blocks are never freed and the swap space shrinks for good.",
        "a finished sequence holds no block",
        "the ignored request still holds its CPU blocks",
        ("vllm/core/scheduler.py: Scheduler._schedule_swapped, the AllocStatus.NEVER branch (marks FINISHED_IGNORED, "
         "calls no free_seq)", "vllm/core/scheduler.py: Scheduler.free_finished_seq_groups (visits running only)"),
        "Call self.free_seq(seq) for each sequence of the group in the NEVER branch before dropping it.",
        "none found; V0 was removed from vLLM after 0.10.x, so the report is for users of the V0 engine and its "
        "forks.",
        classes=("swap-in-never-leaks-cpu-blocks",), problems=("RES-005", "RES-004"),
        fix_patch="vllm-v0-free-never-swappable.json",
        reproducers=(Reproducer("docs/traces/lockstep/swap-in-never-leaks-cpu-blocks.json", "vllm-v0",
                                "still holds blocks"),
                     Reproducer("docs/traces/vllm-v0/counterexamples/RES-005.json", "vllm-v0", "still holds blocks")),
    ),
    Finding(
        "vllm-v0-priority-swap-out-lost", ("vllm-v0",),
        "vLLM V0's priority preemption by swap loses the swap-out map and files the SWAPPED victim in waiting",
        "SWP-001",
        "Scheduler._schedule_priority_preemption preempts into a local blocks_to_swap_out list that is never returned "
        "into SchedulerOutputs, then puts the victim in the waiting queue. When _preempt picks swap, the victim's "
        "blocks move to CPU in the block tables but its KV is never copied (swap-in later reads garbage), and a "
        "SWAPPED group sits in waiting.",
        "every GPU block of a group swapped out in the step is in the step's blocks_to_swap_out",
        "the swap-out map is empty while the victim is SWAPPED",
        ("vllm/core/scheduler.py:977 and 1012-1013 (0.10.2, _schedule_priority_preemption: local blocks_to_swap_out; "
         "`waiting_queue.appendleft(vseq_group)`)",),
        "Preempt priority victims by recompute only (their group goes to waiting), or return the swap-out list into "
        "the step's SchedulerOutputs and put a SWAPPED victim in self.swapped.",
        "none found; V0 was removed from vLLM after 0.10.x.",
        classes=("priority-swap-out-lost",), problems=("SWP-001", "SWP-003", "QUE-002"),
        fix_patch="vllm-v0-priority-preempt-by-recompute.json",
        reproducers=(Reproducer("docs/traces/vllm-v0/counterexamples/QUE-002.json", "vllm-v0",
                                "in the waiting queue with status SWAPPED"),
                     Reproducer("docs/traces/vllm-v0/counterexamples/SWP-001.json", "vllm-v0",
                                "its KV is never copied", with_fix=False,
                                note="with the fix the victim is recomputed, not swapped: SWP-001 has nothing to "
                                     "check (the exported test says its trigger never held), so only QUE-002 is "
                                     "run against the fix"),
                     Reproducer("docs/traces/lockstep/priority-swap-out-lost.json", "vllm-v0",
                                "its KV is never copied", with_fix=False, note="as above")),
    ),
    Finding(
        "vidur-restart-assertion", ("vidur-vllm", "vidur-sarathi"),
        "Vidur crashes on `assert self._num_stage_processed_tokens <= self.total_tokens` after a restart",
        "FAULT-raised",
        "Request.restart resets _num_processed_tokens but not _num_stage_processed_tokens nor "
        "_is_prefill_stage_complete, so the re-prefill's stage tokens add to the first prefill's and the assert in "
        "on_batch_stage_end fails: every simulation in which a restarted request re-prefills more than the tokens "
        "left crashes.",
        "the simulator runs a recompute-preempted request again to its end",
        "AssertionError at vidur/entities/request.py:300 in on_batch_stage_end",
        ("vidur/entities/request.py:328-344 (Request.restart)", "vidur/entities/request.py:300 (the assert)"),
        "Reset the stage counters in Request.restart: `self._num_stage_processed_tokens = 0` and "
        "`self._is_prefill_stage_complete = False` beside `_num_processed_tokens = 0`.",
        "none found in microsoft/vidur.",
        classes=("restart-assertion",), problems=("FAULT-raised",),
        fix_patch="vidur-restart-resets-stage-counters.json",
        reproducers=(Reproducer("docs/traces/vidur-vllm/counterexamples/FAULT-raised.json", "vidur-vllm",
                                "AssertionError at request.py:300"),
                     Reproducer("docs/traces/vidur-sarathi/counterexamples/FAULT-raised.json", "vidur-sarathi",
                                "AssertionError at request.py:300"),
                     Reproducer("docs/traces/lockstep-vidur/spec-restart-assertion.json", "vidur-vllm",
                                "AssertionError at request.py:300")),
    ),
    Finding(
        "vidur-never-fitting-request-waits", ("vidur-vllm", "vidur-sarathi", "vidur-orca"),
        "Vidur's replica schedulers leave a request that can never fit at the head of the queue for ever",
        "LIV-001",
        "_can_allocate_request only answers 'not now': a prompt that needs more blocks than the pool holds waits at "
        "the head of the queue for ever and blocks every request behind it (vLLM ignores it, AllocStatus.NEVER).",
        "with nothing running, the head of waiting is admitted or dropped as never fitting",
        "every step schedules nothing with the request waiting",
        ("vidur/scheduler/replica_scheduler/vllm_replica_scheduler.py: _can_allocate_request",
         "vidur/scheduler/replica_scheduler/sarathi_replica_scheduler.py: _can_allocate_request",
         "vidur/scheduler/replica_scheduler/orca_replica_scheduler.py: _get_next_batch (can_allocate)"),
        "When a request needs more blocks than num_blocks, drop it from the queue (and record it as ignored), as "
        "vLLM's AllocStatus.NEVER does.",
        "none found in microsoft/vidur.",
        classes=("never-fits-not-ignored",), problems=("LIV-001", "LIV-003"),
        reproducers=tuple(Reproducer(f"docs/traces/vidur-{kind}-liveness/counterexamples/LIV-001.json", f"vidur-{kind}",
                                     "idles with work queued") for kind in ("vllm", "sarathi", "orca")),
    ),
    Finding(
        "vidur-sarathi-restart-mid-prefill", ("vidur-sarathi",),
        "Vidur's Sarathi scheduler restarts a request mid-prefill with its prompt cut to the chunks done",
        "REQ-004",
        "Request.restart makes the tokens processed so far the new prompt and the rest decode tokens, which is right "
        "only past the prefill; Sarathi picks victims with _preempted_requests.pop(-1), which can be mid chunked "
        "prefill: its sequence shrinks and the rest of its prompt is then 'generated' a token a step.",
        "a request's tokens never go down",
        "a request's length goes down at the restart",
        ("vidur/entities/request.py:328-344 (Request.restart: `_num_prefill_tokens = _num_processed_tokens`)",
         "vidur/scheduler/replica_scheduler/sarathi_replica_scheduler.py: _get_next_batch (victim "
         "`_preempted_requests.pop(-1)`)"),
        "In Request.restart keep the original prompt length when the prefill was not complete: "
        "`_num_prefill_tokens = max(_num_prefill_tokens, _num_processed_tokens)` and the decode tokens left unchanged.",
        "none found in microsoft/vidur.",
        problems=("REQ-004",),
        reproducers=(Reproducer("docs/traces/vidur-sarathi/counterexamples/REQ-004.json", "vidur-sarathi",
                                "tokens were dropped"),),
    ),
)


def finding_of(trace: Trace, target: str) -> Finding | None:
    """The finding a trace of ``target`` shows: by its lockstep class, else by the problem it was saved for."""
    cls = trace.meta.get("class")
    problem = trace.meta.get("problem")
    for finding in FINDINGS:
        if target not in finding.targets:
            continue
        if cls is not None and cls in finding.classes:
            return finding
    for finding in FINDINGS:
        if target in finding.targets and cls is None and problem in finding.problems:
            return finding
    return None


def get_finding(slug: str) -> Finding:
    for finding in FINDINGS:
        if finding.slug == slug:
            return finding
    raise KeyError(slug)
