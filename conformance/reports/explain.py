"""One step's decisions as sentences a person can read.

`explain_step` turns a `SchedulerOutput` (and, optionally, the requests that finished in the
step) into lines: every structured reason the scheduler attached, rendered with its numbers,
plus a plain statement of each decision that carries no reason (an adapter around a
third-party scheduler reports what it did but rarely why): the decision alone, with no remark
about the reason it lacks, since most adapters give none and the remark would be every line. The lockstep divergence report
prints these lines for the reference beside those for the target; the HTML trace view shows
the same sentences.
"""

from __future__ import annotations

from collections.abc import Iterable

from spec.reasons import Reason
from spec.types import Finished, SchedulerOutput

# Reason kinds that explain each kind of decision (used to tell which decisions are explained).
_ADMISSION = ("admitted",)
_PREEMPTION = ("preempted_swap", "preempted_recompute")
_SWAP_IN = ("swapped_in",)
_DECODE = ("decode",)


def _explained(reasons: Iterable[Reason], kinds: tuple[str, ...]) -> set[str]:
    return {r.request_id for r in reasons if r.kind in kinds}


def explain_step(output: SchedulerOutput, finished: Iterable[Finished] = ()) -> list[str]:
    """Sentences for one step, in the order the decisions were taken.

    Reasons come first, in the scheduler's order; then a bare statement for each decision
    without a reason (prefills, decodes, preemptions, swap-ins, ignores); then the finished
    requests (with their reason where one was given). Never empty: a step that decided nothing
    says so.
    """
    reasons = list(output.reasons)
    lines = [r.text() for r in reasons]

    prefill: dict[str, int] = {}
    decode: dict[str, int] = {}
    for item in output.scheduled:
        target = prefill if item.is_prefill else decode
        target[item.request_id] = target.get(item.request_id, 0) + item.num_tokens
    admitted = _explained(reasons, _ADMISSION)
    for rid, tokens in prefill.items():
        if rid not in admitted:
            lines.append(f"{rid} prefills {tokens} token(s)")
    decoded = _explained(reasons, _DECODE) | _explained(reasons, _SWAP_IN)
    for rid, tokens in decode.items():
        if rid not in decoded:
            lines.append(f"{rid} decodes {tokens} token(s)")
    preempted = _explained(reasons, _PREEMPTION)
    for p in output.preempted:
        if p.request_id not in preempted:
            lines.append(f"{p.request_id} preempted by {p.mode.value}")
    swapped_in = _explained(reasons, _SWAP_IN)
    for rid in output.swapped_in:
        if rid not in swapped_in:
            lines.append(f"{rid} swapped in")
    ignored = {r.request_id for r in reasons if r.kind.startswith("ignored_")}
    for rid in output.ignored:
        if rid not in ignored:
            lines.append(f"{rid} ignored")
    if output.swap_out:
        lines.append("swap out (GPU→CPU): " + _pairs(output.swap_out))
    if output.swap_in:
        lines.append("swap in (CPU→GPU): " + _pairs(output.swap_in))
    if output.copies:
        lines.append("copy-on-write (GPU→GPU): " + _pairs(output.copies))

    for f in finished:
        if f.reason is not None and f.reason in reasons:
            continue  # an ignored request's reason was already printed above
        if f.reason is not None:
            lines.append(f.reason.text())
        else:
            lines.append(f"{f.request_id} finished: {f.status.value}")
    if not lines:
        lines.append("nothing scheduled")
    return lines


def _pairs(pairs: Iterable[tuple[int, int]]) -> str:
    return ", ".join(f"{a}→{b}" for a, b in pairs)
