"""A trace as the plain Python literals an exported test replays.

The exported file carries no kvsched types: the config is the trace's config dict, each request a
dict with its arrival step and its prompt's token ids (resolved here, by the engine's rule, so a
reader sees the exact prompt), and the aborts, stops and draft decisions are dicts by step, keyed
by request id (every exported engine runs one sequence per request).
"""

from __future__ import annotations

import pprint
from collections.abc import Callable

from spec.errors import InputError
from spec.trace import Trace


def trace_literals(trace: Trace, prompt_of: Callable[[dict], list[int]],
                   request_extra: Callable[[dict], dict] | None = None) -> str:
    """The constants block of an exported file: CONFIG, REQUESTS, ABORTS, STOPS, DRAFTS, MAX_STEPS
    and PIPELINE_DEPTH."""
    data = trace.to_dict()
    if trace.admin:
        raise InputError("trace.admin", "the exporter does not replay admin calls (reset_prefix_cache)")
    for request in data["requests"]:
        if request.get("n", 1) != 1:
            raise InputError("trace.requests", f"request {request['id']} has n={request['n']}: the exporter "
                             "replays one sequence per request")
    requests = [{"step": r["arrival_step"], "id": r["id"], "prompt": list(prompt_of(r)), "max_tokens": r["max_tokens"],
                 "priority": r.get("priority", 0), **(request_extra(r) if request_extra else {})}
                for r in data["requests"]]
    aborts: dict[int, list[str]] = {}
    for a in data["aborts"]:
        aborts.setdefault(a["step"], []).append(a["request"])
    for batch in data.get("abort_batches", []):
        aborts.setdefault(batch["step"], []).extend(batch["requests"])
    stops: dict[int, list[str]] = {}
    for s in data["stops"]:
        stops.setdefault(s["step"], []).append(s["seq"].rsplit("#", 1)[0])
    drafts: dict[int, dict[str, dict]] = {}
    for d in data.get("drafts", []):
        decision = {k: v for k, v in d.items() if k not in ("step", "seq")}
        drafts.setdefault(d["step"], {})[d["seq"].rsplit("#", 1)[0]] = decision
    config = {k: v for k, v in data["config"].items() if v is not None}
    lines = [
        "# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------",
        f"CONFIG = {_pretty(config)}",
        "# arrival step, request id, prompt token ids, max_tokens, priority",
        f"REQUESTS = {_pretty(requests)}",
        f"ABORTS = {_pretty(aborts)}  # step -> request ids aborted before that step's schedule()",
        f"STOPS = {_pretty(stops)}  # step -> request ids whose sampled token that step is a stop token",
        f"DRAFTS = {_pretty(drafts)}  # step -> request id -> the drafter's and rejection sampler's decision",
        f"MAX_STEPS = {trace.max_steps}",
        f"PIPELINE_DEPTH = {trace.config.pipeline_depth}",
    ]
    return "\n".join(lines) + "\n"


def _pretty(value: object) -> str:
    return pprint.pformat(value, width=110, sort_dicts=False, compact=True)
