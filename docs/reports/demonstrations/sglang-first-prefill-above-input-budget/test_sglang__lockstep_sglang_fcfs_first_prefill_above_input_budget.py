"""Reproducer: BUD-001 on sglang.

Standalone: it imports the engine, never kvsched. Exported by `kvsched export
docs/traces/lockstep-sglang/fcfs-first-prefill-above-input-budget.json --to pytest --target sglang
--property BUD-001` from kvsched's shrunk trace, for sglang==0.5.23 (the installed sglang with torch
and transformers; no model, no GPU).

    python THIS_FILE            # exit 1 and one FAILED line when the property breaks
                                # (exit 2 and one ERROR line if the engine raises first)
    python -m pytest THIS_FILE

How: SGLang's scheduling parts built on CPU as its unit tests build them (PrefillAdder over a
RadixCache, ReqToTokenPool and TokenToKVPoolAllocator, as
test/registered/unit/managers/test_prefill_adder.py does), with the Scheduler's event-loop glue
(get_next_batch_to_run, update_running_batch, the batch result processor) replayed from
managers/scheduler.py; the trace's steps are replayed as kvsched's driver runs them (arrivals,
aborts, schedule(), the model's outcome), the model played here.

Asserts BUD-001: The tokens scheduled in one step never exceed max_num_batched_tokens.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import traceback
import types
from array import array
from importlib.metadata import version
from types import SimpleNamespace


class _Placeholder:
    """Stands for any torchvision object: multimodal helpers import torchvision at module level,
    and the scheduler's paths never use it (its only wheel pulls a CUDA torch)."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name: str):
        return _Placeholder()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []


def load_sglang() -> str:
    """SGLang's scheduler modules without running ``sglang/__init__.py`` (it patches Hugging Face
    and imports the whole ``sglang.lang`` frontend): a stub parent package with the real
    ``__path__``, so the submodules import from the installed files; torchvision answered by
    inert placeholders, after transformers has cached that it is not installed. Returns the
    package folder."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        raise SystemExit(f"sglang is not installed for {sys.executable}")
    parent = types.ModuleType("sglang")
    parent.__path__ = [os.path.dirname(spec.origin)]
    parent.__file__ = spec.origin
    sys.modules["sglang"] = parent
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    import_utils.is_torchvision_greater_or_equal("0.27")
    sys.meta_path.insert(0, _TorchvisionStub())
    return os.path.dirname(spec.origin)


PACKAGE_DIR = load_sglang()
import torch  # noqa: E402
from sglang.srt import runtime_context  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

ENGINE = f"sglang {version('sglang')} from {PACKAGE_DIR}"
EOS = 2  # a request the trace stops samples this id (its only EOS id)
# ServerArgs reads the model's config.json only: a two-layer Llama, no weights, no tokenizer.
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2,
              "vocab_size": 1024, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "torch_dtype": "float32",
              "bos_token_id": 1, "eos_token_id": 2}
MODEL_CONFIG = SimpleNamespace(vocab_size=2**31 - 1, is_encoder_decoder=False, hf_text_config=SimpleNamespace(),
                               is_multimodal=False)


def token_id(request_id: str, position: int) -> int:
    """The id at ``position`` of a request's sequence (prompt ids and "sampled" ids alike): a fixed
    function of the request, distinct per request and never 0..15."""
    base = 16 + (sum((i + 1) * ord(c) for i, c in enumerate(request_id)) * 7919) % 100_000
    return base + (position * 104_729) % 900_000


def publish_server_args() -> None:
    """As SGLang's unit tests set the scheduler's global ServerArgs (a dummy model, page size 1, CPU)."""
    path = tempfile.mkdtemp(prefix="tiny-llama-")
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(TINY_LLAMA, f)
    runtime_context.publish(ServerArgs(model_path=path, device="cpu", page_size=1, skip_tokenizer_init=True),
                            role="scheduler")


class Engine:
    """SGLang's Scheduler event loop around its real parts, with the model played here.

    Real and unmodified: ``SchedulePolicy`` (fcfs or lpm), ``PrefillAdder``, ``Req``,
    ``ScheduleBatch`` (``init_new``, ``prepare_for_extend``, ``filter_batch``, ``merge_batch``,
    ``check_decode_mem``, ``retract_decode``, ``prepare_for_decode``), ``RadixCache``,
    ``ReqToTokenPool``, ``TokenToKVPoolAllocator`` (page size 1) and ``NewTokenRatioTracker``, built
    on CPU as SGLang's unit tests build them (test/registered/unit/managers/test_prefill_adder.py
    builds the PrefillAdder with these arguments). ``Scheduler`` itself cannot be built without a TP
    worker and a model, so its glue is replayed from managers/scheduler.py:
    ``get_next_batch_to_run`` (3894-4035: merge the last extend batch into the running batch, try a
    prefill batch, else decode), ``_get_new_batch_prefill_raw`` (4079-4457, no LoRA, HiCache or
    priority preemption), ``update_running_batch`` (4459-4545: retract on KV exhaustion) and the
    batch-result processing (batch_result_processor.py: append the token, ``update_finish_state``,
    ``release_kv_cache`` or ``checkpoint_kv_cache``). The door is ``handle_generate_request``'s
    (scheduler.py:2700-2716, utils.py:259-289) with ``max_req_len = min(max_model_len + 1,
    num_gpu_blocks - 1)`` (tp_worker.py:568-572 with a context length of max_model_len + 2)."""

    SCHEDULE_CALL, UPDATE_CALL = "Scheduler.get_next_batch_to_run()", "process_batch_result()"

    def __init__(self, config: dict) -> None:
        if config["block_size"] != 1 or config.get("num_cpu_blocks") or config["preemption_mode"] != "recompute":
            raise SystemExit("the SGLang reproducer replays page size 1, recompute and no CPU pool only")
        publish_server_args()
        self.config = config
        self.max_running = config["max_num_seqs"]
        self.chunk_size = config["max_num_batched_tokens"] if config.get("enable_chunked_prefill") else None
        self.chunked_req = None
        self.max_req_len = min(config["max_model_len"] + 1, config["num_gpu_blocks"] - 1)
        self.max_req_input_len = self.max_req_len - 5
        self.req_pool = ReqToTokenPool(size=self.max_running, max_context_len=config["max_model_len"] + 4,
                                       device="cpu", enable_memory_saver=False)
        self.alloc = TokenToKVPoolAllocator(size=config["num_gpu_blocks"], dtype=torch.float16, device="cpu",
                                            kvcache=SimpleNamespace(), need_sort=False)
        self.cache = RadixCache(CacheInitParams(disable=False, req_to_token_pool=self.req_pool,
                                                token_to_kv_pool_allocator=self.alloc, page_size=1))
        self.policy = SchedulePolicy(config["policy"], self.cache, False, False, False)
        self.ratio = NewTokenRatioTracker.from_config()
        self.waiting: list = []
        self.running = ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch = None
        self.reqs: dict = {}  # request id -> Req
        self.final: dict = {}  # request id -> how it finished
        self.refused: set = set()
        self.pending = None  # (batch, is_prefill) between the schedule and its result

    def add(self, spec: dict) -> None:
        params = SamplingParams(max_new_tokens=spec["max_tokens"])
        params.normalize(None)
        req = Req(spec["id"], "", array("q", spec["prompt"]), params, eos_token_ids={EOS})
        if len(spec["prompt"]) >= self.max_req_input_len:  # validate_input_length (managers/utils.py:272)
            self.refused.add(spec["id"])
            return
        params.max_new_tokens = max(0, min(params.max_new_tokens, self.max_req_len - len(spec["prompt"]) - 1))
        self.reqs[spec["id"]] = req
        self.waiting.append(req)

    def abort(self, request_ids: list) -> None:
        raise NotImplementedError("the SGLang reproducer replays no abort")

    def allocatable(self, running_bs: int, held_rows: int = 0) -> int:
        """Scheduler.get_num_allocatable_reqs (scheduler.py:4027-4050)."""
        return min(self.max_running - running_bs, self.req_pool.available_size() + held_rows)

    def new_prefill_batch(self):
        running = self.running
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        if self.allocatable(len(running.reqs)) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting, running)
        adder = PrefillAdder(page_size=1, tree_cache=self.cache, token_to_kv_pool_allocator=self.alloc,
                             running_batch=running, new_token_ratio=self.ratio.current,
                             rem_input_tokens=self.config["max_num_batched_tokens"], rem_chunk_tokens=self.chunk_size,
                             num_mixed_decode_tokens=0, max_running_requests=self.max_running)
        if self.chunked_req is not None:  # scheduler.py:4176-4184: the chunked request's next chunk first
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == AddReqResult.OTHER:
                break
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self.allocatable(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if res != AddReqResult.CONTINUE:
                if res == AddReqResult.NO_TOKEN:
                    running.batch_is_full = len(adder.can_run_list) > 0 or not running.is_empty()
                break
        if not adder.can_run_list:
            return None
        chosen = set(adder.can_run_list)
        self.waiting = [r for r in self.waiting if r not in chosen]
        if adder.new_chunked_req is not None:  # scheduler.py:4324-4330
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = ScheduleBatch.init_new(adder.can_run_list, self.req_pool, self.alloc, self.cache, MODEL_CONFIG,
                                       False, SpeculativeAlgorithm.NONE, chunked_req=self.chunked_req)
        batch.prepare_for_extend()
        return batch

    def decode_batch(self, retracted_ids: list):
        """Scheduler.update_running_batch (scheduler.py:4459-4545)."""
        batch = self.running
        initial = batch.batch_size()
        batch.filter_batch()
        if batch.is_empty():
            batch.batch_is_full = False
            return None
        if not batch.check_decode_mem():
            retracted, ratio, aborted = batch.retract_decode()
            if aborted:
                raise RuntimeError(f"retract_decode aborted {[r.rid for r in aborted]}")
            self.ratio.current = ratio
            for req in retracted:
                retracted_ids.append(req.rid)
                self.waiting.append(req)
        else:
            self.ratio.decay_step()
        if batch.batch_size() < initial:
            batch.batch_is_full = False
        if batch.is_empty():
            return None
        batch.prepare_for_decode()
        return batch

    def schedule(self) -> dict:
        """Scheduler.get_next_batch_to_run (scheduler.py:3894-4035), the no-feature path."""
        last, exclude = self.last_batch, []
        if self.chunked_req is not None:  # scheduler.py:3911-3919: keep it out of the merge, stash its chunk
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                checkpoint_kv_cache(self.chunked_req, self.cache)
        if last is not None and last.forward_mode.is_extend():
            bs = last.batch_size()
            last.filter_batch(reqs_to_exclude=exclude)
            if last.batch_size() < bs:
                self.running.batch_is_full = False
            if not last.is_empty():
                if self.running.is_empty():
                    self.running = last
                else:
                    self.running.merge_batch(last)
        bs = self.running.batch_size()
        self.running.filter_batch()
        if self.running.batch_size() < bs:
            self.running.batch_is_full = False
        retracted: list = []
        batch = self.new_prefill_batch()
        prefill = batch is not None
        if batch is None and not self.running.is_empty():
            batch = self.decode_batch(retracted)
        self.last_batch = batch
        self.pending = (batch, prefill) if batch is not None else None
        tokens = {req.rid: (req.extend_len if prefill else 1) for req in batch.reqs} if batch is not None else {}
        return {"tokens": tokens, "retracted": retracted}

    def update(self, stopped, drafts: dict) -> set:
        """BatchResultProcessor.process_batch_result_prefill / _decode: one token per request."""
        if self.pending is not None:
            batch, prefill = self.pending
            self.pending = None
            for req in batch.reqs:
                if req.finished() or req.is_retracted:
                    continue
                if req.inflight_middle_chunks > 0:  # batch_result_processor.py:424-432: a middle chunk samples nothing
                    req.inflight_middle_chunks -= 1
                    continue
                position = len(req.origin_input_ids) + len(req.output_ids)
                token = EOS if req.rid in stopped else token_id(req.rid, position)
                req.output_ids.append(token)
                req.update_finish_state()
                if req.finished():
                    release_kv_cache(req, self.cache, checkpoint=True)
                    self.final[req.rid] = "FINISHED_STOPPED" if token == EOS else "FINISHED_LENGTH_CAPPED"
                elif prefill:
                    checkpoint_kv_cache(req, self.cache)
        return set(self.final) | self.refused

    # -- what the checks read ------------------------------------------------------------------
    def running_ids(self) -> set:
        ids = {r.rid for r in self.running.reqs if not r.finished()}
        if self.last_batch is not None:
            ids |= {r.rid for r in self.last_batch.reqs if not r.finished() and not r.is_retracted}
        return ids

    def queued(self) -> dict:
        running = self.running_ids()
        return {"waiting": [r.rid for r in self.waiting],
                "running": [rid for rid in self.reqs if rid in running and rid not in self.final]}

    def scheduled_anything(self, out) -> bool:
        return bool(out["tokens"] or out["retracted"])

    def scheduled_ids(self, out) -> list:
        return list(out["tokens"])

    def scheduled_tokens(self, out) -> dict:
        return dict(out["tokens"])

    def lengths(self) -> dict:
        """Per request, finished ones too: (tokens, committed KV tokens while it runs, else 0)."""
        running = self.running_ids()
        return {rid: (len(r.origin_input_ids) + len(r.output_ids),
                      int(r.kv.kv_committed_len) if rid in running and rid not in self.final else 0)
                for rid, r in self.reqs.items()}

    def status(self, rid: str) -> str:
        if rid in self.final:
            return self.final[rid]
        return "RUNNING" if rid in self.running_ids() else "WAITING"


# -- the trace (kvsched's shrunk counterexample, as plain data) ------------------------------------
CONFIG = {'block_size': 1,
 'num_gpu_blocks': 9,
 'num_cpu_blocks': 0,
 'max_num_seqs': 1,
 'max_num_batched_tokens': 1,
 'max_model_len': 7,
 'watermark': 0.0,
 'preemption_mode': 'recompute',
 'policy': 'fcfs',
 'enable_prefix_caching': True}
# arrival step, request id, prompt token ids, max_tokens, priority
REQUESTS = [{'step': 0, 'id': 'r8', 'prompt': [4, 4], 'max_tokens': 1, 'priority': 0}]
ABORTS = {}  # step -> request ids aborted before that step's schedule()
STOPS = {}  # step -> request ids whose sampled token that step is a stop token
DRAFTS = {}  # step -> request id -> the drafter's and rejection sampler's decision
MAX_STEPS = 1
PIPELINE_DEPTH = 0
PROPERTY = 'BUD-001'
STATEMENT = 'The tokens scheduled in one step never exceed max_num_batched_tokens.'


# -- the property ---------------------------------------------------------------------------------
def check_after_schedule(step, engine, out, before, history) -> None:
    """BUD-001: the tokens one schedule() call schedules are at most max_num_batched_tokens."""
    tokens = engine.scheduled_tokens(out)
    history["exercised"] += bool(tokens)
    if sum(tokens.values()) > CONFIG["max_num_batched_tokens"]:
        raise AssertionError(
            f"step {step}: schedule() scheduled {sum(tokens.values())} tokens (per request: {tokens}) with "
            f"max_num_batched_tokens={CONFIG['max_num_batched_tokens']}. Expected: {STATEMENT}")


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
