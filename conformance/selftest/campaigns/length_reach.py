"""Do the traces of a domain reach what lengths and outputs decide (issue 34 item 3)?

Three events a defect about lengths needs, counted on a campaign of a domain's traces run on the
reference of the domain's flow (`reference_impl.scheduler` for V0, `reference_impl.v1_scheduler`
and `reference_impl.nano_scheduler` for the token flows):

- ``long_output_preempted``: a request preempted after it generated at least LONG_OUTPUT tokens
  (a recompute's credit for its unsampled tokens, and the stall after it, need one);
- ``chunk_sizes``: the sizes of the partial prefill chunks scheduled (a prompt split short of its
  end), which must cover 1..CHUNK_SIZES where the domain has chunked prefill;
- ``stop_in_chunk``: a stop in the trace at a step where that sequence ran a partial chunk (no
  token is sampled there, so the stop must change nothing).

tests/test_length_reach.py runs 300 traces per domain of `DOMAINS` and fails on a count of zero,
like the coverage gate (`conformance.selftest.campaigns.coverage_gate`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from spec.domain import ConfigDomain
from spec.trace import Trace
from spec.types import StepOutcome

LONG_OUTPUT = 8  # generated tokens that make an output long
CHUNK_SIZES = 4  # partial chunks of 1..CHUNK_SIZES tokens must all occur

# One domain per kind of engine the examples and the zoo declare.
DOMAINS: dict[str, ConfigDomain] = {
    "v0": ConfigDomain(),
    "v0-no-length-limit": ConfigDomain(length_limit=False),
    "v0-count-only": ConfigDomain(stops=False, max_n=1, aborts=False),
    "v1-chunked": ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, chunked_prefill=True,
                               prefix_caching=True, budget_covers_model_len=True, cache_holds_model_len=True),
    "v1-no-seq-limit": ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, seq_limit=False,
                                    chunked_prefill=True, prefix_caching=True, budget_covers_model_len=True,
                                    cache_holds_model_len=True),
    "v1-always-chunks": ConfigDomain(flow="v1", swap=False, cpu_pool=False, max_n=1, priority=False,
                                     chunked_prefill=True, unchunked=False, prefill_caps=False,
                                     prefix_caching=True, uncached=False),
    "nano": ConfigDomain(flow="nano", swap=False, cpu_pool=False, max_n=1, priority=False, prefix_caching=True,
                         budget_covers_model_len=True, cache_holds_model_len=True),
}


@dataclass
class Reach:
    traces: int = 0
    long_output_preempted: int = 0
    chunk_sizes: Counter = field(default_factory=Counter)
    stop_in_chunk: int = 0

    def gaps(self, domain: ConfigDomain) -> list[str]:
        out = [] if self.long_output_preempted else [f"no request preempted after {LONG_OUTPUT} generated tokens"]
        if domain.chunked_prefill:
            missing = [n for n in range(1, CHUNK_SIZES + 1) if not self.chunk_sizes[n]]
            out += [f"no partial chunk of {missing} token(s)"] if missing else []
            if domain.stops and not self.stop_in_chunk:
                out.append("no stop at a step that ran a partial chunk")
        return out


def _reference(domain: ConfigDomain) -> Any:
    if domain.flow == "v1":
        from reference_impl.v1_scheduler import V1Scheduler

        return V1Scheduler
    if domain.flow == "nano":
        from reference_impl.nano_scheduler import NanoScheduler

        return NanoScheduler
    from reference_impl.scheduler import Scheduler

    return Scheduler


def count(domain: ConfigDomain, traces: list[Trace]) -> Reach:
    """Run each trace on the domain flow's reference and count the three events."""
    make = _reference(domain)
    reach = Reach(traces=len(traces))
    for trace in traces:
        engine = make(trace.config)
        for step in range(trace.max_steps):
            for request in trace.arrivals_at(step):
                engine.add_request(request)
            for rid in trace.aborts_at(step):
                engine.abort_request(rid)
            before = engine.snapshot().seqs or {}
            output = engine.schedule()
            for p in output.preempted:
                generated = [v.num_tokens - engine_prompt(trace, p.request_id) for v in before.values()
                             if v.request_id == p.request_id and v.num_tokens is not None]
                reach.long_output_preempted += bool(generated) and max(generated) >= LONG_OUTPUT
            stops = trace.stops_at(step)
            for item in output.scheduled:
                view = before.get(item.seq_id)
                if view is None or view.num_tokens is None or view.num_computed is None:
                    continue
                if item.is_prefill and view.num_computed + item.num_tokens < view.num_tokens:
                    reach.chunk_sizes[item.num_tokens] += 1
                    reach.stop_in_chunk += item.seq_id in stops
            engine.update(StepOutcome(stops))
            if step >= trace.last_arrival_step and not (engine.waiting or engine.running or getattr(engine, "swapped", ())):
                break
    return reach


def engine_prompt(trace: Trace, request_id: str) -> int:
    return next(a.request.prompt_len for a in trace.arrivals if a.request.request_id == request_id)
