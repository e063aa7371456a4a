"""The request lifecycle as a graph: statuses are nodes, actions are labelled edges.

It documents which moves exist (a finished status has no way out), lets tests check that every
status is reachable from WAITING and every unfinished one can still finish, and measures which
edges a run exercised (transition coverage). networkx is imported by the functions that build the
graph, not by the module: transition coverage, which every conformance worker computes, needs only
the edge list, and importing networkx was about a quarter of such a worker's start-up.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from spec.observation import StepRecord
from spec.status import Status

if TYPE_CHECKING:
    import networkx as nx

S = Status

# (from, to, action)
EDGES: tuple[tuple[Status, Status, str], ...] = (
    (S.WAITING, S.RUNNING, "admit"),
    (S.WAITING, S.FINISHED_IGNORED, "ignore"),
    (S.WAITING, S.FINISHED_ABORTED, "abort"),
    (S.RUNNING, S.RUNNING, "decode"),
    (S.RUNNING, S.WAITING, "preempt_recompute"),
    (S.RUNNING, S.SWAPPED, "swap_out"),
    (S.RUNNING, S.FINISHED_STOPPED, "finish_stop"),
    (S.RUNNING, S.FINISHED_LENGTH_CAPPED, "finish_length"),
    (S.RUNNING, S.FINISHED_ABORTED, "abort"),
    (S.RUNNING, S.FINISHED_IGNORED, "preempt_then_ignore"),
    (S.SWAPPED, S.RUNNING, "swap_in"),
    (S.SWAPPED, S.FINISHED_IGNORED, "ignore"),
    (S.SWAPPED, S.FINISHED_ABORTED, "abort"),
)
# KV connectors (spec/connector.py): an asynchronous load waits holding its blocks, then runs;
# a load that fails is recomputed or fails its request. Only a config with a connector takes them.
CONNECTOR_EDGES: tuple[tuple[Status, Status, str], ...] = (
    (S.WAITING, S.WAITING_FOR_REMOTE_KV, "load_async"),
    (S.WAITING_FOR_REMOTE_KV, S.RUNNING, "admit_loaded"),
    (S.WAITING_FOR_REMOTE_KV, S.WAITING, "load_failed_recompute"),
    (S.WAITING_FOR_REMOTE_KV, S.FINISHED_ERROR, "load_failed"),
    (S.WAITING_FOR_REMOTE_KV, S.FINISHED_ABORTED, "abort"),
    (S.RUNNING, S.FINISHED_ERROR, "load_failed"),
)
EDGES += CONNECTOR_EDGES
# Structured output (spec/invariants/grammar.py): a request with a grammar_ready_step waits for its
# grammar in the waiting queue, then waits as any other (vLLM's WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR).
GRAMMAR_EDGES: tuple[tuple[Status, Status, str], ...] = (
    (S.WAITING, S.WAITING_FOR_GRAMMAR, "await_grammar"),
    (S.WAITING_FOR_GRAMMAR, S.WAITING, "grammar_ready"),
    (S.WAITING_FOR_GRAMMAR, S.FINISHED_ABORTED, "abort"),
)
EDGES += GRAMMAR_EDGES
# Streaming-input sessions (spec/session.py): a session whose generation is done waits for its next
# input holding its KV (vLLM's WAITING_FOR_STREAMING_REQ), or takes it up at once if it is there.
SESSION_EDGES: tuple[tuple[Status, Status, str], ...] = (
    (S.RUNNING, S.WAITING_FOR_INPUT, "await_input"),
    (S.RUNNING, S.WAITING, "take_input"),
    (S.WAITING_FOR_INPUT, S.WAITING, "input_arrived"),
    (S.WAITING_FOR_INPUT, S.FINISHED_ABORTED, "abort"),
)
EDGES += SESSION_EDGES

INITIAL = S.WAITING


def lifecycle_graph() -> nx.MultiDiGraph:
    import networkx as nx

    graph = nx.MultiDiGraph()
    for status in Status:
        graph.add_node(status, final=status.is_finished)
    for src, dst, action in EDGES:
        graph.add_edge(src, dst, key=action, action=action)
    return graph


def unreachable(graph: nx.MultiDiGraph | None = None) -> set[Status]:
    import networkx as nx

    graph = graph or lifecycle_graph()
    return set(graph.nodes) - nx.descendants(graph, INITIAL) - {INITIAL}


def cannot_finish(graph: nx.MultiDiGraph | None = None) -> set[Status]:
    import networkx as nx

    graph = graph or lifecycle_graph()
    finals = {n for n in graph.nodes if n.is_finished}
    return {n for n in graph.nodes if not n.is_finished and not (nx.descendants(graph, n) & finals)}


def transitions(
    record: StepRecord, previous: dict[str, Status] | None = None
) -> list[tuple[Status, Status, str]]:
    """The lifecycle edges one step took, read from its statuses and outputs.

    ``previous`` is the status map at the end of the step before (aborts happen before this
    step's first snapshot, so their starting status comes from there)."""
    before, after = record.before.statuses, record.after.statuses
    if before is None or after is None:
        return []
    preempted = {p.request_id: p.mode.value for p in record.output.preempted}
    scheduled = {s.request_id for s in record.output.scheduled}
    taken = []
    for rid, new in after.items():
        old = before.get(rid)
        if old is None or old.is_finished:
            continue
        if old is new:
            if new is S.RUNNING and rid in scheduled:
                taken.append((old, new, "decode"))
            continue
        action = _action(old, new, preempted.get(rid))
        if action is not None:
            taken.append((old, new, action))
    for rid in record.aborted:
        old = (previous or {}).get(rid, S.WAITING)
        if not old.is_finished:
            taken.append((old, S.FINISHED_ABORTED, "abort"))
    return taken


def _action(old: Status, new: Status, preempt_mode: str | None) -> str | None:
    if old is S.RUNNING and new is S.FINISHED_IGNORED:
        return "preempt_then_ignore"
    if old is S.RUNNING and new is S.WAITING:
        # preempted: recompute; else a streaming session whose generation ended took up its next
        # input within the step (SESSION_EDGES), which no step reports as a preemption
        return "preempt_recompute" if preempt_mode else "take_input"
    if old is S.RUNNING and new is S.RUNNING:
        return "decode"
    for src, dst, action in EDGES:
        if src is old and dst is new:
            return action
    if old is S.RUNNING and new is S.SWAPPED and preempt_mode:
        return "swap_out"
    return None


def coverage(records: Iterable[StepRecord]) -> dict[tuple[str, str, str], int]:
    """How often each lifecycle edge was taken; unexercised edges count 0."""
    counts = {(a.value, b.value, act): 0 for a, b, act in EDGES}
    previous: dict[str, Status] = {}
    for record in records:
        for a, b, act in transitions(record, previous):
            key = (a.value, b.value, act)
            if key in counts:
                counts[key] += 1
        previous = dict(record.after.statuses or {})
    return counts


def to_mermaid() -> str:
    lines = ["stateDiagram-v2", f"    [*] --> {INITIAL.value}"]
    for src, dst, action in EDGES:
        lines.append(f"    {src.value} --> {dst.value}: {action}")
    for status in Status:
        if status.is_finished:
            lines.append(f"    {status.value} --> [*]")
    return "\n".join(lines) + "\n"


def to_dot() -> str:
    lines = ["digraph lifecycle {", "  rankdir=LR;"]
    for status in Status:
        shape = "doublecircle" if status.is_finished else "circle"
        lines.append(f'  "{status.value}" [shape={shape}];')
    for src, dst, action in EDGES:
        lines.append(f'  "{src.value}" -> "{dst.value}" [label="{action}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
