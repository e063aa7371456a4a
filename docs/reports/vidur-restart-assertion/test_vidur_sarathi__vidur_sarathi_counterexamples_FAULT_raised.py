"""Reproducer: Vidur crashes on `assert self._num_stage_processed_tokens <= self.total_tokens` after a
restart.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/traces/vidur-sarathi/counterexamples/FAULT-raised.json --to pytest --target vidur-sarathi` from
kvsched's shrunk trace, for vidur==0.0.26 (the installed vidur).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: Vidur's sarathi replica scheduler with its Request, Batch and event entities, the events of
each batch handled in Simulator.run's order on one replica (a fixed stage time, no metrics); the
trace's steps are replayed as kvsched's driver runs them (arrivals, aborts, schedule(), the model's
outcome), the model played here.

Asserts FAULT-raised: every call on the scheduler returns: a config the engine accepted and the
requests it admitted never crash it (an assert or exception here ends the engine and every request
in it)
"""

import logging
import os
import sys
import traceback
from types import SimpleNamespace

logging.disable(logging.WARNING)

import vidur  # noqa: E402
from vidur import config as vc  # noqa: E402
from vidur.entities import Replica, Request  # noqa: E402
from vidur.events.replica_schedule_event import ReplicaScheduleEvent  # noqa: E402
from vidur.scheduler.replica_scheduler.orca_replica_scheduler import OrcaReplicaScheduler  # noqa: E402
from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import SarathiReplicaScheduler  # noqa: E402
from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler  # noqa: E402

KIND = 'sarathi'  # the replica scheduler under test
ENGINE = f"vidur from {os.path.dirname(vidur.__file__)}, {KIND} replica scheduler"
STAGE_TIME = 1.0  # every batch stage takes one second: the time decides when events fire, not what is scheduled


class NoMetrics:
    """The metrics store: every method accepts anything and records nothing."""

    def __getattr__(self, name: str):
        return lambda *args, **kwargs: None


class FixedTimePredictor:
    """Vidur's execution-time predictor (a random forest over profiled kernels), answering one time."""

    def get_execution_time(self, batch, stage_id: int):
        return SimpleNamespace(total_time=STAGE_TIME, model_time=STAGE_TIME, to_dict=lambda: {})


class OneReplica:
    """What the events ask of the global scheduler, for a cluster of one replica."""

    def __init__(self, replica_scheduler) -> None:
        self._replica_schedulers = {replica_scheduler.replica_id: replica_scheduler}  # the events read it

    def get_replica_scheduler(self, replica_id):
        return self._replica_schedulers[replica_id]

    def get_replica_stage_scheduler(self, replica_id, stage_id: int):
        return self._replica_schedulers[replica_id].get_replica_stage_scheduler(stage_id)


def create_replica_scheduler(config: dict):
    scheduler_config = {
        "vllm": lambda: vc.VllmSchedulerConfig(batch_size_cap=config["max_num_seqs"],
                                               max_tokens_in_batch=config["max_num_batched_tokens"]),
        "sarathi": lambda: vc.SarathiSchedulerConfig(batch_size_cap=config["max_num_seqs"],
                                                     chunk_size=config["max_num_batched_tokens"]),
        "orca": lambda: vc.OrcaSchedulerConfig(batch_size_cap=config["max_num_seqs"])}[KIND]()
    cache_config = vc.CacheConfig(block_size=config["block_size"], num_blocks=config["num_gpu_blocks"],
                                  watermark_blocks_fraction=float(config["watermark"]))
    replica_config = vc.ReplicaConfig(num_pipeline_stages=1)
    lengths = vc.FixedRequestLengthGeneratorConfig(max_tokens=config["max_model_len"])
    generator = vc.SyntheticRequestGeneratorConfig(length_generator_config=lengths)
    cls = {"vllm": VLLMReplicaScheduler, "sarathi": SarathiReplicaScheduler, "orca": OrcaReplicaScheduler}[KIND]
    return cls(replica_config, scheduler_config, cache_config, generator, Replica(replica_config), 1,
               FixedTimePredictor())


class Engine:
    """One replica, its events handled in Simulator.run's order: ReplicaScheduleEvent ->
    BatchStageArrivalEvent -> ReplicaStageScheduleEvent (the step's batch) and then
    BatchStageEndEvent -> BatchEndEvent (its outcome)."""

    SCHEDULE_CALL = "the step's decision (ReplicaScheduleEvent -> ReplicaStageScheduleEvent)"
    UPDATE_CALL = "the batch's end (BatchStageEndEvent -> BatchEndEvent)"

    def __init__(self, config: dict) -> None:
        self.config = config
        self.replica = create_replica_scheduler(config)
        self.cluster, self.metrics = OneReplica(self.replica), NoMetrics()
        self.events: list = []
        self.time = 0.0
        self.requests: dict = {}
        self.rid_of: dict = {}
        self.batch = None

    def add(self, spec: dict) -> None:
        request = Request(arrived_at=self.time, num_prefill_tokens=len(spec["prompt"]),
                          num_decode_tokens=spec["max_tokens"])
        self.requests[spec["id"]] = request
        self.rid_of[request.id] = spec["id"]
        self.replica.add_request(request)  # GlobalScheduleEvent.handle_event, one replica

    def abort(self, request_ids: list) -> None:
        raise NotImplementedError("Vidur has no abort")

    def run_events(self, until) -> None:
        while self.events:
            self.events.sort(key=lambda e: e._priority_number)
            event = self.events.pop(0)
            self.time = event.time
            self.events += event.handle_event(self.cluster, self.metrics)
            if until(event):
                return

    def queued(self) -> dict:
        running = [rid for rid, r in self.requests.items() if r.id in self.replica._allocation_map and not r.completed]
        return {"waiting": [self.rid_of[r.id] for r in self.replica._request_queue], "running": running}

    def schedule(self):
        self.events.append(ReplicaScheduleEvent(self.time, self.replica.replica_id))
        self.run_events(lambda e: type(e).__name__ == "ReplicaStageScheduleEvent" and e._batch is not None)
        self.batch = next((e._batch for e in self.events if type(e).__name__ == "BatchStageEndEvent"), None)
        return self.batch

    def update(self, stopped, drafts: dict) -> set:
        if self.batch is not None:
            self.batch = None
            self.run_events(lambda e: type(e).__name__ == "BatchEndEvent")
            # the ReplicaScheduleEvents the batch's end queued are the next step's: schedule adds its own
            self.events = [e for e in self.events
                           if type(e).__name__ not in ("ReplicaScheduleEvent", "ReplicaStageScheduleEvent")]
        return {rid for rid, r in self.requests.items() if r.completed}

    # -- what the checks read ------------------------------------------------------------------
    def scheduled_anything(self, batch) -> bool:
        return batch is not None and bool(batch.requests)

    def scheduled_ids(self, batch) -> list:
        return [] if batch is None else [self.rid_of[r.id] for r in batch.requests]

    def lengths(self) -> dict:
        """Per request: (tokens, None); a request's tokens are its prompt until its prefill completes."""
        return {rid: (int(r.num_processed_tokens if r.is_prefill_complete else r.num_prefill_tokens), None)
                for rid, r in self.requests.items()}


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 4,
 'num_gpu_blocks': 4,
 'num_cpu_blocks': 0,
 'max_num_seqs': 1,
 'max_num_batched_tokens': 13,
 'max_model_len': 1,
 'watermark': 0.01,
 'preemption_mode': 'recompute',
 'policy': 'fcfs',
 'enable_chunked_prefill': True}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0,
  'id': 'r0',
  'prompt': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
  'max_tokens': 2,
  'priority': 0}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 2
PIPELINE_DEPTH = 0
PROPERTY = 'FAULT-raised'
STATEMENT = 'every call on the scheduler returns: a config the engine accepted and the requests it admitted never crash it (an assert or exception here ends the engine and every request in it)'


# -- the property ---------------------------------------------------------------------------------
# FAULT-raised: checked by `call` around every call on the engine.
def check_after_schedule(step, engine, out, before, history) -> None:
    pass


def check_after_update(step, engine, history) -> None:
    pass


def check_at_end(engine, history) -> None:
    history["exercised"] = HISTORY_OF_CALLS[0]


# -- the replay: kvsched's driver loop, step by step ----------------------------------------------
def engine_frame(error: BaseException) -> str:
    """Where in the engine an exception was raised: the innermost frame, as file:line in function."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    frame = frames[-1]
    return f" at {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"


class EngineRaised(Exception):
    """The engine raised while this file checks another property: an error of the run, reported as
    what the engine raised, never as that property's failure (an assert of the engine's own is an
    AssertionError too)."""


def call(step: int, what: str, fn, *args):
    if PROPERTY == "FAULT-raised" and what == Engine.SCHEDULE_CALL:
        HISTORY_OF_CALLS[0] += 1
    try:
        return fn(*args)
    except Exception as error:
        raised = (f"step {step}: {what} raised {type(error).__name__}{engine_frame(error)}"
                  f"{': ' + str(error) if str(error) else ''}")
        if PROPERTY != "FAULT-raised":
            raise EngineRaised(f"{raised}, before {PROPERTY} broke") from error
        raise AssertionError(f"{raised}. Expected: {STATEMENT}") from error


HISTORY_OF_CALLS = [0]  # FAULT-raised: the schedule() calls made


def replay() -> dict:
    engine = Engine(CONFIG)
    arrived: set = set()
    last_arrival = max((r["step"] for r in REQUESTS), default=0)
    history: dict = {"last_scheduled": None, "steps": 0, "exercised": 0}
    for step in range(MAX_STEPS):
        history["steps"] = step + 1
        for spec in REQUESTS:
            if spec["step"] == step:
                call(step, "add_request", engine.add, spec)
                arrived.add(spec["id"])
        if ABORTS.get(step):
            call(step, "abort", engine.abort, ABORTS[step])
        before = engine.queued()
        out = call(step, engine.SCHEDULE_CALL, engine.schedule)
        check_after_schedule(step, engine, out, before, history)
        finished = call(step, engine.UPDATE_CALL, engine.update, set(STOPS.get(step, ())), DRAFTS.get(step, {}))
        check_after_update(step, engine, history)
        if step >= last_arrival and arrived <= finished:
            break
    check_at_end(engine, history)
    if not history["exercised"]:  # a property whose trigger never held has not passed
        raise AssertionError(f"the trace never reached what {PROPERTY} is about in {history['steps']} steps")
    return history


def test_reproducer() -> None:
    replay()


if __name__ == "__main__":
    print(f"engine: {ENGINE}")
    try:
        done = replay()
    except AssertionError as failure:
        print(f"FAILED: {failure}")
        sys.exit(1)
    except EngineRaised as error:
        print(f"ERROR: {error}")
        sys.exit(2)
    print(f"passed ({done['steps']} steps, checked at {done['exercised']}): {STATEMENT}")
