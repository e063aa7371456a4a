"""What an adapter declares it reserves (spec.reservation) is what CAP-006 allows, no more.

A scheduler that takes blocks early is correct when it says so: the same lookahead scheduler
passes with its declaration and fails CAP-006 without it, and CAP-001 (vLLM V0's exact count)
is policy, not safety.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conformance.flows.profiles import get_profile
from conformance.generation.v0 import sample_traces, traces
from conformance.runner.driver import run_checked
from spec.catalogue import Checker
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.observation import ALL_CAPABILITIES
from spec.reservation import NONE, Reservation
from spec.types import Request

sys.path.insert(0, str(Path(__file__).parent))
from zoo import lookahead, whole_request  # noqa: E402
from zoo._adapter import zoo_adapter  # noqa: E402

SAFETY = get_profile("safety").invariants()


def test_the_bound_is_tokens_plus_lookahead_or_the_whole_request():
    request = Request("r", prompt_len=5, max_tokens=7)
    assert NONE.max_tokens_held(6, request) == 6
    assert Reservation(lookahead_tokens=2).max_tokens_held(6, request) == 8
    assert Reservation(whole_request=True).max_tokens_held(6, request) == 12
    assert Reservation(lookahead_tokens=9, whole_request=True).max_tokens_held(6, request) == 15


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"lookahead_tokens": -1}, "lookahead_tokens"), ({"lookahead_tokens": 1.5}, "lookahead_tokens"),
    ({"lookahead_tokens": True}, "lookahead_tokens"), ({"whole_request": 1}, "whole_request"),
])
def test_a_bad_declaration_is_one_input_error_naming_the_field(kwargs, field):
    with pytest.raises(InputError) as err:
        Reservation(**kwargs)
    assert err.value.where == f"adapter.reservation.{field}"


def test_the_checker_refuses_what_is_not_a_reservation():
    with pytest.raises(InputError) as err:
        Checker(SchedulerConfig(), ALL_CAPABILITIES, reservation={"lookahead_tokens": 1})  # type: ignore[arg-type]
    assert err.value.where == "adapter.reservation"


def _problems(adapter, count: int = 60) -> set[str]:
    found: set[str] = set()
    for trace in sample_traces(traces(), count, 5):
        found |= run_checked(adapter, trace, SAFETY, timeout=None, stop_at_first=False).problem_ids
    return found


def test_early_blocks_pass_when_declared_and_fail_cap_006_when_not():
    declared = zoo_adapter("lookahead", lookahead.ReserveAtSampling, reservation=Reservation(lookahead_tokens=1))
    silent = zoo_adapter("lookahead-undeclared", lookahead.ReserveAtSampling)
    assert _problems(declared) == set()
    assert _problems(silent) == {"CAP-006"}


def test_a_whole_request_reservation_needs_its_declaration():
    declared = zoo_adapter("whole", whole_request.ReserveWholeRequest, reservation=Reservation(whole_request=True))
    too_little = zoo_adapter("whole-lookahead", whole_request.ReserveWholeRequest, reservation=Reservation(lookahead_tokens=1))
    assert _problems(declared) == set()
    assert _problems(too_little) == {"CAP-006"}


def test_exact_block_counts_are_vllm_v0_policy():
    adapter = zoo_adapter("lookahead", lookahead.ReserveAtSampling, reservation=Reservation(lookahead_tokens=1))
    policy = [inv for inv in get_profile("vllm-v0").invariants() if inv.id in ("CAP-001", "CAP-002")]
    assert {inv.category for inv in policy} == {"policy"}
    found: set[str] = set()
    for trace in sample_traces(traces(), 60, 5):
        found |= run_checked(adapter, trace, policy, timeout=None, stop_at_first=False).problem_ids
    assert "CAP-001" in found  # the zoo member is a real departure from V0's timing, not a no-op


def test_a_pipelined_scheduler_declares_its_depth_as_lookahead():
    """At depth 1 the pipelined reference allocates the in-flight token's slot before the token
    is counted: one token of lookahead. Declared, the capacity range holds; declared as none (an
    adapter given no reservation takes the scheduler's own, so "none" is said explicitly), CAP-006
    says exactly that (docs/ASYNC.md lists the other synchronous-step assumptions)."""
    from conformance.generation.async_paths import path_strategy
    from conformance.runner.adapter import SchedulerAdapter
    from reference_impl.async_scheduler import AsyncV1Scheduler

    capacity = [inv for inv in SAFETY if inv.id in ("CAP-004", "CAP-005", "CAP-006")]
    found = {}
    for declared in (Reservation(lookahead_tokens=1), Reservation()):
        adapter = SchedulerAdapter("async-d1", lambda c: AsyncV1Scheduler(c, depth=1), reservation=declared)
        found[declared] = set()
        for trace in sample_traces(path_strategy("plain"), 40, 20261201):
            found[declared] |= run_checked(adapter, trace, capacity, timeout=None, stop_at_first=False).problem_ids
    assert found[Reservation(lookahead_tokens=1)] == set()
    assert found[Reservation()] == {"CAP-006"}


def test_the_declaration_is_reported_and_a_bad_one_refused_at_load(tmp_path, capsys):
    """The report says what the adapter declared (so a reader sees what CAP-006 allowed); a
    declaration of the wrong type is one line naming adapter.reservation, exit 2, nothing written."""
    from conformance.commands.cli import main

    report = tmp_path / "r.json"
    zoo = Path(__file__).parent / "zoo" / "lookahead.py"
    assert main(["conform", "--adapter", f"{zoo}:make", "--max-examples", "5", "--quiet",
                 "--out", str(tmp_path / "o"), "--json", str(report)]) == 0
    assert json.loads(report.read_text())["reservation"] == {"lookahead_tokens": 1, "whole_request": False}
    bad = tmp_path / "bad.py"
    bad.write_text("from conformance.runner.adapter import load_adapter\n"
                   "def make():\n    a = load_adapter('reference')\n    a.reservation = 3\n    return a\n")
    capsys.readouterr()
    assert main(["conform", "--adapter", f"{bad}:make", "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "adapter.reservation" in err and not (tmp_path / "never").exists()


def _drafting_trace(k: int):
    """One request whose drafts are all rejected (block size 1): its table holds k draft slots past
    its tokens after every verifying step, which only a k-token reservation allows."""
    from spec.speculative import DraftDecision
    from spec.trace import Arrival, Trace

    config = SchedulerConfig(block_size=1, num_gpu_blocks=32, num_cpu_blocks=0, max_num_seqs=1,
                             max_num_batched_tokens=16, max_model_len=32, watermark=0.0,
                             preemption_mode="recompute", num_speculative_tokens=k)
    drafts = tuple((step, "A#0", DraftDecision(accepted=0)) for step in range(12))
    return Trace(config, (Arrival(0, Request("A", 2, 8)),), max_steps=20, drafts=drafts)


def test_a_per_config_reservation_reaches_a_worker_isolated_run(tmp_path):
    """The speculative reference reserves k draft slots, k from the config: a worker-isolated run
    (`kvsched conform`, --workers) checks each trace against the reservation for its config and
    tells the runner which one that was; the report names the widest."""
    from conformance.commands.cli import main
    from conformance.runner.adapter import SchedulerAdapter
    from conformance.runner.isolated import ChildRunner
    from reference_impl.specdec_scheduler import SpecDecScheduler

    safety = [inv.id for inv in get_profile("specdec").invariants()]
    runner = ChildRunner("reference-specdec")
    try:
        runner.start()
        summaries = {k: runner.run(_drafting_trace(k), safety) for k in (1, 3)}
    finally:
        runner.close()
    for k, summary in summaries.items():
        assert summary.reservation == {"lookahead_tokens": k, "whole_request": False}
        assert "CAP-006" not in summary.problems, summary.problems
    # the trace needs the reservation: declared as none, the same scheduler breaks CAP-006
    undeclared = SchedulerAdapter("undeclared", SpecDecScheduler, reservation=NONE)
    assert "CAP-006" in run_checked(undeclared, _drafting_trace(3), get_profile("specdec").invariants()).problem_ids

    report = tmp_path / "report.json"
    code = main(["conform", "--adapter", "reference-specdec", "--max-examples", "5", "--seed", "3", "--quiet",
                 "--workers", "2", "--out", str(tmp_path / "out"), "--json", str(report)])
    data = json.loads(report.read_text())
    assert code == 0 and data["conforming"]
    assert data["reservation"] is not None and data["reservation"]["lookahead_tokens"] >= 1
