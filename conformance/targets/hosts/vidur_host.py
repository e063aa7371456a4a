"""kvsched adapter host for the Vidur simulator's replica schedulers (vidur==0.0.26; run with its venv's Python).

    python vidur_host.py --scheduler vllm|sarathi|orca

Vidur plans LLM-serving capacity by simulating an engine; its replica schedulers
(vidur/scheduler/replica_scheduler/{vllm,sarathi,orca}_replica_scheduler.py) claim to decide as
vLLM (V0), Sarathi-Serve and Orca do. What runs unmodified: the replica scheduler, its
``ReplicaStageScheduler``, the ``Request`` / ``Batch`` / ``BatchStage`` entities, and the events
of one batch's life, handled in the order ``Simulator.run`` (simulator.py:58-80) pops them:
``ReplicaScheduleEvent`` -> ``BatchStageArrivalEvent`` -> ``ReplicaStageScheduleEvent`` (the
step's decision: ``schedule``) and then ``BatchStageEndEvent`` -> ``BatchEndEvent`` (the step's
outcome: ``update``), each event's ``handle_event`` making the next.

What is replaced, and why:

* the global scheduler: one replica, so routing is not under test; a request goes straight to
  ``replica_scheduler.add_request`` as ``GlobalScheduleEvent`` does (events/global_schedule_event.py);
  the events reach the replica through a two-method stand-in (``get_replica_scheduler``,
  ``get_replica_stage_scheduler``);
* the metrics store: a stand-in whose every method does nothing (metrics only observe);
* the execution-time predictor: every batch stage takes 1.0 s (vidur trains a random forest on
  profiled GPU kernels to predict it; the times change when events fire, never what a
  scheduler decides with one pipeline stage).

One pipeline stage, so each step is one batch. Vidur has no stop tokens (a request runs
exactly ``num_decode_tokens``), no aborts and no priorities: the targets' traces have none.
Vidur's token counts: a request's ``num_processed_tokens`` counts its prompt and the token its
prefill samples, so the host reports ``num_tokens`` as that (or the prompt while the prefill is
unfinished) and keeps no computed-token count.

Observations Vidur has: statuses and queues (``_request_queue`` is waiting; a request in the
allocation map is running), the free block count (``num_blocks - num_allocated_blocks``) and
per-request block counts (``_allocation_map``, sent as ``vidur_num_blocks``: informational, as
the protocol's block tables are block ids). No block ids, ref counts or free lists exist.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402

STAGE_TIME = 1.0


class _Nothing:
    """The metrics store: every method accepts anything and records nothing."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


class _Predictor:
    """Vidur's execution-time predictor, answering a fixed time for every batch stage."""

    def get_execution_time(self, batch, stage_id: int):
        return SimpleNamespace(total_time=STAGE_TIME, model_time=STAGE_TIME, to_dict=lambda: {})


class _OneReplica:
    """What the events ask of the global scheduler, for a cluster of one replica."""

    def __init__(self, replica_scheduler) -> None:
        self._replica_schedulers = {replica_scheduler.replica_id: replica_scheduler}

    def get_replica_scheduler(self, replica_id):
        return self._replica_schedulers[replica_id]

    def get_replica_stage_scheduler(self, replica_id, stage_id: int):
        return self._replica_schedulers[replica_id].get_replica_stage_scheduler(stage_id)


class VidurEngine:
    def __init__(self, kind: str) -> None:
        logging.disable(logging.WARNING)
        from vidur import config as vc
        from vidur.entities import Replica, Request
        from vidur.events.replica_schedule_event import ReplicaScheduleEvent
        from vidur.scheduler.replica_scheduler.orca_replica_scheduler import OrcaReplicaScheduler
        from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler
        from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler

        self.kind, self.vc, self.Replica, self.Request, self.ScheduleEvent = kind, vc, Replica, Request, ReplicaScheduleEvent
        self.scheduler_cls = {"vllm": VLLMReplicaScheduler, "sarathi": SarathiReplicaScheduler,
                              "orca": OrcaReplicaScheduler}[kind]

    def hello_extra(self) -> dict:
        from importlib.metadata import version

        return {"version": f"vidur=={version('vidur')}", "source": os.path.dirname(sys.modules["vidur"].__file__)}

    def reset(self, config: dict) -> None:
        chunked = bool(config.get("enable_chunked_prefill"))
        for key, ok in (("num_cpu_blocks", not config.get("num_cpu_blocks")),
                        ("preemption_mode", config["preemption_mode"] == "recompute"),
                        ("policy", config["policy"] == "fcfs"),
                        ("enable_prefix_caching", not config.get("enable_prefix_caching")),
                        ("enable_chunked_prefill", chunked == (self.kind == "sarathi"))):
            if not ok:
                raise ValueError(f"config.{key}: Vidur's {self.kind} scheduler takes recompute, fcfs, no CPU pool, no "
                                 f"prefix caching, chunked prefill {'on' if self.kind == 'sarathi' else 'off'}; "
                                 f"got {config.get(key)!r}")
        vc = self.vc
        self.config = config
        sched_cfg = {"vllm": lambda: vc.VllmSchedulerConfig(batch_size_cap=config["max_num_seqs"],
                                                            max_tokens_in_batch=config["max_num_batched_tokens"]),
                     "sarathi": lambda: vc.SarathiSchedulerConfig(batch_size_cap=config["max_num_seqs"],
                                                                  chunk_size=config["max_num_batched_tokens"]),
                     "orca": lambda: vc.OrcaSchedulerConfig(batch_size_cap=config["max_num_seqs"])}[self.kind]()
        cache = vc.CacheConfig(block_size=config["block_size"], num_blocks=config["num_gpu_blocks"],
                               watermark_blocks_fraction=float(config["watermark"]))
        replica_cfg = vc.ReplicaConfig(num_pipeline_stages=1)
        # max_tokens: the longest request Vidur plans for (Orca reserves max_tokens // block_size blocks for
        # each request). SyntheticRequestGeneratorConfig.__post_init__ takes it from its length generator.
        lengths = vc.FixedRequestLengthGeneratorConfig(max_tokens=config["max_model_len"])
        generator = vc.SyntheticRequestGeneratorConfig(length_generator_config=lengths)
        self.replica = self.scheduler_cls(replica_cfg, sched_cfg, cache, generator, self.Replica(replica_cfg), 1,
                                          _Predictor())
        self.cluster = _OneReplica(self.replica)
        self.metrics = _Nothing()
        self.events: list = []  # the simulator's event queue between schedule and update
        self.time = 0.0
        self.reqs: dict = {}  # rid -> vidur Request
        self.rid_of: dict = {}  # vidur id -> rid
        self.final: dict = {}
        self.batch = None
        self.step_no = 0

    def add_request(self, request: dict):
        rid = request["id"]
        if request.get("n", 1) != 1:
            raise ValueError("request.n: Vidur's requests have one sequence (n must be 1)")
        if rid in self.reqs:
            raise ValueError(f"duplicate request id {rid!r}")
        req = self.Request(arrived_at=self.time, num_prefill_tokens=request["prompt_len"],
                           num_decode_tokens=request["max_tokens"])
        self.reqs[rid], self.rid_of[req.id] = req, rid
        self.replica.add_request(req)  # GlobalScheduleEvent.handle_event, one replica
        return None

    def abort_request(self, request_id: str):
        raise NotImplementedError("Vidur has no abort")

    def _run_events(self, until) -> None:
        """Handle queued events in Simulator.run's order (priority number) until ``until(event)``
        says the step's half is done; that event is handled, later ones stay queued."""
        while self.events:
            self.events.sort(key=lambda e: e._priority_number)
            event = self.events.pop(0)
            self.time = event.time
            self.events += event.handle_event(self.cluster, self.metrics)
            if until(event):
                return

    def schedule(self) -> dict:
        restarts = {rid: r.num_restarts for rid, r in self.reqs.items()}
        self.events.append(self.ScheduleEvent(self.time, self.replica.replica_id))
        # decide: up to the stage scheduling that gives the batch its end time
        self._run_events(lambda e: type(e).__name__ == "ReplicaStageScheduleEvent" and e._batch is not None)
        batch = next((e._batch for e in self.events if type(e).__name__ == "BatchStageEndEvent"), None)
        self.batch = batch
        scheduled = []
        if batch is not None:
            for req, q in zip(batch.requests, batch.num_q_tokens, strict=True):
                rid = self.rid_of[req.id]
                scheduled.append({"seq": f"{rid}#0", "request": rid, "tokens": int(q),
                                  "prefill": not req.is_prefill_complete})
        preempted = [{"request": rid, "mode": "recompute"} for rid, r in self.reqs.items()
                     if r.num_restarts > restarts[rid]]
        out = {"step": self.step_no, "scheduled": scheduled, "preempted": preempted, "swapped_in": [],
               "swap_out": [], "swap_in": [], "copies": [], "ignored": []}
        self.step_no += 1
        return out

    def update(self, stopped: list) -> list:
        if stopped:
            raise ValueError("stopped: Vidur has no stop tokens; a request runs its max_tokens")
        if self.batch is None:
            return []
        batch, self.batch = self.batch, None
        self._run_events(lambda e: type(e).__name__ == "BatchEndEvent")
        # the ReplicaScheduleEvents the batch's end queued are the next step's: schedule adds its own
        self.events = [e for e in self.events if type(e).__name__ not in ("ReplicaScheduleEvent",
                                                                          "ReplicaStageScheduleEvent")]
        finished = []
        for req in batch.requests:
            rid = self.rid_of[req.id]
            if req.completed and rid not in self.final:
                self.final[rid] = "FINISHED_LENGTH_CAPPED"
                finished.append({"request": rid, "status": "FINISHED_LENGTH_CAPPED"})
        return finished

    def snapshot(self) -> dict:
        alloc = self.replica._allocation_map
        waiting = [self.rid_of[r.id] for r in self.replica._request_queue]
        statuses, views, running = {}, {}, []
        for rid, req in self.reqs.items():
            if rid in self.final:
                st = self.final[rid]
            elif req.id in alloc:
                st = "RUNNING"
                running.append(rid)
            else:
                st = "WAITING"
            statuses[rid] = st
            tokens = req.num_processed_tokens if req.is_prefill_complete else req.num_prefill_tokens
            views[f"{rid}#0"] = {"request": rid, "status": st, "num_tokens": int(tokens), "num_computed": None,
                                 "blocks": [], "device": None, "vidur_num_blocks": int(alloc.get(req.id, 0))}
        free = self.config["num_gpu_blocks"] - self.replica.num_allocated_blocks
        return {"statuses": statuses, "seqs": views, "waiting": waiting, "running": running, "swapped": [],
                "gpu_free": int(free), "cpu_free": 0}


CAPABILITIES = ["output", "statuses", "queues", "free_counts", "seq_lengths"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheduler", choices=("vllm", "sarathi", "orca"), required=True)
    args = parser.parse_args()
    return kvsched_host.serve(VidurEngine(args.scheduler), f"vidur-{args.scheduler}", ("safety",), CAPABILITIES)


if __name__ == "__main__":
    sys.exit(main())
