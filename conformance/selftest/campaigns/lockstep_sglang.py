"""Strict lockstep: the reference's ``sglang`` flow against SGLang 0.5.23's real scheduler code.

    python -m conformance.selftest.campaigns.lockstep_sglang [--path fcfs|lpm|retract|chunked|lora|all] [--traces 400]
        [--seed 20261201] [--out docs/results/lockstep-sglang.json]
        [--traces-dir docs/traces/lockstep-sglang] [--no-shrink]

Runs seeded traces through the installed ``sglang`` target (hosts/sglang_host.py drives
``PrefillAdder``, ``SchedulePolicy``, ``ScheduleBatch.retract_decode`` and ``RadixCache``
unmodified) with the ``sglang`` profile's reference (`reference_impl.sglang_scheduler`) beside it,
one path per policy (``--traces`` each):

``fcfs``     SGLang's default policy;
``lpm``      longest prefix match first;
``retract``  either policy, every trace a burst sized so that decode runs out of slots;
``chunked``  either policy, chunked prefill on (``chunked_prefill_size`` and ``max_prefill_tokens``
             both the token budget, drawn below the longer prompts);
``lora``     either policy, chunked prefill on, ``max_loras`` 1-2 and adapters 1-3 (`sglang_lora_traces`:
             the shape of sgl-project/sglang #25865), through SGLang's own ``can_schedule_lora_req`` and
             ``LoRAManager`` (hosts/sglang_lora.py).

All draw `sglang_traces`: page size 1, the radix cache on, prompts cut from a few shared stems
over a small vocabulary (prefix hits, node splits and evictions happen), small KV pools and long
outputs (so that decode runs out of slots and ``retract_decode`` retracts), arrivals spread over
steps, some stop decisions, some prompts at or over SGLang's input limit (refused at the door).

Every step compares the decisions (`conformance.runner.lockstep.compare`) and then the state after the
step (`conformance.selftest.campaigns.lockstep_v1.compare_state`: each unfinished request's status, computed
tokens and KV slot ids, the running requests, the waiting queue in order, and the free list in
order: the reference's allocator and radix cache hand out and take back slots in SGLang's order).
A trace runs to its first divergence; every divergence is classified (`CLASSES`, with SGLang's
source lines) or counted ``unclassified`` (a misreading to fix in the reference). The first trace
of each class is shrunk and saved under ``--traces-dir``. Needs ``kvsched targets install
sglang``; takes minutes, not run in CI (tests/test_sglang_lockstep.py runs a few traces).
"""

from __future__ import annotations

import collections
import json
import time
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.sglang import sglang_lora_traces, sglang_traces
from conformance.generation.v0 import sample_traces
from conformance.selftest.campaigns import lockstep_v1
from conformance.selftest.campaigns.campaign_args import campaign_parser, keep_class_trace, write_report
from conformance.selftest.campaigns.lockstep_v1 import Outcome
from conformance.selftest.campaigns.recording import RecordsSnapshots
from conformance.targets import get_target
from reference_impl.sglang_scheduler import SglangScheduler, door_limits
from spec.trace import Trace

TARGET = "sglang"
PROFILE = "sglang"
PATHS = ("fcfs", "lpm", "retract", "chunked", "lora")
SRC = "sglang/srt/"

# class -> (kind, explanation with SGLang's source location); filled from what the runs found.
CLASSES: dict[str, tuple[str, str]] = {
    "first-prefill-above-input-budget": (
        "sglang-deviation",
        f"{SRC}managers/schedule_policy.py:1627-1633 (PrefillAdder._select_prefill_admission, 'Without chunking, "
        "allow the first request even above the input cap'): without chunked prefill the first request of a "
        "prefill batch is admitted whatever its length against max_prefill_tokens (the host passes "
        "max_num_batched_tokens), so a prompt longer than the token budget is prefilled in one step. The spec "
        "bounds every step by the budget (BUD-001) and ignores a prompt over min(max_model_len, budget) (LEN-002, "
        "LEN-003). "
        "Engine and reference agree step for step; the trace space of the flow's own tests keeps the budget at "
        "max_model_len or more (`sglang_configs`), the campaign draws it below too.",
    ),
    "unclassified": ("open", "not yet explained"),
}
# Misreadings of SGLang that lockstep found and the reference fixed.
FIXES: dict[str, str] = {
    "retracted-request-reservation": "PrefillAdder checks a request against its remaining max_new_tokens "
    "(add_one_req: max_new_tokens - len(output_ids)) but, once admitted, reserves the whole max_new_tokens "
    f"({SRC}managers/schedule_policy.py:1638, _select_prefill_admission; _commit_prefill_admission). The reference "
    "had reserved the remaining tokens, so after a retraction it admitted one request more than SGLang in the same "
    "prefill batch (first seen on the lpm path).",
    "lora-namespaced-radix-keys": "SGLang appends a request's lora_id to its extra_key (schedule_batch.py:1164-1170) "
    f"and the radix cache namespaces every child key by it ({SRC}mem_cache/radix_cache.py:222-240), so requests of "
    "different adapters share no cached prefix. The reference had matched on tokens alone and counted another "
    "adapter's prefix as computed (first seen on the lora path: 22 of 40 traces).",
}


# ------------------------------------------------------------------------------ traces
def path_strategy(path: str) -> st.SearchStrategy:
    """One campaign path's traces (`PATHS`)."""
    if path == "retract":
        return sglang_traces(burst=True)
    if path == "chunked":
        return sglang_traces(chunked=True, burst=False)
    if path == "lora":
        return sglang_lora_traces()
    return sglang_traces(path)


def pre_23179_adapter():
    """The ``sglang`` target with the host's LoRA counterfactual (hosts/sglang_lora.py ``pre-23179``:
    ``running_loras`` from the running batch only, the code sgl-project/sglang #25865 describes), for
    ``kvsched conform --adapter conformance.selftest.campaigns.lockstep_sglang:pre_23179_adapter``:
    shows that the checks catch the defect once SGLang's fix is taken out. Never a target of its own."""
    from dataclasses import replace

    return replace(get_target(TARGET), host_args=("--lora-counterfactual", "pre-23179")).adapter()


class Recorded(RecordsSnapshots, SglangScheduler):
    """The reference, keeping its snapshot after every step (to compare state, not only decisions)."""


def run_one(adapter, trace: Trace, invariants, reference: type[Recorded] = Recorded, timeout: float = 60) -> Outcome:
    """One lockstep run against SGLang's reference: decisions by the driver, then the state after
    every step (`lockstep_v1.run_one`)."""
    return lockstep_v1.run_one(adapter, trace, invariants, reference, timeout)


def classify(outcome: Outcome) -> str | None:
    """The divergence's class (a key of `CLASSES`), ``unclassified`` when none fits, or None. A run
    whose decisions and states agree but that breaks BUD-001 / LEN-002 / LEN-003 on both sides with a
    budget below max_model_len is SGLang's first-request exemption from the input budget."""
    if outcome.divergence_step is None:
        return None
    if outcome.result.divergence is None and outcome.state is None:
        config = outcome.result.trace.config
        if outcome.result.problem_ids <= {"BUD-001", "LEN-002", "LEN-003"} and \
                config.max_num_batched_tokens < config.max_model_len:
            return "first-prefill-above-input-budget"
        return "violation-only"
    return "unclassified"


def run_path(adapter, path: str, count: int, seed_value: int, first: dict, invariants, log=print) -> dict[str, Any]:
    traces = sample_traces(path_strategy(path), count, seed_value + PATHS.index(path))
    by_field: collections.Counter[str] = collections.Counter()
    by_class: collections.Counter[str] = collections.Counter()
    violations: collections.Counter[str] = collections.Counter()
    reached: collections.Counter[str] = collections.Counter()
    steps = agreeing = 0
    started = time.monotonic()
    for index, trace in enumerate(traces):
        outcome = run_one(adapter, trace, invariants)
        result = outcome.result
        steps += len(result.records)
        for problem in result.problem_ids - {"LOCKSTEP"}:
            violations[problem] += 1
        reached.update(_reached(result))
        cls = classify(outcome)
        if cls is None:
            agreeing += 1
        else:
            by_field[outcome.field or "?"] += 1
            by_class[cls] += 1
            first.setdefault((path, cls), (trace, outcome))
        if (index + 1) % 50 == 0:
            log(f"{path}: {index + 1}/{len(traces)} traces, {agreeing} agree, {dict(by_class)}")
    return {"traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
            "divergent_by_field": dict(sorted(by_field.items())), "by_class": dict(sorted(by_class.items())),
            "violations": dict(sorted(violations.items())), "traces_reaching": dict(sorted(reached.items())),
            "seconds": round(time.monotonic() - started, 1)}


def _reached(result) -> set[str]:
    """Which of SGLang's paths the trace took (on the engine's side), for the coverage line."""
    found: set[str] = set()
    last_prefills: set[str] = set()
    limit = result.trace.config.max_loras
    adapter = {a.request.request_id: a.request.lora_id for a in result.trace.arrivals}
    for record in result.records:
        out = record.output
        prefills = {s.request_id for s in out.scheduled if s.is_prefill}
        carried = prefills & last_prefills
        if carried:
            found.add("chunked_prefill")  # prefilled in two steps running: its prompt came in chunks
        if limit and carried:  # sglang#25865's step: a chunk carried over, slots full, another adapter waits
            used = {adapter.get(s.request_id) for s in out.scheduled} | {adapter.get(r) for r in record.before.running or ()}
            if len(used) >= limit and any(adapter.get(r) not in used for r in record.before.waiting or ()):
                found.add("lora_slots_full_beside_a_carried_chunk")
        last_prefills = prefills
        if out.preempted:
            found.add("retract_decode")
        if out.ignored:
            found.add("refused_at_the_door")
        if any(s.is_prefill for s in out.scheduled) and any(
                s.num_tokens < (record.before.seqs or {}).get(s.seq_id, _NO_VIEW).num_tokens
                for s in out.scheduled if record.before.seqs and s.seq_id in record.before.seqs):
            found.add("radix_prefix_hit")
    return found


class _NoView:
    num_tokens = 1 << 30


_NO_VIEW = _NoView()


def main(argv: list[str] | None = None) -> int:
    parser = campaign_parser(__doc__.splitlines()[0], PATHS, seed=20261201, out="docs/results/lockstep-sglang.json",
                             traces_dir="docs/traces/lockstep-sglang")
    args = parser.parse_args(argv)
    paths = PATHS if args.path == "all" else (args.path,)
    target = get_target(TARGET)
    adapter, profile = target.adapter(), get_profile(PROFILE)
    invariants = profile.invariants()
    report: dict[str, Any] = {"version": 1, "target": TARGET, "package": target.version,
                              "reference": profile.reference, "profile": profile.name, "seed": args.seed,
                              "reference_fixes": FIXES, "paths": {}, "classes": {}}
    if args.out.exists():  # keep the other path's results
        old = json.loads(args.out.read_text())
        if old.get("version") == 1:
            report["paths"].update(old.get("paths", {}))
            report["classes"].update(old.get("classes", {}))
    first: dict[tuple[str, str], tuple[Trace, Outcome]] = {}
    for path in paths:
        report["paths"][path] = entry = run_path(adapter, path, args.traces, args.seed, first, invariants)
        print(json.dumps({"path": path, **entry}), flush=True)
    for (path, cls), (trace, outcome) in sorted(first.items()):
        small, final = trace, outcome
        if not args.no_shrink:
            small, final = _shrunk(adapter, trace, cls, invariants)
        kind, why = CLASSES.get(cls, ("open", "not yet explained"))
        meta = {"adapter": TARGET, "profile": PROFILE, "path": path, "class": cls, "kind": kind,
                "message": final.describe(), "steps": len(final.result.records)}
        keep_class_trace(report, args.traces_dir, path, cls, kind, why, small, meta, final.describe())
    write_report(report, args.out)
    return 0 if all(report["paths"][p]["by_class"].get("unclassified", 0) == 0 for p in paths) else 1


def _shrunk(adapter, trace: Trace, cls: str, invariants) -> tuple[Trace, Outcome]:
    from conformance.runner.shrink import shrink

    policy = trace.config.policy

    def failing(candidate: Trace) -> int | None:
        c = candidate.config
        if c.policy != policy or c.block_size != 1 or door_limits(c)[0] <= 0:
            return None
        try:
            got = run_one(adapter, candidate, invariants)
        except Exception:  # noqa: BLE001 - a candidate outside what the host accepts is no smaller instance
            return None
        return got.divergence_step if classify(got) == cls else None

    try:
        small, _ = shrink(trace, failing, budget=300, seconds=90)
    except ValueError:
        small = trace
    final = run_one(adapter, small, invariants)
    if classify(final) != cls:
        small, final = trace, run_one(adapter, trace, invariants)
    return small, final


if __name__ == "__main__":
    raise SystemExit(main())
