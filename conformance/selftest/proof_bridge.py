"""The bridge between the Z3 encoding (``spec.proofs``) and the reference scheduler.

- `concrete_state`: a reference scheduler's state as the encoding's concrete state (the same
  dict `spec.proofs.encoding.read_state` produces), so a symbolic pre-state can be pinned to it.
- `apply_action`: one action of the matrix performed on the reference with the reference's own
  methods (block manager, scheduler helpers, ``update()``), and `reference_guard`, whether the
  reference would take it. The tests use both to check the encoding against the code that runs.
- `counterexample_trace`: a matrix counterexample (pre-state, action) turned into a version-1
  JSON trace that drives a (possibly mutated) reference into a state of the same shape and takes
  the action; replaying it shows the violation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from reference_impl.block_manager import AllocStatus
from reference_impl.scheduler import Scheduler, _StepBuilder
from reference_impl.sequence import SequenceGroup
from spec.catalogue import Checker, Violation
from spec.config import MAX_SPECULATIVE_TOKENS, SchedulerConfig
from spec.observation import ALL_CAPABILITIES
from spec.proofs.bound import Bound
from spec.status import Status
from spec.trace import Arrival, Trace
from spec.types import Request, ScheduledSeq, SchedulerOutput, StepOutcome

_CODE = {Status.WAITING: "WAITING", Status.RUNNING: "RUNNING", Status.SWAPPED: "SWAPPED"}


@dataclass
class Layout:
    """Which request is group j and which sequence is slot s."""

    groups: list[str]  # group index -> request id ("" for a group that has not arrived)
    slots: list[tuple[int, str | None]]  # slot -> (group index, seq id or None when not born)


def config_constants(config: SchedulerConfig) -> dict[str, int]:
    return {"watermark_blocks": config.watermark_blocks, "max_num_seqs": config.max_num_seqs,
            "max_model_len": config.max_model_len, "max_num_batched_tokens": config.max_num_batched_tokens}


def layout_of(sched: Scheduler, bound: Bound, next_n: int | None = None) -> Layout | None:
    """Slots for every arrived request (n each, in arrival order); the slots left over go to the
    next, not yet arrived group (``next_n`` of them at most). None when it does not fit."""
    groups = sorted(sched.groups.values(), key=lambda g: g.arrival)
    if len(groups) > bound.groups:
        return None
    slots: list[tuple[int, str | None]] = []
    for j, group in enumerate(groups):
        born = {s.seq_id for s in group.seqs}
        for k in range(group.request.n):
            sid = f"{group.request_id}#{k}"
            slots.append((j, sid if sid in born else None))
    if len(slots) > bound.seqs:
        return None
    spare = bound.seqs - len(slots)
    if spare:
        if len(groups) >= bound.groups:
            return None
        slots += [(len(groups), None)] * spare
    names = [g.request_id for g in groups] + [""] * (bound.groups - len(groups))
    return Layout(names, slots)


def concrete_state(sched: Scheduler, bound: Bound, layout: Layout) -> dict[str, Any] | None:
    bm = sched.block_manager
    if bm.gpu.num_blocks != bound.gpu_blocks or bm.cpu.num_blocks != bound.cpu_blocks:
        return None
    seqs = []
    for j, sid in layout.slots:
        if sid is None:
            seqs.append({"group": j, "status": "NONE", "device": None, "table": [], "tokens": 0, "computed": 0})
            continue
        group = sched.groups[layout.groups[j]]
        seq = next(s for s in group.seqs if s.seq_id == sid)
        if sid in bm.gpu_tables:
            table, device = list(bm.gpu_tables[sid]), "gpu"
        elif sid in bm.cpu_tables:
            table, device = list(bm.cpu_tables[sid]), "cpu"
        else:
            table, device = [], None
        if len(table) > bound.table_len:
            return None
        status = "FINISHED" if seq.status.is_finished else _CODE[seq.status]
        seqs.append({"group": j, "status": status, "device": device, "table": table,
                     "tokens": seq.num_tokens, "computed": seq.num_computed})
    groups = []
    for rid in layout.groups:
        if not rid:
            groups.append({"status": "NONE", "queues": [], "forked": False, "prompt_len": 0, "max_tokens": 0})
            continue
        group = sched.groups[rid]
        queues = [name for name, q in (("waiting", sched.waiting), ("running", sched.running),
                                       ("swapped", sched.swapped)) if any(g is group for g in q)]
        status = "FINISHED" if group.status.is_finished else _CODE[group.status]
        groups.append({"status": status, "queues": queues, "forked": group.forked,
                       "prompt_len": group.request.prompt_len, "max_tokens": group.request.max_tokens})
    return {
        "gpu_ref": list(bm.gpu.ref_counts), "gpu_free": [b in set(bm.gpu.free_ids()) for b in range(bm.gpu.num_blocks)],
        "cpu_ref": list(bm.cpu.ref_counts), "cpu_free": [b in set(bm.cpu.free_ids()) for b in range(bm.cpu.num_blocks)],
        "seqs": seqs, "groups": groups,
    }


# ------------------------------------------------------------------------------ reference side
def _running_seats(sched: Scheduler) -> int:
    return sum(g.max_running_seqs() for g in sched.running)


def reference_guard(sched: Scheduler, action: str, group: SequenceGroup | None, seq_id: str | None, bound: Bound) -> bool:
    """Whether the reference would take ``action`` now (within the bound's table length)."""
    cfg, bm = sched.config, sched.block_manager
    if action == "add":
        return group is None
    assert group is not None
    status = group.status
    fits = all(cfg.blocks_for(s.num_tokens) <= bound.table_len for s in group.live_seqs())
    if action in ("admit", "fork"):
        if status is not Status.WAITING or sched.swapped:
            return False
        if (action == "fork") == group.forked:
            return False
        seats = group.max_running_seqs()
        return (
            group.uncomputed_tokens() <= cfg.prompt_limit and seats <= cfg.max_num_seqs
            and bm.can_allocate(group) is AllocStatus.OK and group.uncomputed_tokens() <= cfg.max_num_batched_tokens
            and _running_seats(sched) + seats <= cfg.max_num_seqs and fits
        )
    if action == "decode":
        return status is Status.RUNNING and bm.can_append_slots(group) and _appends_fit(sched, group, bound)
    if action == "preempt_recompute":
        return status is Status.RUNNING
    if action == "swap_out":
        return status is Status.RUNNING and bm.can_swap_out(group)
    if action == "swap_in":
        return (
            status is Status.SWAPPED and bm.can_swap_in(group) is AllocStatus.OK
            and len(group.live_seqs()) <= cfg.max_num_batched_tokens
            and _running_seats(sched) + group.max_running_seqs() <= cfg.max_num_seqs
            and _appends_fit(sched, group, bound)
        )
    if action == "finish":
        seq = next((s for s in group.seqs if s.seq_id == seq_id), None)
        return seq is not None and seq.status is Status.RUNNING
    if action == "abort":
        return not status.is_finished
    if action == "ignore":
        if status is Status.WAITING:
            return (
                group.uncomputed_tokens() > cfg.prompt_limit or group.max_running_seqs() > cfg.max_num_seqs
                or bm.can_allocate(group) is AllocStatus.NEVER
            )
        return status is Status.SWAPPED and bm.can_swap_in(group) is AllocStatus.NEVER
    raise ValueError(action)


def _appends_fit(sched: Scheduler, group: SequenceGroup, bound: Bound) -> bool:
    bs = sched.config.block_size
    for s in group.live_seqs():
        tables = sched.block_manager.gpu_tables if s.seq_id in sched.block_manager.gpu_tables else sched.block_manager.cpu_tables
        if s.num_computed // bs == len(tables.get(s.seq_id, ())) and len(tables.get(s.seq_id, ())) >= bound.table_len:
            return False
    return True


def _feed_back(sched: Scheduler, group: SequenceGroup, prefill: bool) -> None:
    """Run the reference's own update() on one step that scheduled exactly this group."""
    items = tuple(
        ScheduledSeq(s.seq_id, group.request_id, s.num_uncomputed if prefill else 1, prefill) for s in group.live_seqs()
    )
    sched._last_output = SchedulerOutput(step=sched._step, scheduled=items)
    sched._step += 1
    sched.update(StepOutcome())


def apply_action(sched: Scheduler, action: str, group: SequenceGroup | None, seq_id: str | None = None,
                 new_request: Request | None = None) -> None:
    """Perform one matrix action on the reference, through its own methods."""
    bm = sched.block_manager
    if action == "add":
        assert new_request is not None
        sched.add_request(new_request)
        return
    assert group is not None
    if action in ("admit", "fork"):
        sched.waiting.remove(group)
        bm.allocate(group)
        group.set_status(Status.RUNNING)
        sched._enqueue(sched.running, group)
        _feed_back(sched, group, prefill=True)
    elif action == "decode":
        for s in group.live_seqs():
            bm.append_slot(s)
        _feed_back(sched, group, prefill=False)
    elif action == "preempt_recompute":
        sched.running.remove(group)
        sched._preempt_by_recompute(group)
    elif action == "swap_out":
        sched.running.remove(group)
        bm.swap_out(group)
        group.set_status(Status.SWAPPED)
        sched._enqueue(sched.swapped, group)
    elif action == "swap_in":
        sched.swapped.remove(group)
        bm.swap_in(group)
        group.set_status(Status.RUNNING)
        sched._enqueue(sched.running, group)
        for s in group.live_seqs():
            bm.append_slot(s)
        _feed_back(sched, group, prefill=False)
    elif action == "finish":
        seq = next(s for s in group.seqs if s.seq_id == seq_id)
        sched._check_stop(group, seq, frozenset({seq.seq_id}))
        if not group.live_seqs():
            sched.running.remove(group)
            group.status = sched._final_status(group)
    elif action == "abort":
        sched.abort_request(group.request_id)
    elif action == "ignore":
        step = _StepBuilder(sched._step)
        step.reason("ignored_never_fits", group.request_id, blocks=0, capacity=0)
        queue = sched.waiting if group.status is Status.WAITING else sched.swapped
        sched._ignore(queue, group, step)
        sched._ignored.clear()
    else:
        raise ValueError(action)


# ------------------------------------------------------------------------------ counterexamples
SchedulerFactory = Callable[[SchedulerConfig], Scheduler]


def config_for(cex: dict[str, Any]) -> SchedulerConfig | None:
    """A reference config with the counterexample's constants (None if the watermark count has no fraction)."""
    b = cex["bound"]
    c = cex["config"]
    B = b["gpu_blocks"]
    wm = c["watermark_blocks"]
    # int(w * B) == wm for w = wm / B exactly (and w < 1 because wm <= B - 1)
    watermark = wm / B
    if int(watermark * B) != wm:
        watermark = (wm + 0.5) / B
    cfg = SchedulerConfig(
        block_size=b["block_size"], num_gpu_blocks=B, num_cpu_blocks=b["cpu_blocks"],
        max_num_seqs=max(1, c["max_num_seqs"]), max_num_batched_tokens=max(c["max_num_batched_tokens"], c["max_num_seqs"], 1),
        max_model_len=max(1, c["max_model_len"]), watermark=watermark, preemption_mode="auto",
    )
    return cfg


def find_violation(trace: Trace, make: SchedulerFactory, invariant_id: str) -> list[Violation]:
    from reference_impl.engine import iter_steps

    checker = Checker(trace.config, ALL_CAPABILITIES)
    found: list[Violation] = []
    try:
        for record in iter_steps(trace, make(trace.config)):
            found += [v for v in checker.check_step(record) if v.invariant_id == invariant_id]
            if found:
                return found
    except Exception as err:  # a mutated reference may crash: that is a finding too
        return [Violation(invariant_id, None, f"the scheduler raised {type(err).__name__}: {err}")]
    return found


def counterexample_trace(
    cex: dict[str, Any], invariant_id: str, make: SchedulerFactory, *, tries: int = 3000, seed: int = 0,
    max_steps: int = 16,
) -> tuple[Trace, list[Violation]] | None:
    """Search for a trace that drives ``make``'s scheduler into a state shaped like the
    counterexample's pre-state (same config, same request shapes: n and prompt length) and then
    takes its action, so the catalogue predicate ``invariant_id`` fails on the replay.

    Candidate traces are built from the counterexample's requests (their n from the slots they
    own, their prompt from the token counts) with arrival steps, stops and aborts chosen by a
    seeded random search, the counterexample's own shape first. Returns the first trace whose
    replay violates the invariant, or None when none was found (then the pre-state may be
    unreachable, which means the invariant set needs strengthening).
    """
    exact = config_for(cex)
    if exact is None:
        return None
    bound = cex["bound"]
    # Variants of the counterexample's config: the same pools, block size and watermark; the
    # budgets relaxed and the preemption mode varied (so preemptions by swap happen).
    relaxed = replace(exact, max_num_seqs=max(exact.max_num_seqs, bound["seqs"]),
                      max_num_batched_tokens=max(exact.max_num_batched_tokens, 4 * bound["block_size"] * bound["table_len"]),
                      max_model_len=max(exact.max_model_len, bound["block_size"] * bound["table_len"]))
    configs = [exact, replace(exact, preemption_mode="swap"), relaxed, replace(relaxed, preemption_mode="swap")]
    pre = cex["pre"]
    rng = random.Random(seed)
    for attempt in range(tries):
        config = configs[attempt % len(configs)]
        shapes = _request_shapes(pre, config)
        prompt_choices = list(range(1, config.block_size * bound["table_len"] + 1))
        requests = []
        randomised = attempt >= len(configs)
        for k, (n, prompt) in enumerate(shapes):
            if randomised and rng.random() < 0.5:
                n, prompt = rng.randint(1, 2), rng.choice(prompt_choices)
            requests.append(Request(f"R{k}", prompt_len=prompt, max_tokens=rng.randint(1, 8) if randomised else 8, n=n))
        while randomised and len(requests) < 4 and rng.random() < 0.5:
            requests.append(Request(f"R{len(requests)}", prompt_len=rng.choice(prompt_choices), max_tokens=rng.randint(1, 8),
                                    n=rng.randint(1, 2)))
        arrivals = tuple(Arrival(rng.randint(0, 3) if randomised else 0, r) for r in requests)
        aborts, stops = _random_aborts_and_stops(rng, requests, max_steps) if randomised else ([], [])
        trace = Trace(config, arrivals, tuple(aborts), tuple(stops), max_steps=max_steps,
                      meta={"counterexample": {"invariant": invariant_id, "action": cex.get("action"),
                                               "params": cex.get("params"), "config": cex.get("config"), "pre": pre}})
        found = find_violation(trace, make, invariant_id)
        if found:
            return trace, found
    return None


def _request_shapes(pre: dict[str, Any], config: SchedulerConfig) -> list[tuple[int, int]]:
    shapes = []
    for j, grp in enumerate(pre["groups"]):
        slots = [q for q in pre["seqs"] if q["group"] == j]
        if grp["status"] == "NONE" or not slots:
            continue
        first = slots[0]
        prompt = max(1, min(first["tokens"] - (0 if first["status"] in ("WAITING", "NONE") else 1), config.max_model_len))
        shapes.append((len(slots), prompt))
    if not shapes:
        shapes.append((1, 1))
    return shapes


def all_groups_of(sched: Scheduler) -> list[SequenceGroup]:
    return sorted(sched.groups.values(), key=lambda g: g.arrival)



# ============================================================================== flow v1 (chunked prefill)
# The same bridge for `spec.proofs.chunked` and reference_impl/v1_scheduler.py (prefix caching
# off): one slot per request, in arrival order; no swap space.
def v1_config_constants(config: SchedulerConfig) -> dict[str, Any]:
    return {**config_constants(config), "long_prefill_token_threshold": config.long_prefill_token_threshold,
            "max_num_partial_prefills": config.max_num_partial_prefills,
            "enable_chunked_prefill": config.enable_chunked_prefill}


def v1_requests(sched: Any) -> list[Any]:
    """The V1 reference's requests in arrival order (slot s is the s-th to arrive)."""
    return sorted(sched.requests.values(), key=lambda t: t.arrival)


def v1_concrete_state(sched: Any, bound: Bound, *, keys_ok: bool = False) -> dict[str, Any] | None:
    """A V1 reference's state as the v1 encoding's concrete state (None when it exceeds the bound).
    ``keys_ok``: prefix caching may be on (the specdec encoding models its keys; the caller makes
    sure no cache hit happened, which no encoding models)."""
    pool = sched.pool
    tracked = v1_requests(sched)
    if pool.num_blocks != bound.gpu_blocks or len(tracked) > bound.seqs \
            or (sched.config.enable_prefix_caching and not keys_ok):
        return None
    free = set(pool.free_ids())
    seqs, groups = [], []
    for j in range(bound.seqs):
        if j >= len(tracked):
            seqs.append({"group": j, "status": "NONE", "device": None, "table": [], "tokens": 0, "computed": 0})
            groups.append({"status": "NONE", "queues": [], "forked": False, "prompt_len": 0, "max_tokens": 0})
            continue
        t = tracked[j]
        if len(t.blocks) > bound.table_len:
            return None
        status = "FINISHED" if t.status.is_finished else _CODE[t.status]
        seqs.append({"group": j, "status": status, "device": "gpu" if t.blocks else None, "table": list(t.blocks),
                     "tokens": t.num_tokens, "computed": t.num_computed})
        queues = [name for name, q in (("waiting", sched.waiting), ("running", sched.running)) if any(r is t for r in q)]
        groups.append({"status": status, "queues": queues, "forked": True, "prompt_len": t.request.prompt_len,
                       "max_tokens": t.request.max_tokens})
    return {
        "gpu_ref": list(pool.ref_counts), "gpu_free": [b in free for b in range(pool.num_blocks)],
        "cpu_ref": [0] * bound.cpu_blocks, "cpu_free": [True] * bound.cpu_blocks,
        "seqs": seqs, "groups": groups,
    }


def _v1_chunk_sizes(sched: Any, t: Any) -> set[int]:
    """Every chunk the reference could give ``t`` now, over the budgets left in a step (1..max)."""
    cfg = sched.config
    threshold = cfg.long_prefill_token_threshold if len(sched.running) + len(sched.waiting) > 1 else 0
    rem = t.num_tokens - t.num_computed
    tokens = threshold if 0 < threshold < rem else rem
    admitting = t.status is Status.WAITING
    sizes = set()
    for budget in range(1, cfg.max_num_batched_tokens + 1):
        if admitting and not cfg.enable_chunked_prefill and tokens > budget:
            continue
        sizes.add(min(tokens, budget))
    return {k for k in sizes if k >= 1}


def v1_reference_guard(sched: Any, action: str, t: Any, tokens: int, bound: Bound) -> bool:
    """Whether the V1 reference would take ``action`` (with a chunk of ``tokens``) now."""
    cfg = sched.config
    if action == "add":
        return t is None
    assert t is not None
    if action in ("admit", "chunk"):
        want = Status.WAITING if action == "admit" else Status.RUNNING
        if t.status is not want or tokens not in _v1_chunk_sizes(sched, t):
            return False
        if cfg.blocks_for(t.num_computed + tokens) > bound.table_len:
            return False
        if action == "chunk":
            return sched._blocks_needed(t, tokens) <= sched.pool.num_free
        if t.request.prompt_len > cfg.prompt_limit or cfg.blocks_for(t.num_tokens) > cfg.num_gpu_blocks - cfg.watermark_blocks:
            return False  # ignored instead
        if len(sched.running) >= cfg.max_num_seqs:
            return False
        limit = cfg.max_num_partial_prefills
        if limit and t.num_computed + tokens < t.num_tokens - 1:
            if sum(1 for r in sched.running if sched._mid_prefill_after(r, {})) >= limit:
                return False
        return sched._whole_sequence_fits(t, []) and sched._blocks_needed(t, tokens) + cfg.watermark_blocks <= sched.pool.num_free
    if action == "preempt_recompute":
        return t.status is Status.RUNNING
    if action == "abort":
        return not t.status.is_finished
    if action == "ignore":
        return t.status is Status.WAITING and (
            t.request.prompt_len > cfg.prompt_limit or cfg.blocks_for(t.num_tokens) > cfg.num_gpu_blocks - cfg.watermark_blocks
        )
    raise ValueError(action)


def v1_apply_action(sched: Any, action: str, t: Any, tokens: int = 1, stop: bool = False,
                    new_request: Request | None = None) -> None:
    """Perform one v1 matrix action on the V1 reference, through its own methods."""
    from reference_impl.v1_scheduler import apply_outcome

    if action == "add":
        assert new_request is not None
        sched.add_request(new_request)
        sched._rejected = []  # reported by the next schedule(); the state is already final
        return
    assert t is not None
    if action in ("admit", "chunk"):
        if action == "admit":
            assert sched._allocate(t, tokens, hits=[], watermark=True)
            sched.waiting.remove(t)
            t.status = Status.RUNNING
            t.in_prefill = True
            sched.running.append(t)
        else:
            assert sched._allocate(t, tokens, hits=[], watermark=False)
        apply_outcome([(t, tokens)], frozenset({t.seq_id} if stop else ()), sched.config, sched.running, sched._finish)
    elif action == "preempt_recompute":
        sched.running.remove(t)
        sched._preempt(t)
    elif action == "abort":
        sched.abort_request(t.request_id)
    elif action == "ignore":
        assert sched._ignore_if_infeasible(t, [], [])
        sched._ignored.clear()
    else:
        raise ValueError(action)


def v1_config_for(cex: dict[str, Any]) -> SchedulerConfig:
    """The V1 reference's config with the counterexample's constants."""
    base = config_for(cex)
    assert base is not None
    c = cex["config"]
    chunked = bool(c.get("enable_chunked_prefill")) or c.get("long_prefill_token_threshold", 0) > 0 \
        or c.get("max_num_partial_prefills", 0) > 0
    return replace(base, preemption_mode="recompute", enable_chunked_prefill=chunked,
                   long_prefill_token_threshold=max(0, c.get("long_prefill_token_threshold", 0)),
                   max_num_partial_prefills=max(0, c.get("max_num_partial_prefills", 0)))


def v1_counterexample_trace(
    cex: dict[str, Any], invariant_id: str, make: SchedulerFactory, *, tries: int = 2000, seed: int = 0,
    max_steps: int = 16, flow: str = "v1",
    configure: Callable[[SchedulerConfig], SchedulerConfig] | None = None,
    decide: Callable[[random.Random, list[Request], int], tuple[Any, ...]] | None = None,
) -> tuple[Trace, list[Violation]] | None:
    """`counterexample_trace` for the v1 flow: a seeded search for a trace that drives the V1
    reference built by ``make`` (a mutant, say) into a state shaped like the counterexample's
    (same config; its requests' prompt lengths and max_tokens, n = 1) and has the catalogue
    predicate ``invariant_id`` fail on replay. None when none was found. A flow built on v1's
    (``flow``) adds to the config (``configure``) and draws the trace's other decisions
    (``decide(rng, requests, max_steps)``: its ``drafts``)."""
    exact = v1_config_for(cex)
    if configure is not None:
        exact = configure(exact)
    bound = cex["bound"]
    relaxed = replace(exact, max_num_seqs=max(exact.max_num_seqs, bound["seqs"]),
                      max_num_batched_tokens=max(exact.max_num_batched_tokens, exact.max_num_seqs, bound["seqs"]),
                      max_model_len=max(exact.max_model_len, bound["block_size"] * bound["table_len"]))
    configs = [exact, relaxed]
    # Z3's pre-state need only satisfy the invariants, not be reachable under the exact config: a
    # request mid-prefill with chunked prefill off, say, or a watermark that holds back the one
    # admission the bug needs. The reference reaches such a shape with the limit relaxed.
    if not relaxed.enable_chunked_prefill:
        configs.append(replace(relaxed, enable_chunked_prefill=True))
    if relaxed.watermark > 0:
        configs.append(replace(relaxed, watermark=0.0))
    pre = cex["pre"]
    shapes = [(g["prompt_len"], g["max_tokens"]) for g in pre["groups"] if g["status"] != "NONE"] or [(1, 1)]
    rng = random.Random(seed)
    for attempt in range(tries):
        config = configs[attempt % len(configs)]
        randomised = attempt >= len(configs)
        if randomised and config.enable_chunked_prefill and rng.random() < 0.5:
            # chunks smaller than the budget leave room for a second request in the same step
            config = replace(config, long_prefill_token_threshold=rng.choice([1, 2, 3]),
                             max_num_batched_tokens=config.max_num_batched_tokens + rng.choice([0, 2, 4]))
        prompt_choices = list(range(1, config.block_size * bound["table_len"] + 1))
        requests = []
        for k, (prompt, max_tokens) in enumerate(shapes):
            prompt, max_tokens = max(1, prompt), max(1, min(max_tokens, 8))
            if randomised and rng.random() < 0.5:
                prompt, max_tokens = rng.choice(prompt_choices), rng.randint(1, 8)
            requests.append(Request(f"R{k}", prompt_len=prompt, max_tokens=max_tokens))
        while randomised and len(requests) < bound["seqs"] and rng.random() < 0.5:
            requests.append(Request(f"R{len(requests)}", prompt_len=rng.choice(prompt_choices), max_tokens=rng.randint(1, 8)))
        arrivals = tuple(Arrival(rng.randint(0, 3) if randomised else 0, r) for r in requests)
        aborts, stops = _random_aborts_and_stops(rng, requests, max_steps) if randomised else ([], [])
        drafts = decide(rng, requests, max_steps) if decide is not None else ()
        trace = Trace(config, arrivals, tuple(aborts), tuple(stops), max_steps=max_steps,
                      meta={"counterexample": {"flow": flow, "invariant": invariant_id, "action": cex.get("action"),
                                               "params": cex.get("params"), "config": cex.get("config"), "pre": pre}},
                      drafts=drafts)
        found = find_violation(trace, make, invariant_id)
        if found:
            return trace, found
    return None


def _random_aborts_and_stops(
    rng: random.Random, requests: list[Request], max_steps: int,
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """A trace search's random environment: each request aborted with probability 0.1 (after
    step 0), each of its sequences stopped with probability 0.15."""
    aborts: list[tuple[int, str]] = []
    stops: list[tuple[int, str]] = []
    for r in requests:
        if rng.random() < 0.1:
            aborts.append((rng.randint(1, max_steps - 1), r.request_id))
        for k in range(r.n):
            if rng.random() < 0.15:
                stops.append((rng.randint(0, max_steps - 1), f"{r.request_id}#{k}"))
    return aborts, stops


# ============================================================================== flow async (pipelined V1)
# `spec.proofs.encoding_async` and reference_impl/async_scheduler.py: the v1 bridge plus each
# request's in-flight share (its counters, and its entries in the in-flight steps, oldest first).
def async_config_constants(config: SchedulerConfig) -> dict[str, Any]:
    return {**v1_config_constants(config), "pipeline_depth": config.pipeline_depth}


def async_concrete_state(sched: Any, bound: Bound) -> dict[str, Any] | None:
    """An async reference's state as the async encoding's concrete state (None past the bound)."""
    from spec.proofs.encoding_async import Q

    state = v1_concrete_state(sched, bound)
    if state is None:
        return None
    tracked = v1_requests(sched)
    for j, seq in enumerate(state["seqs"]):
        if j >= len(tracked):
            seq["in_flight"] = {"placeholders": 0, "tokens": 0, "stale": 0, "entries": []}
            continue
        t = tracked[j]
        c = sched.counters[t.request_id]
        entries = [[k, -1 if p is None else p] for step in sched.in_flight for (r, k, p, _drafts) in step.entries if r is t]
        if len(entries) > Q:
            return None
        seq["in_flight"] = {"placeholders": c.num_placeholders, "tokens": c.num_in_flight, "stale": c.num_stale,
                            "entries": entries}
    return state


# ============================================================================== flow specdec (V1 + drafts)
# `spec.proofs.encoding_specdec` and reference_impl/specdec_scheduler.py: the v1 bridge plus each
# request's proposal and keyed blocks, and the encoding's proof-only ``void`` ghost (which the
# caller tracks: the reference keeps no such field).
def specdec_config_constants(config: SchedulerConfig) -> dict[str, Any]:
    return {**v1_config_constants(config), "num_speculative_tokens": config.num_speculative_tokens,
            "enable_prefix_caching": config.enable_prefix_caching}


def specdec_concrete_state(sched: Any, bound: Bound, void: frozenset[str] = frozenset()) -> dict[str, Any] | None:
    """A speculative V1 reference's state as the specdec encoding's concrete state (None past the
    bound). ``void``: the requests whose last outcome committed no token."""
    state = v1_concrete_state(sched, bound, keys_ok=True)
    if state is None:
        return None
    tracked = v1_requests(sched)
    for j, seq in enumerate(state["seqs"]):
        t = tracked[j] if j < len(tracked) else None
        seq["proposed"] = t.num_proposed if t is not None else 0
        seq["keyed"] = t.num_keyed if t is not None else 0
        seq["void"] = t is not None and t.request_id in void and bool(t.blocks)
    return state


def specdec_counterexample_trace(
    cex: dict[str, Any], invariant_id: str, make: SchedulerFactory, *, tries: int = 2000, seed: int = 0,
    max_steps: int = 16,
) -> tuple[Trace, list[Violation]] | None:
    """`v1_counterexample_trace` for the specdec flow: the counterexample's k (at least 1) and
    prefix caching, and random speculative decisions per step and request (proposals, acceptance,
    stops inside the run; empty outcomes only when the counterexample's outcome was empty)."""
    from spec.speculative import DraftDecision

    c = cex["config"]
    k = min(max(1, c.get("num_speculative_tokens", 1)), MAX_SPECULATIVE_TOKENS)
    empties = bool((cex.get("params") or {}).get("empty"))

    def configure(config: SchedulerConfig) -> SchedulerConfig:
        return replace(config, num_speculative_tokens=k, enable_prefix_caching=bool(c.get("enable_prefix_caching")))

    def decide(rng: random.Random, requests: list[Request], steps: int) -> tuple[Any, ...]:
        return tuple(
            (step, f"{r.request_id}#0", DraftDecision(
                proposed=rng.choice([None, None, 0, 1, k]), accepted=rng.randint(0, k),
                stop_at=rng.choice([None, 0, 1]), empty=empties and rng.random() < 0.3))
            for step in range(steps) for r in requests)

    return v1_counterexample_trace(cex, invariant_id, make, tries=tries, seed=seed, max_steps=max_steps,
                                   flow="specdec", configure=configure, decide=decide)
