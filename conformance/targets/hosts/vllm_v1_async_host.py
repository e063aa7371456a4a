"""kvsched adapter host for vLLM 0.33.0's ``AsyncScheduler`` (vllm/v1/core/sched/async_scheduler.py),
driven the way ``EngineCore.step_with_batch_queue`` (vllm/v1/engine/core.py:708-822) drives it:
outcomes come back one step late.

Run with the target venv's Python (VLLM_TARGET_DEVICE=cpu):  python vllm_v1_async_host.py

Everything but the engine loop is `vllm_v1_host.V1Engine` (same CPU-only set-up, same token
scheme, same snapshot translation), with ``SchedulerConfig.async_scheduling=True`` and the
``AsyncScheduler`` class (vllm/config/scheduler.py:231 ``get_scheduler_cls``). The CPU platform
turns ``async_scheduling`` off while building the ``VllmConfig`` (platforms/cpu.py:346-348); the host
sets it back, so that ``max_concurrent_batches`` is 2 and ``max_in_flight_tokens`` two batches as on
a GPU engine (config/vllm.py:588-609): a windowed KV cache group's admission cap reads it.

The engine loop, as ``step_with_batch_queue`` runs it with ``batch_queue_size`` 2
(vllm/config/vllm.py:588 ``max_concurrent_batches``: async scheduling without PP keeps two
batches in flight):

1. wire ``schedule`` (step k): if the scheduler has requests, ``schedule()`` plans step k and the
   batch joins the front of the queue (core.py:734, 763). If the queue is then still short of
   two batches and the step ran a model or requests remain, the engine returns without taking an
   outcome (core.py:764-769); otherwise the oldest batch's outcome is due.
2. wire ``update(stopped)``: "the model runs" step k: every request whose step-k tokens complete
   its known tokens (``not request.is_prefill_chunk`` after scheduling, the same test
   ``AsyncScheduler._update_after_schedule`` uses to add a placeholder) samples one token, the
   trace's stop token when the runner says so, else ``spec.types.generated_token`` at the
   position the step computes. That outcome waits in the queue. If an outcome is due (step 1),
   the oldest batch is popped and fed to ``update_from_output`` (core.py:778-795), whose finished
   requests are this wire step's answer.

So at steady state wire step k schedules step k and processes step k-1's outcome: a request's
finish is reported one wire step after the step that sampled its last token, and the step in
between may already have scheduled one more token for it (the ``at most d tokens past a stop``
of docs/ASYNC.md). Aborts run between steps as ``_process_aborts_queue`` does, through
``finish_requests``; an in-flight outcome of an aborted request is dropped by
``update_from_output`` (scheduler.py:2327-2334).

Translations beyond vllm_v1_host.py's:
* the snapshot's ``num_computed`` is the processed frontier, ``num_computed_tokens -
  num_in_flight_tokens`` (0 for a preempted request): V1 advances ``num_computed_tokens`` when it
  schedules (scheduler.py:1845 ``_update_after_schedule``), the KV of an in-flight step is not
  yet known to be written;
* ``prefill`` in the wire output is True until the request is scheduled for a step that samples
  after its (re)admission (decided when the step is scheduled, not when its outcome returns);
* it claims ``ordered_steps``: without a KV connector vLLM frees a request's blocks at once
  (``defer_block_free`` is off, scheduler.py:189-195) and relies on steps running in order on
  the device, the claim that makes PIP-004 moot;
* the host's ``hello`` adds ``"pipeline_depth": 1``; its snapshot adds ``in_flight`` (per
  unfinished sequence: placeholders, in-flight tokens, stale tokens; capability ``in_flight``,
  read by PIP-003).

With a KV connector (config ``kv_connector``; vllm_kv_connector.py, the scripted connector the
synchronous host registers in vLLM's factory): loads start in the wire step that schedules them; the
workers' ``KVConnectorOutput`` of a batch is what the script reports for that batch's step, handed
to ``update_from_output`` with the batch's output when it is processed (one wire step late); sends
count from the next step to schedule. vLLM then defers frees (``defer_block_free``: a consumer
connector with two batches in flight, scheduler.py:189-195): the snapshot adds ``gpu_fenced``
(``deferred_frees``, tail first), and an asynchronous load in flight shows its local hit as computed.
A request cut back by a failed synchronous load is a prefill again until a step samples for it. The
hello's ``ordered_steps`` claim is made for configs without a connector only (hello's
``claims_without_kv_connector``): with one, vLLM fences instead, and PIP-004 holds it to the fence.

Speculative decoding (k > 0; vllm_v1_host.py says how the host plays drafter and sampler): the
scheduled drafts are ``AsyncScheduler``'s ``-1`` placeholders (the real drafts stay on the device,
async_scheduler.py:24-56), so the drafts a step really verifies are what the drafter proposed
after the request's previous sampling step (the trace's ``proposed`` there, dropped on
preemption). Positions are counted when the model runs: the tokens a request has plus those of its
outcomes decided but not yet processed (a step's first token depends on how many drafts the step
before accepted, unknown when it was scheduled).
"""

from __future__ import annotations

import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402

PROTOCOL_OUT = kvsched_host.protocol_stream()  # before vLLM is imported: 0.29.0 logs to stdout then
import vllm_v1_host  # noqa: E402
from vllm.v1.core.sched.async_scheduler import AsyncScheduler  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

BATCH_QUEUE_SIZE = 2  # vllm/config/vllm.py:592-597: async scheduling, no PP


class InFlight:
    """One scheduled batch in the engine's batch queue: its SchedulerOutput, the requests that
    sample in it (with the token position they sample), and, once "the model ran", its output."""

    def __init__(self, step: int, output, samples: dict[str, int]) -> None:
        self.step = step  # the wire step that scheduled it (a KV connector's reports are by step)
        self.output = output
        self.samples = samples
        self.model_output: ModelRunnerOutput | None = None
        self.committed: dict[str, int] = {}  # speculative decoding: tokens its outcome commits, by request


class AsyncV1Engine(vllm_v1_host.V1Engine):
    scheduler_cls = AsyncScheduler
    async_scheduling = True
    # VllmConfig refuses async scheduling with "ngram" on the V1 model runner (config/vllm.py:1653-1662);
    # the device-side n-gram drafter is allowed and, like it, needs no model and no extra slots.
    spec_method = "ngram_gpu"

    def hello_extra(self) -> dict:
        # ordered_steps only without a KV connector: with one vLLM fences (defer_block_free), so
        # the runner checks PIP-004 on a connector's traces (docs/PROTOCOL.md)
        return {**super().hello_extra(), "pipeline_depth": BATCH_QUEUE_SIZE - 1,
                "claims_without_kv_connector": ["ordered_steps"]}

    def reset(self, config: dict) -> None:
        super().reset(config)
        self.batch_queue: collections.deque[InFlight] = collections.deque()
        self.due = False  # an outcome is to be processed in this wire step's update
        self.new_batch: InFlight | None = None
        self.ignored: list[str] = []
        self.undelivered: dict[str, int] = collections.Counter()  # decided, not yet processed tokens
        self.proposed: dict[str, int] = {}  # the drafter's last proposal per request

    def schedule(self) -> dict:
        sched = self.sched
        ignored, self.rejected = self.rejected, []
        result = {"step": self.step_no, "scheduled": [], "preempted": [], "swapped_in": [], "swap_out": [],
                  "swap_in": [], "copies": [], "ignored": ignored}
        step = self.step_no
        self.step_no += 1
        if self.kv is not None:  # the scripted KV connector (vllm_kv_connector.py): loads start in this
            # step; a finish from here on (no request finishes inside schedule()) counts its sends from the next
            self.kv.step, self.kv.next_step, self.kv.reported = step, self.step_no, {}
        self.pending = None
        self.clients_before_schedule(step)  # grammars compiled, session inputs sent (vllm_v1_host.py)
        if not sched.has_requests():  # core.py:771-778: nothing to schedule, take an outcome if one is queued
            self.due = bool(self.batch_queue)
            self.new_batch = None
            self.ignored = ignored
            return result
        out = sched.schedule()
        self.decoding -= set(out.preempted_req_ids or ())
        for rid in out.preempted_req_ids or ():
            self.proposed.pop(rid, None)  # its drafts went with the preemption
        samples = {}
        for rid in out.num_scheduled_tokens:
            r = self.reqs[rid]
            spec = out.scheduled_spec_decode_tokens.get(rid)
            result["scheduled"].append({"seq": f"{rid}#0", "request": rid, "tokens": out.num_scheduled_tokens[rid],
                                        "prefill": rid not in self.decoding, **({"drafts": len(spec)} if spec else {})})
            if not r.is_prefill_chunk:  # the step samples: its token lands at position num_computed_tokens
                samples[rid] = r.num_computed_tokens
                self.decoding.add(rid)
        result["preempted"] = [{"request": rid, "mode": "recompute"} for rid in sorted(out.preempted_req_ids or ())]
        encoder = vllm_v1_host.vllm_budgets.encoder_inputs_of(out)  # the encoder inputs this step computes
        if encoder:
            result["encoder_inputs"] = encoder
        batch = InFlight(step, out, samples)
        self.batch_queue.appendleft(batch)
        executed = out.total_num_scheduled_tokens > 0
        self.due = not (len(self.batch_queue) < BATCH_QUEUE_SIZE and (executed or sched.has_requests()))
        self.new_batch = batch
        self.ignored = ignored
        return result

    def update(self, stopped: list, drafts: dict | None = None) -> list:
        finished = [{"request": rid, "status": "FINISHED_IGNORED"} for rid in self.ignored]
        self.ignored = []
        if self.new_batch is not None:  # the model runs the batch scheduled in this wire step
            if self.k:
                self.new_batch.model_output = self._run_model_speculative(self.new_batch, set(stopped), drafts or {})
            else:
                self.new_batch.model_output = self._run_model(self.new_batch, set(stopped))
            if self.kv is not None:  # its requests computed KV a send could carry
                self.kv.ran.update(self.new_batch.output.num_scheduled_tokens)
            self.new_batch = None
        if not self.due:
            return finished
        self.due = False
        batch = self.batch_queue.pop()
        for rid, count in batch.committed.items():
            self.undelivered[rid] -= count
        req_ids = list(batch.output.num_scheduled_tokens)
        if self.kv is not None:  # the workers' transfer reports in the batch's outcome
            batch.model_output.kv_connector_output = self.kv.report(batch.step)
            computed = {rid: r.num_computed_tokens for rid, r in self.reqs.items() if r.status == RequestStatus.RUNNING}
            invalid = batch.model_output.kv_connector_output.invalid_block_ids or set()
            bs = self.sched.block_size
            # the running requests a failed block touches, among the blocks of their computed tokens
            # (the range `_update_requests_with_invalid_blocks` scans, scheduler.py:3630-3640): with
            # drafts a rejection also takes a count back, and that request stays a decode
            touched = {rid for rid, n in computed.items()
                       if invalid & set(self.sched.kv_cache_manager.get_block_ids(rid)[0][: -(-n // bs)])}
        self.sched.update_from_output(batch.output, batch.model_output)
        self.relabel_resumed_sessions(req_ids)
        if self.kv is not None:
            # a request whose synchronous load failed is cut back to its first failed block
            # (scheduler.py:3655-3666) and recomputes: a prefill again until a step samples for it
            if invalid:
                self.decoding -= {rid for rid in touched if self.reqs[rid].num_computed_tokens < computed[rid]}
            req_ids = list(dict.fromkeys([*req_ids, *self.reqs]))  # FINISHED_ERROR reaches unscheduled ones too
        for rid in req_ids:
            r = self.reqs[rid]
            if r.is_finished() and rid not in self.final:
                self.final[rid] = vllm_v1_host.STATUS.get(r.status, r.status.name)
                finished.append({"request": rid, "status": self.final[rid]})
        return finished

    def _run_model(self, batch: InFlight, stop: set) -> ModelRunnerOutput:
        req_ids = list(batch.output.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            if rid in batch.samples:
                token = vllm_v1_host.STOP_TOKEN if f"{rid}#0" in stop else vllm_v1_host.generated_token(
                    rid, batch.samples[rid])
                sampled.append([token])
            else:
                sampled.append([])
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def _run_model_speculative(self, batch: InFlight, stop: set, drafts: dict) -> ModelRunnerOutput:
        """`_run_model` with drafts: each sampling request commits the accepted drafts that were
        really proposed and the bonus, from the position its decided outcomes leave it at."""
        req_ids = list(batch.output.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            if rid not in batch.samples:
                sampled.append([])
                continue
            decision = drafts.get(f"{rid}#0", {})
            num_drafts = len(batch.output.scheduled_spec_decode_tokens.get(rid, ()))
            position = self.reqs[rid].num_tokens + self.undelivered[rid]
            tokens = self.sample(rid, position, num_drafts, self.proposed.get(rid, 0), f"{rid}#0" in stop, decision)
            sampled.append(tokens)
            batch.committed[rid] = len(tokens)
            self.undelivered[rid] += len(tokens)
            self.proposed[rid] = self.k if decision.get("proposed") is None else min(int(decision["proposed"]), self.k)
        return ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                 sampled_token_ids=sampled)

    def snapshot(self) -> dict:
        self.pending = None  # the base class would subtract this step's tokens; the frontier does it
        snap = super().snapshot()
        for rid, r in self.reqs.items():
            view = snap["seqs"].get(f"{rid}#0")
            if view is None:
                continue
            # a finished request too: a step of it may still have been in flight when it finished
            # (its 1 + k tokens would count past its tokens)
            # A stale step's tokens are not in the count (a preemption set it to 0; a session whose
            # turn stopped resumed from its materialized frontier, scheduler.py:2722-2730), so only
            # the in-flight tokens of steps still counted are taken off: the reference's frontier.
            view["num_computed"] = max(r.num_computed_tokens - (r.num_in_flight_tokens - r.num_stale_output_tokens), 0)
        snap["in_flight"] = {"version": 1, "seqs": self.in_flight()}  # PIP-003 (docs/PROTOCOL.md)
        if self.kv is not None:
            import vllm_kv_connector

            vllm_kv_connector.pipelined_snapshot_parts(self.sched, snap)
        return snap

    def in_flight(self) -> dict:
        """The counters PIP-003 reads, per unfinished sequence: its output placeholders,
        in-flight tokens and stale tokens (capability ``in_flight``, docs/PROTOCOL.md)."""
        return {f"{rid}#0": {"placeholders": r.num_output_placeholders, "in_flight_tokens": r.num_in_flight_tokens,
                             "stale": r.num_stale_output_tokens}
                for rid, r in self.reqs.items() if not r.is_finished()}


if __name__ == "__main__":
    # --name NAME: the same host serves every pinned vLLM version (vllm-v1-async-0.29 runs it in
    # vLLM 0.29.0's venv; the AsyncScheduler API it drives is the same there).
    name = sys.argv[sys.argv.index("--name") + 1] if "--name" in sys.argv else "vllm-v1-async"
    sys.exit(kvsched_host.serve(AsyncV1Engine(), name, ("safety",), [*vllm_v1_host.CAPABILITIES, "in_flight", "ordered_steps"],
                                stdout=PROTOCOL_OUT))
