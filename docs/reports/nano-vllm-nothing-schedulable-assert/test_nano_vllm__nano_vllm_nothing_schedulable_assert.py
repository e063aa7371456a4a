"""Reproducer: nano-vllm crashes on `assert scheduled_seqs` when a waiting prompt can never fit and
nothing runs.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/reports/traces/nano-vllm-nothing-schedulable-assert.json --to pytest --target nano-vllm` from
kvsched's shrunk trace, for nano-vllm-npu==0.0.2 (the installed package; no torch, no model).

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

PKG = 'nanovllmnpu'  # the package under test

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
CONFIG = {'block_size': 256,
 'num_gpu_blocks': 1,
 'num_cpu_blocks': 0,
 'max_num_seqs': 4,
 'max_num_batched_tokens': 512,
 'max_model_len': 512,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs'}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0,
  'id': 'r0',
  'prompt': [63006, 167735, 272464, 377193, 481922, 586651, 691380, 796109, 900838, 105567, 210296, 315025,
             419754, 524483, 629212, 733941, 838670, 943399, 148128, 252857, 357586, 462315, 567044, 671773,
             776502, 881231, 85960, 190689, 295418, 400147, 504876, 609605, 714334, 819063, 923792, 128521,
             233250, 337979, 442708, 547437, 652166, 756895, 861624, 66353, 171082, 275811, 380540, 485269,
             589998, 694727, 799456, 904185, 108914, 213643, 318372, 423101, 527830, 632559, 737288, 842017,
             946746, 151475, 256204, 360933, 465662, 570391, 675120, 779849, 884578, 89307, 194036, 298765,
             403494, 508223, 612952, 717681, 822410, 927139, 131868, 236597, 341326, 446055, 550784, 655513,
             760242, 864971, 69700, 174429, 279158, 383887, 488616, 593345, 698074, 802803, 907532, 112261,
             216990, 321719, 426448, 531177, 635906, 740635, 845364, 950093, 154822, 259551, 364280, 469009,
             573738, 678467, 783196, 887925, 92654, 197383, 302112, 406841, 511570, 616299, 721028, 825757,
             930486, 135215, 239944, 344673, 449402, 554131, 658860, 763589, 868318, 73047, 177776, 282505,
             387234, 491963, 596692, 701421, 806150, 910879, 115608, 220337, 325066, 429795, 534524, 639253,
             743982, 848711, 953440, 158169, 262898, 367627, 472356, 577085, 681814, 786543, 891272, 96001,
             200730, 305459, 410188, 514917, 619646, 724375, 829104, 933833, 138562, 243291, 348020, 452749,
             557478, 662207, 766936, 871665, 76394, 181123, 285852, 390581, 495310, 600039, 704768, 809497,
             914226, 118955, 223684, 328413, 433142, 537871, 642600, 747329, 852058, 956787, 161516, 266245,
             370974, 475703, 580432, 685161, 789890, 894619, 99348, 204077, 308806, 413535, 518264, 622993,
             727722, 832451, 937180, 141909, 246638, 351367, 456096, 560825, 665554, 770283, 875012, 79741,
             184470, 289199, 393928, 498657, 603386, 708115, 812844, 917573, 122302, 227031, 331760, 436489,
             541218, 645947, 750676, 855405, 960134, 164863, 269592, 374321, 479050, 583779, 688508, 793237,
             897966, 102695, 207424, 312153, 416882, 521611, 626340, 731069, 835798, 940527, 145256, 249985,
             354714, 459443, 564172, 668901, 773630, 878359, 83088, 187817, 292546, 397275, 502004, 606733,
             711462, 816191, 920920, 125649, 230378, 335107, 439836, 544565, 649294, 754023, 858752, 63481,
             168210, 272939, 377668, 482397, 587126, 691855, 796584, 901313, 106042, 210771, 315500, 420229,
             524958, 629687, 734416, 839145, 943874, 148603, 253332, 358061, 462790, 567519, 672248, 776977],
  'max_tokens': 4,
  'priority': 0,
  'own_ids': True}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 3
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
