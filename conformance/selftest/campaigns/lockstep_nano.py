"""Strict lockstep: the reference's ``nano-vllm`` flow against nano-vllm's real scheduler core.

    python -m conformance.selftest.campaigns.lockstep_nano [--traces 1000] [--seed 20261130] \
        [--out docs/results/lockstep-nano-vllm.json] [--traces-dir docs/traces/lockstep-nano]

Runs seeded traces through the installed ``nano-vllm`` target (nano-vllm-npu 0.0.2:
``nanovllmnpu/engine/scheduler.py``, ``block_manager.py``) with the ``nano-vllm`` profile's
reference (`reference_impl.nano_scheduler.NanoScheduler`) beside it, in two trace spaces
(``--traces`` each):

``spec``  where nano-vllm's behaviour is meant to be specified (`spec_traces`, `in_spec_space`):
          block sizes 2, 4, 8 (nano's real Config wants a multiple of 256; its block arithmetic
          ``len % block_size == 1`` breaks at 1), prefix caching on (nano always caches), FCFS,
          recompute, no watermark, no abort, n = 1; every request fits the token budget and,
          grown to prompt + max_tokens, the KV cache on its own and max_model_len. Prompts share
          stems over a small vocabulary, so prefix hits, evictions and equal blocks after
          different prefixes all happen.
``full``  the whole space the nano host takes (`full_traces`): block size 1 too, prompts over
          max_model_len or the budget, requests that outgrow max_model_len or the cache.

Each step compares the decisions (`conformance.runner.lockstep`) and then the state after the step
(`state_of`: statuses, computed tokens, block tables with their ids, the queues and the free queue
in order). Every trace runs to its first divergence (or violation or crash), which is classified
(`classify`): a crash by where nano raised; a divergence by which of nano-vllm's known deviations,
modelled back into the reference (`EngineModel`), makes it go away or move later. Each class
is a documented deviation of nano-vllm with its source location (`CLASSES`); a divergence no
deviation explains is ``unclassified`` (a misreading to fix in the reference). Each trace that
diverged is also run against the reference with every deviation modelled:
``diverging_with_deviations_modelled`` counts those that still diverge (a crash aside), and
``traces_needing_deviation`` how many traces diverge when one deviation alone is left out (so a
deviation hidden behind an earlier one is counted too). The first trace of each class is shrunk and saved under
``--traces-dir``. Needs ``kvsched targets install nano-vllm``; takes minutes, not run in CI
(`tests/test_targets_nano_lockstep.py` runs 20 traces of the spec space).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces
from conformance.generation.v1 import _bound
from conformance.runner.driver import TraceResult, run_checked
from conformance.runner.lockstep import Divergence
from conformance.runner.shrink import shrink
from conformance.selftest.campaigns.recording import RecordsSnapshots
from conformance.targets import get_target
from reference_impl.nano_scheduler import NanoScheduler
from reference_impl.prefix_cache import CachingBlockPool
from spec.catalogue import catalogue
from spec.config import SchedulerConfig
from spec.observation import Snapshot
from spec.prefix import block_keys
from spec.trace import Arrival, Trace
from spec.types import Request, seq_id

TARGET = "nano-vllm"
SRC = "nanovllmnpu/engine/"

# class -> (kind, explanation with the nano-vllm source location)
CLASSES: dict[str, tuple[str, str]] = {
    "seats-overfilled": (
        "nano-deviation",
        f"{SRC}scheduler.py: Scheduler.schedule, line 29 (`while self.waiting and num_seqs < self.max_num_seqs`): "
        "`num_seqs` starts at 0 each step and counts only this step's admissions, so requests already running "
        "are not counted and running can exceed max_num_seqs. The spec bounds running (BUD-003, STR-002); the "
        "reference waits (`wait_seats`).",
    ),
    "whole-prompt-hit": (
        "nano-deviation",
        f"{SRC}block_manager.py: BlockManager.allocate, lines 63-73: every full block of the prompt is looked up, "
        "the last one included, so a prompt whose blocks are all cached is admitted with num_cached_tokens == "
        "len(seq): a prefill of zero tokens, nothing to sample from. The spec caps a hit at num_tokens - 1 "
        "(CHK-001, PFX-005): the reference recomputes the last block.",
    ),
    "stale-index-hit": (
        "nano-deviation",
        f"{SRC}block_manager.py: BlockManager.allocate, lines 66-67, and _allocate_block (line 44): a block handed "
        "out fresh is reset but its old hash stays in `hash_to_block_id`; a hit is validated only by the block's own "
        "`token_ids`, so a block recomputed after a different prefix (same tokens, other chain) is handed out as a "
        "hit: wrong KV (PFX-002). The reference drops an evicted block from the index.",
    ),
    "no-max-model-len": (
        "nano-deviation",
        f"{SRC}scheduler.py: Scheduler.schedule (lines 29-40) admits a prompt longer than max_model_len, and "
        "Scheduler.postprocess (line 70) stops a sequence only at EOS or max_tokens, never at max_model_len "
        "(LEN-001..003); nano's LLMEngine does not check either. The reference ignores an over-long prompt and "
        "caps a sequence at max_model_len.",
    ),
    "never-fitting-request-waits": (
        "nano-deviation",
        f"{SRC}scheduler.py: Scheduler.schedule, lines 29-33: nano has no ignore path: a waiting request whose "
        "blocks exceed the whole cache (BlockManager.can_allocate, block_manager.py line 57) or whose prompt "
        "exceeds the token budget stays at the head of waiting for good, blocking every request behind it (FCFS), "
        "until nothing runs and `assert scheduled_seqs` fires (line 57). The reference finishes it as ignored "
        "(LEN-003).",
    ),
    "nothing-schedulable-assert": (
        "nano-deviation",
        f"{SRC}scheduler.py: Scheduler.schedule, line 57 (`assert scheduled_seqs`): a waiting head that can never "
        "fit the budget or the free blocks while nothing runs, or a lone running sequence that outgrew the cache "
        "and preempted itself, crashes the engine. The reference ignores a request that can never fit and "
        "returns a step whose only decision is the preemption.",
    ),
    "block-size-1": (
        "nano-deviation",
        f"{SRC}block_manager.py: BlockManager.may_append, lines 99-105: with block_size 1 `len(seq) % 1 == 1` "
        "never holds (no block is ever appended) and `len(seq) % 1 == 0` always does, so the first decode trips "
        "`assert last_block.hash == -1` (its last block was hashed at admission). nano's Config requires "
        "kvcache_block_size % 256 == 0 (nanovllmnpu/config.py); the reference allocates a block per token.",
    ),
    "unclassified": ("open", "not yet explained"),
}
# Misreadings of nano-vllm that lockstep found and the reference fixed.
FIXES = {
    "index-overwrite": "nano's hash_to_block_id holds one block per key and each registration overwrites it "
                       f"({SRC}block_manager.py: BlockManager.allocate line 81, may_append line 110), so once the "
                       "newest block under a key is handed out fresh nano misses on that key, although an older "
                       "block registered under it still holds those tokens. The reference had kept every holder "
                       "findable (a hit nano does not make); reference_impl/prefix_cache.py (order 'nano') now "
                       "keeps one block per key and un-keys the older holders.",
}
# Invariants of the profile not checked here, and why (the results file lists them).
UNCHECKED: dict[str, str] = {}
# The deviations `EngineModel` can put back into the reference, tried in this order.
MODELLED = ("seats-overfilled", "whole-prompt-hit", "stale-index-hit", "no-max-model-len",
            "never-fitting-request-waits")
SPACES = ("spec", "full")


# ------------------------------------------------------------------------------ trace spaces
@st.composite
def _configs(draw: st.DrawFn, space: str) -> SchedulerConfig:
    block_size = draw(st.sampled_from([2, 4, 8] if space == "spec" else [1, 2, 4, 8]))
    max_num_seqs = draw(st.integers(1, 5))
    max_model_len = draw(st.integers(block_size * 2, block_size * 10))
    lowest = max(max_num_seqs, max_model_len)  # nano's Config asserts budget >= max_model_len
    budget = draw(st.integers(lowest, max(lowest, max_model_len * 2)))
    need = -(-max_model_len // block_size)
    low = need if space == "spec" else max(1, need // 2)
    blocks = draw(st.integers(low, need + 4) | st.integers(low, need + 14))
    return SchedulerConfig(block_size=block_size, num_gpu_blocks=blocks, num_cpu_blocks=0, max_num_seqs=max_num_seqs,
                           max_num_batched_tokens=budget, max_model_len=max_model_len, watermark=0.0,
                           preemption_mode="recompute", policy="fcfs", enable_prefix_caching=True)


@st.composite
def _traces(draw: st.DrawFn, space: str, max_requests: int = 6) -> Trace:
    config = draw(_configs(space))
    mml = config.max_model_len
    vocab = draw(st.sampled_from([2, 3, 50]))
    stems = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=mml), min_size=1, max_size=3))
    count = draw(st.integers(min(3, max_requests), max_requests) | st.integers(1, max_requests))
    arrivals, stops, step = [], [], 0
    for i in range(count):
        step += draw(st.sampled_from([0, 0, 1, 3]))
        if space == "spec":  # prompt + max_tokens <= max_model_len: nano never meets the limit
            length = draw(st.integers(1, mml - 1))
            max_tokens = draw(st.integers(1, min(12, mml - length)))
        else:
            length = draw(st.integers(1, mml + 1))
            max_tokens = draw(st.integers(1, 12))
        tail = draw(st.lists(st.integers(0, vocab - 1), max_size=4))
        tokens = (list(draw(st.sampled_from(stems))[:length]) + tail)[:length]
        while len(tokens) < length:
            tokens.append(len(tokens) % vocab)
        request = Request(f"r{i}", prompt_len=length, max_tokens=max_tokens, prompt_tokens=tuple(tokens))
        arrivals.append(Arrival(step, request))
        if draw(st.integers(0, 4)) == 0:
            stops.append((step + draw(st.integers(1, 14)), seq_id(request.request_id, 0)))
    trace = Trace(config, tuple(arrivals), (), tuple(sorted(stops)))
    return Trace(config, trace.arrivals, (), trace.stops, max_steps=step + 30 + _bound(trace))


def spec_traces() -> st.SearchStrategy:
    """Traces of the space where nano-vllm's behaviour is meant to be specified (`in_spec_space`)."""
    return _traces("spec")


def full_traces() -> st.SearchStrategy:
    """Traces of everything the nano host takes: block size 1, over-long prompts, small caches."""
    return _traces("full")


def in_spec_space(trace: Trace) -> bool:
    """The spec space, as a predicate (the shrinker keeps a spec-space class inside it)."""
    c = trace.config
    if (c.block_size not in (2, 4, 8) or not c.enable_prefix_caching or c.watermark or c.policy != "fcfs"
            or c.enable_chunked_prefill or trace.aborts or c.max_num_batched_tokens < c.max_model_len):
        return False
    return all(r.n == 1 and r.prompt_tokens is not None and r.prompt_len + r.max_tokens <= c.max_model_len
               and c.blocks_for(r.prompt_len + r.max_tokens) <= c.num_gpu_blocks
               for r in (a.request for a in trace.arrivals))


def stale_hit_trace() -> Trace:
    """A handmade spec-space trace of `stale-index-hit` (random traces rarely line the FIFO free queue
    up for it): ``a`` caches blocks [5,6] and [5,6|1,2]; ``b``'s fifth block is handed ``a``'s second
    one, now [1,2] after another prefix; ``c`` = ``a``'s prompt: nano's stale index entry for
    [5,6|1,2] names that block, whose own tokens match, so nano serves 4 tokens from the cache (KV
    computed after [..., 14, 15]); the reference serves 2."""
    config = SchedulerConfig(block_size=2, num_gpu_blocks=6, num_cpu_blocks=0, max_num_seqs=1,
                             max_num_batched_tokens=16, max_model_len=16, watermark=0.0,
                             preemption_mode="recompute", policy="fcfs", enable_prefix_caching=True)
    prompts = ((0, "a", (5, 6, 1, 2, 9)), (2, "b", (7, 8, 10, 11, 12, 13, 14, 15, 1, 2)), (4, "c", (5, 6, 1, 2, 9)))
    arrivals = tuple(Arrival(step, Request(rid, prompt_len=len(p), max_tokens=1, prompt_tokens=p))
                     for step, rid, p in prompts)
    return Trace(config, arrivals, (), (), max_steps=12)


# ------------------------------------------------------------------------------ the engine's deviations, modelled
class Recorded(RecordsSnapshots, NanoScheduler):
    """The reference, keeping its snapshot after every step (to compare state, not only decisions)."""


class _NanoIndexPool(CachingBlockPool):
    """nano's `hash_to_block_id` with its stale entries: one block per key (each registration
    overwrites), never removed when the block is handed out fresh, a hit validated by the block's
    own tokens only (not by its chain)."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks, caching=True, order="nano")
        self.latest: dict[str, int] = {}
        self.own: dict[str, tuple[int, ...]] = {}  # key -> the block's own tokens (content-determined)

    def register(self, block: int, key: str) -> None:
        self.latest[key] = block
        super().register(block, key)

    def find(self, key: str) -> int | None:
        block = self.latest.get(key)
        if block is None or self.keys[block] is None:
            return None
        return block if self.own.get(self.keys[block]) == self.own[key] else None


class EngineModel(Recorded):
    """The reference with some of nano-vllm's deviations (`MODELLED`) put back; used only to
    classify a divergence, never as a reference."""

    def __init__(self, config: SchedulerConfig, deviations: frozenset[str] | tuple[str, ...]) -> None:
        self.deviations = frozenset(deviations)
        if "no-max-model-len" in self.deviations:
            config = dataclasses.replace(config, max_model_len=max(config.max_num_batched_tokens, 1 << 20))
        super().__init__(config)
        if "stale-index-hit" in self.deviations:
            self.pool = _NanoIndexPool(config.num_gpu_blocks)

    def _ignore_if_infeasible(self, tracked, reasons, ignored) -> bool:
        if "never-fitting-request-waits" in self.deviations:
            return False  # it stays at the head of waiting: the budget or block check stops admission
        return super()._ignore_if_infeasible(tracked, reasons, ignored)

    def _schedule_prefills(self, reasons, ignored):
        if "seats-overfilled" not in self.deviations:
            return super()._schedule_prefills(reasons, ignored)
        # nano counts only this step's admissions against max_num_seqs: hide the running ones.
        running, self.running = self.running, []
        try:
            scheduled = super()._schedule_prefills(reasons, ignored)
        finally:
            self.running = running + self.running
        return scheduled

    def _hit_limit(self, tracked) -> int:
        return tracked.num_tokens if "whole-prompt-hit" in self.deviations else super()._hit_limit(tracked)

    def _lookup(self, tracked, index, key):
        if not isinstance(self.pool, _NanoIndexPool):
            return super()._lookup(tracked, index, key)
        self.pool.own[key] = self._own_tokens(tracked, index)
        return self.pool.find(key)

    def _register(self, tracked, index, key) -> None:
        if isinstance(self.pool, _NanoIndexPool):
            self.pool.own[key] = self._own_tokens(tracked, index)
        super()._register(tracked, index, key)

    def _own_tokens(self, tracked, index: int) -> tuple[int, ...]:
        bs = self.config.block_size
        return tuple(tracked.tokens[index * bs:(index + 1) * bs])

    def _append_slot(self, tracked) -> None:
        bs = self.config.block_size
        if isinstance(self.pool, _NanoIndexPool) and (tracked.num_computed + 1) % bs == 0:
            keys = block_keys(tracked.tokens, bs, limit=tracked.num_computed + 1)
            self.pool.own[keys[-1]] = self._own_tokens(tracked, len(keys) - 1)
        super()._append_slot(tracked)


# ------------------------------------------------------------------------------ running and classifying
def state_of(snap: Snapshot) -> dict[str, Any]:
    """What must agree after every step besides the decisions: live requests' statuses, computed
    tokens and block tables (block ids included: both hand out the FIFO free queue's front), the
    queues in order, and the free queue in order."""
    live = {rid for rid, s in (snap.statuses or {}).items() if not s.is_finished}
    seqs = {v.request_id: v for v in (snap.seqs or {}).values() if v.request_id in live}
    return {
        "statuses": {rid: snap.statuses[rid].value for rid in sorted(live)},
        "computed": {rid: seqs[rid].num_computed for rid in sorted(seqs)},
        "blocks": {rid: tuple(seqs[rid].blocks or ()) for rid in sorted(seqs)},
        "running": tuple(snap.running or ()),
        "waiting": tuple(snap.waiting or ()),
        "free_ids": tuple(snap.gpu_free_ids or ()),
    }


def _state_divergence(result: TraceResult, reference: Recorded) -> Divergence | None:
    for record, ref in zip(result.records, reference.after, strict=False):
        want, got = state_of(ref), state_of(record.after)
        for key, value in want.items():
            if got[key] != value:
                if isinstance(value, dict):
                    diff = sorted(k for k in set(value) | set(got[key]) if value.get(k) != got[key].get(k))
                    value, got_value = {k: value.get(k) for k in diff}, {k: got[key].get(k) for k in diff}
                else:
                    got_value = got[key]
                return Divergence(record.step, f"state.{key}", value, got_value, ())
    return None


def run(adapter, trace: Trace, deviations: tuple[str, ...] | None = None, checked: bool = True) -> TraceResult:
    """One lockstep run against the profile's reference (``deviations`` None) or `EngineModel`:
    decisions compared by the driver, then the state after every step (`state_of`); the earlier
    divergence wins (a decision one at the same step). ``checked``: also check the profile's
    invariants; otherwise only BLK-001 (for the snapshots; nano keeps it)."""
    profile = get_profile(TARGET)
    assert profile.reference == "reference_impl.nano_scheduler:NanoScheduler", profile.reference
    made: list[Recorded] = []

    def factory(config: SchedulerConfig) -> Recorded:
        made.append(Recorded(config) if deviations is None else EngineModel(config, deviations))
        return made[-1]

    invariants = [inv for inv in profile.invariants() if inv.id not in UNCHECKED] if checked else \
        [inv for inv in catalogue() if inv.id == "BLK-001"]
    result = run_checked(adapter, trace, invariants, timeout=60, lockstep=True, reference_factory=factory)
    state = _state_divergence(result, made[0]) if made else None
    if state is not None and (result.failure_step is None or state.step < result.failure_step):
        result.divergence = state
    return result


def classify(adapter, result: TraceResult) -> str | None:
    """The class of a run's first problem (None: it agreed and held every invariant)."""
    if not result.failed:
        return None
    if result.fault is not None:
        message = result.fault.message  # "... (at FILE:LINE in FUNCTION)" from the host
        if "in may_append)" in message and result.trace.config.block_size == 1:
            return "block-size-1"
        if "AssertionError" in message and "scheduler.py" in message and "in schedule)" in message:
            return "nothing-schedulable-assert"
        return "unclassified"
    first = result.failure_step
    plain = result if result.divergence is not None else run(adapter, result.trace, checked=False)
    if plain.divergence is None or plain.divergence.step > first:
        return "unclassified"  # a violation with the reference in agreement: not a lockstep class
    for size in range(1, len(MODELLED) + 1):  # the smallest set of deviations that explains it
        for deviations in itertools.combinations(MODELLED, size):
            again = run(adapter, result.trace, deviations, checked=False)
            if again.failure_step is None or again.failure_step > plain.divergence.step:
                return "+".join(deviations)
    return "unclassified"


def class_info(cls: str) -> tuple[str, str]:
    """(kind, explanation) of a class, deviations meeting in one step (``a+b``) included."""
    if cls in CLASSES:
        return CLASSES[cls]
    return "nano-deviation", " And, in the same step: ".join(CLASSES[part][1] for part in cls.split("+"))


def describe(result: TraceResult) -> str:
    if result.fault is not None:
        return str(result.fault)
    if result.divergence is not None:
        return result.divergence.describe()
    return "; ".join(str(v) for v in result.violations[:2])


def run_space(adapter, space: str, count: int, seed: int, first: dict, log=print) -> dict[str, Any]:
    traces = sample_traces(spec_traces() if space == "spec" else full_traces(), count, seed)
    by_class: collections.Counter[str] = collections.Counter()
    by_field: collections.Counter[str] = collections.Counter()
    problems: collections.Counter[str] = collections.Counter()
    needing: collections.Counter[str] = collections.Counter()
    steps = agreeing = residual = 0
    for trace in traces:
        result = run(adapter, trace)
        steps += len(result.records)
        cls = classify(adapter, result)
        if cls is None:
            agreeing += 1
            continue
        by_class[cls] += 1
        if result.divergence is not None:
            by_field[result.divergence.field] += 1
        for problem in result.problem_ids:
            problems[problem] += 1
        if run(adapter, trace, MODELLED, checked=False).divergence is not None:
            residual += 1  # a crash cannot be modelled; a divergence left over would be a misreading
            continue
        for deviation in MODELLED:  # which deviations the whole trace needs, not only its first divergence
            if run(adapter, trace, tuple(d for d in MODELLED if d != deviation), checked=False).divergence:
                needing[deviation] += 1
        first.setdefault((space, cls), trace)
    report = {"traces": len(traces), "steps": steps, "agreeing_traces": agreeing,
              "divergent_traces": len(traces) - agreeing, "by_class": dict(sorted(by_class.items())),
              "divergent_by_field": dict(sorted(by_field.items())), "problems": dict(sorted(problems.items())),
              "diverging_with_deviations_modelled": residual,
              "traces_needing_deviation": {d: needing[d] for d in MODELLED}}
    log(f"{space}: {json.dumps(report)}")
    return report


def shrink_class(adapter, space: str, cls: str, trace: Trace, traces_dir: Path, seconds: float) -> dict[str, Any]:
    handmade = trace == stale_hit_trace()

    def failing(candidate: Trace) -> int | None:
        c = candidate.config
        if space == "spec" and not in_spec_space(candidate):
            return None
        if c.max_num_batched_tokens < c.max_model_len or (c.block_size < 2 and cls != "block-size-1"):
            return None  # nano's Config refuses the first; block size 1 is a class of its own
        result = run(adapter, candidate)
        return result.failure_step if classify(adapter, result) == cls else None

    small = trace
    if not handmade:
        try:
            small, _ = shrink(trace, failing, budget=400, seconds=seconds)
        except ValueError:
            pass
    final = run(adapter, small)
    kind, why = class_info(cls)
    message = describe(final)
    meta = {"adapter": TARGET, "profile": TARGET, "lockstep": True, "space": space, "class": cls, "kind": kind,
            "origin": "handmade (lockstep_nano.stale_hit_trace)" if handmade else "fuzzed, shrunk",
            "problems": sorted(final.problem_ids), "message": message, "steps": len(final.records)}
    small = Trace(small.config, small.arrivals, small.aborts, small.stops, small.max_steps, meta)
    path = small.save(traces_dir / f"{cls}.json")
    return {"kind": kind, "explanation": why, "space": space, "trace": str(path), "origin": meta["origin"],
            "message": message}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=1000, help="traces per space")
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--spaces", nargs="+", default=list(SPACES), choices=SPACES)
    ap.add_argument("--out", type=Path, default=Path("docs/results/lockstep-nano-vllm.json"))
    ap.add_argument("--traces-dir", type=Path, default=Path("docs/traces/lockstep-nano"))
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    ap.add_argument("--no-shrink", action="store_true")
    args = ap.parse_args(argv)
    started = time.monotonic()
    target = get_target(TARGET)
    adapter = target.adapter()
    profile = get_profile(TARGET)
    report: dict[str, Any] = {"version": 1, "target": TARGET, "package": target.version,
                              "reference": profile.reference, "profile": profile.name, "seed": args.seed,
                              "unchecked": UNCHECKED, "reference_fixes": FIXES,
                              "spaces": {}, "classes": {}}
    first: dict[tuple[str, str], Trace] = {}
    for space in args.spaces:
        report["spaces"][space] = run_space(adapter, space, args.traces, args.seed, first)
    stale = run(adapter, stale_hit_trace())
    if classify(adapter, stale) == "stale-index-hit":
        first.setdefault(("spec", "stale-index-hit"), stale_hit_trace())  # handmade: kept as it is
    for (space, cls), trace in sorted(first.items(), key=lambda kv: (SPACES.index(kv[0][0]), kv[0][1])):
        if cls in report["classes"] or "+" in cls:
            continue  # shrunk from the spec space already; a meeting of deviations has each part's trace
        if args.no_shrink:
            kind, why = class_info(cls)
            report["classes"][cls] = {"kind": kind, "explanation": why, "space": space}
            continue
        report["classes"][cls] = shrink_class(adapter, space, cls, trace, args.traces_dir, args.shrink_seconds)
        print(f"{cls}: {report['classes'][cls]['trace']}", flush=True)
    report["seconds"] = round(time.monotonic() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out} in {report['seconds']} s")
    spec = report["spaces"].get("spec")
    return 1 if spec and spec["by_class"].get("unclassified") else 0


if __name__ == "__main__":
    raise SystemExit(main())
