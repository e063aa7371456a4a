"""Reproducer: nano-vllm-fork leaves a preempted sequence in `running`: it is in two queues and is
scheduled twice.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/traces/nano-vllm-fork/counterexamples/REQ-004.json --to pytest --target nano-vllm-fork` from
kvsched's shrunk trace, for nano-vllm-fork==20260210 (the installed package; no torch, no model).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: nano-vllm's Scheduler driven as LLMEngine.step drives it (schedule(), one token per scheduled
sequence, postprocess()), its Config replaced by the five fields the Scheduler reads; the trace's
steps are replayed as kvsched's driver runs them (arrivals, aborts, schedule(), the model's
outcome), the model played here.

Asserts REQ-004: Every generated token is kept: a step adds exactly one token to each scheduled
sequence (with chunked prefill: one once all of its tokens are computed, none after a partial chunk;
with d draft tokens: from one to d + 1, the accepted drafts and the bonus, or none on an outcome
with no token) and none to the others, and preemption never drops tokens; except that where the
scheduler claims ``output_at_finish``, a preemption by recompute may drop generated tokens from the
end (never the prompt).
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
CONFIG = {'block_size': 4,
 'num_gpu_blocks': 18,
 'num_cpu_blocks': 0,
 'max_num_seqs': 3,
 'max_num_batched_tokens': 69,
 'max_model_len': 1,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs'}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0,
  'id': 'r0',
  'prompt': [63006, 167735, 272464, 377193, 481922, 586651, 691380, 796109, 900838, 105567, 210296, 315025,
             419754, 524483, 629212, 733941, 838670, 943399, 148128, 252857, 357586, 462315, 567044, 671773,
             776502, 881231, 85960, 190689, 295418, 400147, 504876, 609605, 714334, 819063, 923792, 128521],
  'max_tokens': 2,
  'priority': 0,
  'own_ids': True},
 {'step': 0,
  'id': 'r1',
  'prompt': [78844, 183573, 288302, 393031, 497760, 602489, 707218, 811947, 916676, 121405, 226134, 330863,
             435592, 540321, 645050, 749779, 854508, 959237, 163966, 268695, 373424, 478153, 582882, 687611],
  'max_tokens': 3,
  'priority': 0,
  'own_ids': True},
 {'step': 0,
  'id': 'r2',
  'prompt': [94682, 199411, 304140, 408869, 513598, 618327, 723056, 827785, 932514],
  'max_tokens': 2,
  'priority': 0,
  'own_ids': True}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 4
PIPELINE_DEPTH = 0
PROPERTY = 'REQ-004'
STATEMENT = 'Every generated token is kept: a step adds exactly one token to each scheduled sequence (with chunked prefill: one once all of its tokens are computed, none after a partial chunk; with d draft tokens: from one to d + 1, the accepted drafts and the bonus, or none on an outcome with no token) and none to the others, and preemption never drops tokens; except that where the scheduler claims ``output_at_finish``, a preemption by recompute may drop generated tokens from the end (never the prompt).'


# -- the property ---------------------------------------------------------------------------------
def check_after_schedule(step, engine, out, before, history) -> None:
    history["scheduled"] = set(engine.scheduled_ids(out))


def check_after_update(step, engine, history) -> None:
    """REQ-004: a request's tokens never go down; at pipeline depth 0 a step adds exactly one to each
    scheduled sequence (with chunked prefill: one once its tokens before the step are all computed,
    none after a partial chunk; with drafts: at most 1 + the drafts) and none to the others."""
    now = engine.lengths()
    last = history.get("lengths", {})
    drafts = bool(CONFIG.get("num_speculative_tokens"))
    for rid, (tokens, computed) in now.items():
        if rid not in last:
            continue
        history["exercised"] += 1
        before, grew = last[rid][0], tokens - last[rid][0]
        if grew < 0:
            raise AssertionError(f"step {step}: request {rid} went from {before} to {tokens} tokens: "
                                 f"tokens were dropped. Expected: {STATEMENT}")
        if not drafts and grew > 1:
            raise AssertionError(f"step {step}: request {rid} went from {before} to {tokens} tokens in one "
                                 f"step, which samples one token per sequence. Expected: {STATEMENT}")
        if PIPELINE_DEPTH or drafts:  # outcomes a step late, or 1 + accepted drafts: only the above
            continue
        if rid not in history["scheduled"]:
            if grew:
                raise AssertionError(f"step {step}: request {rid} was not scheduled, yet went from {before} to "
                                     f"{tokens} tokens. Expected: {STATEMENT}")
            continue
        if CONFIG.get("enable_chunked_prefill"):
            if computed is None:  # the engine reports no computed tokens: a partial chunk cannot be told
                continue
            completes = computed >= before  # every token it had before the step is computed now
        else:
            completes = True
        if grew != int(completes):
            what = "gained no token" if completes else "gained a token after a chunk that left tokens uncomputed"
            raise AssertionError(f"step {step}: request {rid} was scheduled and {what} ({before} -> {tokens} "
                                 f"tokens, {computed} computed). Expected: {STATEMENT}")
    history["lengths"] = now


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
