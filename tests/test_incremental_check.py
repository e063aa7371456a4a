"""Incremental checking finds exactly what checking everything finds.

The runner checks incrementally (spec.invariants._views): derived views are carried forward
through each snapshot's delta, and checks skip what is identical to what they passed a step
before. These tests hold that shortcut to the slow path (every view, every step), on the
reference and on every mutant, and hold the reference's delta snapshots to a from-scratch build.
"""

from __future__ import annotations

import pytest

from conformance.flows import FLOWS
from conformance.generation.v0 import sample_traces, traces
from conformance.selftest.mutants import MUTANTS
from reference_impl import Scheduler
from reference_impl.engine import iter_steps
from spec import observation
from spec.catalogue import Checker

MUTANT_TRACES = 25
RARE_ON_THESE_TRACES = {
    "abort-finished-again", "admission-ignores-watermark", "recompute-to-back", "running-in-admission-order",
    "v1-ignores-partial-prefill-limit",
    "stop-to-wrong-request",  # needs a stop on a sequence batched with another request's
    "specdec-delivers-past-stop",  # needs a stop inside an accepted run of two or more drafts
    "specdec-empty-outcome-keeps-drafts",  # needs an empty outcome on a step that verified drafts
    "v1-admission-ignores-watermark",  # needs a watermark > 0 and a tight admission beside a running request
    "v1-reset-refuses-idle-cache", "v1-reset-keeps-keys",  # need reset_prefix_cache calls (trace `admin`)
    "connector-holder-behind-head",  # needs a head that cannot fit in front of a landed load, with nothing running
    "connector-ignores-fail-policy",  # needs kv_load_failure_policy fail and a load that fails
    "connector-keeps-failed-tokens",  # needs an asynchronous load that fails under recompute
    "connector-loading-takes-a-seat",  # needs a load in flight that fills max_num_seqs beside a request that fits
    "specdec-async-accepts-placeholders",  # needs an acceptance beyond a proposal of fewer than k
    "specdec-async-delivers-past-stop",  # as specdec-delivers-past-stop, a step late
    "specdec-async-empty-outcome-keeps-drafts",  # as specdec-empty-outcome-keeps-drafts, a step late
    "specdec-async-caches-rejected-kv",  # needs prefix caching and a block filled by the bonus token
    "sglang-retract-most-generated",  # needs a retraction (a few in a hundred of the flow's traces)
    # issue 32: need encoder inputs under a binding budget or a full cache, or two requests sharing one
    # (conformance.generation.budgets.budget_traces: tests/test_mutants.py finds each within its search)
    "v1-encoder-chunk-without-output", "v1-encoder-frees-begun-input", "v1-encoder-ignores-budget",
    "v1-encoder-shared-counted-twice",
}


def _violations(factory, trace, invariants=None) -> list[tuple[str, int | None, str]]:
    scheduler = factory(trace.config)
    checker = Checker(trace.config, scheduler.capabilities, invariants)
    found = []
    try:
        for record in iter_steps(trace, scheduler):
            found.extend(checker.check_step(record))
    except Exception:  # noqa: BLE001 - a mutant may crash; what was found before counts
        pass
    return sorted((v.invariant_id, v.step, v.message) for v in found)


def _first_violations(found):
    """Each invariant's first violating step, with the messages at that step."""
    first: dict[str, tuple[int | None, set[str]]] = {}
    for inv, step, message in found:
        if inv not in first:
            first[inv] = (step, set())
        if first[inv][0] == step:
            first[inv][1].add(message)
    return first


def _assert_same_findings(fast, slow):
    """Incremental checking reports each invariant first at the same step as checking everything,
    with a subset of its messages there: a view that fails after schedule() and is unchanged at
    the end of the step is reported once, not twice. (A run stops at its first violation.)"""
    fast_first, slow_first = _first_violations(fast), _first_violations(slow)
    assert {k: v[0] for k, v in fast_first.items()} == {k: v[0] for k, v in slow_first.items()}
    for inv, (_, messages) in fast_first.items():
        assert messages and messages <= slow_first[inv][1], inv


def _both_ways(monkeypatch, factory, trace, invariants=None):
    monkeypatch.setattr(observation, "INCREMENTAL", True)
    fast = _violations(factory, trace, invariants)
    monkeypatch.setattr(observation, "INCREMENTAL", False)
    slow = _violations(factory, trace, invariants)
    monkeypatch.setattr(observation, "INCREMENTAL", True)
    return fast, slow


def test_reference_snapshots_are_exact_deltas():
    """Every delta snapshot equals a from-scratch one, and unchanged views are the base's objects."""
    for trace in sample_traces(traces(max_requests=8), 60, 7):
        scheduler = Scheduler(trace.config)
        for record in iter_steps(trace, scheduler):
            for snap in (record.before, record.mid, record.after):
                if snap is None or snap.base is None:
                    continue
                for sid, view in snap.seqs.items():
                    if sid not in snap.changed_seqs:
                        assert view is snap.base.seqs[sid]
            last, settled = scheduler._last_snapshot, set(scheduler._settled)
            scheduler._last_snapshot, scheduler._settled = None, set()
            scratch = scheduler.snapshot()
            scheduler._last_snapshot, scheduler._settled = last, settled
            assert scratch == record.after


@pytest.mark.parametrize("flow", [f.id for f in FLOWS.values() if f.id != "v0"])
def test_token_budget_snapshots_are_exact_deltas(flow):
    """Every token-budget flow's reference (conformance/flows/: V1, nano-vllm, async): its delta
    snapshots equal from-scratch ones."""
    from conformance.flows import get_flow

    factory = get_flow(flow).make_reference()
    deltas = 0
    for trace in sample_traces(get_flow(flow).trace_strategy(), 60, 5):
        scheduler = factory(trace.config)
        for record in iter_steps(trace, scheduler):
            snap = record.after
            last, scheduler._last_snapshot = scheduler._last_snapshot, None
            scratch = scheduler.snapshot()  # no base: built whole
            scheduler._last_snapshot = last
            assert scratch.base is None and scratch == snap
            if snap.base is not None:
                deltas += 1
                for sid, view in snap.seqs.items():
                    if sid not in snap.changed_seqs:
                        assert view is snap.base.seqs[sid]
    assert deltas > 100


def test_reference_incremental_equals_full(monkeypatch):
    for trace in sample_traces(traces(max_requests=10), 80, 11):
        fast, slow = _both_ways(monkeypatch, Scheduler, trace)
        assert fast == slow == []


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_incremental_equals_full(monkeypatch, name):
    """On every mutant, the same violations (id, step, message) either way; and each violated
    invariant checked alone finds what it found among the others (the shrinker checks a problem
    alone: conformance/runner/fuzz.py, ``alone``; tests/test_mutants.py's search too)."""
    from conformance.flows.profiles import get_profile
    from spec.catalogue import get

    mutant = MUTANTS[name]
    strategy = mutant.trace_strategy() if mutant.trace_strategy else traces(max_requests=8)
    invariants = get_profile(mutant.profile).invariants() if mutant.profile else None
    compared = 0
    for trace in sample_traces(strategy, MUTANT_TRACES, 3):
        fast, slow = _both_ways(monkeypatch, mutant.factory, trace, invariants)
        _assert_same_findings(fast, slow)
        for inv in {i for i, _, _ in fast}:
            alone = _violations(mutant.factory, trace, [get(inv)])
            assert alone == [v for v in fast if v[0] == inv], inv
        compared += bool(fast)
        if compared >= 2:
            break
    # Equality is only a claim where something was found: every mutant but these few (caught at
    # the end of a run, or only on rarer traces than these 25) shows a step violation here.
    assert compared or name in RARE_ON_THESE_TRACES


def test_entry_counts_follow_the_delta(monkeypatch):
    """The per-block entry counts carried through the delta equal a whole count of the tables, and
    (on the reference) its reference counts."""
    from spec.invariants._views import entry_counts

    carried = 0
    for trace in sample_traces(traces(max_requests=10), 40, 13):
        for record in iter_steps(trace, Scheduler(trace.config)):
            for snap in (record.mid, record.after):
                for device, refs in (("gpu", snap.gpu_ref_counts), ("cpu", snap.cpu_ref_counts)):
                    counts = entry_counts(snap, device, len(refs))
                    monkeypatch.setattr(observation, "INCREMENTAL", False)
                    whole = entry_counts(observation.Snapshot(seqs=dict(snap.seqs)), device, len(refs))
                    monkeypatch.setattr(observation, "INCREMENTAL", True)
                    assert counts == whole == refs
                    carried += snap.base is not None
    assert carried > 500


class _WholeSnapshots:
    """A scheduler whose snapshots carry no delta and share no object with the one before: what
    an adapter around a third-party engine hands (the driver diffs it, `spec.observation.with_delta`)."""

    def __init__(self, make, config):
        self._inner = make(config)
        self.capabilities = self._inner.capabilities

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def snapshot(self):
        snap = self._inner.snapshot()

        def fresh(part):
            return tuple(list(part)) if isinstance(part, tuple) else part

        return observation.Snapshot(
            statuses=dict(snap.statuses) if snap.statuses is not None else None,
            seqs={sid: observation.SeqView(*map(fresh, v)) for sid, v in snap.seqs.items()} if snap.seqs is not None
            else None,
            **{name: fresh(getattr(snap, name)) for name in ("waiting", "running", "swapped", "gpu_ref_counts",
                                                             "cpu_ref_counts", "gpu_free", "cpu_free", "gpu_free_ids",
                                                             "cpu_free_ids", "gpu_block_keys", "gpu_fenced")},
            cache_index={k: fresh(v) for k, v in snap.cache_index.items()} if snap.cache_index is not None else None,
            in_flight=dict(snap.in_flight) if snap.in_flight is not None else None,
            group_tables={k: tuple(map(fresh, v)) for k, v in snap.group_tables.items()}
            if snap.group_tables is not None else None,
            encoder_cache=dict(snap.encoder_cache) if snap.encoder_cache is not None else None,
            encoder_free=snap.encoder_free, pause_state=snap.pause_state,
            kv_transfers=dict(snap.kv_transfers) if snap.kv_transfers is not None else None,
            kv_reported=dict(snap.kv_reported) if snap.kv_reported is not None else None,
        )


def _driven(make, trace, invariants):
    """(id, step, message) of every violation the driver finds, and how many snapshots it diffed."""
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.driver import run_checked
    from spec.catalogue import catalogue

    result = run_checked(SchedulerAdapter("under-test", make), trace, invariants or catalogue(), timeout=None,
                         stop_at_first=False)
    diffed = sum(1 for r in result.records if r.after.base is not None)
    return sorted((v.invariant_id, v.step, v.message) for v in result.violations), diffed


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_whole_snapshots_diffed_equal_full(monkeypatch, name):
    """An adapter that gives whole snapshots, diffed by the driver into deltas, gets the verdicts
    of checking everything on every mutant."""
    from conformance.flows.profiles import get_profile

    mutant = MUTANTS[name]
    strategy = mutant.trace_strategy() if mutant.trace_strategy else traces(max_requests=8)
    invariants = get_profile(mutant.profile).invariants() if mutant.profile else None
    compared = diffed = 0
    for trace in sample_traces(strategy, MUTANT_TRACES, 3):
        monkeypatch.setattr(observation, "INCREMENTAL", True)
        fast, count = _driven(lambda config: _WholeSnapshots(mutant.factory, config), trace, invariants)
        diffed += count
        monkeypatch.setattr(observation, "INCREMENTAL", False)
        slow, _ = _driven(mutant.factory, trace, invariants)
        monkeypatch.setattr(observation, "INCREMENTAL", True)
        _assert_same_findings(fast, slow)
        compared += bool(fast)
        if compared >= 2:
            break
    assert diffed
    assert compared or name in RARE_ON_THESE_TRACES


@pytest.mark.parametrize("flow", ["v0", "v1", "nano"])
def test_references_incremental_equal_full(monkeypatch, flow):
    """The references pass either way, as deltas, diffed whole snapshots or checked whole, on their
    own traces (prefix caching and chunked prefill included for V1 and nano-vllm)."""
    from conformance.flows.profiles import get_profile
    from conformance.generation.v1 import token_traces
    from reference_impl.nano_scheduler import NanoScheduler
    from reference_impl.v1_scheduler import V1Scheduler

    factory = {"v0": Scheduler, "v1": V1Scheduler, "nano": NanoScheduler}[flow]
    strategy = traces(max_requests=10) if flow == "v0" else token_traces(flow)
    invariants = None if flow == "v0" else get_profile("safety").invariants()  # V0's policy is not theirs
    for trace in sample_traces(strategy, 30, 17):
        fast, slow = _both_ways(monkeypatch, factory, trace, invariants)
        assert fast == slow == []
        whole, diffed = _driven(lambda config: _WholeSnapshots(factory, config), trace, invariants)
        assert whole == [] and (diffed or len(trace.arrivals) == 0)


def test_with_delta_is_exact():
    """A diffed snapshot equals the whole one, names exactly the views and requests that differ,
    and shares every unchanged part with the snapshot before it."""
    from conformance.generation.v1 import token_traces
    from reference_impl.v1_scheduler import V1Scheduler

    checked = 0
    for trace in sample_traces(token_traces("v1"), 20, 23):
        scheduler = _WholeSnapshots(V1Scheduler, trace.config)
        previous = None
        for _ in iter_steps(trace, scheduler):
            whole = scheduler.snapshot()
            snap = observation.with_delta(whole, previous)
            assert snap == whole
            if previous is not None:
                checked += 1
                assert snap.base is previous
                assert snap.changed_seqs == {sid for sid in {*whole.seqs, *previous.seqs}
                                             if whole.seqs.get(sid) != previous.seqs.get(sid)}
                assert snap.changed_requests == {rid for rid in {*whole.statuses, *previous.statuses}
                                                 if whole.statuses.get(rid) != previous.statuses.get(rid)}
                for sid, view in snap.seqs.items():
                    if sid not in snap.changed_seqs:
                        assert view is previous.seqs[sid]
                if whole.gpu_ref_counts == previous.gpu_ref_counts:
                    assert snap.gpu_ref_counts is previous.gpu_ref_counts
            previous = snap
    assert checked > 50


def test_carried_key_views_equal_whole(monkeypatch):
    """Keys extended along the snapshot chain and the keyed blocks carried through changed keys
    equal their whole computation, on prefix-caching traces."""
    from conformance.generation.v1 import token_traces
    from reference_impl.v1_scheduler import V1Scheduler
    from spec.invariants._views import chained_keys, keyed_blocks
    from spec.prefix import block_keys

    keyed_seen = 0
    for trace in sample_traces(token_traces("v1"), 30, 29):
        bs = trace.config.block_size
        for record in iter_steps(trace, V1Scheduler(trace.config)):
            for snap in (record.mid, record.after):
                keyed = keyed_blocks(snap)
                assert keyed == {b for b, k in enumerate(snap.gpu_block_keys) if k is not None}
                keyed_seen += bool(keyed)
                for sid, view in snap.seqs.items():
                    if view.token_ids is not None:
                        assert chained_keys(snap, sid, bs) == block_keys(view.token_ids, bs)
    assert keyed_seen


def test_pool_observation_is_current():
    """The tuples a V1 / nano-vllm pool hands a snapshot (reused while its change counters stand
    still) are its state at that moment, on the references and on every mutant with such a pool
    (some override the pool's eviction)."""
    from conformance.generation.v1 import token_traces
    from reference_impl.nano_scheduler import NanoScheduler
    from reference_impl.prefix_cache import CachingBlockPool
    from reference_impl.v1_scheduler import V1Scheduler

    cases = [(V1Scheduler, token_traces("v1")), (NanoScheduler, token_traces("nano"))]
    cases += [(m.factory, m.trace_strategy()) for m in MUTANTS.values() if m.trace_strategy and m.reference]
    looked = 0
    for factory, strategy in cases:
        for trace in sample_traces(strategy, 8, 31):
            scheduler = factory(trace.config)
            pool = getattr(scheduler, "pool", None)
            if not isinstance(pool, CachingBlockPool):
                break
            steps = iter_steps(trace, scheduler)
            while True:
                try:
                    next(steps)
                except StopIteration:
                    break
                except Exception:  # noqa: BLE001 - a mutant may crash (its pool's own asserts too); what was looked at counts
                    break
                assert pool.observed("ref_counts") == tuple(pool.ref_counts)
                assert pool.observed("free_ids") == pool.free_ids()
                assert pool.observed("keys") == tuple(pool.keys)
                assert pool.observed("cache_index") == pool.cache_index()
                looked += 1
    assert looked > 100


@pytest.mark.parametrize("bad", [1.0, True, "1", None, 2**70])
def test_snapshot_check_reads_changed_counts(bad):
    """The driver's snapshot check, reading only the reference counts that are not the base's
    objects, still names a bad entry that appears in a later snapshot (equal to an int or not)."""
    from conformance.runner.guard import AdapterFault
    from conformance.runner.normalize import check_snapshot

    first = check_snapshot(observation.Snapshot(gpu_ref_counts=(0, 1, 2, 1)))
    good = check_snapshot(observation.Snapshot(gpu_ref_counts=(0, 1, 2, 0), base=first))
    assert good.gpu_ref_counts == (0, 1, 2, 0)
    with pytest.raises(AdapterFault, match="gpu_ref_counts"):
        check_snapshot(observation.Snapshot(gpu_ref_counts=(0, bad, 2, 0), base=good))
    with pytest.raises(AdapterFault, match="gpu_ref_counts"):
        check_snapshot(observation.Snapshot(gpu_ref_counts=(0, bad, 2, 0)), previous=good)


def _pool_cases():
    """(factory, trace strategy) for the three references and every mutant (their pools, some
    overridden, log their own changes)."""
    from conformance.generation.v1 import token_traces
    from reference_impl.nano_scheduler import NanoScheduler
    from reference_impl.v1_scheduler import V1Scheduler

    cases = [(Scheduler, traces(max_requests=8)), (V1Scheduler, token_traces("v1")), (NanoScheduler, token_traces("nano"))]
    return cases + [(m.factory, m.trace_strategy() if m.trace_strategy else traces(max_requests=8))
                    for m in MUTANTS.values()]


def test_pool_deltas_are_exact():
    """Every block a snapshot's pool delta leaves out has the base's reference count and free-list
    entries, and every block it names has the entries it gives, on the references and every mutant
    (the delta is what lets the block checks skip the rest of the pool)."""
    from collections import Counter

    checked = 0
    for factory, strategy in _pool_cases():
        for trace in sample_traces(strategy, 4, 37):
            try:
                for record in iter_steps(trace, factory(trace.config)):
                    for snap in (record.before, record.mid, record.after):
                        if snap is None or snap.base is None:
                            continue
                        for device in ("gpu", "cpu"):
                            changes = getattr(snap, f"{device}_block_changes")
                            if changes is None:
                                continue
                            refs, old_refs = getattr(snap, f"{device}_ref_counts"), getattr(snap.base, f"{device}_ref_counts")
                            free = Counter(getattr(snap, f"{device}_free_ids"))
                            old_free = Counter(getattr(snap.base, f"{device}_free_ids"))
                            assert len(refs) == len(old_refs)
                            differ = {b for b in range(len(refs)) if refs[b] != old_refs[b]}
                            differ |= {b for b in {*free, *old_free} if free[b] != old_free[b]}
                            assert differ <= set(changes), (device, differ - set(changes))
                            assert all(free[b] == n for b, n in changes.items())
                            checked += 1
            except AssertionError:
                raise
            except Exception:  # noqa: BLE001 - a mutant may crash; what was looked at counts
                pass
    assert checked > 1000


def test_carried_pool_facts_equal_whole(monkeypatch):
    """The pool facts and the free blocks held by tables, carried through the pool deltas, equal
    their whole computation, on the references and every mutant (where the facts show a fault)."""
    from spec.invariants import _views

    carried = faulty = 0
    for factory, strategy in _pool_cases():
        for trace in sample_traces(strategy, 4, 41):
            try:
                for record in iter_steps(trace, factory(trace.config)):
                    for snap in (record.mid, record.after):
                        if snap is None:
                            continue
                        for device, total in (("gpu", trace.config.num_gpu_blocks), ("cpu", trace.config.num_cpu_blocks)):
                            facts = _views.pool_facts(snap, device)
                            held = _views.free_in_tables(snap, device, total)
                            refs = getattr(snap, f"{device}_ref_counts") or ()
                            free_ids = getattr(snap, f"{device}_free_ids") or ()
                            whole = _views._whole_pool_facts(refs, free_ids)
                            assert facts.free() == whole.free()
                            assert facts._replace(entries=None, low=0, high=0) == whole._replace(entries=None, low=0, high=0)
                            assert not free_ids or (facts.low <= whole.low and facts.high >= whole.high)  # bounds
                            assert facts.outside(len(refs)) == whole.outside(len(refs))
                            counts = _views.entry_counts(snap, device, total)
                            assert held == (None if counts is None else
                                            frozenset(b for b in whole.free() if 0 <= b < total and counts[b]))
                            carried += snap.gpu_block_changes is not None
                            faulty += bool(whole.repeated or whole.referenced_free or held)
            except AssertionError:
                raise
            except Exception:  # noqa: BLE001 - a mutant may crash; what was looked at counts
                pass
    assert carried > 1000 and faulty


def test_snapshot_check_reads_changed_blocks():
    """With a pool delta, the snapshot check reads the counts of the blocks it names and the delta
    itself, and still names a bad entry there."""
    from conformance.runner.guard import AdapterFault
    from conformance.runner.normalize import check_snapshot

    first = check_snapshot(observation.Snapshot(gpu_ref_counts=(0, 1, 2, 1), gpu_free_ids=(0,)))
    good = check_snapshot(observation.Snapshot(gpu_ref_counts=(0, 1, 2, 0), gpu_free_ids=(0, 3), base=first,
                                               gpu_block_changes={3: 1}))
    assert good.gpu_ref_counts == (0, 1, 2, 0)
    with pytest.raises(AdapterFault, match="gpu_ref_counts"):
        check_snapshot(observation.Snapshot(gpu_ref_counts=(0, 1.0, 2, 0), gpu_free_ids=(0, 3), base=good,
                                            gpu_block_changes={1: 0}))
    with pytest.raises(AdapterFault, match="gpu_block_changes"):
        check_snapshot(observation.Snapshot(gpu_ref_counts=(0, 1, 2, 0), gpu_free_ids=(0, 3), base=good,
                                            gpu_block_changes={1: -1}))


def test_carried_shared_blocks_and_queue_sets_equal_whole(monkeypatch):
    """The shared blocks (two or more table entries) and the queues' member sets, carried through
    the deltas, equal their whole computation, on the references and every mutant, forks and
    prefix-cache hits included (where blocks are shared)."""
    from spec.invariants import _views

    carried = shared = 0
    for factory, strategy in _pool_cases():
        for trace in sample_traces(strategy, 4, 43):
            records = []
            try:
                records.extend(iter_steps(trace, factory(trace.config)))
            except Exception:  # noqa: BLE001 - a mutant may crash (an assert of its own included); the steps before count
                pass
            for record in records:  # in order, as a checker reads them (each carried from the one before)
                for snap in (record.mid, record.after):
                    if snap is None:
                        continue
                    total = trace.config.num_gpu_blocks
                    counts = _views.entry_counts(snap, "gpu", total)
                    got = _views.shared_blocks(snap, "gpu", total)
                    assert got == (None if counts is None else frozenset(b for b, n in enumerate(counts) if n > 1))
                    for name in ("waiting", "running", "swapped"):
                        queue = snap.queue(name) or ()
                        assert _views.queue_set(snap, name) == (frozenset(queue), len(set(queue)) != len(queue))
                    carried += snap.base is not None
                    shared += bool(got)
    assert carried > 1000 and shared


@pytest.mark.parametrize("bad", [
    {"num_tokens": True}, {"num_computed": -1}, {"num_tokens": 2**63}, {"blocks": (1, "2")}, {"blocks": [1]},
    {"device": "tpu"}, {"token_ids": (5, 6, 7, 8.0)}, {"token_ids": (1, 2, 3.0)}, {"token_ids": [1, 2, 3]}, {"seq_id": "other#0"},
    {"request_id": 7}, {"status": "RUNNING"},
])
def test_snapshot_check_fast_path_refuses_what_the_slow_one_does(bad):
    """The driver's exact-type fast path (`normalize._plain_view`) accepts only what `_view`
    accepts: a bad field in a changed view is still named, after a decode-like delta."""
    from conformance.runner.guard import AdapterFault
    from conformance.runner.normalize import check_snapshot
    from spec.status import Status

    view = observation.SeqView("r#0", "r", Status.RUNNING, 2, 1, (0,), "gpu", (5, 6))
    first = check_snapshot(observation.Snapshot(statuses={"r": Status.RUNNING}, seqs={"r#0": view}))
    grown = view._replace(num_tokens=3, num_computed=2, token_ids=(5, 6, 7))
    ok = check_snapshot(observation.Snapshot(statuses=first.statuses, seqs={"r#0": grown}, base=first,
                                             changed_seqs=frozenset({"r#0"}), changed_requests=frozenset()))
    assert ok.seqs["r#0"] is grown
    broken = grown._replace(**bad)
    with pytest.raises(AdapterFault, match="Snapshot.seqs"):
        check_snapshot(observation.Snapshot(statuses=first.statuses, seqs={"r#0": broken}, base=ok,
                                            changed_seqs=frozenset({"r#0"}), changed_requests=frozenset()))


def test_kept_tokens_are_exact():
    """Every count a snapshot's token delta gives (`Snapshot.kept_tokens`) is a prefix its view
    shares with the base's, on the references and every mutant, and on the references the whole
    shared prefix (a decode's view is read from its one new token on)."""
    from reference_impl.nano_scheduler import NanoScheduler
    from reference_impl.v1_scheduler import V1Scheduler
    from spec.observation import _token_prefix

    given = 0
    for factory, strategy in _pool_cases():
        for trace in sample_traces(strategy, 4, 47):
            records = []
            try:
                records.extend(iter_steps(trace, factory(trace.config)))
            except Exception:  # noqa: BLE001 - a mutant may crash; the steps before count
                pass
            for record in records:
                for snap in (record.mid, record.after):
                    if snap is None or snap.kept_tokens is None:
                        continue
                    assert set(snap.kept_tokens) <= snap.changed_seqs
                    for sid, kept in snap.kept_tokens.items():
                        old, new = snap.base.seqs[sid].token_ids, snap.seqs[sid].token_ids
                        assert kept <= len(old) and old[:kept] == new[:kept]
                        if factory in (V1Scheduler, NanoScheduler):
                            assert kept == _token_prefix(snap, sid)
                        given += 1
    assert given > 1000
