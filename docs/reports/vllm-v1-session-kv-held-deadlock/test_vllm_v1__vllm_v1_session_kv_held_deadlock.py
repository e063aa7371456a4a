"""Reproducer: vLLM V1 idles with a request waiting while a streaming session that only waits for its
client's next input keeps its KV blocks.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/reports/traces/vllm-v1-session-kv-held-deadlock.json --to pytest --target vllm-v1` from
kvsched's shrunk trace, for vllm==0.33.0 (the installed vLLM, on CPU).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: a Scheduler built from VllmConfig pieces and a KVCacheConfig, fed ModelRunnerOutputs, as in
vLLM's tests/v1/core/utils.py create_scheduler / create_requests; streaming-input sessions as vLLM's
client sends them: a resumable Request, then each later input as another add_request of the same id,
and a non-resumable one to end the session; the trace's steps are replayed as kvsched's driver runs
them (arrivals, aborts, schedule(), the model's outcome), the model played here.

Asserts SES-003: The KV a waiting session holds never stalls an idle engine: in a step that begins
with nothing running or swapped, unpaused, and schedules nothing, no session in the waiting queue
holds blocks while another waiting request is WAITING.
"""

import os
import sys
import tempfile
import traceback
import zlib

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
import vllm  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

ENGINE = f"vllm {vllm.__version__} from {os.path.dirname(vllm.__file__)}"
STOP_TOKEN_ID = 1000  # a request the trace stops samples this id (its only stop_token_id)
VOCAB_SIZE = 50
# ModelConfig reads only config.json: a two-layer Llama, no weights, no tokenizer.
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "torch_dtype": "float32",
              "bos_token_id": 1, "eos_token_id": 2}


def sampled_token(request_id: str, position: int) -> int:
    """The token "the model" samples at ``position``: a fixed function of the request and position."""
    return zlib.crc32(f"{request_id}#0@{position}".encode()) % VOCAB_SIZE


def tiny_model_dir() -> str:
    import json

    path = tempfile.mkdtemp(prefix="tiny-llama-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    return path


def create_scheduler(config: dict, scheduler_cls: type = Scheduler, async_scheduling: bool = False,
                     spec_method: str = "ngram") -> Scheduler:
    """As tests/v1/core/utils.py create_scheduler builds one: VllmConfig pieces and a KVCacheConfig
    of one full-attention group with ``num_gpu_blocks + 1`` blocks (block 0 is V1's null block)."""
    block_size, num_blocks, max_model_len = config["block_size"], config["num_gpu_blocks"] + 1, config["max_model_len"]
    model_config = ModelConfig(model=tiny_model_dir(), skip_tokenizer_init=True, max_model_len=max_model_len,
                               dtype="float32", seed=0)
    watermark_blocks = int(config["watermark"] * config["num_gpu_blocks"])
    scheduler_config = SchedulerConfig(
        max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["max_num_batched_tokens"],
        max_model_len=max_model_len, is_encoder_decoder=False,
        enable_chunked_prefill=bool(config.get("enable_chunked_prefill")),
        long_prefill_token_threshold=int(config.get("long_prefill_token_threshold", 0)),
        async_scheduling=async_scheduling, policy=config["policy"],
        watermark=(watermark_blocks + 0.5) / num_blocks if watermark_blocks else 0.0)
    cache_config = CacheConfig(block_size=block_size, enable_prefix_caching=bool(config.get("enable_prefix_caching")))
    k = int(config.get("num_speculative_tokens", 0))
    speculative_config = SpeculativeConfig(method=spec_method, num_speculative_tokens=k, prompt_lookup_max=k,
                                           prompt_lookup_min=1) if k else None
    vllm_config = VllmConfig(model_config=model_config, scheduler_config=scheduler_config, cache_config=cache_config,
                             speculative_config=speculative_config)
    cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["layer0"], FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    return scheduler_cls(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vllm_config), block_size=block_size,
                         log_stats=False)


def create_request(spec: dict, arrival: int, block_hasher) -> Request:
    """As tests/v1/core/utils.py create_requests: a Request with its prompt ids and sampling params."""
    params = SamplingParams(max_tokens=spec["max_tokens"], ignore_eos=True, stop_token_ids=[STOP_TOKEN_ID])
    return Request(request_id=spec["id"], prompt_token_ids=list(spec["prompt"]), sampling_params=params,
                   pooling_params=None, arrival_time=float(arrival), priority=spec["priority"],
                   block_hasher=block_hasher)


class Engine:
    """The EngineCore loop around the real Scheduler, with the model runner played here: every
    request whose prompt is complete samples ``1 + accepted drafts`` tokens, and the n-gram
    drafter proposes the trace's number of drafts after each step (EngineCore.post_step)."""

    SCHEDULE_CALL, UPDATE_CALL = "Scheduler.schedule()", "Scheduler.update_from_output()"
    scheduler_cls: type = Scheduler
    async_scheduling = False
    spec_method = "ngram"

    def __init__(self, config: dict) -> None:
        self.config = config
        self.sched = create_scheduler(config, self.scheduler_cls, self.async_scheduling, self.spec_method)
        self.k = int(config.get("num_speculative_tokens", 0))
        self.block_hasher = None
        if config.get("enable_prefix_caching"):  # as vllm/v1/engine/core.py EngineCore.__init__ builds it
            hash_fn = get_hash_fn_by_name(self.sched.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.block_hasher = get_request_block_hasher(config["block_size"], hash_fn)
        self.requests: dict[str, Request] = {}
        self.refused: set[str] = set()

    def add(self, spec: dict) -> None:
        if len(spec["prompt"]) >= self.config["max_model_len"]:
            # vllm/v1/engine/input_processor.py InputProcessor._validate_prompt_len refuses it
            # before the scheduler (a generate prompt needs room for one output token)
            self.refused.add(spec["id"])
            return
        request = create_request(spec, len(self.requests), self.block_hasher)
        self.requests[spec["id"]] = request
        self.sched.add_request(request)

    def abort(self, request_ids: list) -> None:
        self.sched.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)

    def queued(self) -> dict:
        return {"waiting": [r.request_id for r in self.sched.waiting],
                "running": [r.request_id for r in self.sched.running]}

    def schedule(self):
        self.output = self.sched.schedule()
        return self.output

    def update(self, stopped, drafts: dict) -> set:
        out = self.output
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            request = self.requests[rid]
            if request.num_computed_tokens < request.num_tokens:  # a prefill chunk: nothing sampled
                sampled.append([])
                continue
            scheduled_drafts = out.scheduled_spec_decode_tokens.get(rid, ())
            real = next((i for i, t in enumerate(scheduled_drafts) if t < 0), len(scheduled_drafts))  # -1: a pad
            sampled.append(self.sample(rid, request.num_tokens, len(scheduled_drafts), real, rid in stopped,
                                       drafts.get(rid, {})))
        model_output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                         sampled_token_ids=sampled)
        self.sched.update_from_output(out, model_output)
        if self.k:  # the drafter proposes for every request that sampled and goes on
            going = [rid for rid, tokens in zip(req_ids, sampled, strict=True)
                     if tokens and not self.requests[rid].is_finished()]
            proposals = [self.propose(rid, drafts.get(rid, {})) for rid in going]
            self.sched.update_draft_token_ids(DraftTokenIds(going, proposals))
        return {rid for rid, r in self.requests.items() if r.is_finished()} | self.refused

    def sample(self, rid: str, position: int, num_drafts: int, real: int, stopped: bool, decision: dict) -> list:
        """The rejection sampler: the accepted drafts and the bonus token; none for an empty output."""
        if decision.get("empty"):
            return []
        accepted = min(int(decision.get("accepted", 0)), num_drafts, real)
        tokens = [sampled_token(rid, position + i) for i in range(accepted + 1)]
        if stopped:
            at = decision.get("stop_at")
            tokens[accepted if at is None else min(int(at), accepted)] = STOP_TOKEN_ID
        return tokens

    def propose(self, rid: str, decision: dict) -> list:
        count = self.k if decision.get("proposed") is None else min(int(decision["proposed"]), self.k)
        return [sampled_token(rid, self.requests[rid].num_tokens + i) for i in range(count)]

    # -- what the checks read ------------------------------------------------------------------
    def scheduled_anything(self, out) -> bool:
        return bool(out.num_scheduled_tokens) or bool(out.preempted_req_ids)

    def scheduled_ids(self, out) -> list:
        return [] if out is None else list(out.num_scheduled_tokens)

    def slots(self, out) -> dict:
        """Per request ``out`` schedules: (the KV slots its block table holds, its computed tokens
        before the step, the tokens scheduled now). schedule() has already counted the step's tokens
        as computed (Scheduler._update_after_schedule); its first KV cache group's table."""
        if out is None:
            return {}
        tables = self.sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
        return {rid: (len([b for b in tables.get(rid, ()) if not b.is_null]) * self.config["block_size"],
                      self.requests[rid].num_computed_tokens - n, n) for rid, n in out.num_scheduled_tokens.items()}

    def lengths(self) -> dict:
        """Per unfinished request: (tokens, computed tokens) once the step's outcome is processed."""
        return {rid: (r.num_tokens, r.num_computed_tokens) for rid, r in self.requests.items() if not r.is_finished()}


# -- streaming-input sessions: vLLM's resumable requests, their client played here ----------------
class SessionEngine(Engine):
    """The engine loop with the client of the streaming sessions (a request with a ``session`` in
    REQUESTS): the session arrives as a ``resumable`` Request (vllm/v1/request.py); before the
    schedule() of each later input's step the client sends the input as another add_request of the
    same id, resumable, with the input's token ids and max_tokens (taken up at once while the
    session is WAITING_FOR_STREAMING_REQ, queued while it runs: Scheduler.add_request), and after
    the last input a non-resumable empty one, the end of the session (it finishes at its next
    stop). A session already finished (aborted) is sent nothing more."""

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.step_no = 0
        self.arrivals = 0  # every Request built, a session's inputs too: its arrival_time, as the host counts
        self.inputs = {spec["id"]: list(spec["session"]) for spec in REQUESTS if spec.get("session")}

    def add(self, spec: dict) -> None:
        rid = spec["id"]
        if len(spec["prompt"]) >= self.config["max_model_len"]:  # InputProcessor._validate_prompt_len, as above
            self.refused.add(rid)
            self.inputs.pop(rid, None)
            return
        request = self.request(rid, spec["prompt"], spec["max_tokens"], rid in self.inputs, spec["priority"])
        self.requests[rid] = request
        self.sched.add_request(request)

    def request(self, rid: str, prompt: list, max_tokens: int, resumable: bool, priority: int = 0) -> Request:
        """create_request, with vLLM's ``resumable`` flag (a session, or one of its later inputs)."""
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[STOP_TOKEN_ID])
        self.arrivals += 1
        return Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=params, pooling_params=None,
                       arrival_time=float(self.arrivals - 1), priority=priority, block_hasher=self.block_hasher,
                       resumable=resumable)

    def schedule(self):
        for rid, left in list(self.inputs.items()):
            session = self.sched.requests.get(rid)
            if session is None or session.is_finished():  # aborted: the client sends nothing more
                del self.inputs[rid]
                continue
            while left and left[0]["step"] <= self.step_no:
                piece = left.pop(0)
                self.sched.add_request(self.request(rid, piece["prompt"], piece["max_tokens"], True))
                if not left:  # the end of the session
                    self.sched.add_request(self.request(rid, [], 1, False))
            if not left:
                del self.inputs[rid]
        self.step_no += 1
        return super().schedule()

    def held_by_sessions(self) -> dict:
        """Per session waiting for its client's next input (WAITING_FOR_STREAMING_REQ): the KV blocks it holds."""
        tables = self.sched.kv_cache_manager.coordinator.single_type_managers[0].req_to_blocks
        return {r.request_id: len([b for b in tables.get(r.request_id, ()) if not b.is_null])
                for r in self.sched.requests.values() if r.status == RequestStatus.WAITING_FOR_STREAMING_REQ}

    def queued(self) -> dict:
        """The waiting queue as vLLM drains it (kv_holding_waiting first, where a session that took up
        an input keeps its KV), less the sessions waiting for their client (``held``: the blocks each
        holds), which wait for no scheduler decision."""
        held = self.held_by_sessions()
        waiting = [r.request_id for r in (*self.sched.kv_holding_waiting, *self.sched.waiting)
                   if r.request_id not in held]
        return {"waiting": waiting, "running": [r.request_id for r in self.sched.running], "held": held,
                "paused": getattr(self.sched, "_pause_state", 0) != 0}


Engine = SessionEngine


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 4,
 'num_gpu_blocks': 8,
 'num_cpu_blocks': 0,
 'max_num_seqs': 4,
 'max_num_batched_tokens': 32,
 'max_model_len': 32,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs',
 'enable_chunked_prefill': True}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0,
  'id': 'A',
  'prompt': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25],
  'max_tokens': 1,
  'priority': 0,
  'session': [{'step': 12, 'prompt': [7, 8], 'max_tokens': 1}]},
 {'step': 2,
  'id': 'B',
  'prompt': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
  'max_tokens': 2,
  'priority': 0}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 60
PIPELINE_DEPTH = 0
PROPERTY = 'SES-003'
STATEMENT = 'The KV a waiting session holds never stalls an idle engine: in a step that begins with nothing running or swapped, unpaused, and schedules nothing, no session in the waiting queue holds blocks while another waiting request is WAITING.'


# -- the property ---------------------------------------------------------------------------------
def check_after_schedule(step, engine, out, before, history) -> None:
    """SES-003: in a step that begins with nothing running, unpaused, and schedules nothing, no
    session waiting for its client's next input holds KV blocks while another request waits."""
    held = {rid: n for rid, n in before.get("held", {}).items() if n}
    if not before.get("held"):
        return
    history["exercised"] += 1
    if before["running"] or before.get("paused") or engine.scheduled_anything(out):
        return
    if held and before["waiting"]:
        shown = ", ".join(f"{rid} holds {n} KV blocks" for rid, n in held.items())
        raise AssertionError(
            f"step {step}: nothing is running and {before['waiting']} wait(s) to be admitted, yet the step schedules "
            f"nothing: session {shown} while it waits for its client's next input (WAITING_FOR_STREAMING_REQ), and "
            f"nothing takes them back; the engine stalls until that client sends more. Expected: {STATEMENT}")


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
