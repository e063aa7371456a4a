"""What `kvsched replay` shows of a checked run, built where the run happened (in the adapter's
child process) as plain JSON, so the runner prints it without importing the adapter."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the runner's result type: reports read it, never import the runner
    from conformance.runner.driver import TraceResult


def replay_view(result: TraceResult) -> dict[str, Any]:
    """The run as JSON: per step what was scheduled and finished, every violation, the fault and
    the lockstep divergence, and the same story as text lines for the terminal."""
    return {
        "steps": [r.output.to_dict() | {"finished": [[f.request_id, f.status.value] for f in r.finished]}
                  for r in result.records],
        "violations": [{"invariant": v.invariant_id, "step": v.step, "message": v.message} for v in result.violations],
        "fault": str(result.fault) if result.fault else None,
        "fault_step": result.fault_step if result.fault else None,
        "divergence": result.divergence.to_dict() if result.divergence else None,
        "failed": bool(result.failed),
        "lines": _lines(result),
    }


def _statement(invariant_id: str) -> str:
    """`` (the invariant's one-line statement)`` beside a violation, where the catalogue has it."""
    from spec.catalogue import get

    try:
        return f"\n      {invariant_id}: {' '.join(get(invariant_id).statement.split())}"
    except KeyError:
        return ""  # FAULT-*, LOCKSTEP: no statement


def _lines(result: TraceResult) -> list[str]:
    from conformance.reports.explain import explain_step

    lines: list[str] = []
    by_step: dict[int | None, list] = {}
    for v in result.violations:
        by_step.setdefault(v.step, []).append(v)
    for record in result.records:
        out = record.output
        sched = " ".join(f"{s.seq_id}:{s.num_tokens}{'P' if s.is_prefill else ''}" for s in out.scheduled) or "-"
        lines.append(f"step {record.step}: scheduled {sched}")
        lines.extend(f"    {line}" for line in explain_step(out))
        lines.extend(f"    finished {f.request_id}: {f.status.value}" for f in record.finished)
        lines.extend(f"  VIOLATION {v}{_statement(v.invariant_id)}" for v in by_step.get(record.step, []))
    lines.extend(f"VIOLATION {v}{_statement(v.invariant_id)}" for v in by_step.get(None, []))
    if result.fault:
        lines.append(f"ADAPTER FAULT at step {result.fault_step}: {result.fault}")
    if result.divergence:
        lines.append("LOCKSTEP DIVERGENCE " + result.divergence.describe())
    if not result.failed:
        lines.append("no violation")
    return lines
