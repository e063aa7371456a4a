"""Generate docs/CONFORMANCE.md from the committed result files in docs/results/.

    python -m conformance.targets.conformance_md [--results docs/results] [--out docs/CONFORMANCE.md]

Per-target reports are `kvsched conform --json` files (``<target>.json``); the lockstep campaigns
are ``lockstep-vllm-v0.json`` and ``lockstep-nano-vllm.json``; causes of each finding are in `CAUSES` (file and function in the
target's source).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

TARGETS = ("nano-vllm", "nano-vllm-fork", "vllm-v0", "vllm-v1", "sglang", "sglang-liveness")
# vllm-v0's report is its safety run; its policy is checked by the lockstep campaign below.
# sglang-liveness is the sglang target's liveness run (sglang.json is its safety run).

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
        "Generated by `python -m conformance.targets.conformance_md` from the JSON result files in",
        "`docs/results/` (each a `kvsched conform --json` report). Every failure links its shrunk,",
        "replayable trace: `kvsched replay <trace> --adapter <target> --profile safety`.",
        "Install a target with `kvsched targets install NAME`; run it with `kvsched conform --adapter NAME`.",
        "",
        "| target | pinned | profile | traces | steps | seed | pass | fail | n/a |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    pins = {"nano-vllm": "nano-vllm-npu==0.0.2", "nano-vllm-fork": "nano-vllm-fork==20260210",
            "vllm-v0": "vllm==0.10.2", "vllm-v1": "vllm==0.33.0", "sglang": "sglang==0.5.23",
            "sglang-liveness": "sglang==0.5.23"}
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
    camp = results / "lockstep-vllm-v0.json"
    if camp.exists():
        data = json.loads(camp.read_text())
        lines += ["", "## Strict lockstep: the reference's `vllm-v0` profile vs vLLM 0.10.2's V0 scheduler", "",
                  f"`python -m conformance.targets.campaign` (seed {data['seed']}, n = {data['max_n']}, default path: "
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
    lines += ["", "## What each adapter translates", "",
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
              "* **sglang**: `hosts/sglang_host.py` drives SGLang's `PrefillAdder`, `SchedulePolicy` (fcfs), "
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
              "neither free nor held by a request (evictable; sent as `sglang_evictable`). Not reached in 300 traces: "
              "`retract_decode` (RUNNING->WAITING): `PrefillAdder` reserves `new_token_ratio` (0.7, decaying over 600 "
              "steps) of every running request's remaining `max_new_tokens`, and short traces never outgrow that; the handmade "
              "[retract-decode](traces/sglang/handmade/retract-decode.json) trace (4 requests on 20 slots) does, and "
              "passes both profiles.", ""]
    return "\n".join(lines)


def _nano_lockstep(path: Path) -> list[str]:
    """The nano-vllm lockstep (`conformance.targets.lockstep_nano`), when its results are committed."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    lines = ["", "## Strict lockstep: the reference's `nano-vllm` flow vs nano-vllm's scheduler", "",
             f"`python -m conformance.targets.lockstep_nano` (seed {data['seed']}, {data['package']}). Two trace spaces: "
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
