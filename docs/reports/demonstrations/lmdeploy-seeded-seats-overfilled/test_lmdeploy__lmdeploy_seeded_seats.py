"""Reproducer: BUD-003 on lmdeploy.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/reports/traces/lmdeploy-seeded-seats.json --to pytest --target lmdeploy` from kvsched's shrunk
trace, for lmdeploy==0.18.0 (the installed lmdeploy with torch and numpy; no model, no GPU).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: LMDeploy's paging Scheduler built as tests/pytorch/paging/test_scheduler.py's fixtures build it
(SchedulerConfig, CacheConfig, SequenceMeta with ARSequenceStrategy; add_session().add_sequence()),
stepped as the PyTorch engine's inputs maker and engine loop step it (prefill or schedule_running,
activate_seqs, preempt_seqs, update_token_ids); the trace's steps are replayed as kvsched's driver
runs them (arrivals, aborts, schedule(), the model's outcome), the model played here.

Asserts BUD-003: The live sequences of running requests never exceed max_num_seqs.
"""

import importlib.util
import os
import sys
import traceback
import types
from importlib.metadata import version

import numpy as np


def load_lmdeploy() -> str:
    """LMDeploy's paging scheduler without running ``lmdeploy/__init__.py`` (it imports the pipeline
    API, mmengine and the tokenizer): a stub parent package with the real ``__path__``, so the
    submodules import from the installed files, and a stub ``lmdeploy.pytorch.engine.model_agent``
    (strategies/ar/sequence.py imports ``BatchedOutputs`` from it for a type hint only; the real
    module pulls the cache engine and zmq). Returns the package folder."""
    spec = importlib.util.find_spec("lmdeploy")
    if spec is None or spec.origin is None:
        raise SystemExit(f"lmdeploy is not installed for {sys.executable}")
    parent = types.ModuleType("lmdeploy")
    parent.__path__ = [os.path.dirname(spec.origin)]
    parent.__file__ = spec.origin
    sys.modules["lmdeploy"] = parent
    agent = types.ModuleType("lmdeploy.pytorch.engine.model_agent")
    agent.BatchedOutputs = object
    sys.modules[agent.__name__] = agent
    return os.path.dirname(spec.origin)


PACKAGE_DIR = load_lmdeploy()
from lmdeploy.pytorch.config import CacheConfig, SchedulerConfig  # noqa: E402
from lmdeploy.pytorch.messages import MessageStatus, SamplingParam, SequenceMeta, UpdateTokenMode  # noqa: E402
from lmdeploy.pytorch.paging import Scheduler  # noqa: E402
from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy  # noqa: E402

ENGINE = f"lmdeploy {version('lmdeploy')} from {PACKAGE_DIR}"
EOS = 2  # a request the trace stops samples this id (its only stop word)
PREFILL_INTERVAL = 16  # lmdeploy.pytorch.config.SchedulerConfig's default: decode rounds and prealloc tokens


def token_id(request_id: str, position: int) -> int:
    """The id at ``position`` of a request's sequence (prompt ids and "sampled" ids alike): a fixed
    function of the request, distinct per request and never 0..15."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return base + (position * 104_729) % 900_000


# -- the scheduler, built as tests/pytorch/paging/test_scheduler.py's fixtures build it ------------
def cache_config(config: dict) -> CacheConfig:
    return CacheConfig(max_batches=config["max_num_seqs"], block_size=config["block_size"], num_cpu_blocks=0,
                       num_gpu_blocks=config["num_gpu_blocks"], max_prefill_token_num=config["max_num_batched_tokens"],
                       enable_prefix_caching=bool(config.get("enable_prefix_caching")), device_type="cpu")


def scheduler_config(config: dict) -> SchedulerConfig:
    return SchedulerConfig(max_batches=config["max_num_seqs"], max_session_len=config["max_model_len"],
                           prefill_interval=PREFILL_INTERVAL, eviction_type="recompute")


def seq_meta(config: dict) -> SequenceMeta:
    return SequenceMeta(config["block_size"], strategy=ARSequenceStrategy())


def create_scheduler(config: dict) -> Scheduler:
    return Scheduler(scheduler_config=scheduler_config(config), cache_config=cache_config(config),
                     seq_meta=seq_meta(config))


class Engine:
    """The PyTorch engine's loop around the real Scheduler, with the model played here:

    * the door (engine/engine.py:328-341, 467-517; engine_instance.py:196): a prompt longer than
      ``max_session_len = min(max_model_len, (num_gpu_blocks - 1) * block_size)`` is refused, and
      ``max_new_tokens`` is clipped to ``max_session_len - prompt_len``;
    * a step (engine/inputs_maker.py: ``do_prefill_default`` 1286-1319, ``_schedule_prefill``
      563-602, ``create_model_inputs_delta`` 1158-1207, ``update_running_seqs`` 1250-1267,
      ``preempt_invalid_decode_seqs`` 1269-1275; engine_loop.py:520-557 ``activate_seqs``):
      prefill when the engine's rule says so, else decode the running sequences with
      ``schedule_running``, whose rejects are preempted;
    * the outcome (strategies/ar/sequence.py:148-182 ``update_running``, model_agent.py:48-66
      ``ARStoppingCriteria.step``): one token per scheduled sequence (none for a prefill whose
      ``max_new_tokens`` is 0), the session ended once it finishes.

    The real loop schedules the next batch before the current one's output is applied; this one
    schedules, applies, then schedules again (no batch in flight)."""

    SCHEDULE_CALL, UPDATE_CALL = "Scheduler.schedule()", "SchedulerSequence.update_token_ids()"

    def __init__(self, config: dict) -> None:
        if config["block_size"] < 16 or config["block_size"] & (config["block_size"] - 1):
            raise SystemExit("LMDeploy needs a block_size that is a power of two >= 16 (messages.py:623-629)")
        self.config = config
        self.sched = create_scheduler(config)
        self.max_session_len = min(config["max_model_len"], (config["num_gpu_blocks"] - 1) * config["block_size"])
        self.decode_count = 0  # InputsMakerAsync._decode_count
        self.running_seqs: list = []  # InputsMakerAsync.running_seqs
        self.seqs: dict = {}  # request id -> SchedulerSequence
        self.sessions: dict = {}  # request id -> session id
        self.final: dict = {}  # request id -> how it finished
        self.refused: set = set()
        self.pending = None  # (batch, is_prefill) between schedule() and the outcome

    def add(self, spec: dict) -> None:
        if len(spec["prompt"]) > self.max_session_len:  # INPUT_LENGTH_ERROR at the door
            self.refused.add(spec["id"])
            return
        session = self.sched.add_session(len(self.sessions) + 1)
        self.sessions[spec["id"]] = session.session_id
        param = SamplingParam(max_new_tokens=spec["max_tokens"], stop_words=[EOS])
        seq = session.add_sequence(np.array(spec["prompt"], dtype=np.int64), sampling_param=param)
        if param.max_new_tokens + seq.num_valid_ids > self.max_session_len:  # engine.py:469-481
            param.max_new_tokens = self.max_session_len - seq.num_valid_ids
        self.seqs[spec["id"]] = seq

    def abort(self, request_ids: list) -> None:
        for rid in request_ids:  # Engine._on_stop_session, then _on_end_session (engine.py:355-425)
            if rid in self.seqs and rid not in self.final:
                self.sched.stop_session(self.sessions[rid])
                self.sched.end_session(self.sessions[rid])
                self.final[rid] = "FINISHED_ABORTED"

    def _do_prefill(self) -> bool:
        """InputsMakerAsync.do_prefill_default (inputs_maker.py:1286-1319), no long-context chunk."""
        if not self.sched.has_waiting():
            self.decode_count = 0
            return False
        if self.decode_count >= PREFILL_INTERVAL:
            return True
        count = 0
        for seq in self.sched.waiting:
            count += seq.num_token_ids
            if count >= self.config["max_num_batched_tokens"]:
                return True
        if self.sched.num_ready() + self.sched.num_running() < self.config["max_num_seqs"] * 0.5:
            return True
        self.decode_count += 1
        return False

    def schedule(self) -> dict:
        batch, prefill, preempted, to_evict = [], False, [], []
        if self._do_prefill():
            batch = self.sched.schedule(is_prefill=True, prealloc_size=PREFILL_INTERVAL).running
            prefill = bool(batch)
            if prefill:
                self.decode_count = 0
        if not prefill and self.running_seqs:
            running = list(self.running_seqs)
            was_running = [seq.status == MessageStatus.RUNNING for seq in running]
            valid = self.sched.schedule_running(running, num_required_tokens=1, prealloc_size=PREFILL_INTERVAL)
            batch = [seq for seq, ok in zip(running, valid, strict=True) if ok]
            to_evict = [seq for seq, ok in zip(running, valid, strict=True) if not ok]
            preempted = [self.rid(seq) for seq, ok, was in zip(running, valid, was_running, strict=True)
                         if was and not ok]
        self.sched.activate_seqs(batch)
        if batch:
            if prefill:
                self.running_seqs += [seq for seq in batch if seq.sampling_param.max_new_tokens > 0]
            else:
                self.running_seqs = batch
        if to_evict:
            self.sched.preempt_seqs(to_evict)
        self.sched.tick()
        self.pending = (batch, prefill) if batch else None
        return {"batch": batch, "prefill": prefill, "preempted": preempted,
                "tokens": {self.rid(seq): int(seq.num_token_ids) if prefill else 1 for seq in batch}}

    def update(self, stopped, drafts: dict) -> set:
        if self.pending is not None:
            batch, prefill = self.pending
            self.pending = None
            mode = UpdateTokenMode.PREFILL if prefill else UpdateTokenMode.DECODE
            for seq in batch:
                if seq.status != MessageStatus.RUNNING:
                    continue
                rid = self.rid(seq)
                if prefill and seq.sampling_param.max_new_tokens == 0:
                    seq.update_token_ids(np.empty((0,), dtype=np.int64), mode=mode)
                    self.finish(rid, seq, "FINISHED_LENGTH_CAPPED")
                    continue
                appendable = seq.sampling_param.max_new_tokens - seq.num_new_tokens - 1
                token = EOS if rid in stopped else token_id(rid, int(seq.num_all_ids))
                seq.update_token_ids(np.array([token], dtype=np.int64), mode=mode)
                if token == EOS or appendable <= 0:
                    self.finish(rid, seq, "FINISHED_STOPPED" if token == EOS else "FINISHED_LENGTH_CAPPED")
        return set(self.final) | self.refused

    def finish(self, rid: str, seq, how: str) -> None:
        seq.finish()
        self.sched.end_session(self.sessions[rid])  # the client ends the session on FINISH
        self.final[rid] = how

    def rid(self, seq) -> str:
        return next(rid for rid, s in self.seqs.items() if s is seq)

    # -- what the checks read ------------------------------------------------------------------
    def queued(self) -> dict:
        """Unfinished requests by queue: READY and RUNNING sequences run, the others wait."""
        waiting, running = [], []
        for rid, seq in sorted(self.seqs.items(), key=lambda item: item[1].arrive_time):
            if rid not in self.final:
                (running if seq.status in (MessageStatus.RUNNING, MessageStatus.READY) else waiting).append(rid)
        return {"waiting": waiting, "running": running}

    def scheduled_anything(self, out) -> bool:
        return bool(out["batch"] or out["preempted"])

    def scheduled_ids(self, out) -> list:
        return list(out["tokens"])

    def scheduled_tokens(self, out) -> dict:
        return dict(out["tokens"])

    def lengths(self) -> dict:
        """Per request, finished ones too: (tokens, cached tokens)."""
        return {rid: (int(s.num_all_ids), int(s.num_history_ids)) for rid, s in self.seqs.items()}

    def blocks(self, rid: str) -> list:
        """The GPU blocks the request's sequence holds (its block table)."""
        return [int(b) for b in self.sched.block_manager.get_block_table(self.seqs[rid])]

    def status(self, rid: str) -> str:
        return self.final.get(rid) or self.seqs[rid].status.name


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 16,
 'num_gpu_blocks': 16,
 'num_cpu_blocks': 0,
 'max_num_seqs': 2,
 'max_num_batched_tokens': 48,
 'max_model_len': 48,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs'}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0,
  'id': 'r0',
  'prompt': [63006, 167735, 272464, 377193, 481922, 586651, 691380, 796109, 900838, 105567, 210296, 315025,
             419754, 524483, 629212, 733941],
  'max_tokens': 20,
  'priority': 0},
 {'step': 1,
  'id': 'r1',
  'prompt': [78844, 183573, 288302, 393031, 497760, 602489, 707218, 811947, 916676, 121405, 226134, 330863,
             435592, 540321, 645050, 749779, 854508, 959237, 163966, 268695, 373424, 478153, 582882, 687611],
  'max_tokens': 4,
  'priority': 0},
 {'step': 1,
  'id': 'r2',
  'prompt': [94682, 199411, 304140, 408869, 513598, 618327, 723056, 827785, 932514, 137243, 241972, 346701,
             451430, 556159, 660888, 765617, 870346, 975075, 179804, 284533, 389262, 493991, 598720, 703449],
  'max_tokens': 4,
  'priority': 0}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 40
PIPELINE_DEPTH = 0
PROPERTY = 'BUD-003'
STATEMENT = 'The live sequences of running requests never exceed max_num_seqs.'


# -- the property ---------------------------------------------------------------------------------
def check_after_schedule(step, engine, out, before, history) -> None:
    """BUD-003: after schedule(), the running sequences never exceed max_num_seqs."""
    running = engine.queued()["running"]
    history["exercised"] += bool(running)
    if len(running) > CONFIG["max_num_seqs"]:
        raise AssertionError(
            f"step {step}: after schedule(), {len(running)} sequences are running {running} with "
            f"max_num_seqs={CONFIG['max_num_seqs']}. Expected: {STATEMENT}")


def check_after_update(step, engine, history) -> None:
    pass


def check_at_end(engine, history) -> None:
    pass


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
