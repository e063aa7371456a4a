"""Generate docs/CONFORMANCE.md from the committed result files in docs/results/.

    python -m conformance.selftest.campaigns.conformance_md [--results docs/results] [--out docs/CONFORMANCE.md]

Per-target reports are `kvsched conform --json` files (``<target>.json``); the lockstep campaigns
are ``lockstep-vllm-v0.json`` and ``lockstep-nano-vllm.json``; causes of each finding are in `CAUSES` (file and function in the
target's source).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from conformance.selftest.campaigns.campaign_args import run_line

TARGETS = ("nano-vllm", "nano-vllm-fork", "vllm-v0", "vllm-v1", "sglang", "sglang-liveness", "lmdeploy",
           "lmdeploy-liveness", "aphrodite", "aphrodite-liveness", "vidur-vllm", "vidur-vllm-liveness", "vidur-sarathi",
           "vidur-sarathi-liveness", "vidur-orca", "vidur-orca-liveness")
# vllm-v0's report is its safety run; its policy is checked by the lockstep campaign below.
# sglang-liveness is the sglang target's liveness run (sglang.json is its safety run); likewise
# for lmdeploy, aphrodite and the vidur-* targets.

CAUSES: dict[tuple[str, str], str] = {
    ("nano-vllm", "BUD-003"): "`nanovllmnpu/engine/scheduler.py: Scheduler.schedule` counts only this step's admissions against `max_num_seqs` (`num_seqs` starts at 0), so running can exceed it.",
    ("nano-vllm", "STR-002"): "same cause as BUD-003 (`Scheduler.schedule`, prefill loop).",
    ("nano-vllm", "LEN-001"): "nothing in `engine/scheduler.py: Scheduler.postprocess` checks `max_model_len`; only EOS and `max_tokens` stop a sequence.",
    ("nano-vllm", "LEN-002"): "`Scheduler.schedule` admits any prompt that fits the token budget and the free blocks; no prompt limit (max_model_len) check.",
    ("nano-vllm", "LEN-003"): "an over-long prompt is never finished as ignored (no ignore path in `Scheduler.schedule`).",
    ("nano-vllm", "BUD-004"): "prefix caching is always on (`engine/block_manager.py: BlockManager.allocate`): a recomputed victim's blocks are found again, so its re-prefill computes fewer tokens than it has uncomputed. A feature outside the spec's default path, not a defect.",
    ("nano-vllm", "FAULT-raised"): "`Scheduler.schedule` ends with `assert scheduled_seqs`: a waiting prompt that can never fit the free blocks with nothing running crashes the engine instead of being ignored.",
    ("nano-vllm-fork", "QUE-001"): "`nanovllm/engine/scheduler.py: Scheduler.schedule` (decode loop over `temp_running`) preempts `temp_running.pop(0)` and `preempt()` never removes the victim from `self.running`: it is in waiting and running at once, is re-admitted, appears twice, and a later `may_append` raises IndexError on its empty table.",
    ("nano-vllm-fork", "QUE-002"): "same cause as QUE-001: a WAITING victim left in `self.running`.",
    ("nano-vllm-fork", "OUT-001"): "same cause as QUE-001: the victim left in `self.running` is re-admitted and then scheduled twice in one step.",
    ("nano-vllm-fork", "REQ-004"): "same cause as QUE-001: scheduled twice, the sequence gains two tokens in one step.",
    ("nano-vllm-fork", "CHK-004"): "same cause as QUE-001: scheduled twice, the sequence computes two tokens where one was given.",
    ("vllm-v0", "FAULT-raised"): "`vllm/core/scheduler.py: Scheduler._swap_out` raises RuntimeError('Aborted due to the lack of CPU swap space') when a swap victim does not fit the CPU pool; no fallback to recompute.",
    ("vllm-v0", "RES-005"): "`vllm/core/scheduler.py: Scheduler._schedule_swapped`, AllocStatus.NEVER branch: a swapped group that can never be swapped back in is marked FINISHED_IGNORED without `free_seq`, so its CPU blocks leak for good (a finished sequence still holds blocks a step later).",
    ("vllm-v0", "SWP-001"): "`vllm/core/scheduler.py: Scheduler._schedule_priority_preemption` (0.10.2, lines 977 and 1012-1013): a victim is preempted with `self._preempt(vseq_group, blocks_to_swap_out)` into a local `blocks_to_swap_out` list that is never returned, then put back in the waiting queue. When `_preempt` picks swap (preemption_mode='swap', or the default for a group with more than one running sequence) the group is marked SWAPPED and `_swap_out` puts its block mapping in that local list, which never reaches the step's `blocks_to_swap_out`: the KV is never copied to the CPU, and the SWAPPED group waits in the waiting queue. Hidden before by the capacity invariants that failed first (issue 15).",
    ("vllm-v0", "SWP-003"): "same cause as SWP-001: the swapped victim's mapping never reaches the step's swap-out list.",
    ("vllm-v0", "QUE-002"): "same cause as SWP-001: the SWAPPED victim is appended to the waiting queue (`waiting_queue.appendleft(vseq_group)`), not to `self.swapped`.",
}
for inv in ("LEN-001", "LEN-002", "LEN-003", "FAULT-raised"):
    CAUSES[("nano-vllm-fork", inv)] = CAUSES[("nano-vllm", inv)].replace("nanovllmnpu", "nanovllm")

_LMDEPLOY_EMPTY = (
    "deviation by design: `lmdeploy/pytorch/engine/engine.py: Engine._add_message` (469-481) clips `max_new_tokens` "
    "to `max_session_len - prompt_len`, 0 for a prompt that fills `max_session_len = min(max_model_len, "
    "(num_gpu_blocks - 1) * block_size)` (`_get_max_session_len`, 328-341); the prefill then appends no token and "
    "finishes the sequence (`strategies/ar/sequence.py: ARSequenceStrategy.update_running`, the `max_new_tokens == 0` "
    "branch). The spec expects a scheduled prefill to produce a token; LMDeploy answers with an empty completion.")
CAUSES[("lmdeploy", "REQ-004")] = CAUSES[("lmdeploy-liveness", "REQ-004")] = _LMDEPLOY_EMPTY
for _run in ("lmdeploy", "lmdeploy-liveness"):
    CAUSES[(_run, "RES-003")] = (
        "deviation by design (lazy recompute eviction): `lmdeploy/pytorch/paging/scheduler.py: Scheduler.preempt_seqs` "
        "(520-526) moves a victim of `schedule_running` to `WaitingState` (`seq_states/states.py:152-153`) without "
        "releasing anything; its blocks and KV go only when another sequence needs the room "
        "(`eviction_helper/recompute_eviction_helper.py: _reclaim_candidate`, 104-118, `release_paging_resources`), "
        "and a victim whose blocks were not reclaimed resumes without recomputing. The spec (vLLM's recompute) frees "
        "the victim's blocks at preemption, so a waiting sequence holds none.")
    CAUSES[(_run, "CAP-003")] = "same cause as RES-003: the waiting victim keeps its computed tokens."
    CAUSES[(_run, "CHK-003")] = "same cause as RES-003: a recompute preemption does not reset the computed count."
_VIDUR = "vidur/scheduler/replica_scheduler"
for _kind in ("vllm", "sarathi", "orca"):
    for _run in (f"vidur-{_kind}", f"vidur-{_kind}-liveness"):
        CAUSES[(_run, "LEN-001")] = (
            "deviation by design: a Vidur request runs exactly its `num_decode_tokens` (`vidur/entities/request.py: "
            "Request.on_batch_end`); nothing stops it at max_model_len. Vidur's request generators never draw a request "
            "longer than `max_tokens`, so its schedulers have no limit of their own.")
        CAUSES[(_run, "LEN-002")] = (
            f"deviation by design: `{_VIDUR}/{_kind}_replica_scheduler.py: _get_next_batch` admits any prompt; no "
            "prompt limit (see LEN-001 on why).")
        CAUSES[(_run, "LEN-003")] = "same cause as LEN-002: an over-long prompt is run, never finished as ignored."
        CAUSES[(_run, "FAULT-raised")] = (
            "defect: a restarted (recompute-preempted) request crashes the simulator. `vidur/entities/request.py: "
            "Request.restart` (328-344) resets `_num_processed_tokens` but not `_num_stage_processed_tokens` nor "
            "`_is_prefill_stage_complete`, so the re-prefill's stage tokens add to the first prefill's and "
            "`Request.on_batch_stage_end` fails `assert self._num_stage_processed_tokens <= self.total_tokens` "
            "(request.py:300). Every restart that re-prefills more than the tokens left trips it.")
        CAUSES[(_run, "LIV-001")] = (
            f"defect: a prompt that can never fit the pool (or a restarted request that has outgrown it) waits at the "
            f"head of the queue for ever: `{_VIDUR}/{_kind}_replica_scheduler.py: _can_allocate_request` (or "
            "`can_allocate` for Orca) only says 'not now', nothing ignores it, and it blocks every request behind it.")
        CAUSES[(_run, "LIV-002")] = "same cause as LIV-001."
        CAUSES[(_run, "LIV-003")] = "same cause as LIV-001."
        CAUSES[(_run, "BUD-001")] = (
            f"deviation by design: Orca batches at iteration level with no token budget: `{_VIDUR}/orca_replica_scheduler.py: "
            "_get_next_batch` bounds a batch by `_max_batch_size` and by the blocks it reserves, never by tokens "
            "(`OrcaSchedulerConfig` has no token limit), so one step may prefill more than max_num_batched_tokens.")
        CAUSES[(_run, "REQ-004")] = (
            "defect: `vidur/entities/request.py: Request.restart` (328-344) makes the tokens processed so far the new "
            "prompt (`_num_prefill_tokens = _num_processed_tokens`) and the rest decode tokens, which is right only "
            f"for a request past its prefill. Sarathi (`{_VIDUR}/sarathi_replica_scheduler.py: _get_next_batch`) picks "
            "victims with `_preempted_requests.pop(-1)`, which can be a request in the middle of a chunked prefill: "
            "its prompt shrinks to the chunks done (the sequence's length goes down) and the rest of its prompt is "
            "then generated one token a step.")

# Findings of earlier runs that turned out to be the runner's, with what fixed them.
RESOLVED = [
    "**Resolved: the Vidur FAULT-hang** (reported before as open for vidur-vllm and vidur-orca, safety and liveness: "
    "one call \"not answered within 60-180 s\" per 300-trace run on a loaded machine, at different calls and steps, "
    "every saved trace replaying cleanly). No call hung: the runner's watchdog misread the shared call stamp. The "
    "adapter's process rewrote the stamp's fields one at a time (`conformance/runner/channel.py`, `Stamp.leave`), and when "
    "it was preempted between storing the start time 0.0 and clearing the call, the watchdog read a call in progress "
    "that had started at 0.0 on the monotonic clock (the machine's uptime ago) and killed the process as hung; the "
    "faulthandler stack it took showed wherever that healthy process was (`threading.py:331`, `json/decoder.py:353`). "
    "The Vidur hosts' calls are the cheapest and most numerous of any target, so they met the window most often; "
    "load 7-17 on 2 cores opened it. Reproduced at once (seed 20261201, vidur-orca safety: a \"hang in snapshot: "
    "no answer within 60 s\" in a run that took 17.6 s in all); measured on the stamp alone, a child entering and "
    "leaving calls at full speed against the watchdog's reading showed 30 false hangs in 21,313 readings. The stamp "
    "is now a seqlock (a count of writes begun before the fields, of writes ended after them; the reader takes a "
    "reading only when the two agree): 0 in 27,969 readings, and the six Vidur runs above, repeated at load 11-17, "
    "have no FAULT-hang (tests/test_channel.py). The same runs also showed each engine error restarting its host "
    "(the wire client left it marked busy): fixed, a 300-trace vidur-vllm run went from 571 s to 19-30 s.",
]

HANDMADE = {
    "nano-vllm-fork": [("QUE-001", "docs/traces/nano-vllm-fork/handmade/preempted-victim-stays-running.json"),
                       ("QUE-002", "docs/traces/nano-vllm-fork/handmade/preempted-victim-stays-running.json")],
}


def build(results: Path) -> str:
    reports = {}
    for t in TARGETS:
        path = results / f"{t}.json"
        if path.exists():
            reports[t] = json.loads(path.read_text())
    status: dict[str, dict[str, tuple[str, str | None]]] = {}
    ids: list[str] = []
    for t, rep in reports.items():
        for row in rep["invariants"]:
            if row["id"] not in ids:
                ids.append(row["id"])
            status.setdefault(row["id"], {})[t] = (row["status"], row.get("counterexample"))
    for t, extra in HANDMADE.items():
        for inv, path in extra:
            if inv not in ids:
                ids.append(inv)
            cur = status.setdefault(inv, {}).get(t)
            if cur is None or cur[0] != "fail":
                status[inv][t] = ("fail", path)
    lines = [
        "# Conformance of real third-party schedulers",
        "",
        "Generated by `python -m conformance.selftest.campaigns.conformance_md` from the JSON result files in",
        "`docs/results/` (each a `kvsched conform --json` report). Every failure links its shrunk,",
        "replayable trace: `kvsched replay <trace> --adapter <target> --profile safety`.",
        "Install a target with `kvsched targets install NAME`; run it with `kvsched conform --adapter NAME`.",
        "Every defect below (not the deviations by design) has an upstream-ready report with standalone reproducers",
        "that import the engine and never kvsched, in [reports/](reports/README.md): "
        "`kvsched export <trace> --to pytest --out repro.py`.",
        "",
        "| target | pinned | profile | traces | steps | seed | pass | fail | n/a |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    pins = {"nano-vllm": "nano-vllm-npu==0.0.2", "nano-vllm-fork": "nano-vllm-fork==20260210",
            "vllm-v0": "vllm==0.10.2", "vllm-v1": "vllm==0.33.0", "sglang": "sglang==0.5.23",
            "sglang-liveness": "sglang==0.5.23", "lmdeploy": "lmdeploy==0.18.0", "lmdeploy-liveness": "lmdeploy==0.18.0",
            "aphrodite": "aphrodite-engine==0.24.1", "aphrodite-liveness": "aphrodite-engine==0.24.1"}
    for name in TARGETS:
        if name.startswith("vidur-"):
            pins[name] = "vidur==0.0.26"
    for t, rep in reports.items():
        s = rep["summary"]
        lines.append(f"| {t} | {pins[t]} | {rep['profile']} | {rep['examples']} | {rep['steps_checked']} | "
                     f"{rep['seed']} | {s['pass']} | {s['fail']} | {s['not_applicable']} |")
    lines += ["", "## Invariant x target", "", "| invariant | " + " | ".join(reports) + " |",
              "| --- |" + " --- |" * len(reports)]
    for inv in ids:
        cells = []
        for t in reports:
            st, path = status.get(inv, {}).get(t, ("-", None))
            cells.append(f"**fail** ([trace]({_rel(path)}))" if st == "fail" and path else st)
        lines.append(f"| {inv} | " + " | ".join(cells) + " |")
    lines += ["", "## Findings and their causes", ""]
    for t in reports:
        fails = [inv for inv in ids if status.get(inv, {}).get(t, ("",))[0] == "fail"]
        if not fails:
            lines.append(f"* **{t}**: no failure in {reports[t]['examples']} traces of its default path.")
            continue
        for inv in fails:
            lines.append(f"* **{t} {inv}**: {CAUSES.get((t, inv), 'see the trace')} "
                         f"([trace]({_rel(status[inv][t][1])}))")
    lines += ["", *RESOLVED]
    camp = results / "lockstep-vllm-v0.json"
    if camp.exists():
        data = json.loads(camp.read_text())
        lines += ["", "## Strict lockstep: the reference's `vllm-v0` profile vs vLLM 0.10.2's V0 scheduler", "",
                  f"`python -m conformance.selftest.campaigns.campaign` (seed {data['seed']}, n = {data['max_n']}, default path: "
                  "no chunked prefill, no prefix caching, watermark 0.01, policies fcfs and priority). Each trace runs "
                  "to its first divergence or violation; each class's first trace is shrunk and committed.", "",
                  "| mode | traces | steps | agree | diverge | by class |", "| --- | --- | --- | --- | --- | --- |"]
        for mode, m in data["modes"].items():
            by = "; ".join(f"{k} x{v}" for k, v in m["by_class"].items())
            lines.append(f"| {mode} | {m['traces']} | {m['steps']} | {m['agreeing_traces']} | {m['divergent_traces']} | {by} |")
        lines += ["", "| class | kind | explanation (vLLM source) | trace |", "| --- | --- | --- | --- |"]
        for cls, c in data["classes"].items():
            lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | [trace]({_rel(c['trace'])}) |")
    lines += _nano_lockstep(results / "lockstep-nano-vllm.json")
    lines += _aphrodite_lockstep(results / "lockstep-aphrodite.json")
    lines += _sglang_lockstep(results / "lockstep-sglang.json")
    lines += _vidur_lockstep(results / "lockstep-vidur-vllm.json")
    lines += _async_hunt(results)
    lines += _specdec(results / "specdec-lockstep.json", results / "specdec-hunt.json")
    lines += _hybrid(results / "lockstep-vllm-v1-hybrid.json", results / "hybrid-hunt-0.33.0.json")
    lines += _budgets(results / "lockstep-vllm-v1-budgets.json")
    lines += ["", "## Search strength: what a campaign reaches (issue 21)", "",
              "Each target declares the lifecycle edges its engine takes and the invariants it can never exercise "
              "(`Target.reach`, `conformance/selftest/campaigns/coverage_gate.py`); tests/test_targets.py runs 100 traces per "
              "target, as `kvsched conform` does, and fails on an applicable invariant with zero exercised steps, an "
              "untaken edge, or a finding the target's expectations file (`conformance/targets/expectations/`) does not "
              "list. On vllm-v0, `kvsched conform --adapter vllm-v0 --profile vllm-v0 --max-examples 100 --seed "
              "20261130`, before and after the target's traces drew n up to 3, roomy swap spaces, tight GPU caches, up "
              "to 8 requests and burst aborts: never exercised before, BLK-002, BLK-004, RES-002, COW-001, COW-002, "
              "SWP-001, SWP-002, SWP-003 and POL-002; after, none (SWP-002 on 11 steps, COW-001/002 on 5, SWP-001 on "
              "30); swap-in, aborts of running and swapped groups and the ignore of a swapped group went from 0 to 9, "
              "19, 5 and 14 edges taken. The group paths found that V0's `swap_out` maps each sequence of a group on "
              "its own, so a block shared after a fork is copied to a CPU block per sequence "
              "(group-swap-flattens-sharing, SWP-001/003), and that an unforked group takes one seat "
              "(group-seats, BUD-003/STR-002); both are in the expectations file with their source.",
              "", "## What each adapter translates", "",
              "* **nano-vllm / nano-vllm-fork**: the host plays `LLMEngine.step` (schedule, one token per sequence, "
              "`postprocess`); stops are EOS tokens. No abort API, no `n`, no priority, no watermark, no swap: traces "
              "keep to those (`trace_strategy`). `num_computed` is derived (len - 1 for running sequences; the prefix-cache "
              "hit during a prefill). A request with `prompt_tokens` runs on those ids and samples the spec's "
              "`generated_token`s (so nano's prefix cache sees what the reference sees); without them each request gets "
              "ids of its own. nano's block hashes are reported as `gpu_block_keys`.",
              "* **vllm-v0**: the host plays `LLMEngine._process_model_outputs` with vLLM's own `StopChecker`; swap maps "
              "are vLLM's (device-relative), block tables are made pool-relative. 0.10.2's engine splits n > 1 into "
              "independent groups before the scheduler, but its Scheduler and block manager still fork, share blocks, "
              "copy on write and swap whole groups: the host forks at the prompt step as V0's sampler did, and the traces "
              "draw n up to 3 (issue 21) outside 'recompute' mode (`_preempt_by_recompute` asserts one sequence) and at "
              "most max_num_seqs; 0.10.2 counts one seat for an unforked group (`SequenceGroup.get_max_num_running_seqs`). "
              "Entry path: `LLMEngine._validate_model_input` raises for a prompt over max_model_len; the host leaves it "
              "to the scheduler's prompt limit, which ignores it unscheduled at the head of waiting (same verdict, later "
              "step: an open translation gap, tests/test_host_fidelity.py).",
              "* **vllm-v1**: block 0 is V1's null block, so the pool has num_gpu_blocks + 1 blocks and ids are reported "
              "minus one; V1 advances `num_computed_tokens` inside `schedule()`, so the mid-step snapshot reports the tokens "
              "computed before the step; a prompt over max_model_len, and a generate prompt of exactly max_model_len "
              "tokens, is rejected by V1's input processor (`InputProcessor._validate_prompt_len`) and refused at the door "
              "(`add_request` answers FINISHED_IGNORED; tests/test_host_fidelity.py). Recompute only, n = 1; chunked prefill and prefix caching as in the V1 lockstep section below.",
              "* **sglang**: `hosts/sglang_host.py` drives SGLang's `PrefillAdder`, `SchedulePolicy` (fcfs or lpm), "
              "`ScheduleBatch` (`prepare_for_extend`, `check_decode_mem`, `retract_decode`, `prepare_for_decode`), "
              "`RadixCache` and the page-size-1 token allocator unmodified, and replays `Scheduler.get_next_batch_to_run`, "
              "`update_running_batch` and the batch-result glue (lines named in its docstring) because `Scheduler.__init__` "
              "needs a TP worker. Page size 1: the spec's blocks are SGLang's KV slots (slot ids minus one; slot 0 is "
              "SGLang's padding slot). Observed: statuses, queues, per-request slot ids, the free list, sequence lengths and "
              "the committed KV length (`req.kv.kv_committed_len`) as computed tokens; no ref counts (a radix node has a "
              "lock count, a slot has none), so BLK-001/BLK-003 are not applicable. SGLang's own "
              "length limits apply (`tp_worker.py:568-572`: `max_req_len = min(context_len - 1, kv_capacity - 1)`, prompts "
              "at or over `max_req_len - 5` refused at the door, reported as ignored by the next step; `max_new_tokens` "
              "clipped to `max_req_len - input_len - 1`); these are stricter than the spec's on small pools, a deviation by "
              "design that the safety and liveness profiles allow (in the 300 safety traces SGLang refused 541 requests at the "
              "door and admitted 426; traces draw max_model_len up to 32 and a pool that holds one max_model_len sequence). Slots a finished request leaves in the radix cache are "
              "neither free nor held by a request (evictable; sent as `sglang_evictable`). `retract_decode` "
              "(RUNNING->WAITING): `PrefillAdder` reserves a new request's whole `max_new_tokens` but only "
              "`new_token_ratio` (0.7, decaying over 600 steps) of a running one's rest, so the plain traces never "
              "outgrow the pool; a third of the traces are bursts sized to that arithmetic "
              "(`conformance.targets._retraction_bursts`), and the 300-trace runs retract 68 times and pass both "
              "profiles, as does the handmade [retract-decode](traces/sglang/handmade/retract-decode.json) trace "
              "(these counts are of the run before issue 32's LoRA traces joined the strategy). LoRA (issue 32): "
              "`hosts/sglang_lora.py` runs SGLang's own `Scheduler.can_schedule_lora_req` (scheduler.py:4416-4443), "
              "`LoRAManager.validate_lora_batch` and, for every batch as `ForwardBatch.init_new` does "
              "(model_executor/forward_batch_info.py:1294), `LoRAManager.fetch_new_loras` with "
              "`LoRAMemoryPool.prepare_lora_batch` (lora_manager.py:427-478, mem_pool.py:780-862); only the adapters "
              "are stubbed (no weights: the manager and pool are built without a model, `load_lora_weight_to_buffer` "
              "does nothing), and the glue that picks `running_loras` is replayed (scheduler.py:4186-4191, 4209-4210, "
              "4276-4277). `max_loras` is `max_loras_per_batch`. SGLang counts the base model (the spec's adapter 0, "
              "its `lora_id` None) as one of those slots and LORA-001 does not: stricter, so still safe; the "
              "generators give every request an adapter in three LoRA traces of four, where the two counts agree. "
              "A quarter of the target's traces are LoRA traces (half of them the carried-chunk shape of #25865).",
              "* **lmdeploy**: `hosts/lmdeploy_host.py` drives LMDeploy 0.18.0's PyTorch-engine `paging.Scheduler` "
              "unmodified (its prefill scheduler, `RecomputeEvictionHelper`, the logical/physical block allocators, the "
              "sequence state machine) and replays the glue of `engine/inputs_maker.py` (`do_prefill_default`, "
              "`_schedule_prefill`, `create_model_inputs_delta`, `update_running_seqs`, `preempt_invalid_decode_seqs`) and "
              "`engine/engine_loop.py` (`activate_seqs`), lines named in its docstring; `lmdeploy/__init__.py` is skipped "
              "(stub parent package) and the model agent is stubbed (imported by `strategies/ar/sequence.py` for a type "
              "hint only). The engine's prefetch (it schedules the next batch before the current output is applied) is "
              "not replayed: the host runs at pipeline depth 0. Block size 16 (LMDeploy asserts a power of two >= 16, "
              "`messages.py:623-629`). Every allocation reserves `prefill_interval` = 16 tokens past the last one "
              "(`AREngineStrategy.get_prealloc_size`), declared as the target's lookahead (CAP-006). Observed: block "
              "tables (physical ids), the free list, per-block ref counts, lengths and `num_history_ids` as computed "
              "tokens. Prefix caching (`enable_prefix_caching`, the scheduler's `BlockTrie`) runs as the engine runs "
              "it; each trie node owns one reference on its block, which the host leaves out of the ref counts (the "
              "spec counts table entries), and a block only the trie holds is reported free (`BlockTrie.evict` hands it "
              "back on demand, as vLLM V1 evicts a cached free block); "
              "[prefix-cache-hit](traces/lmdeploy/handmade/prefix-cache-hit.json) shows two later requests prefilling "
              "8 of their 40 tokens. Prompts over `max_session_len` are refused at the door. A preempted sequence goes "
              "back to WAITING *with* its blocks and KV and keeps them until another sequence's admission or growth "
              "reclaims them (`_reclaim_candidate`; the RES-003 / CAP-003 / CHK-003 findings). The 16-token prealloc "
              "means a request of at most 12 new tokens never grows past its prefill's blocks, so the strategy adds "
              "bursts of one-block prompts with 24-60 new tokens (22 of 200 traces preempt) and shared system prompts "
              "under prefix caching (31 of 56 prefix-cached traces hit the cache). With block sizes below 16 (which "
              "LMDeploy refuses) a prompt that fits max_session_len but not with its 16-token prealloc waits for ever.",
              "* **aphrodite**: `hosts/aphrodite_host.py` runs the vLLM V1 host unchanged on Aphrodite 0.24.1 "
              "(`aphrodite/v1/core/sched/scheduler.py` is vLLM's V1 Scheduler under another package name): `vllm.*` "
              "imports are answered with the `aphrodite.*` module of the same path, `VllmConfig` is `AphroditeConfig`, "
              "and the scheduler gets its config under Aphrodite's keyword `aphrodite_config`. Same translations as "
              "vllm-v1; lockstep against the V1 reference below.",
              "* **vidur-vllm / vidur-sarathi / vidur-orca**: `hosts/vidur_host.py` drives Vidur 0.0.26's replica "
              "schedulers through the simulator's own batch events, handled in `Simulator.run`'s order "
              "(`ReplicaScheduleEvent` -> `BatchStageArrivalEvent` -> `ReplicaStageScheduleEvent` is the step's decision, "
              "`BatchStageEndEvent` -> `BatchEndEvent` its outcome), with one replica (routing is not under test), a "
              "metrics store that records nothing and a fixed stage time (Vidur's trained predictor only sets when events "
              "fire). Vidur has no stop tokens, aborts or priorities, so the traces have none. Observed: statuses, "
              "queues, the free block count and lengths; per-request block counts are sent as `vidur_num_blocks` "
              "(informational: Vidur has no block ids, ref counts or free lists, so the block invariants are not "
              "applicable). Orca reserves `max_model_len // block_size` blocks per request; Sarathi chunks every prefill "
              "at its chunk size (the token budget, chunked prefill on).",
              ""]
    return "\n".join(lines)


def _aphrodite_lockstep(path: Path) -> list[str]:
    """Aphrodite's V1 scheduler against the V1 reference (`conformance.selftest.campaigns.lockstep_v1 --target aphrodite`)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["", "## Strict lockstep: the reference's `vllm-v1` flow vs Aphrodite's V1 scheduler", "",
             f"`python -m conformance.selftest.campaigns.lockstep_v1 --target aphrodite` (seed {data['seed']}, {data['package']}): "
             "the V1 campaign's paths and comparison (decisions, then statuses, computed tokens, block tables, queues and "
             "the free queue after each step), each divergence classified by rerunning the reference with an engine "
             "behaviour modelled.", "",
             "| path | traces | steps | agree | by class | target's violations |", "| --- | --- | --- | --- | --- | --- |"]
    for path_name, m in data["paths"].items():
        by = "; ".join(f"{k} x{v}" for k, v in m.get("by_class", {}).items())
        viol = "; ".join(f"{k} x{v}" for k, v in m.get("violations", {}).items())
        lines.append(f"| {path_name} | {m['traces']} | {m['steps']} | {m['agreeing_traces']} | {by} | {viol} |")
    lines += ["", "| class | kind | explanation (source) | traces |", "| --- | --- | --- | --- |"]
    for cls, c in data["classes"].items():
        links = ", ".join(f"[{p}]({_rel(v['trace'])})" for p, v in c.get("paths", {}).items())
        lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | {links} |")
    lines += ["", "Speculative decoding (which these paths and the 300-trace runs above do not draw): vLLM 0.33.0's three "
              "draft defects are in Aphrodite 0.24.1's copy of the scheduler too, found by exporting their reproducers "
              "for Aphrodite (`kvsched export TRACE --to pytest --target aphrodite`): the padded-admission assert "
              "(aphrodite/v1/core/sched/scheduler.py:1102, replayed alike by the Aphrodite host), the over-budget stall "
              "and the empty-output rollback; each has a report and a fix that passes, in "
              "[reports/](reports/README.md)."]
    return lines


def _sglang_lockstep(path: Path) -> list[str]:
    """SGLang's scheduler code against the sglang reference (`conformance.selftest.campaigns.lockstep_sglang`)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["", "## Strict lockstep: the reference's `sglang` flow vs SGLang's scheduler", "",
             f"`python -m conformance.selftest.campaigns.lockstep_sglang` (seed {data['seed']}, {data['package']}, profile "
             f"{data['profile']}, reference `{data['reference']}`): page size 1, the radix cache on, SGLang's door limits; "
             "paths fcfs, lpm, retract (bursts sized so that decode runs out of KV slots), chunked (chunked prefill on, "
             "either policy) and lora (chunked prefill, max_loras 1-2, adapters 1-3: SGLang's own "
             "`can_schedule_lora_req` and `LoRAManager`, hosts/sglang_lora.py; `lora_slots_full_beside_a_carried_chunk` "
             "counts the traces with a step of sgl-project/sglang #25865's shape: a chunk carried over, the slots full, "
             "another adapter waiting). Every step compares the decisions, then each unfinished request's status, computed tokens "
             "and KV slot ids, the running requests, the waiting queue in order and the free list in order (the "
             "reference's allocator and radix cache hand out and take back slots in SGLang's order, LRU eviction "
             "included). Each trace runs to its first divergence or violation. A class below whose traces break an "
             "invariant on both sides while every decision and state agrees is a deviation by design of SGLang, not a "
             "divergence.", "",
             "| path | traces | steps | agree | by class | violations (both sides) | traces reaching |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for path_name, m in data["paths"].items():
        by = "; ".join(f"{k} x{v}" for k, v in m.get("by_class", {}).items())
        viol = "; ".join(f"{k} x{v}" for k, v in m.get("violations", {}).items())
        reach = "; ".join(f"{k} x{v}" for k, v in m.get("traces_reaching", {}).items())
        lines.append(f"| {path_name} | {m['traces']} | {m['steps']} | {m['agreeing_traces']} | {by} | {viol} | {reach} |")
    lines += ["", "| class | kind | explanation (SGLang source) | traces |", "| --- | --- | --- | --- |"]
    for cls, c in data["classes"].items():
        links = ", ".join(f"[{p}]({_rel(v['trace'])})" for p, v in c.get("paths", {}).items())
        lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | {links} |")
    fixes = data.get("reference_fixes", {})
    if fixes:
        lines += ["", "Misreadings of SGLang that lockstep found and the reference fixed:", ""]
        lines += [f"* **{name}**: {why}" for name, why in fixes.items()]
    return lines


def _vidur_lockstep(path: Path) -> list[str]:
    """Vidur's vLLM replica scheduler against the V0 reference (`conformance.selftest.campaigns.lockstep_vidur`)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["", "## Strict lockstep: the V0 reference vs Vidur's vLLM replica scheduler", "",
             f"`python -m conformance.selftest.campaigns.lockstep_vidur` (seed {data['seed']}, {data['package']}, profile vllm-v0). "
             "A simulator that decides differently from the engine it models gives wrong capacity plans, so every "
             "divergence is a finding. **spec**: every request fits max_model_len and the cache (what Vidur's own request "
             "generators produce); **full**: everything the target takes. Each trace runs to its first divergence, "
             "violation or fault. A trace stopped by Vidur's restart assertion is run again under `python -O` (asserts "
             "off) to see what the scheduler decides after it.", "",
             "| space | traces | steps | agree | by class | restart-assertion traces under python -O |",
             "| --- | --- | --- | --- | --- | --- |"]
    for space, m in data["spaces"].items():
        by = "; ".join(f"{k} x{v}" for k, v in m["by_class"].items())
        beyond = "; ".join(f"{k} x{v}" for k, v in m.get("restart_assertion_traces_under_python_O", {}).items())
        lines.append(f"| {space} | {m['traces']} | {m['steps']} | {m['agreeing_traces']} | {by} | {beyond} |")
    lines += ["", "| class | kind | explanation (Vidur source) | traces |", "| --- | --- | --- | --- |"]
    for cls, c in data["classes"].items():
        links = ", ".join(f"[{s}{' (python -O)' if v.get('python_O') else ''}]({_rel(v['trace'])})"
                          for s, v in c["spaces"].items())
        lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | {links} |")
    return lines


def _nano_lockstep(path: Path) -> list[str]:
    """The nano-vllm lockstep (`conformance.selftest.campaigns.lockstep_nano`), when its results are committed."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["", "## Strict lockstep: the reference's `nano-vllm` flow vs nano-vllm's scheduler", "",
             f"`python -m conformance.selftest.campaigns.lockstep_nano` (seed {data['seed']}, {data['package']}). Two trace spaces: "
             "**spec**, where nano-vllm's behaviour is meant to be specified (block sizes 2, 4, 8; prefix caching on, as "
             "nano always caches; every request fits the budget, the cache and max_model_len), and **full**, everything "
             "the host takes (block size 1, over-long prompts, requests that outgrow max_model_len or the cache). Each "
             "step compares the decisions and the state after it (statuses, computed tokens, block tables with their "
             "ids, the queues and the free queue in order). Each trace runs to its first divergence, violation or crash, which is classified by which of nano-vllm's "
             "deviations, modelled back into the reference, explains it (`a+b`: two met in one step). With every "
             "deviation modelled, the traces that diverged are run again to the end.", "",
             "| space | traces | steps | agree | diverge | by class | still diverging with the deviations modelled |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for space, m in data["spaces"].items():
        by = "; ".join(f"{k} x{v}" for k, v in m["by_class"].items())
        lines.append(f"| {space} | {m['traces']} | {m['steps']} | {m['agreeing_traces']} | {m['divergent_traces']} | "
                     f"{by} | {m['diverging_with_deviations_modelled']} |")
    lines += ["", "| class | kind | explanation (nano-vllm source) | trace |", "| --- | --- | --- | --- |"]
    for cls, c in data["classes"].items():
        handmade = str(c.get("origin", "")).startswith("handmade")
        link = f"[{'handmade trace' if handmade else 'trace'}]({_rel(c['trace'])})" if c.get("trace") else ""
        lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | {link} |")
    for name, why in data.get("reference_fixes", {}).items():
        lines.append(f"\nFixed in the reference ({name}): {why}")
    for inv, why in data.get("unchecked", {}).items():
        lines.append(f"\nNot checked in this lockstep: {inv}: {why}.")
    return lines


# The hunt's reading of what it found (issue 16, item 5); the numbers come from the result files.
ASYNC_HUNT_NOTES = [
    "**What was found.** On both versions one class, the synchronous target's known "
    "`chunk-clamped-below-max-model-len`: a prompt of exactly max_model_len tokens whose chunked prefill "
    "continues as a running chunk is clamped at `max_model_len - num_computed_tokens - 1` and never gets its last "
    "prompt token (LIV-001 where it is the only work, LIV-002); vLLM 0.33.0 "
    "`vllm/v1/core/sched/scheduler.py:851-857` (running loop, 'Make sure the input position does not exceed the max model "
    "len'), 0.29.0 the same clamp (`scheduler.py:596-603`). `AsyncScheduler` inherits it from `Scheduler`. Nothing "
    "else: no safety violation (PIP-002, PIP-003, PIP-005, PIP-007 and the synchronous invariants checked as planned "
    "included; PIP-001 needs token ids the host does not send, PIP-004 is moot for a host that claims "
    "`ordered_steps`), no engine failure, no in-flight counter out of range (PIP-003), on either version.",
    "**Where the versions differ.** The hunt ran the same 600 traces on both (the same seed): 21 stall on 0.29.0, "
    "16 on 0.33.0, and no trace stalls on 0.33.0 alone. Of the 55 traces with the clamp's shape (chunked prefill, a "
    "prompt of exactly max_model_len), 5 finish on 0.33.0 and stall on 0.29.0: the request is alone, and 0.33.0 "
    "drops `long_prefill_token_threshold` when only one request is eligible ('When it is the only request there is "
    "nobody to starve', 0.33.0 `scheduler.py:754-763`), so it takes the whole prompt from the waiting queue and "
    "finishes; 0.29.0 applies the threshold always (`scheduler.py:984` on the waiting path, `:590-591` running), "
    "cuts the prompt, and the running-chunk clamp then stalls it for good. Smallest case: one request, prompt 2 = "
    "max_model_len 2, threshold 1 ([trace](traces/async/hunt/vllm-v1-async-0.29-lone-request-clamp.json): 0.33.0 "
    "finishes it length-capped at step 4, 0.29.0 never schedules it again after step 3). 0.33.0 narrows the stall "
    "to prompts that meet another request; it does not fix the clamp.",
    "**#57562** (placeholder underflow, `assert request.num_output_placeholders >= 0`, reported on 0.29.0 with "
    "chunked prefill and concurrent requests, no spec decode, no preemption). Not reproduced on 0.29.0 nor on "
    "0.33.0. Tried: the hunt above (chunked prefill in about half the traces, prefix caching, preemption, aborts "
    "and stops), and the probe made for the report's shape (`python -m conformance.selftest.campaigns.async_probe --target "
    "vllm-v1-async-0.29`: chunked prefill always on, 4 to 8 seats, a token budget of one or two tokens per seat, "
    "up to 10 requests at once, long_prefill_token_threshold 0, 1 or 3, prefix caching on in about half; every "
    "step reads the host's in-flight counters). Where 0.29.0 differs: the decrement and the assert live in "
    "`AsyncScheduler._update_request_with_output` (0.29.0 `vllm/v1/core/sched/async_scheduler.py:51-70`, the "
    "assert at `:63`; 0.33.0 moved them into `Scheduler`), and the placeholder is skipped for a request whose "
    "step leaves it mid-prompt (`async_scheduler.py:28`, `is_prefill_chunk` set in `scheduler.py:1466-1468` as "
    "`num_computed_tokens < num_tokens + num_output_placeholders`); the same rule as 0.33.0, and both agree with "
    "the reference here. The report's hybrid Gated DeltaNet + attention model (the Mamba-aligned chunk split, "
    "`_mamba_block_aligned_split`) was out of this hunt's reach and is tried in the hybrid hunt below (KV cache "
    "groups built in the host: not reproduced either). Out of the host's reach, and so not tried: data-parallel prefill "
    "throttling (`defer_prefills`, 0.29.0 `scheduler.py:545-548` and `:579-583`: an in-progress prefill chunk "
    "is skipped on a throttled step), speculative decoding and streaming input (#35755).",
]


def _async_hunt(results: Path) -> list[str]:
    """Issue 16's hunt (`conformance.selftest.campaigns.async_hunt`), the #57562 probes and the 0.29.0
    lockstep, when their results are committed."""
    hunts = {v: results / f"async-hunt-{v}.json" for v in ("0.33.0", "0.29.0")}
    if not any(p.exists() for p in hunts.values()):
        return []
    lines = ["", "## Pipelined (async) scheduling: the hunt on vLLM 0.33.0 and 0.29.0", "",
             "`python -m conformance.selftest.campaigns.async_hunt --target vllm-v1-async` (0.33.0) and `--target "
             "vllm-v1-async-0.29` (0.29.0, the version vllm-project/vllm#57562 was reported on; own venv, the same "
             "host). Each trace is the target's own (`conformance.generation.async_paths.all_paths_strategy`: plain, chunked prefill and "
             "KV-pressure preemption paths at pipeline depth 1, prefix caching on in about half, aborts and stops), "
             "checked against `safety` and `liveness` together, run whole, its problems classified; the first trace "
             "of each class is shrunk and committed. docs/ASYNC.md is the design.", "",
             "| version | traces | steps | preemptions | aborts | stops | prefix caching on | chunked prefill on | "
             "clean | by class |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    classes: dict[str, dict] = {}
    for version, path in hunts.items():
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        r = data["run"]
        by = "; ".join(f"{k} x{v}" for k, v in r["by_class"].items()) or "-"
        lines.append(f"| {version} (seed {data['seed']}) | {r['traces']} | {r['steps']} | {r['preemptions']} | "
                     f"{r['aborts']} | {r['stops']} | {r['prefix_caching_on']} | {r['chunked_prefill_on']} | "
                     f"{r['clean_traces']} | {by} |")
        for cls, c in data["classes"].items():
            entry = classes.setdefault(cls, {"kind": c["kind"], "explanation": c["explanation"], "traces": []})
            entry["traces"].append(f"[{version}]({_rel(c['trace'])}) ({c['steps']} steps: {c['message'][:160]})")
    if classes:
        lines += ["", "| class | kind | explanation (vLLM source) | shrunk traces |", "| --- | --- | --- | --- |"]
        for cls, c in sorted(classes.items()):
            lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | {'; '.join(c['traces'])} |")
    probes = [(v, results / name) for v, name in (("0.33.0", "async-probe-57562.json"),
                                                   ("0.29.0", "async-probe-57562-0.29.0.json"))]
    if any(p.exists() for _, p in probes):
        lines += ["", "The #57562 probe (`conformance.selftest.campaigns.async_probe`):", "",
                  "| version | traces | steps | most requests in a trace | prefix caching on | problems |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for version, path in probes:
            if path.exists():
                d = json.loads(path.read_text())
                lines.append(f"| {version} (seed {d['seed']}) | {d['traces']} | {d['steps']} | "
                              f"{d['requests_per_trace_max']} | {d['prefix_caching_on']} | {len(d['problems'])} |")
    lock = results / "async-lockstep-0.29.0.json"
    if lock.exists():
        d = json.loads(lock.read_text())
        lines += ["", "Strict lockstep of 0.29.0 against the pipelined reference (`python -m "
                  "conformance.selftest.campaigns.lockstep_async --target vllm-v1-async-0.29`, seed "
                  f"{d['seed']}; 0.33.0's is in docs/ASYNC.md section 5):", "",
                  "| path | traces | steps | agree | by class |", "| --- | --- | --- | --- | --- |"]
        for path_name, m in d["paths"].items():
            by = "; ".join(f"{k} x{v}" for k, v in m["by_class"].items()) or "-"
            lines.append(f"| {path_name} | {m['traces']} | {m['steps']} | {m['agreeing_traces']} | {by} |")
    lines += [""] + [f"{note}\n" for note in ASYNC_HUNT_NOTES]
    return lines


def _specdec(lockstep: Path, hunt: Path) -> list[str]:
    """Speculative decoding on vLLM 0.33.0 (docs/SPECDEC.md): the lockstep campaign
    (`conformance.selftest.campaigns.lockstep_specdec`) and the safety + liveness hunt with the #42722 probe
    (`conformance.selftest.campaigns.specdec_hunt`)."""
    if not lockstep.exists():
        return []
    data = json.loads(lockstep.read_text())
    lines = ["", "## Speculative decoding: the V1 references with drafts vs vLLM 0.33.0 (sync and async)", "",
             "`python -m conformance.selftest.campaigns.lockstep_specdec` (docs/SPECDEC.md): an n-gram drafter configured, the "
             "host plays the drafter and the rejection sampler from the trace; k in 1..4; KV pressure, chunked prefill "
             "and prefix caching drawn; every divergence classified by a counterfactual rerun. The reference "
             f"({data.get('reference_mode', 'policy')} mode; `V1Scheduler` knobs on: "
             f"{', '.join(k for k, on in data.get('reference_knobs', {}).items() if on) or 'none'}) "
             "stands behind V1's front door (`conformance/selftest/campaigns/door.py`).", "",
             "| path | target | traces | steps | steps with drafts | drafts | stops inside a verified step | agree | "
             "divergent (class) | run |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path, p in data["paths"].items():
        classes = "; ".join(f"{c} x{n}" for c, n in p["by_class"].items())
        run = run_line({"run": p["run"]}).strip().removeprefix("Run ") if p.get("run") else ""
        lines.append(f"| {path} | {data['targets'].get(path, '')} | {p['traces']} | {p['steps']} | "
                     f"{p['steps_with_drafts']} | {p['drafts_scheduled']} | {p['stops_inside_a_verified_step']} | "
                     f"{p['agreeing_traces']} | {classes} | {run} |")
    lines += ["", "| class | kind | explanation (vLLM source) | traces |", "| --- | --- | --- | --- |"]
    for cls, c in data["classes"].items():
        links = ", ".join(f"[{path}]({_rel(v['trace'])})" for path, v in c["paths"].items())
        lines.append(f"| {cls} | {c['kind']} | {c['explanation']} | {links} |")
    if hunt.exists():
        h = json.loads(hunt.read_text())
        lines += ["", f"Hunt under `{h['profile']}` (`python -m conformance.selftest.campaigns.specdec_hunt`), no lockstep, behind "
                  "V1's front door (a refusal at `add_request` is the request's answer, counted apart, not a stall):", "",
                  "| path | traces | steps | drained | clean | refused at the door | by class | problems | run |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for path, p in h["paths"].items():
            classes = "; ".join(f"{k} x{n}" for k, n in p.get("by_class", {}).items()) or "none"
            found = "; ".join(f"{k} x{n}" for k, n in p["traces_violating"].items()) or "none"
            run = run_line({"run": p["run"]}).strip().removeprefix("Run ") if p.get("run") else ""
            lines.append(f"| {path} | {p['traces']} | {p['steps']} | {p['drained']} | {p.get('clean_traces', '')} | "
                         f"{p.get('door_refusals', '')} | {classes} | {found} | {run} |")
        for cls, c in h.get("classes", {}).items():
            links = ", ".join(f"[{path}]({_rel(v)})" for path, v in c["paths"].items())
            lines.append(f"\n`{cls}` ({c['kind']}): {c['explanation']} Traces: {links}")
        for path, p in h.get("probe_42722", {}).items():
            found = "; ".join(f"{k}: {v}" for k, v in p["violations"].items()) or "none"
            lines.append(f"\nvllm-project/vllm#42722 probe, {path}: drained {p['drained']} in {p['steps']} steps; "
                         f"{found}")
    return lines


def _hybrid(lockstep: Path, hunt: Path) -> list[str]:
    """Hybrid KV cache groups on vLLM 0.33.0 (docs/HYBRID.md): the lockstep campaign
    (`conformance.selftest.campaigns.lockstep_hybrid`) and the hunt (`conformance.selftest.campaigns.hybrid_hunt`)."""
    if not lockstep.exists():
        return []
    data = json.loads(lockstep.read_text())
    lines = ["", "## Hybrid KV cache groups: the hybrid reference vs vLLM 0.33.0 (sync and async)", "",
             "`python -m conformance.selftest.campaigns.lockstep_hybrid --path PATH --traces N` (docs/HYBRID.md): the host "
             "builds the trace's `kv_groups` as vLLM `KVCacheGroupSpec`s over one pool "
             "(`conformance/targets/hosts/vllm_hybrid_groups.py`); every decision and the state after every step are "
             "compared, every group's block tables (null positions included) and the free queue in order among them. "
             "`async-*` paths run the same layouts at pipeline depth 1 on vLLM's AsyncScheduler beside the pipelined "
             "hybrid reference, comparing the delivered tokens too.", "",
             "| path | traces | steps | agree | divergent (first field) | seconds |", "| --- | --- | --- | --- | --- | --- |"]
    for path, p in data["paths"].items():
        fields = "; ".join(f"{k} x{n}" for k, n in p["divergent_by_field"].items()) or "none"
        if p.get("by_class"):
            fields += " (" + "; ".join(f"`{k}` x{n}" for k, n in p["by_class"].items()) + ")"
        if p.get("agreeing_stalls_by_class"):  # agreeing traces on which both sides stall (LIV-002 at the end)
            fields += "; agreeing, both stall: " + "; ".join(f"`{k}` x{n}" for k, n in p["agreeing_stalls_by_class"].items())
        lines.append(f"| {path} | {p['traces']} | {p['steps']} | {p['agreeing_traces']} | {fields} | {p['seconds']} |")
    for key, first in data.get("first_divergences", {}).items():
        lines.append(f"\nFirst divergence `{key}`: {first['message'][:300]}")
    for cls, c in data.get("classes", {}).items():
        lines.append(f"\n`{cls}` ({c['kind']}): {c['explanation']}")
    lines.append(run_line(data))
    if hunt.exists():
        h = json.loads(hunt.read_text())
        lines += ["", "Hunt (`python -m conformance.selftest.campaigns.hybrid_hunt`, no lockstep, every trace run whole): "
                  "`sync` is vllm-v1 under safety, liveness and vLLM's own hybrid policy (HYB-004/005); `async` is "
                  "vllm-v1-async at depth 1 under the async profile and liveness, with vllm-project/vllm#57562's shape "
                  "weighted in (Mamba align with prefix caching, chunked prefill, a few tokens per seat, up to 8 "
                  "requests); PIP-003 reads the host's in-flight counters (#57562's placeholder underflow) and PIP-005 "
                  "any failure of the engine on an in-flight outcome.", "",
                  "| run | target | traces | steps | preemptions | prefix caching on | chunked prefill on | clean | problems |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for name, r in h["runs"].items():
            problems = "; ".join(f"{k} x{n}" for k, n in r["problems"].items()) or "none"
            lines.append(f"| {name} | {r['target']} | {r['traces']} | {r['steps']} | {r['preemptions']} | "
                         f"{r['prefix_caching_on']} | {r['chunked_prefill_on']} | {r['clean_traces']} | {problems} |")
        for name, r in h["runs"].items():
            for problem, first in r.get("first", {}).items():
                lines.append(f"\n`{name}` {problem}: {first['message'][:300]}")
        pipelined = h["runs"].get("async")
        if pipelined is not None:
            aligned = sum(n for layout, n in pipelined.get("layouts", {}).items() if "mamba-align" in layout)
            found = "reproduced" if pipelined["problems"] else "not reproduced"
            lines.append(
                f"\n**vllm-project/vllm#57562 with a hybrid model** (placeholder underflow on a hybrid Gated DeltaNet + "
                f"attention model under async scheduling): {found} on 0.33.0. Tried: {pipelined['traces']} traces at "
                f"depth 1 on the AsyncScheduler with KV cache groups built in the host, {aligned} of them with a Mamba "
                f"\"align\" group and prefix caching (the report's model's mode with prefix caching), chunked prefill on "
                f"in {pipelined['chunked_prefill_on']}, {pipelined['preemptions']} preemptions, aborts and stops; "
                "PIP-003 read the host's `num_output_placeholders` and in-flight counters after every step and PIP-005 "
                "watched for a failure on an in-flight outcome. Not tried: vLLM 0.29.0 (the reported version) with "
                "groups, the GDN kernels, multimodal inputs, speculative decoding with a state group (docs/HYBRID.md "
                "section 7).")
        lines.append(run_line(h))
    return lines


def _budgets(lockstep: Path) -> list[str]:
    """Encoder inputs, LoRA, pause and grammar waits on vLLM 0.33.0 (issue 32): the lockstep campaign
    (`conformance.selftest.campaigns.lockstep_budgets`) and what the hunt tried."""
    if not lockstep.exists():
        return []
    data = json.loads(lockstep.read_text())
    lines = ["", "## Encoder cache and budget, LoRA slots, pause, grammar waits, streaming sessions: the V1 reference vs "
             "vLLM 0.33.0", "",
             "`python -m conformance.selftest.campaigns.lockstep_budgets --path PATH --traces N`: the host "
             "(`conformance/targets/hosts/vllm_budgets.py`) gives V1's Scheduler the config's encoder budget and an "
             "`EncoderCacheManager` of the config's size, each request's encoder inputs as `mm_features` (content hash "
             "as the identifier, no model), its adapter as a `LoRARequest` under `LoRAConfig.max_loras`, the trace's "
             "pause calls as `set_pause_state`, and plays the grammar compiler (a request with `grammar_ready_step` k "
             "gets structured outputs and its grammar before step k's `schedule()`) and the client of each streaming "
             "session (a `resumable` request; each later input sent as an `add_request` of the same id before its step's "
             "`schedule()`, then the session's end). Every decision, the encoder "
             "inputs computed, and the state after every step (with each encoder-cache entry's holders, the free "
             "space and the pause state) are compared; a divergence is classified by rerunning against the reference "
             "with vLLM's behaviour modelled. `violations` counts the vllm-v1 profile's invariants that vLLM broke.", "",
             "| path | traces | steps | agree | by class | violations by vLLM | seconds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for path, p in data["paths"].items():
        classes = "; ".join(f"{k} x{n}" for k, n in p.get("by_class", {}).items()) or "none"
        violations = "; ".join(f"{k} x{n}" for k, n in p["violations"].items()) or "none"
        lines.append(f"| {path} | {p['traces']} | {p['steps']} | {p['agreeing_traces']} | {classes} | {violations} | "
                     f"{p['seconds']} |")
    for path, p in data["paths"].items():
        if p.get("drawn"):
            drawn = "; ".join(f"{k} {n}" for k, n in p["drawn"].items())
            lines.append(f"\n{path}, traces holding (of {p['traces']}): {drawn}.")
    for cls, c in data.get("classes", {}).items():
        lines.append(f"\n`{cls}` ({c['kind']}): {c['explanation']}")
    lines.append(run_line(data))
    lines += ["", "Hunt on vLLM 0.33.0 with these features (issue 32 item 5). What was tried: every lockstep trace "
              "above is also a hunt (the vllm-v1 profile's invariants on vLLM's own snapshots: ENC-001..005, "
              "LORA-001, PAU-001, GRM-001/002, SES-001..003 among them); the violations column is what it found. Found "
              "by a probe of a streaming session (tests/test_targets_v1_budgets_lockstep.py "
              "test_vllm_takes_a_session_past_max_model_len): vLLM 0.33.0 validates each streaming input alone "
              "(v1/engine/input_processor.py:557-575, `_validate_prompt_len` of the one prompt), and `_update_request_as_session` appends it whatever the session's length "
              "(v1/core/sched/scheduler.py:1879-1921), so a session of 10 tokens with max_model_len 16 takes an input of 8 "
              "and is admitted with 21 tokens; `allocate_slots` caps its slots at max_model_len "
              "(v1/core/kv_cache_manager.py:551-553), so its 8-token chunk runs with the blocks of 16 tokens: CAP-002 "
              "(a chunk computed without KV slots). The generators keep sessions within max_model_len, so the lockstep "
              "rows above do not draw it. Upstream report (vllm-project/vllm#42489, open fix #42502), with a standalone "
              "reproducer that fails on 0.33.0 (CAP-005) and passes with #42502's rule: "
              "[reports/vllm-v1-session-input-past-max-model-len.md](reports/vllm-v1-session-input-past-max-model-len.md). "
              "Found by reading "
              "the installed source and confirmed by a probe on vLLM's own class: vllm-project/vllm #55733 (open fix "
              "#51228) is still in 0.33.0, `EncoderDecoderCacheManager.free_encoder_input` credits `num_free_slots` "
              "unconditionally and `get_cached_input_ids` returns every input (v1/core/encoder_cache_manager.py:430-431 "
              "and 443-445), so the free space of a 100-embedding cache reads 0, 100, 200, 300, 400, 500 over five "
              "decode steps: `python -m conformance.selftest.campaigns.encdec_free_slots_probe` (exit 1 while the "
              "fault is there; the museum's vllm-encdec-encoder-slots-credited). Upstream report, with a hand-written "
              "standalone reproducer (can_allocate admits two 100-embedding inputs into a 100-embedding cache; fails "
              "on 0.33.0, passes with #51228's rule applied): "
              "[reports/vllm-v1-encdec-encoder-slots-credited.md](reports/vllm-v1-encdec-encoder-slots-credited.md). Not reached, and why: the host builds "
              "no encoder-decoder scheduler (cross-attention blocks need an encoder-decoder model config) and no EC "
              "connector, and a trace with a KV connector beside a session, a grammar wait, an adapter or encoder inputs "
              "is refused at load (the connector's waiting pass models none of their waits; docs/CONNECTORS.md "
              "section 8). A session's later inputs carry encoder "
              "inputs of their own (an audio chunk of a realtime session; `spec.session.InputPiece.encoder_inputs`, "
              "session version 2): vLLM moves them to where the input lands (`_update_request_as_session`, "
              "scheduler.py:1899-1905, offset + base), the reference the same way (`spec.session.taken_up_inputs`), "
              "and the checker places them from the session's length when it takes the input up "
              "(`CheckContext.encoder_inputs`); streaming-mixed and async-streaming-mixed draw them "
              "(tests/test_targets_v1_budgets_lockstep.py test_vllm_places_a_later_inputs_encoder_input_where_its_tokens_land; "
              "the mutant v1-session-input-encoder-dropped). "
              "The async- paths (encoder inputs, adapters and a pause together, grammar waits, sessions, and everything together on vLLM's AsyncScheduler at depth 1, "
              "the vllm-v1-async host playing the same clients) needed two reference rules the pipelined flow lacked: "
              "a session whose turn stops voids its in-flight steps, resumes from its materialized frontier and is "
              "admitted without waiting for them (vLLM `_handle_stopped_request`, scheduler.py:2722-2730, and the "
              "`drop_stale_output` skip at :1084 and :2338), and consumed encoder outputs are let go when a step's "
              "outcome is processed, past the placeholders (:2387-2389, 2847-2855); and the host's processed "
              "frontier subtracts only the in-flight tokens still counted (a stale step's are not). A third rule came "
              "from the open divergences: a session whose turn stops holding no KV (`num_computed_tokens` 0) joins "
              "the tail of the plain waiting queue, not its KV-holding front (`_enqueue_waiting_request` and "
              "`_holds_kv_blocks`, scheduler.py:2697, 2709-2715; the reference's `SessionFlow._insert_holding`; "
              "[session-without-kv-joins-waiting-last](traces/async/session-without-kv-joins-waiting-last.json)). "
              "It closed async-streaming's 2 open (state.waiting) and 4 of async-streaming-mixed's 9 (statuses 3, "
              "waiting 1; the waiting one now agrees, the statuses ones are of session-arrival-renewed). The last 5 (state.encoder_cache, an entry vLLM shows with no holder while the reference counts a "
              "session holding it) were lets-go-between-same-hash-inputs all along: the classifying model let go of an "
              "output again at every step after its first input was consumed, while vLLM drops each held input once "
              "(request_cached_ids, encoder_cache_manager.py:236-249, read by _free_encoder_inputs, scheduler.py:2828-2853) "
              "and counts an input held from the step that schedules it, in flight too; the model now keeps the held "
              "inputs as vLLM does (`LetsGoAtConsumed`), and every divergence of every budgets path is classified.",
              "", "Hunt on SGLang 0.5.23 for LoRA (issue 32 item 5; sgl-project/sglang #25865 and #23141: a batch with "
              "max_loras_per_batch + 1 adapters, on which `LoRAManager.fetch_new_loras` asserts, lora_manager.py:464). "
              "SGLang's LoRA admission runs on CPU: the host imports `sglang.srt.lora.lora_manager` and its memory "
              "pool without a GPU (Triton falls back to CPU) and needs no model for the admission check. **Not "
              "reproduced on 0.5.23**: its `_get_new_batch_prefill_raw` adds the adapters already staged in the "
              "`PrefillAdder` to `running_loras` before the waiting queue is read (scheduler.py:4186-4191, 'Account "
              "for LoRAs that are already loaded in the adder, such as chunked requests'), which is what PR #23179 "
              "('add lora chunked req test and fix', merged 2026-04-19) describes; #25865 (filed 2026-05-20) quotes "
              "the code without those lines, and its fix PRs (#25567, #26029; #25078 for #23141) were closed "
              "unmerged. What was tried: the lockstep lora path above (1000 traces, 297 of them with a step of "
              "#25865's shape, 0 violations of the sglang profile, 0 divergences) and "
              "`kvsched conform --adapter sglang --profile safety --max-examples 300 --seed 20261130` (LORA-001 "
              "exercised on 2441 of 4289 steps, no failure; liveness likewise). That the checks would see it: with "
              "scheduler.py:4190-4191 taken out (the host's `--lora-counterfactual pre-23179`; `kvsched conform "
              "--adapter conformance.selftest.campaigns.lockstep_sglang:pre_23179_adapter --profile safety "
              "--max-examples 300 --seed 20261202`) LORA-001 fails, shrunk to two steps "
              "([pre-23179-lora-001](traces/sglang/pre-23179-lora-001.json): r1's last chunk staged, r0 of another "
              "adapter admitted beside it, max_loras 1), and it breaks in 20 of 300 traces drawn as the lora path draws them "
              "(`run_checked` with the safety profile on `pre_23179_adapter()` over `sample_traces(path_strategy('lora'), 300, "
              "20261205)`; on the same 300 traces SGLang's own `fetch_new_loras` refuses a batch in 20 without the two lines, 5 "
              "of them with the base model among the ids, and none on the release: a one-off loop over the host's "
              "`SglangEngine` reading its `sglang_lora_overflows`, 2026-12-02); "
              "the handmade [lora-carried-chunk](traces/sglang/handmade/lora-carried-chunk.json) trace passes on the "
              "release and fails without the two lines (tests/test_sglang_lora.py). #23141's 'N adapters plus a "
              "base-model request' is the same count with the base model's `None` as one of the ids: SGLang's "
              "admission treats `None` as any other id (scheduler.py:4187-4191, 4429-4443; lora_manager.py:431-436), "
              "so the all-adapter traces cover it. Not hosted, and why: the LoRA drainer "
              "(`lora_drain_wait_threshold` > 0), overlap loading (`enable_lora_overlap_loading`), pinned adapters, "
              "mixed chunks, priority preemption and the overlap event loop (the host replays the plain loop)."]
    return lines


def _rel(path: str | None) -> str:
    if not path:
        return ""
    p = str(path)
    return p[len("docs/"):] if p.startswith("docs/") else p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("docs/results"))
    parser.add_argument("--out", type=Path, default=Path("docs/CONFORMANCE.md"))
    args = parser.parse_args(argv)
    args.out.write_text(build(args.results))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
