"""Reproducer: nano-vllm crashes on `assert scheduled_seqs` when a waiting prompt can never fit and
nothing runs.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/traces/nano-vllm-fork/counterexamples/FAULT-raised.json --to pytest --target nano-vllm-fork`
from kvsched's shrunk trace, for nano-vllm-fork==20260210 (the installed package; no torch, no
model).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: nano-vllm's Scheduler driven as LLMEngine.step drives it (schedule(), one token per scheduled
sequence, postprocess()), its Config replaced by the five fields the Scheduler reads; the trace's
steps are replayed as kvsched's driver runs them (arrivals, aborts, schedule(), the model's
outcome), the model played here.

Asserts FAULT-raised: every call on the scheduler returns: a config the engine accepted and the
requests it admitted never crash it (an assert or exception here ends the engine and every request
in it)
"""

import importlib
import importlib.util
import os
import sys
import traceback
import types
import zlib
from types import SimpleNamespace

PKG = 'nanovllm'  # the package under test

def load_nano(pkg: str):
    """nano-vllm's scheduler, block manager and sequence, without running the package's
    __init__ (it imports torch, transformers and the model runner): a stub parent package and
    a stub ``<pkg>.config`` (Config.__post_init__ loads a Hugging Face model; the Scheduler reads
    five of its fields, given below)."""
    spec = importlib.util.find_spec(pkg)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{pkg} is not installed for {sys.executable}")
    parent = types.ModuleType(pkg)
    parent.__path__ = [os.path.dirname(spec.origin)]
    parent.__file__ = spec.origin
    sys.modules[pkg] = parent
    config = types.ModuleType(pkg + ".config")
    config.Config = type("Config", (SimpleNamespace,), {})
    sys.modules[pkg + ".config"] = config
    return (importlib.import_module(pkg + ".engine.scheduler"), importlib.import_module(pkg + ".engine.sequence"),
            importlib.import_module(pkg + ".sampling_params"))


scheduler_module, sequence_module, sampling_module = load_nano(PKG)
Scheduler, Sequence, SequenceStatus = scheduler_module.Scheduler, sequence_module.Sequence, sequence_module.SequenceStatus
SamplingParams = sampling_module.SamplingParams
ENGINE = f"{PKG} from {os.path.dirname(sys.modules[PKG].__file__)}"
EOS = 2**31 - 1  # a request the trace stops samples the EOS id, so nano's own EOS rule finishes it
VOCAB_SIZE = 50


def sampled_token(request_id: str, position: int) -> int:
    """The token "the model" samples at ``position``: a fixed function of the request and position."""
    return zlib.crc32(f"{request_id}#0@{position}".encode()) % VOCAB_SIZE


def own_token(request_id: str, position: int) -> int:
    """The sampled token of a request whose prompt ids are its own (no prefix shared with others)."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id + "#0")) * 7919) % 100_000
    return base + (position * 104_729) % 900_000


class Engine:
    """nano-vllm's LLMEngine.step around the real Scheduler: ``seqs, is_prefill = schedule()``,
    one token per scheduled sequence (the model runner, played here), ``postprocess(seqs, tokens)``."""

    SCHEDULE_CALL, UPDATE_CALL = "Scheduler.schedule()", "Scheduler.postprocess()"

    def __init__(self, config: dict) -> None:
        self.config = config
        Sequence.block_size = config["block_size"]  # LLMEngine sets it from kvcache_block_size
        self.sched = Scheduler(SimpleNamespace(
            max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["max_num_batched_tokens"],
            eos=EOS, num_kvcache_blocks=config["num_gpu_blocks"], kvcache_block_size=config["block_size"]))
        self.seqs: dict = {}  # request id -> Sequence
        self.rid_of: dict = {}
        self.sampler: dict = {}  # request id -> its token function
        self.refused: set = set()

    def add(self, spec: dict) -> None:
        seq = Sequence(list(spec["prompt"]), SamplingParams(temperature=1.0, max_tokens=spec["max_tokens"]))
        try:
            self.sched.add(seq)
        except ValueError:  # a refusal at the door (nano-vllm has none; a fixed engine may): the request's answer
            self.refused.add(spec["id"])
            return
        self.seqs[spec["id"]] = seq
        self.sampler[spec["id"]] = own_token if spec.get("own_ids") else sampled_token
        self.rid_of[seq.seq_id] = spec["id"]

    def abort(self, request_ids: list) -> None:
        raise NotImplementedError("nano-vllm has no abort")

    def queued(self) -> dict:
        return {"waiting": [self.rid_of[s.seq_id] for s in self.sched.waiting],
                "running": [self.rid_of[s.seq_id] for s in self.sched.running]}

    def schedule(self):
        if self.sched.is_finished():  # LLMEngine.generate steps only while work is left
            self.output = ([], False)
        else:
            self.output = self.sched.schedule()
        return self.output

    def update(self, stopped, drafts: dict) -> set:
        seqs, _ = self.output
        rids = [self.rid_of[s.seq_id] for s in seqs]
        tokens = [EOS if rid in stopped else self.sampler[rid](rid, len(s)) for rid, s in zip(rids, seqs, strict=True)]
        self.sched.postprocess(seqs, tokens)
        return {rid for rid, s in self.seqs.items() if s.status == SequenceStatus.FINISHED} | self.refused

    # -- what the checks read ------------------------------------------------------------------
    def scheduled_anything(self, out) -> bool:
        return bool(out[0])

    def scheduled_ids(self, out) -> list:
        return [self.rid_of[s.seq_id] for s in out[0]]

    def lengths(self) -> dict:
        """Per request, finished ones too: (tokens, cached tokens)."""
        return {rid: (len(s), s.num_cached_tokens) for rid, s in self.seqs.items()}

    def status(self, rid: str) -> str:
        return self.seqs[rid].status.name


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 1,
 'num_gpu_blocks': 1,
 'num_cpu_blocks': 0,
 'max_num_seqs': 1,
 'max_num_batched_tokens': 1,
 'max_model_len': 1,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs'}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0, 'id': 'r0', 'prompt': [63006, 167735], 'max_tokens': 1, 'priority': 0, 'own_ids': True}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 1
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
