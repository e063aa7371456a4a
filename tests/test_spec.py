"""The spec's own pieces: config validation, traces, the catalogue's shape, the lifecycle graph."""

from __future__ import annotations

import json

import pytest

from conformance.commands.cli import main
from spec.catalogue import CATEGORIES, catalogue
from spec.config import SchedulerConfig
from spec.errors import InputError
from spec.lifecycle import (
    CONNECTOR_EDGES,
    EDGES,
    SESSION_EDGES,
    cannot_finish,
    coverage,
    lifecycle_graph,
    to_dot,
    to_mermaid,
    unreachable,
)
from spec.status import Status
from spec.trace import Trace


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 0), ("num_gpu_blocks", -1), ("num_cpu_blocks", -1), ("max_num_seqs", 0),
        ("max_num_batched_tokens", 0), ("max_model_len", 0), ("watermark", 1.0), ("watermark", -0.1),
        ("watermark", "x"), ("preemption_mode", "drop"), ("policy", "lifo"), ("block_size", True),
        ("block_size", 1.5),
    ],
)
def test_bad_config_names_the_field(field, value):
    with pytest.raises(InputError) as err:
        SchedulerConfig(**{field: value})
    assert err.value.where == f"config.{field}"
    assert "\n" not in str(err.value)


def test_token_budget_below_seats_is_rejected():
    with pytest.raises(InputError, match="config.max_num_batched_tokens"):
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=4)


def test_unknown_config_field():
    with pytest.raises(InputError, match="config.blocksize: unknown field"):
        SchedulerConfig.from_dict({"blocksize": 4})


def test_trace_round_trips_through_json(tmp_path):
    from reference_impl.workloads import tour

    trace = tour()
    path = trace.save(tmp_path / "t.json")
    again = Trace.load(path)
    assert again.to_dict() == trace.to_dict()
    assert json.loads(path.read_text())["version"] == 1


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ({"version": 2}, "version"),
        ({"version": 1, "requests": [{"id": "a"}]}, "requests[0]"),
        ({"version": 1, "requests": [{"id": "a", "prompt_len": 0}]}, "requests[0].prompt_len"),
        ({"version": 1, "requests": [{"id": "a", "prompt_len": 3}, {"id": "a", "prompt_len": 3}]}, "requests[1].id"),
        ({"version": 1, "aborts": [{"step": -1, "request": "a"}]}, "aborts[0].step"),
        ({"version": 1, "stops": "x"}, "stops"),
        ({"version": 1, "config": {"policy": "x"}}, "config.policy"),
    ],
)
def test_bad_trace_names_the_field(doc, where):
    with pytest.raises(InputError) as err:
        Trace.from_dict(doc)
    assert err.value.where == where


def test_catalogue_shape():
    items = catalogue()
    assert len(items) >= 25
    assert len({i.id for i in items}) == len(items)
    for inv in items:
        assert inv.category in CATEGORIES
        assert inv.statement and inv.rationale and (inv.step or inv.end or inv.failure)
        assert inv.statement.count("\n") == 0
    assert {i.category for i in items} == set(CATEGORIES)


def test_lifecycle_every_status_reachable_and_can_finish():
    graph = lifecycle_graph()
    assert set(graph.nodes) == set(Status)
    assert unreachable(graph) == set()
    assert cannot_finish(graph) == set()
    for status in Status:
        if status.is_finished:
            assert graph.out_degree(status) == 0, f"{status} must be final"


def test_lifecycle_check_catches_a_dead_end():
    graph = lifecycle_graph()
    graph.remove_edges_from([(Status.SWAPPED, d, k) for _, d, k in graph.out_edges(Status.SWAPPED, keys=True)])
    assert Status.SWAPPED in cannot_finish(graph)
    graph.remove_edges_from([(s, Status.SWAPPED, k) for s, _, k in graph.in_edges(Status.SWAPPED, keys=True)])
    assert Status.SWAPPED in unreachable(graph)


def test_tour_covers_most_lifecycle_edges():
    from reference_impl import run_trace
    from reference_impl.workloads import tour

    counts = coverage(run_trace(tour()).records)
    taken = {k for k, v in counts.items() if v}
    assert ("WAITING", "RUNNING", "admit") in taken
    assert ("RUNNING", "SWAPPED", "swap_out") in taken and ("SWAPPED", "RUNNING", "swap_in") in taken
    assert ("WAITING", "FINISHED_IGNORED", "ignore") in taken
    # the tour (a V0 workload) runs no KV connector and no streaming session
    assert len(taken) >= (len(EDGES) - len(CONNECTOR_EDGES) - len(SESSION_EDGES)) // 2


def test_diagrams_name_every_edge():
    mermaid, dot = to_mermaid(), to_dot()
    for src, dst, action in EDGES:
        assert f"{src.value} --> {dst.value}: {action}" in mermaid
        assert f'"{src.value}" -> "{dst.value}"' in dot


def test_cli_invariants_json(capsys):
    assert main(["invariants", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["version"] == 1 and len(data["invariants"]) >= 25


def test_cli_simulate_runs_every_builtin(capsys):
    from reference_impl.workloads import BUILTIN

    for name in BUILTIN:
        assert main(["simulate", "--workload", name, "--json"]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["metrics"]["drained"] is True and data["violations"] == []


def test_cli_simulate_explain_prints_reasons(capsys):
    assert main(["simulate", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "admitted" in out and "preempted by swap" in out and "ignored" in out


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ('{"version": 1, "config": {"block_size": 0}}', "config.block_size"),
    ],
)
def test_cli_simulate_bad_workload_one_line_exit_2(tmp_path, capsys, content, expected):
    path = tmp_path / "w.json"
    if content is not None:
        path.write_text(content)
    assert main(["simulate", "--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err
