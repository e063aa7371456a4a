"""Shrink a failing trace to a short one that still fails the same way.

Hypothesis shrinks the first failure it finds; a run can fail several invariants, so each
finding is shrunk again here, greedily, for its own invariant: cut the trace at the failing
step, drop requests, aborts and stops, lower numbers, simplify the config. A candidate is kept
when the same problem still shows and the trace got simpler. Given the adapter's
`spec.domain.ConfigDomain`, no candidate leaves it: a smaller trace the engine cannot be given
would shrink the adapter's translation, not the scheduler's bug.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

from spec.config import SchedulerConfig
from spec.connector import ConnectorScript
from spec.domain import ConfigDomain
from spec.errors import InputError
from spec.trace import Arrival, Trace

# failing(trace) -> the step the problem shows at, or None when it does not show.
Failing = Callable[[Trace], "int | None"]


def size(trace: Trace, failure_step: int) -> tuple[int, ...]:
    reqs = [a.request for a in trace.arrivals]
    return (
        failure_step,
        len(reqs),
        len(trace.aborts) + len(trace.stops) + len(trace.drafts),
        sum(r.prompt_len + r.max_tokens + r.n + r.priority + len(r.encoder_inputs) + len(r.session) for r in reqs)
        + sum(a.step for a in trace.arrivals),
        sum(v for v in trace.config.to_dict().values() if isinstance(v, int)),
    )


def shrink(trace: Trace, failing: Failing, budget: int = 400, seconds: float = 30.0,
           domain: ConfigDomain | None = None) -> tuple[Trace, int]:
    """Return the simplest failing trace found within ``budget`` candidate runs (and about
    ``seconds`` of time), and its failing step. Candidates outside ``domain`` are never run."""
    deadline = time.monotonic() + seconds
    step = failing(trace)
    if step is None:
        raise ValueError("shrink() needs a failing trace")

    def cut_failing(candidate: Trace, at: int) -> tuple[Trace, int]:
        # The cut is run again: it can change the run, not only shorten it (without the arrivals
        # after the failing step, the driver stops once the earlier requests are done).
        cut = _cut(candidate, at)
        again = failing(cut)
        return (cut, again) if again is not None else (candidate, at)

    best, best_step = cut_failing(trace, step)
    tries = 0
    improved = True
    while improved and tries < budget and time.monotonic() < deadline:
        improved = False
        for candidate in _candidates(best):
            if domain is not None and not domain.admits(candidate):
                continue
            tries += 1
            if tries > budget or time.monotonic() > deadline:
                break
            got = failing(candidate)
            if got is not None and size(_cut(candidate, got), got) < size(best, best_step):
                tries += 1
                kept, kept_step = cut_failing(candidate, got)
                if size(kept, kept_step) < size(best, best_step):
                    best, best_step, improved = kept, kept_step, True
                    break
    return best, best_step


def _cut(trace: Trace, step: int) -> Trace:
    """Keep only what happens up to the failing step."""
    return Trace(
        trace.config,
        tuple(a for a in trace.arrivals if a.step <= step),
        tuple(x for x in trace.aborts if x[0] <= step),
        tuple(x for x in trace.stops if x[0] <= step),
        max_steps=step + 1,
        meta=trace.meta,
        drafts=tuple(x for x in trace.drafts if x[0] <= step),
        abort_batches=tuple(x for x in trace.abort_batches if x[0] <= step),
        admin=tuple(x for x in trace.admin if x[0] <= step),
        connector=trace.connector,
    )


def connector_simplifications(script: ConnectorScript) -> Iterator[ConnectorScript]:
    """One-step simpler scripts: fewer external tokens, synchronous, one step, no failure, no send."""
    for tokens in sorted({0, script.external_tokens // 2, script.external_tokens - 1}):
        if 0 <= tokens < script.external_tokens:
            yield dataclasses.replace(script, external_tokens=tokens)
    if script.load_async:
        yield dataclasses.replace(script, load_async=False)
    if script.load_steps > 1:
        yield dataclasses.replace(script, load_steps=1)
    if script.failed_blocks:
        yield dataclasses.replace(script, failed_blocks=())
    if script.send_steps:
        yield dataclasses.replace(script, send_steps=0)


def _replace(trace: Trace, **changes) -> Trace:
    fields = {f.name: getattr(trace, f.name) for f in dataclasses.fields(trace)}
    fields.update(changes)
    return Trace(**fields)


def _candidates(trace: Trace) -> Iterator[Trace]:
    arrivals = list(trace.arrivals)
    first = min((a.step for a in arrivals), default=0)
    if first > 0:  # nothing happens before the first arrival: start the whole trace there
        yield _replace(
            trace,
            arrivals=tuple(Arrival(a.step - first, a.request) for a in arrivals),
            aborts=tuple((max(step - first, 0), rid) for step, rid in trace.aborts),
            stops=tuple((max(step - first, 0), sid) for step, sid in trace.stops),
            max_steps=max(trace.max_steps - first, 1),
            drafts=tuple((step - first, sid, d) for step, sid, d in trace.drafts if step >= first),
            abort_batches=tuple((max(step - first, 0), ids) for step, ids in trace.abort_batches),
            admin=tuple((max(step - first, 0), op) for step, op in trace.admin),
        )
    for i, a in enumerate(arrivals):  # drop one request with its aborts and stops
        rid = a.request.request_id
        yield _replace(
            trace,
            arrivals=tuple(arrivals[:i] + arrivals[i + 1:]),
            aborts=tuple(x for x in trace.aborts if x[1] != rid),
            stops=tuple(x for x in trace.stops if not x[1].startswith(rid + "#")),
            drafts=tuple(x for x in trace.drafts if not x[1].startswith(rid + "#")),
            connector={k: v for k, v in trace.connector.items() if k != rid},
        )
    for i in range(len(trace.drafts)):  # drop one draft decision (the default takes its place)
        yield _replace(trace, drafts=trace.drafts[:i] + trace.drafts[i + 1:])
    for rid, script in trace.connector.items():  # a KV connector's script, towards none (spec/connector.py)
        for simpler_script in connector_simplifications(script):
            yield _replace(trace, connector={**trace.connector, rid: simpler_script})
        yield _replace(trace, connector={k: v for k, v in trace.connector.items() if k != rid})
    for i in range(len(trace.aborts)):
        yield _replace(trace, aborts=trace.aborts[:i] + trace.aborts[i + 1:])
    for i in range(len(trace.abort_batches)):
        yield _replace(trace, abort_batches=trace.abort_batches[:i] + trace.abort_batches[i + 1:])
    for i in range(len(trace.admin)):
        yield _replace(trace, admin=trace.admin[:i] + trace.admin[i + 1:])
    for i in range(len(trace.stops)):
        yield _replace(trace, stops=trace.stops[:i] + trace.stops[i + 1:])
    for i, a in enumerate(arrivals):
        r = a.request
        options: list[dict[str, object]] = []
        for name, low in (("prompt_len", 1), ("max_tokens", 1), ("n", 1), ("priority", 0)):
            value = getattr(r, name)
            for smaller in sorted({low, value // 2, value - 1}):
                if low <= smaller < value:
                    changes: dict[str, object] = {name: smaller}
                    if name == "prompt_len" and r.prompt_tokens is not None:  # a shorter prompt: its head
                        changes["prompt_tokens"] = r.prompt_tokens[:smaller]
                    if name == "prompt_len" and r.encoder_inputs:  # and the encoder inputs within it
                        changes["encoder_inputs"] = tuple(e for e in r.encoder_inputs if e.end <= smaller)
                    options.append(changes)
        # one encoder input fewer, one session input fewer (later inputs keep their order)
        options += [{"encoder_inputs": r.encoder_inputs[:j] + r.encoder_inputs[j + 1:]} for j in range(len(r.encoder_inputs))]
        options += [{"session": r.session[:j] + r.session[j + 1:]} for j in range(len(r.session))]
        for changes in options:
            try:
                request = dataclasses.replace(r, **changes)
            except InputError:  # a request the spec refuses (spec.types.Request checks its fields)
                continue
            yield _replace(trace, arrivals=tuple(arrivals[:i] + [Arrival(a.step, request)] + arrivals[i + 1:]))
        if a.step > 0:
            yield _replace(trace, arrivals=tuple(arrivals[:i] + [Arrival(a.step - 1, r)] + arrivals[i + 1:]))
    config = trace.config.to_dict()
    simpler = [("watermark", 0.0), ("policy", "fcfs")]
    for name in ("num_gpu_blocks", "num_cpu_blocks", "max_num_seqs", "max_model_len", "max_num_batched_tokens", "block_size"):
        value = config[name]
        simpler.extend((name, v) for v in sorted({value // 2, value - 1}) if 0 <= v < value)
    for name, value in simpler:
        if config[name] != value:
            try:
                new = SchedulerConfig(**{**config, name: value})
            except InputError:
                continue
            yield _replace(trace, config=new)
