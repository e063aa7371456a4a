"""A first probe for vllm-project/vllm#57562 on the async host: chunked prefill with many concurrent
requests, no spec decode, no preemption pressure needed.

    python -m conformance.selftest.campaigns.async_probe [--traces 500] [--seed 57562] [--target vllm-v1-async-0.29]
        [--out docs/results/async-probe-57562.json]

#57562 (open, reported on 0.29.0) is a placeholder underflow (`assert
request.num_output_placeholders >= 0`) with chunked prefill and concurrent requests. This probe
drives vLLM 0.33.0's AsyncScheduler (``vllm_v1_async_host.py``) through traces made for that
shape: up to 8 requests at once, a token budget of one or two tokens per seat, long prompts,
``long_prefill_token_threshold`` on or off, prefix caching on or off, aborts and stops. After
every step it reads the host's ``in_flight`` counters (PIP-003) and records any failure of the
host (PIP-005). ``--target vllm-v1-async-0.29`` runs it on vLLM 0.29.0, the version the report
names. Full attention only: the report's hybrid model is out of reach. It says what was tried and
what was seen, and saves the first failing trace if there is one (the hunt is
`conformance.selftest.campaigns.async_hunt`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from spec.config import SchedulerConfig
from spec.trace import Trace
from spec.types import StepOutcome

VERSION = 1


@st.composite
def concurrent_chunked_configs(draw: st.DrawFn) -> SchedulerConfig:
    block_size = draw(st.sampled_from([1, 2, 4]))
    seats = draw(st.integers(4, 8))
    max_model_len = draw(st.integers(block_size * 4, block_size * 16))
    min_blocks = -(-max_model_len // block_size)
    return SchedulerConfig(
        block_size=block_size, num_gpu_blocks=draw(st.integers(min_blocks * 2, min_blocks * 6)), num_cpu_blocks=0,
        max_num_seqs=seats, max_num_batched_tokens=draw(st.integers(seats, seats * 2)), max_model_len=max_model_len,
        watermark=0.0, preemption_mode="recompute", policy=draw(st.sampled_from(["fcfs", "priority"])),
        enable_chunked_prefill=True, long_prefill_token_threshold=draw(st.sampled_from([0, 1, 3])),
        enable_prefix_caching=draw(st.booleans()),
    )


def probe_strategy() -> st.SearchStrategy:
    from conformance.generation.v1 import token_traces

    return concurrent_chunked_configs().flatmap(lambda c: token_traces("v1", config=c, max_requests=10))


def probe_one(adapter, trace: Trace) -> tuple[int, str | None]:
    """Run ``trace``; return (steps run, the first problem: a host failure or a counter out of range)."""
    adapter.reset(trace.config)
    unfinished: set[str] = set()
    for step in range(trace.max_steps):
        try:
            for request in trace.arrivals_at(step):
                done = adapter.add_request(request)
                unfinished.add(request.request_id)
                unfinished -= {done.request_id} if done else set()
            for rid in trace.aborts_at(step):
                done = adapter.abort_request(rid)
                unfinished -= {done.request_id} if done else set()
            adapter.schedule()
            unfinished -= {f.request_id for f in adapter.update(StepOutcome(trace.stops_at(step)))}
            counters = adapter.host.call("snapshot", {}, 120)["in_flight"]["seqs"]
        except Exception as err:  # noqa: BLE001 - the host's failure is the finding (PIP-005)
            return step + 1, f"PIP-005 at step {step}: {type(err).__name__}: {err}"
        for seq, c in counters.items():
            if min(c.values()) < 0 or c["placeholders"] > 1:
                return step + 1, f"PIP-003 at step {step}: {seq} {c}"
        if step >= trace.last_arrival_step and not unfinished:
            return step + 1, None
    return trace.max_steps, None


def main(argv: list[str] | None = None) -> int:
    from conformance.generation.v0 import sample_traces
    from conformance.targets import get_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=int, default=500)
    ap.add_argument("--seed", type=int, default=57562)
    ap.add_argument("--out", type=Path, default=Path("docs/results/async-probe-57562.json"))
    ap.add_argument("--traces-dir", type=Path, default=Path("docs/traces/async"))
    ap.add_argument("--target", default="vllm-v1-async", help="vllm-v1-async (0.33.0) or vllm-v1-async-0.29")
    args = ap.parse_args(argv)
    target = get_target(args.target)

    def async_adapter():
        return target.adapter()

    adapter = async_adapter()
    started = time.monotonic()
    steps, found = 0, []
    traces = sample_traces(probe_strategy(), args.traces, args.seed)
    for index, trace in enumerate(traces):
        ran, problem = probe_one(adapter, trace)
        steps += ran
        if problem is not None:
            found.append({"trace": index, "problem": problem})
            if len(found) == 1:
                Trace(trace.config, trace.arrivals, trace.aborts, trace.stops, trace.max_steps,
                      {"adapter": args.target, "probe": "57562", "message": problem}).save(
                    args.traces_dir / f"probe-57562-{args.target}.json")
            adapter.close()
            adapter = async_adapter()
    adapter.close()
    report: dict[str, Any] = {
        "version": VERSION, "target": f"{args.target} (vllm_v1_async_host.py)", "package": target.version,
        "upstream": "vllm-project/vllm#57562", "seed": args.seed, "traces": len(traces), "steps": steps,
        "requests_per_trace_max": max(len(t.arrivals) for t in traces),
        "prefix_caching_on": sum(t.config.enable_prefix_caching for t in traces),
        "problems": found, "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "problems"}), f"problems: {len(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
