"""Reproducer: tokasaurus' manager dies on `assert additional_blocks_needed == 0` when precise
onboarding considers a max_tokens=1 request whose prompt is not cached.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/examples/tokasaurus/traces/FAULT-raised.json --to pytest --target tokasaurus` from kvsched's
shrunk trace, for tokasaurus==0.0.4 (the tokasaurus venv of docs/examples/tokasaurus/README.md; no
model, no GPU).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: tokasaurus' manager state (BlockAllocator, SchedulingQueue, BatchIndexAllocator) from a
ServerConfig set as its tests/test_basic.py make_basic_config sets one, driven by its own manager
functions in manager_loop's order (handle_new_server_commands, try_cancelling_requests,
schedule_steps, handle_output, finish_sequences); the trace's steps are replayed as kvsched's driver
runs them (arrivals, aborts, schedule(), the model's outcome), the model played here.

Asserts FAULT-raised: every call on the scheduler returns: a config the engine accepted and the
requests it admitted never crash it (an assert or exception here ends the engine and every request
in it)
"""

import os
import queue
import sys
import traceback
import types
from importlib.metadata import version
from types import SimpleNamespace

# flashinfer (GPU attention kernels) is imported by tokasaurus/model/types.py and never called by
# the manager: an inert module stands for it.
_flashinfer = types.ModuleType("flashinfer")
_flashinfer.__getattr__ = lambda name: type(name, (), {}) if not name.startswith("__") else None
sys.modules.setdefault("flashinfer", _flashinfer)

import tokasaurus  # noqa: E402
import torch  # noqa: E402
from tokasaurus.common_types import ServerConfig  # noqa: E402
from tokasaurus.manager import manager as tm  # noqa: E402
from tokasaurus.manager.allocator import BatchIndexAllocator, BlockAllocator  # noqa: E402
from tokasaurus.manager.types import ManagerState, SchedulingQueue  # noqa: E402
from tokasaurus.server.types import CancelledRequest, SamplingParams, TokasaurusRequest  # noqa: E402

ENGINE = f"tokasaurus {version('tokasaurus')} from {os.path.dirname(tokasaurus.__file__)}"
EOS = 0  # the generation config's only EOS id; a request the trace stops samples it


def token_id(request_id: str, position: int) -> int:
    """The id at ``position`` of a request's sequence (prompt ids and "sampled" ids alike): a fixed
    function of the request, never the EOS id."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return base + (position * 104_729) % 900_000


class State(ManagerState):
    """ManagerState without a model folder: its __post_init__ loads a tokenizer and a generation
    config, of which the manager reads only the EOS ids here (requests carry no stop strings)."""

    def __post_init__(self) -> None:
        self.tokenizer = None
        self.generation_config = SimpleNamespace(eos_token_id=EOS)
        self.logger = getattr(tm, "logger", None) or SimpleNamespace(info=print, debug=print, warning=print)


def server_config(config: dict) -> ServerConfig:
    """A ServerConfig as tokasaurus' tests/test_basic.py make_basic_config sets one, with the
    trace's sizes: one step in flight (kvsched's step is synchronous), no completion-length
    predictions (admission plans for max_tokens), tokasaurus' own allocator checks on."""
    cfg = ServerConfig()
    cfg.model = "none"
    cfg.page_size = config["block_size"]
    cfg.kv_cache_num_tokens = config["block_size"] * config["num_gpu_blocks"]
    cfg.max_seqs_per_forward = config["max_num_seqs"]
    cfg.max_tokens_per_forward = config["max_num_batched_tokens"]
    cfg.max_num_tokens_per_request = min(config["max_model_len"], cfg.kv_cache_num_tokens)
    cfg.scheduling_steps_ahead = 1
    cfg.track_early_stopping = False
    cfg.use_spec_allocation = False
    cfg.use_hydragen = False
    cfg.allocator_sanity_checks = True
    return cfg  # enable_precise_onboard: tokasaurus' default (on)


class Engine:
    """tokasaurus' manager_loop (tokasaurus/manager/manager.py) around its real ManagerState
    (BlockAllocator, SchedulingQueue, BatchIndexAllocator): ``handle_new_server_commands`` for
    arrivals and cancels, ``try_cancelling_requests``, ``schedule_steps(state, 1)``, and for the
    model's output ``handle_output`` and ``finish_sequences``. The model is played here:
    ``prepare_and_submit_to_model`` keeps the step's decision instead of building torch inputs,
    and the output is one token per sequence the decision returns a token for. The server's door
    (server/utils.py validate_length) refuses a prompt + max_tokens over
    ``max_num_tokens_per_request``."""

    SCHEDULE_CALL, UPDATE_CALL = "schedule_steps()", "handle_output()"

    def __init__(self, config: dict) -> None:
        self.config = config
        cfg = server_config(config)
        self.cfg = cfg
        self.state = State(config=cfg, scheduling_queue=SchedulingQueue(),
                           block_allocator=BlockAllocator(num_blocks=config["num_gpu_blocks"],
                                                          page_size=config["block_size"]),
                           batch_index_allocator=BatchIndexAllocator(cfg.max_seqs_per_forward),
                           q_manager_to_model=queue.Queue(), q_model_to_manager=queue.Queue(),
                           q_server_to_manager=queue.Queue(), q_manager_to_server=queue.Queue(),
                           process_name="manager")
        self.state.stats_tracker.reset()
        self.decision = None
        tm.prepare_and_submit_to_model = self.submit
        self.arrived: list = []
        self.final: dict = {}  # request id -> how it finished
        self.refused: set = set()

    def submit(self, state, decision, hydragen_groups=None):
        self.decision = decision
        return decision

    def add(self, spec: dict) -> None:
        if len(spec["prompt"]) + spec["max_tokens"] > self.cfg.max_num_tokens_per_request:
            self.refused.add(spec["id"])
            return
        self.arrived.append(spec["id"])
        request = TokasaurusRequest(id=spec["id"], input_ids=list(spec["prompt"]), max_num_tokens=spec["max_tokens"],
                                    sampling_params=SamplingParams(temperature=0.0, top_p=1.0), stop=[], n=1,
                                    ignore_eos=False)
        self.state.q_server_to_manager.put(request)
        tm.handle_new_server_commands(self.state)

    def abort(self, request_ids: list) -> None:
        for rid in request_ids:
            if rid in self.arrived and rid not in self.final:
                self.state.q_server_to_manager.put(CancelledRequest(rid))
                tm.handle_new_server_commands(self.state)

    def schedule(self):
        tm.try_cancelling_requests(self.state)
        self.decision = None
        if self.state.scheduling_queue.num_unfinished_seqs() > 0:
            tm.schedule_steps(self.state, 1)
        return self.decision

    def update(self, stopped, drafts: dict) -> set:
        d, st = self.decision, self.state
        if d is not None:
            ids = [EOS if seq.request.id in stopped else
                   token_id(seq.request.id, len(seq.input_ids) + len(seq.seq_output.completion_ids))
                   for seq in d.seqs_with_tokens_to_return]
            st.q_model_to_manager.put(SimpleNamespace(schedule_id=d.id, tensors=SimpleNamespace(
                output_ids=torch.tensor(ids, dtype=torch.long), chosen_logprobs=None, topk_indices=None,
                topk_logprobs=None)))
        newly, with_output = set(), set()
        for output in tm.queue_iterator(st.q_model_to_manager):
            tm.handle_output(st, output, newly, with_output)
        tm.finish_sequences(st, newly)
        for answer in tm.queue_iterator(st.q_manager_to_server):
            reasons = {so.finish_reason for so in answer.sequence_outputs}
            self.final[answer.id] = "FINISHED_LENGTH_CAPPED" if reasons == {"length"} else "FINISHED_STOPPED"
        for rid in self.arrived:  # a cancel tokasaurus carried out: the request has left its queues
            if rid not in self.final and rid not in self.queued_ids() and not self.state.req_id_to_seq_ids.get(rid):
                self.final[rid] = "FINISHED_ABORTED"
        return set(self.final) | self.refused

    # -- what the checks read ------------------------------------------------------------------
    def queued_ids(self) -> set:
        q = self.state.scheduling_queue
        return {s.request.id for s in [*q.queued_seqs.values(), *q.decoding_seqs.values(),
                                      *q.prefilling_seqs.values()]}

    def queued(self) -> dict:
        q = self.state.scheduling_queue
        waiting = list(dict.fromkeys(s.request.id for s in q.queued_seqs.values()))
        running = list(dict.fromkeys(s.request.id for s in [*q.decoding_seqs.values(), *q.prefilling_seqs.values()]))
        return {"waiting": waiting, "running": running}

    def scheduled_anything(self, out) -> bool:
        return out is not None and bool(out.prefill_seqs or out.decoding_seqs)

    def scheduled_tokens(self, out) -> dict:
        if out is None:
            return {}
        tokens = {seq.request.id: n for seq, n in out.prefill_seqs}
        for seq in out.decoding_seqs:
            tokens[seq.request.id] = tokens.get(seq.request.id, 0) + 1
        return tokens

    def scheduled_ids(self, out) -> list:
        return list(self.scheduled_tokens(out))

    def status(self, rid: str) -> str:
        if rid in self.final:
            return self.final[rid]
        return "WAITING" if rid in self.queued()["waiting"] else "RUNNING"


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 4,
 'num_gpu_blocks': 3,
 'num_cpu_blocks': 0,
 'max_num_seqs': 2,
 'max_num_batched_tokens': 2,
 'max_model_len': 10,
 'watermark': 0.05,
 'preemption_mode': 'recompute',
 'policy': 'fcfs',
 'enable_chunked_prefill': True,
 'enable_prefix_caching': True}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0, 'id': 'r0', 'prompt': [31], 'max_tokens': 1, 'priority': 0},
 {'step': 0, 'id': 'r3', 'prompt': [31, 15, 1, 12, 4, 5, 6, 7, 8], 'max_tokens': 1, 'priority': 0}]
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
