"""Reproducer: Aphrodite's V1 scheduler keeps rejected draft positions computed when the model returns
no token for a request with drafts (vLLM's #42722 defect, in the fork).

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/reports/traces/aphrodite-empty-output-skips-rollback.json --to pytest --target aphrodite` from
kvsched's shrunk trace, for aphrodite-engine==0.24.1 (the installed aphrodite-engine, on CPU).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: a Scheduler built from VllmConfig pieces and a KVCacheConfig, fed ModelRunnerOutputs, as in
vLLM's tests/v1/core/utils.py create_scheduler / create_requests; Aphrodite's modules under vLLM's
names (a vLLM fork with vLLM's module paths); the trace's steps are replayed as kvsched's driver
runs them (arrivals, aborts, schedule(), the model's outcome), the model played here.

Asserts CHK-002: A sequence's computed tokens never exceed its tokens, and after schedule() its
computed tokens plus the tokens scheduled now, draft tokens aside, do not either.
"""

import os
import sys
import tempfile
import traceback
import zlib

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("APHRODITE_TARGET_DEVICE", "cpu")
import importlib  # noqa: E402
import importlib.abc  # noqa: E402
import importlib.util  # noqa: E402


class _VllmIsAphrodite(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Aphrodite is a vLLM fork whose V1 scheduler keeps vLLM's module paths under the package name
    ``aphrodite``: every ``vllm.X`` below is the installed ``aphrodite.X`` (nothing is changed)."""

    def __init__(self) -> None:
        self.own_specs: dict = {}

    def find_spec(self, name, path, target=None):
        if name == "vllm" or name.startswith("vllm."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = importlib.import_module("aphrodite" + spec.name[len("vllm"):])
        self.own_specs[id(module)] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self.own_specs.pop(id(module), module.__spec__)


sys.meta_path.insert(0, _VllmIsAphrodite())
_aphrodite_config = importlib.import_module("aphrodite.config")
_aphrodite_config.VllmConfig = _aphrodite_config.AphroditeConfig  # the same class, vLLM's name

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


# -- Aphrodite: the config goes to its Scheduler as ``aphrodite_config`` ---------------------------
from importlib.metadata import version  # noqa: E402

import aphrodite  # noqa: E402

ENGINE = f"aphrodite-engine {version('aphrodite-engine')} from {os.path.dirname(aphrodite.__file__)}"
_AphroditeScheduler = Scheduler


def aphrodite_scheduler(*, vllm_config, **kwargs):
    """Aphrodite's Scheduler takes vLLM's ``vllm_config`` as ``aphrodite_config``
    (aphrodite/v1/core/sched/scheduler.py:80-90)."""
    return _AphroditeScheduler(aphrodite_config=vllm_config, **kwargs)


Engine.scheduler_cls = staticmethod(aphrodite_scheduler)


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 4,
 'num_gpu_blocks': 16,
 'num_cpu_blocks': 0,
 'max_num_seqs': 2,
 'max_num_batched_tokens': 64,
 'max_model_len': 64,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs',
 'num_speculative_tokens': 2}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0, 'id': 'A', 'prompt': [1, 2, 3, 4, 5], 'max_tokens': 8, 'priority': 0}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {0: {'A': {'accepted': 0, 'proposed': 2}}, 1: {'A': {'accepted': 0, 'proposed': 2, 'empty': True}}}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 40
PIPELINE_DEPTH = 0
PROPERTY = 'CHK-002'
STATEMENT = "A sequence's computed tokens never exceed its tokens, and after schedule() its computed tokens plus the tokens scheduled now, draft tokens aside, do not either."


# -- the property ---------------------------------------------------------------------------------
def check_after_schedule(step, engine, out, before, history) -> None:
    """CHK-002, where the engine's loop says what a step schedules against the computed tokens
    (``scheduled_lengths``: the pipelined vLLM loop): no step schedules past a request's tokens."""
    scheduled_lengths = getattr(engine, "scheduled_lengths", None)
    for rid, (tokens, computed, scheduled) in (scheduled_lengths(out) if scheduled_lengths else {}).items():
        history["exercised"] += 1
        if computed + scheduled > tokens:
            raise AssertionError(
                f"step {step}: schedule() gives request {rid} {scheduled} token(s) to compute while it has "
                f"{tokens} tokens, {computed} of them computed: it computes past its last token. "
                f"Expected: {STATEMENT}")


def check_after_update(step, engine, history) -> None:
    """CHK-002: once a step's outcome is processed, no request counts more computed tokens than it has."""
    for rid, (tokens, computed) in engine.lengths().items():
        history["exercised"] += 1
        if computed > tokens:
            raise AssertionError(
                f"step {step}: after update_from_output(), request {rid} has {tokens} tokens but "
                f"num_computed_tokens is {computed}. Expected: {STATEMENT}")


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
