"""The wire protocol (docs/PROTOCOL.md): a host written without kvsched's helpers conforms; a host
that crashes, hangs, or writes garbage is a fault with the step; the snapshot codec round-trips."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import traces
from conformance.runner.driver import run_checked
from conformance.runner.fuzz import fuzz
from conformance.runner.plan import RunPlan
from conformance.wire import WireAdapter, WireError, snapshot_from_json, snapshot_to_json
from reference_impl.scheduler import Scheduler
from spec.config import SchedulerConfig
from spec.trace import Arrival, Trace
from spec.types import Request, StepOutcome

RAW = Path(__file__).parent / "wire_hosts" / "raw_host.py"


def raw(*bug: str, timeout: float = 30.0) -> WireAdapter:
    return WireAdapter("raw", [sys.executable, str(RAW), *bug], timeout=timeout)


def _trace() -> Trace:
    config = SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2,
                             max_num_batched_tokens=16, max_model_len=16)
    return Trace(config, (Arrival(0, Request("a", 5, 3)), Arrival(0, Request("b", 4, 2, n=2))), max_steps=40)


def test_raw_host_conforms_to_safety(tmp_path):
    result = fuzz(lambda: raw(), RunPlan(get_profile("safety"), max_examples=30, seed=3, out_dir=tmp_path))
    assert result.examples == 30 and not result.findings
    assert "QUE-001" in result.active and "BLK-001" in result.not_applicable  # what it exposes, and not


def test_raw_host_overbudget_is_caught_and_shrunk(tmp_path):
    result = fuzz(lambda: raw("--bug", "overbudget"), RunPlan(get_profile("safety"), max_examples=20, seed=1, out_dir=tmp_path))
    assert "BUD-001" in result.findings
    assert result.findings["BUD-001"].path.exists()


@pytest.mark.parametrize("bug, kind, words", [
    ("crash", "exit", "exited (code 3)"),
    ("garbage", "raised", "not JSON"),
])
def test_host_faults_are_reported_with_the_step(bug, kind, words):
    result = run_checked(raw("--bug", bug), _trace(), get_profile("safety").invariants(), timeout=10)
    assert result.fault is not None and result.fault.kind == kind and words in result.fault.message
    assert result.fault_step == 2


def test_hung_host_is_a_hang_and_is_replaced():
    adapter = raw("--bug", "hang", timeout=60)
    result = run_checked(adapter, _trace(), get_profile("safety").invariants(), timeout=1.5)
    assert result.fault is not None and result.fault.kind == "hang" and result.fault_step == 2
    fresh = raw("--bug", "hang")  # the pool kills the abandoned host and starts another
    fresh.start()
    assert fresh.host is not adapter.host and not adapter.host.alive


def test_own_read_timeout_kills_a_silent_host():
    adapter = raw("--bug", "hang", timeout=1.0)
    adapter.reset(_trace().config)
    adapter.add_request(Request("a", 5, 3))
    for _ in range(2):
        adapter.schedule()
        adapter.update(StepOutcome())
    with pytest.raises(WireError, match="hung"):
        adapter.schedule()
    assert not adapter.host.alive


def test_host_error_answer_names_the_method():
    adapter = raw()
    adapter.start()
    with pytest.raises(WireError, match="unknown method"):
        adapter.host.call("no_such_method", {}, 5)


@settings(max_examples=25, deadline=None)
@given(traces())
def test_snapshot_codec_round_trips_reference_states(trace):
    scheduler = Scheduler(trace.config)
    for step in range(12):
        for request in trace.arrivals_at(step):
            scheduler.add_request(request)
        scheduler.schedule()
        snap = scheduler.snapshot()
        decoded = snapshot_from_json(snapshot_to_json(snap))
        for name in ("statuses", "waiting", "running", "swapped", "gpu_ref_counts", "cpu_ref_counts", "gpu_free",
                     "cpu_free", "gpu_free_ids", "cpu_free_ids"):
            assert getattr(decoded, name) == getattr(snap, name)
        assert {k: (v.status, v.num_tokens, v.num_computed, v.blocks, v.device) for k, v in decoded.seqs.items()} == \
            {k: (v.status, v.num_tokens, v.num_computed, v.blocks, v.device) for k, v in snap.seqs.items()}
        scheduler.update(StepOutcome(trace.stops_at(step)))


def test_malformed_snapshot_names_the_field():
    with pytest.raises(WireError, match="snapshot.gpu_ref_counts"):
        snapshot_from_json({"gpu_ref_counts": [1, "x"]})
    with pytest.raises(WireError, match="unknown status"):
        snapshot_from_json({"statuses": {"a": "DONE"}})


def test_a_host_can_refuse_a_request_at_the_door(tmp_path):
    """add_request's answer may be the refusal itself ({"request", "status": "FINISHED_IGNORED"}):
    a host that refuses unservable prompts at arrival conforms to safety and liveness."""
    adapter = raw("--bug", "door")
    adapter.reset(SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2,
                                  max_num_batched_tokens=16, max_model_len=16))
    refused = adapter.add_request(Request("long", 40, 3))
    assert refused is not None and refused.request_id == "long" and refused.status.value == "FINISHED_IGNORED"
    assert adapter.add_request(Request("short", 4, 2)) is None
    adapter.close()
    for profile in ("safety", "liveness"):
        result = fuzz(lambda: raw("--bug", "door"), RunPlan(get_profile(profile), max_examples=40, seed=5, out_dir=tmp_path / profile))
        assert result.examples == 40 and not result.findings, {p: f.message for p, f in result.findings.items()}


def test_an_old_host_is_refused_with_one_line():
    """A protocol-1 host is refused at hello, in one line that says what to do."""
    adapter = raw("--protocol", "1")
    with pytest.raises(WireError) as err:
        adapter.reset(_trace().config)
    message = str(err.value)
    assert "\n" not in message and "speaks protocol 1" in message and "version 2" in message


class _CallByCall:
    """The same host without the driver hook: every call a round trip (protocol 1's way)."""

    def __init__(self, adapter: WireAdapter) -> None:
        self._adapter = adapter
        self.capabilities = adapter.capabilities

    def __getattr__(self, name):
        if name == "begin_trace":
            raise AttributeError(name)
        return getattr(self._adapter, name)

    def reset(self, config):
        self._adapter.reset(config)
        self.capabilities = self._adapter.capabilities


@pytest.mark.parametrize("bug", [None, "overbudget", "door"])
def test_steps_answer_as_the_calls_do(bug):
    """Running many steps per message (`steps`) gives the driver what calling each method in turn
    gives: the same outputs, finishes, snapshots and verdicts, on fuzzed traces."""
    from conformance.generation.v0 import sample_traces

    args = ("--bug", bug) if bug else ()
    batched, single = raw(*args), _CallByCall(raw(*args))
    invariants = get_profile("safety").invariants()
    for trace in sample_traces(traces(max_requests=6), 25, 9):
        fast = run_checked(batched, trace, invariants, timeout=30, stop_at_first=False)
        slow = run_checked(single, trace, invariants, timeout=30, stop_at_first=False)
        assert fast.fault is None and slow.fault is None
        assert [(r.output, r.finished, r.after) for r in fast.records] == \
            [(r.output, r.finished, r.after) for r in slow.records]
        assert [str(v) for v in fast.violations] == [str(v) for v in slow.violations]
    assert batched._batch is not None  # the driver did batch


def test_a_trace_that_ends_early_leaves_its_host_to_the_next_adapter():
    """A trace whose requests all finish before its last step leaves the host running steps the
    driver never reads (``_trace``: 40 steps asked for, done in a few). The driver's ``end_trace``
    says the host is idle, not hung, so the next adapter of the same command takes the same process
    from the pool (vLLM's start costs 4 s), and its trace runs as on a fresh host."""
    invariants = get_profile("safety").invariants()
    first = raw().start()
    ran = run_checked(first, _trace(), invariants, timeout=30, stop_at_first=False)
    assert ran.fault is None and len(ran.records) < _trace().max_steps
    second = raw().start()
    assert second.host is first.host and second.host.proc.pid == first.host.proc.pid
    again = run_checked(second, _trace(), invariants, timeout=30, stop_at_first=False)
    assert again.fault is None
    assert [(r.output, r.finished, r.after) for r in again.records] == [(r.output, r.finished, r.after) for r in ran.records]


def test_snapshot_deltas_decode_to_the_whole_snapshots():
    """kvsched_host's `steps` sends each snapshot after the first as a delta on the one before; the
    runner rebuilds the very snapshot it would have decoded whole, sharing the unchanged parts."""
    from conformance.generation.v0 import sample_traces
    from conformance.generation.v1 import token_traces
    from reference_impl.v1_scheduler import V1Scheduler
    from spec.observation import with_delta

    sys.path.insert(0, str(Path(__file__).parents[1] / "conformance" / "targets" / "hosts"))
    import kvsched_host

    class Engine:  # the V1 reference behind the host helper, snapshots as JSON
        def __init__(self, config):
            self.s = V1Scheduler(config)

        def snapshot(self):
            return snapshot_to_json(self.s.snapshot())

    deltas = 0
    for trace in sample_traces(token_traces("v1"), 15, 4):
        engine = Engine(trace.config)
        steps, previous = kvsched_host._Steps(engine), None
        for step in range(12):
            for request in trace.arrivals_at(step):
                engine.s.add_request(request)
            engine.s.schedule()
            engine.s.update(StepOutcome(trace.stops_at(step)))
            whole = engine.snapshot()
            sent = steps._delta(engine.snapshot())
            snap = snapshot_from_json(sent, previous)
            assert snap == snapshot_from_json(whole)
            if previous is not None:
                deltas += sent.get("delta") is True
                # decoded straight into the checks' delta form, naming every entry that changed
                diffed = with_delta(snapshot_from_json(whole), previous)
                assert snap.base is previous
                assert snap.changed_seqs >= diffed.changed_seqs and snap.changed_requests >= diffed.changed_requests
                for sid, view in snap.seqs.items():
                    if sid not in snap.changed_seqs:
                        assert view is previous.seqs[sid]
                for name in ("waiting", "gpu_ref_counts", "gpu_free_ids"):
                    if getattr(snap, name) == getattr(previous, name):
                        assert getattr(snap, name) is getattr(previous, name)
            previous = snap
    assert deltas > 50
    with pytest.raises(WireError, match="no snapshot before it"):
        snapshot_from_json({"delta": True})


def test_killing_a_host_kills_the_processes_it_started() -> None:
    """A restarted host must not leave its engine's helper processes behind (they piled up under
    a lockstep campaign that restarted vLLM hosts)."""
    import os
    import subprocess
    import sys
    import time

    from conformance.wire.client import HostProcess, _descendants

    if not os.path.exists(f"/proc/{os.getpid()}/task"):
        pytest.skip("needs Linux's /proc")
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '300']); "
                             "print('up', flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    for _ in range(50):
        helpers = _descendants(proc.pid)
        if helpers:
            break
        time.sleep(0.1)
    assert helpers
    host = HostProcess.__new__(HostProcess)
    host.proc = proc
    host.kill()
    time.sleep(0.3)

    def running(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split()[2] != "Z"
        except OSError:
            return False

    assert proc.poll() is not None and not [pid for pid in helpers if running(pid)]


def test_steps_carry_each_steps_drafts_to_a_speculative_engine():
    """Protocol 2 with speculative decoding: the client puts each step's draft decisions in the
    `steps` batch (only the steps that have some) and the host's `_Steps` hands them to a
    speculative engine's update, as a lone `update` call would (docs/PROTOCOL.md)."""
    from conformance.wire.client import _Batch
    from spec.speculative import DraftDecision

    sys.path.insert(0, str(Path(__file__).parents[1] / "conformance" / "targets" / "hosts"))
    import kvsched_host

    config = SchedulerConfig(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=1,
                             max_num_batched_tokens=16, max_model_len=16, num_speculative_tokens=2)
    decision = DraftDecision(accepted=1, stop_at=0)
    trace = Trace(config, (Arrival(0, Request("a", 5, 8)),), stops=((2, "a#0"),), max_steps=4,
                  drafts=((1, "a#0", DraftDecision(accepted=2)), (2, "a#0", decision)))

    class Host:  # records the message instead of sending it
        def send(self, method, params):
            self.sent = (method, params)
            return 1

    adapter = WireAdapter("spy", [sys.executable, "-c", "pass"])
    adapter.host = Host()
    batch = _Batch(trace, observe=False, mid_step=False)
    adapter._send_steps(batch)
    method, params = adapter.host.sent
    assert method == "steps" and [s["step"] for s in params["steps"]] == [0, 1, 2, 3]
    assert ["drafts" in s for s in params["steps"]] == [False, True, True, False]
    assert params["steps"][2]["drafts"] == {"a#0": decision.to_dict()}

    class Engine:  # a speculative engine that only records what update() is given
        speculative = True

        def __init__(self):
            self.updates = []

        def add_request(self, request):
            return None

        def schedule(self):
            return {}

        def update(self, stopped, drafts):
            self.updates.append((stopped, drafts))
            return []

    engine, lines = Engine(), []
    kvsched_host._Steps(engine).run({**params, "last_arrival_step": 9}, lines.append)
    assert engine.updates == [([], {}), ([], {"a#0": DraftDecision(accepted=2).to_dict()}),
                              (["a#0"], {"a#0": decision.to_dict()}), ([], {})]
    assert len(lines) == 4


def _helper_host(schedule_at_step_3: str) -> list[str]:
    """A host on kvsched_host.serve whose ``schedule`` runs ``schedule_at_step_3`` at step 3."""
    sys.path.insert(0, str(RAW.parent))
    import helper_host

    return helper_host.command(schedule_at_step_3)


def test_an_engine_error_in_steps_keeps_the_host():
    """An engine that raises inside a `steps` run answers with an error and stays up: the fault is
    reported at its step, and the next trace runs on the same host process (restarting it cost
    0.2-0.3 s a failing trace: nano-vllm's scheduler asserts on many traces)."""
    adapter = WireAdapter("raiser", _helper_host("raise RuntimeError('boom')"), timeout=30)
    invariants = get_profile("safety").invariants()
    first = run_checked(adapter, _trace(), invariants, timeout=10)
    assert first.fault is not None and first.fault.kind == "raised" and "boom" in first.fault.message
    assert first.fault_step == 3
    pid = adapter.host.proc.pid
    second = run_checked(adapter, _trace(), invariants, timeout=10)
    assert second.fault_step == 3 and adapter.host.proc.pid == pid


@pytest.mark.parametrize("fault, kind", [("time.sleep(3600)", "hang"), ("sys.exit(3)", "exit")])
def test_held_step_lines_still_pin_a_fault_to_its_step(fault, kind, monkeypatch):
    """With flush_ms, kvsched_host holds step lines to write them together; a step that hangs (the
    watcher thread writes the held lines) or exits (serve writes them on the way out) is still
    reported at its own step, not at the first step whose line was held."""
    import conformance.wire.client as client

    monkeypatch.setattr(client, "_FLUSH_MS", 1.0)  # held lines are what this tests (the runner sends 0)
    adapter = WireAdapter("helper", _helper_host(fault), timeout=60)
    result = run_checked(adapter, _trace(), get_profile("safety").invariants(), timeout=1.5)
    assert result.fault is not None and result.fault.kind == kind and result.fault_step == 3


_SEGV = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"  # helper_host.SEGV


@pytest.mark.parametrize("fault, kind, words", [(_SEGV, "crash", "host killed by SIGSEGV"),
                                                ("import os; os._exit(0)", "exit", "host exited (code 0)")])
def test_a_host_killed_mid_steps_is_reported_at_its_own_step(fault, kind, words):
    """A host that dies without a word (a segfault in an engine's C code, os._exit) is a fault at the
    step it died in, with held step lines on (the runner's default): the lines it held die with it,
    so the driver replays the trace with each line written at once and reports where that dies. A
    signal is a crash, an exit (whatever its code) an exit, as for an isolated adapter's process."""
    import conformance.wire.client as client

    assert client._FLUSH_MS > 0  # the default holds lines
    adapter = WireAdapter("killed", _helper_host(fault), timeout=60)
    try:
        result = run_checked(adapter, _trace(), get_profile("safety").invariants(), timeout=10)
    finally:
        adapter.close()
    assert result.fault is not None and result.fault_step == 3, (result.fault, result.fault_step)
    assert result.fault.kind == kind and words in result.fault.message, result.fault


def test_a_death_under_held_lines_is_replayed_to_its_step(monkeypatch):
    """Lines held up to 1 s (so steps 0-2 are surely lost with the host): the first run cannot tell the
    step (its fault says so), the replay pins it, and the result is the one a run writing each line
    at once gives: the same fault, step and records (what the report and the shrinker see)."""
    import conformance.runner.driver as driver
    import conformance.wire.client as client

    invariants = get_profile("safety").invariants()
    replays = []
    real = driver._replay_exactly

    def spy(*args, **kwargs):
        replays.append(inspect.signature(real).bind(*args, **kwargs).arguments["first"])  # the first run's result
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "_replay_exactly", spy)
    monkeypatch.setattr(client, "_FLUSH_MS", 0.0)
    exact = WireAdapter("exact", _helper_host(_SEGV), timeout=60)
    monkeypatch.setattr(client, "_FLUSH_MS", 1000.0)
    held = WireAdapter("held", _helper_host(_SEGV), timeout=60)
    try:
        want = run_checked(exact, _trace(), invariants, timeout=10)
        assert not replays
        got = run_checked(held, _trace(), invariants, timeout=10)
    finally:
        exact.close()
        held.close()
    assert len(replays) == 1 and replays[0].fault.step_uncertain and replays[0].fault_step == 0
    assert held.flush_ms == 1000.0  # holding is back on after the replay
    assert got.fault is not None and want.fault is not None
    assert (got.fault.kind, got.fault.message, got.fault_step) == (want.fault.kind, want.fault.message, 3)
    assert [(r.output, r.finished, r.after) for r in got.records] == \
        [(r.output, r.finished, r.after) for r in want.records]
    assert len(got.records) == 3 and [str(v) for v in got.violations] == [str(v) for v in want.violations]


def test_a_nondeterministic_death_is_reported_where_its_lines_stop(tmp_path, monkeypatch):
    """A host that dies only in its first life (the replay runs the trace to its end): the fault
    stays at the first step whose line is missing, and its message says the crash did not come again."""
    import conformance.wire.client as client

    monkeypatch.setattr(client, "_FLUSH_MS", 1000.0)
    mark = tmp_path / "died-once"
    once = (f"import os, signal; os.path.exists({str(mark)!r}) or (open({str(mark)!r}, 'w').close(), "
            "os.kill(os.getpid(), signal.SIGSEGV))")
    adapter = WireAdapter("flaky", _helper_host(once), timeout=60)
    try:
        result = run_checked(adapter, _trace(), get_profile("safety").invariants(), timeout=10)
    finally:
        adapter.close()
    assert mark.exists()
    assert result.fault is not None and result.fault.kind == "crash" and result.fault_step == 0, result.fault
    assert "nondeterministic" in result.fault.message and "host killed by SIGSEGV" in result.fault.message


def test_a_crashed_host_is_a_crash_in_the_runners_child_too(monkeypatch):
    """Under `kvsched conform` the adapter runs in a child process (conformance/runner/isolated.py); its wire
    host killed by a signal is reported from there as FAULT-crash at the step it died in (the
    replay runs in the child), and the child itself lives on."""
    from conformance.runner.isolated import ChildRunner, Limits

    monkeypatch.syspath_prepend(str(RAW.parent))
    runner = ChildRunner("helper_host:segfault_at_step_3", Limits(timeout=10.0))
    try:
        runner.start()
        summary = runner.run(_trace(), [inv.id for inv in get_profile("safety").invariants()])
    finally:
        runner.close()
    problem = summary.problems.get("FAULT-crash")
    assert problem is not None and problem.step == 3 and "SIGSEGV" in problem.message, summary.problems


def test_a_reset_folded_into_steps_still_rejects_a_config():
    """After a host's first reset (a round trip of its own), each trace's reset goes with its first
    `steps` message (one round trip a trace less); a config the engine refuses there is still
    `config-rejected` in reset at step 0, with no records, as when reset was its own call, and the
    host stays up for the next trace."""
    import dataclasses

    sys.path.insert(0, str(RAW.parent))
    import helper_host

    invariants = get_profile("safety").invariants()
    good = _trace()
    bad = dataclasses.replace(good, config=dataclasses.replace(good.config, block_size=8))
    adapter = WireAdapter("picky", helper_host.command(refuse_block_size=8), timeout=30)
    try:
        assert run_checked(adapter, good, invariants, timeout=10).fault is None
        host = adapter.host
        assert host.folds_reset
        sent, send = [], host.send
        host.send = lambda method, params: (sent.append((method, "reset" in params)), send(method, params))[1]
        folded = run_checked(adapter, bad, invariants, timeout=10)
        assert sent == [("steps", True)]  # no message of its own
        host.folds_reset = False  # the same refusal, reset sent alone
        alone = run_checked(adapter, bad, invariants, timeout=10)
        assert sent[1:] == [("reset", False)]
        for result in (folded, alone):
            assert result.fault is not None and result.fault.kind == "config-rejected", result.fault
            assert result.fault.call == "reset" and result.fault_step == 0 and not result.records
            assert "no such block size" in result.fault.message and not result.active
        assert folded.fault.message == alone.fault.message
        host.folds_reset = True
        assert run_checked(adapter, good, invariants, timeout=10).fault is None and adapter.host is host
        adapter.reset(bad.config)  # without the driver's hook: the held reset goes before the next call
        with pytest.raises(WireError, match="no such block size") as err:
            adapter.schedule()
        assert err.value.fault_kind == "config-rejected"
    finally:
        adapter.close()


def test_a_crash_in_a_folded_reset_is_a_crash_in_reset():
    """A host killed by a signal in a reset sent with the first `steps` message is a crash in reset at
    step 0, nothing checked, as when the reset was its own call (the driver's replay sends it alone)."""
    import dataclasses

    sys.path.insert(0, str(RAW.parent))
    import helper_host

    invariants = get_profile("safety").invariants()
    good = _trace()
    bad = dataclasses.replace(good, config=dataclasses.replace(good.config, block_size=8))
    adapter = WireAdapter("fragile", helper_host.command(refuse_block_size=8, refusal=_SEGV), timeout=30)
    try:
        assert run_checked(adapter, good, invariants, timeout=10).fault is None and adapter.host.folds_reset
        result = run_checked(adapter, bad, invariants, timeout=10)
    finally:
        adapter.close()
    assert result.fault is not None and result.fault.kind == "crash" and result.fault.call == "reset", result.fault
    assert result.fault_step == 0 and not result.records and not result.violations and not result.active
    assert "SIGSEGV" in result.fault.message


def test_a_claim_made_only_without_a_kv_connector_is_dropped_for_one(monkeypatch):
    """hello's ``claims_without_kv_connector`` (docs/PROTOCOL.md): the claim stands for a config
    without a KV connector and is dropped for one with (vLLM's ordered_steps: with a consumer
    connector it fences, so PIP-004 applies), and comes back for the next config without."""
    import conformance.wire.client as client
    from spec.observation import Capability

    class Host:
        alive, busy, folds_reset = True, False, False
        hello = {"protocol": 2, "capabilities": ["output", "in_flight", "kv_transfers", "ordered_steps"],
                 "claims_without_kv_connector": ["ordered_steps", "no_such_claim"]}

        def call(self, method, params, timeout):  # noqa: ANN001, ANN201 - a stand-in host
            return None

    monkeypatch.setattr(client, "acquire_host", lambda *args: Host())
    adapter = WireAdapter("fake", ["unused"])
    pip004 = next(i for i in get_profile("safety").invariants() if i.id == "PIP-004")
    plain = SchedulerConfig(pipeline_depth=1)
    adapter.reset(plain)
    assert Capability.ORDERED_STEPS in adapter.capabilities and Capability.KV_TRANSFERS not in adapter.capabilities
    assert not pip004.applicable(adapter.capabilities, plain)
    with_connector = SchedulerConfig(pipeline_depth=1, kv_connector=True)
    adapter.reset(with_connector)
    assert Capability.ORDERED_STEPS not in adapter.capabilities and Capability.KV_TRANSFERS in adapter.capabilities
    assert pip004.applicable(adapter.capabilities | pip004.needs, with_connector)
    adapter.reset(plain)
    assert Capability.ORDERED_STEPS in adapter.capabilities
