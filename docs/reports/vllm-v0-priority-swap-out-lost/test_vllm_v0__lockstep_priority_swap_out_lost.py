"""Reproducer: vLLM V0's priority preemption by swap loses the swap-out map and files the SWAPPED
victim in waiting.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/traces/lockstep/priority-swap-out-lost.json --to pytest --target vllm-v0` from kvsched's shrunk
trace, for vllm==0.10.2 (the installed vLLM with its V0 engine, VLLM_USE_V1=0, on CPU).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: vLLM V0's Scheduler built as tests/core/test_scheduler.py builds it, each step's outcome
processed as LLMEngine._process_model_outputs does (vLLM's StopChecker, free_seq,
free_finished_seq_groups); the trace's steps are replayed as kvsched's driver runs them (arrivals,
aborts, schedule(), the model's outcome), the model played here.

Asserts SWP-001: Swap-out is a bijection from exactly the GPU blocks of the swapped-out requests'
unfinished sequences onto CPU blocks that no other request holds after schedule() (after the step,
when that is all there is to see).
"""

import logging
import os
import sys
import traceback

os.environ.setdefault("VLLM_USE_V1", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
logging.disable(logging.WARNING)

import vllm  # noqa: E402
from vllm.config import CacheConfig, SchedulerConfig  # noqa: E402
from vllm.core.scheduler import Scheduler  # noqa: E402
from vllm.engine.output_processor.stop_checker import StopChecker  # noqa: E402
from vllm.inputs.data import token_inputs  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.sequence import Sequence, SequenceGroup, SequenceStatus  # noqa: E402

ENGINE = f"vllm {vllm.__version__} from {os.path.dirname(vllm.__file__)}"
STOP_TOKEN_ID = 3  # a request the trace stops samples this id (its only stop_token_id)


def sampled_token(seq_key: str, position: int) -> int:
    """The token "the model" samples at ``position``: a fixed function of the sequence and position."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(seq_key)) * 7919) % 100_000
    return base + (position * 104_729) % 900_000


def create_scheduler(config: dict) -> Scheduler:
    """As tests/core/test_scheduler.py builds one: SchedulerConfig, CacheConfig with the block
    counts set, ``Scheduler(scheduler_config, cache_config, None)``."""
    mode = config["preemption_mode"]
    scheduler_config = SchedulerConfig(
        runner_type="generate", max_num_batched_tokens=config["max_num_batched_tokens"],
        max_num_seqs=config["max_num_seqs"], max_model_len=config["max_model_len"], enable_chunked_prefill=False,
        preemption_mode=None if mode == "auto" else mode, policy=config["policy"])
    cache_config = CacheConfig(block_size=config["block_size"], swap_space=0, cache_dtype="auto",
                               enable_prefix_caching=False)
    cache_config.num_gpu_blocks = config["num_gpu_blocks"]
    cache_config.num_cpu_blocks = config["num_cpu_blocks"]
    return Scheduler(scheduler_config, cache_config, lora_config=None)


class Engine:
    """LLMEngine._process_model_outputs around the real Scheduler: ``schedule()``, then for each
    scheduled group ``update_num_computed_tokens``, one token per running sequence, vLLM's own
    StopChecker, ``free_seq`` for finished sequences and ``free_finished_seq_groups()``."""

    SCHEDULE_CALL = "Scheduler.schedule()"
    UPDATE_CALL = "the outcome (update_num_computed_tokens, append_token_id, StopChecker, free_seq)"

    def __init__(self, config: dict) -> None:
        self.config = config
        self.sched = create_scheduler(config)
        self.stop_checker = StopChecker(config["max_model_len"], lambda seq: None)
        self.groups: dict = {}
        self.ignored: set = set()
        self.G = config["num_gpu_blocks"]

    def add(self, spec: dict) -> None:
        seq = Sequence(len(self.groups), token_inputs(list(spec["prompt"])), self.config["block_size"])
        params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, detokenize=False,
                                stop_token_ids=[STOP_TOKEN_ID])
        group = SequenceGroup(spec["id"], [seq], arrival_time=float(len(self.groups)), sampling_params=params,
                              priority=spec["priority"])
        self.groups[spec["id"]] = group
        self.sched.add_seq_group(group)

    def abort(self, request_ids: list) -> None:
        for rid in request_ids:
            self.sched.abort_seq_group(rid)

    def queued(self) -> dict:
        return {"waiting": [g.request_id for g in self.sched.waiting],
                "running": [g.request_id for g in self.sched.running],
                "swapped": [g.request_id for g in self.sched.swapped]}

    def schedule(self):
        self.before = {rid: (self.status(rid), self.gpu_blocks(rid)) for rid in self.groups}
        self.metas, self.output, _ = self.sched.schedule()
        self.ignored |= {g.request_id for g in self.output.ignored_seq_groups}
        return self.output

    def update(self, stopped, drafts: dict) -> set:
        for scheduled, meta in zip(self.output.scheduled_seq_groups, self.metas, strict=True):
            group = scheduled.seq_group
            group.update_num_computed_tokens(scheduled.token_chunk_size)
            if not meta.do_sample:
                continue
            for seq in group.get_seqs(status=SequenceStatus.RUNNING):
                token = STOP_TOKEN_ID if group.request_id in stopped else sampled_token(f"{group.request_id}#0",
                                                                                         seq.get_len())
                seq.append_token_id(token, {token: Logprob(0.0)})
                self.stop_checker.maybe_stop_sequence(seq, 0, group.sampling_params)
                if seq.is_finished():
                    self.sched.free_seq(seq)
        self.sched.free_finished_seq_groups()
        return {rid for rid, g in self.groups.items() if g.is_finished()}

    # -- what the checks read ------------------------------------------------------------------
    def status(self, rid: str) -> str:
        seqs = self.groups[rid].seqs
        live = [s.status.name for s in seqs if not s.is_finished()]
        return live[0] if live else seqs[0].status.name

    def blocks(self, rid: str) -> list:
        tables = self.sched.block_manager.block_tables
        return [b for s in self.groups[rid].seqs if s.seq_id in tables
                for b in tables[s.seq_id].physical_block_ids if b is not None]

    def gpu_blocks(self, rid: str) -> list:
        return [b for b in self.blocks(rid) if b < self.G]

    def scheduled_anything(self, out) -> bool:
        return bool(out.scheduled_seq_groups or out.ignored_seq_groups or out.preempted)

    def scheduled_ids(self, out) -> list:
        return [s.seq_group.request_id for s in out.scheduled_seq_groups]

    def lengths(self) -> dict:
        return {rid: (g.seqs[0].get_len(), g.seqs[0].data.get_num_computed_tokens()) for rid, g in self.groups.items()}

    def num_finished(self) -> int:
        return sum(g.is_finished() for g in self.groups.values())

    def finished_holding_blocks(self) -> dict:
        """Finished requests that still hold blocks, by request: ["gpu 0", "cpu 2", ...] (CPU ids
        relative to the CPU pool)."""
        held = {}
        for rid, group in self.groups.items():
            if group.is_finished() and self.blocks(rid):
                held[rid] = [f"gpu {b}" if b < self.G else f"cpu {b - self.G}" for b in self.blocks(rid)]
        return held

    def swapped_out_now(self, before) -> dict:
        """Requests the step just preempted by swap, with the GPU blocks they held before it."""
        return {rid: blocks for rid, (status, blocks) in self.before.items()
                if status != "SWAPPED" and self.status(rid) == "SWAPPED"}


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 2,
 'num_gpu_blocks': 1,
 'num_cpu_blocks': 1,
 'max_num_seqs': 1,
 'max_num_batched_tokens': 7,
 'max_model_len': 3,
 'watermark': 0.01,
 'preemption_mode': 'swap',
 'policy': 'priority'}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 5, 'id': 'r2', 'prompt': [94682], 'max_tokens': 2, 'priority': 1},
 {'step': 6, 'id': 'r4', 'prompt': [26358], 'max_tokens': 1, 'priority': 0}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 7
PIPELINE_DEPTH = 0
PROPERTY = 'SWP-001'
STATEMENT = "Swap-out is a bijection from exactly the GPU blocks of the swapped-out requests' unfinished sequences onto CPU blocks that no other request holds after schedule() (after the step, when that is all there is to see)."


# -- the property ---------------------------------------------------------------------------------
def check_after_schedule(step, engine, out, before, history) -> None:
    """SWP-001: every GPU block of a request swapped out in this step is in the step's swap-out map."""
    for rid, gpu_blocks in engine.swapped_out_now(before).items():
        history["exercised"] += 1
        sources = sorted(src for src, _ in out.blocks_to_swap_out)
        if not set(gpu_blocks) <= set(sources):
            raise AssertionError(
                f"step {step}: request {rid} was preempted by swap (its status is now SWAPPED) from GPU blocks "
                f"{sorted(gpu_blocks)}, but the step's blocks_to_swap_out has sources {sources}: its KV is never "
                f"copied to the CPU. Expected: {STATEMENT}")


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
