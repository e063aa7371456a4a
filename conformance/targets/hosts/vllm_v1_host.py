"""kvsched adapter host for vLLM 0.33.0's V1 scheduler (vllm/v1/core/sched/scheduler.py) and its
KVCacheManager, on CPU: no model weights, no tokenizer, no workers.

Run with the target venv's Python (VLLM_TARGET_DEVICE=cpu):  python vllm_v1_host.py
``ModelConfig`` reads only ``$KVSCHED_TARGET_DIR/tiny-llama/config.json`` (written by
``kvsched targets install vllm-v1``).

The host plays the model runner: ``schedule()`` -> one sampled token per request whose prompt
is complete -> ``ModelRunnerOutput`` -> ``update_from_output()`` (which applies vLLM's own
``check_stop``). A request the trace stops samples a token in its ``stop_token_ids``.

Translations (documented in docs/CONFORMANCE.md):
* block 0 is V1's null block: the pool gets ``num_gpu_blocks + 1`` blocks and ids are reported
  minus one, so the spec's pool of ``num_gpu_blocks`` blocks is exactly V1's usable pool;
* V1 advances ``num_computed_tokens`` inside ``schedule()``; between ``schedule()`` and the
  outcome the snapshot reports the tokens computed *before* the step (the KV is written when
  the model runs);
* a prompt longer than ``max_model_len``, or of exactly ``max_model_len`` tokens (a generate
  request must leave room for one output token), is rejected by V1's input processor before it
  reaches the scheduler (vllm/v1/engine/input_processor.py: InputProcessor._validate_prompt_len,
  the ``prompt_len == max_prompt_len and runner_type == "generate"`` branch); the host refuses it
  at the door (``add_request`` answers FINISHED_IGNORED) as the engine's entry path does;
* chunked prefill (with ``long_prefill_token_threshold``) and prefix caching are passed to V1's
  SchedulerConfig / CacheConfig; ``max_num_partial_prefills`` is accepted and has no effect
  (V1's scheduler has no such limit). With prefix caching, each Request gets V1's own block
  hasher (``get_request_block_hasher``, as ``EngineCore`` builds it), so V1 hashes the trace's
  token ids: the prompt's ``prompt_tokens`` (else ``spec.types.default_prompt_tokens``) and the
  sampled tokens ``spec.types.generated_token`` (crc32, re-implemented here; kvsched is not
  importable in the target venv). A stop is the token ``STOP_TOKEN``, outside that vocabulary;
* a scheduled request is reported as a prefill until it samples a token after its (re)admission
  (the reference's flag), which holds also when a prefix hit leaves only its last token.

Speculative decoding (config ``num_speculative_tokens`` = k > 0; spec/speculative.py): V1 gets an
n-gram ``SpeculativeConfig`` (no draft model, no extra drafting slots: ``max_num_new_slots_for_
drafting`` 0), and the host plays the drafter and the rejection sampler from the trace's draft
decisions (``update(stopped, drafts)``):
* the wire output's ``drafts`` is ``len(scheduled_spec_decode_tokens[req])``, placeholders included
  (V1 pads a new decode from waiting with ``-1`` drafts, scheduler.py:1306-1330);
* the model accepts ``min(accepted, drafts scheduled, drafts really proposed)`` of them (a ``-1``
  placeholder is never a proposal) and samples j + 1 tokens, ``spec.types.generated_token`` by
  position, the stop token at the decision's ``stop_at`` when the trace stops it; an ``empty``
  decision returns no token (vllm-project/vllm#42722's output);
* after ``update_from_output`` the drafter proposes ``proposed`` (default k) drafts for every
  request that sampled and goes on, through ``update_draft_token_ids`` as ``EngineCore.post_step``
  does (vllm/v1/engine/core.py:703-706).
"""

from __future__ import annotations

import logging
import os
import sys
import zlib

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402
import vllm_budgets  # noqa: E402

logging.disable(logging.WARNING)

import torch  # noqa: E402
from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402

STOP_TOKEN = 1000  # outside the trace vocabulary (spec.types.VOCAB_SIZE = 50): only a trace stop samples it
VOCAB_SIZE = 50


def default_prompt_tokens(prompt_len: int) -> list[int]:
    """spec.types.default_prompt_tokens."""
    return [i % VOCAB_SIZE for i in range(prompt_len)]


def generated_token(request_id: str, position: int) -> int:
    """spec.types.generated_token for sequence 0."""
    return zlib.crc32(f"{request_id}#0@{position}".encode()) % VOCAB_SIZE
STATUS = {  # vLLM RequestStatus -> the protocol's status (shared with vllm_v1_async_host.py)
    RequestStatus.WAITING: "WAITING", RequestStatus.PREEMPTED: "WAITING", RequestStatus.RUNNING: "RUNNING",
    RequestStatus.FINISHED_STOPPED: "FINISHED_STOPPED", RequestStatus.FINISHED_LENGTH_CAPPED: "FINISHED_LENGTH_CAPPED",
    RequestStatus.FINISHED_ABORTED: "FINISHED_ABORTED", RequestStatus.FINISHED_IGNORED: "FINISHED_IGNORED",
    # a KV connector's (vllm_kv_connector.py, only with config kv_connector)
    RequestStatus.WAITING_FOR_REMOTE_KVS: "WAITING_FOR_REMOTE_KV", RequestStatus.FINISHED_ERROR: "FINISHED_ERROR",
    RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR: "WAITING_FOR_GRAMMAR",
}
if hasattr(RequestStatus, "WAITING_FOR_STREAMING_REQ"):  # a streaming session (vllm_budgets.py; vLLM 0.33.0)
    STATUS[RequestStatus.WAITING_FOR_STREAMING_REQ] = "WAITING_FOR_INPUT"


def model_dir() -> str:
    root = os.environ.get("KVSCHED_TARGET_DIR", os.path.dirname(os.path.abspath(__file__)))
    return os.path.join(root, "tiny-llama")


class V1Engine:
    # Hook points for a variant host (vllm_v1_async_host.py): the scheduler class and V1's
    # ``SchedulerConfig.async_scheduling`` flag (vllm/config/scheduler.py: get_scheduler_cls picks
    # AsyncScheduler when it is set).
    scheduler_cls: type = Scheduler
    async_scheduling: bool = False
    speculative = True  # update() takes the trace's draft decisions (kvsched_host.serve)
    spec_method = "ngram"  # a drafter without a model (vllm/config/speculative.py SpeculativeMethod)

    def __init__(self) -> None:
        self._model_configs: dict[int, ModelConfig] = {}

    def hello_extra(self) -> dict:
        import vllm

        return {"version": f"vllm=={vllm.__version__}", "source": os.path.dirname(vllm.__file__)}

    def reset(self, config: dict) -> None:
        if config.get("num_cpu_blocks", 0) and config.get("preemption_mode") == "swap":
            raise ValueError("vLLM V1 has no swap: preemption is recompute only")
        self.cfg = config
        chunked, caching = bool(config.get("enable_chunked_prefill")), bool(config.get("enable_prefix_caching"))
        mml, bs, G = config["max_model_len"], config["block_size"], config["num_gpu_blocks"]
        if G * bs < mml:  # vllm/v1/core/kv_cache_planning.py: check_enough_kv_cache_memory, at start-up
            raise ValueError(f"vLLM V1 refuses a KV cache of {G * bs} tokens for max_model_len {mml}")
        if mml not in self._model_configs:  # building a ModelConfig inspects the architecture: slow
            self._model_configs[mml] = ModelConfig(model=model_dir(), skip_tokenizer_init=True, max_model_len=mml,
                                                   dtype="float32", seed=0)
        sc = SchedulerConfig(max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["max_num_batched_tokens"],
                             max_model_len=mml, is_encoder_decoder=False, enable_chunked_prefill=chunked,
                             long_prefill_token_threshold=int(config.get("long_prefill_token_threshold", 0)),
                             async_scheduling=self.async_scheduling, policy=config["policy"],
                             watermark=v1_watermark(float(config["watermark"]), G))
        cc = CacheConfig(block_size=bs, enable_prefix_caching=caching)
        self.k = int(config.get("num_speculative_tokens", 0))
        spec = SpeculativeConfig(method=self.spec_method, num_speculative_tokens=self.k, prompt_lookup_max=self.k,
                                 prompt_lookup_min=1) if self.k else None
        kv = None
        if config.get("kv_connector"):  # a scripted KV connector (vllm_kv_connector.py), registered in vLLM's factory
            import vllm_kv_connector

            kv = vllm_kv_connector.transfer_config(config)
        vc = VllmConfig(model_config=self._model_configs[mml], scheduler_config=sc, cache_config=cc,
                        speculative_config=spec, kv_transfer_config=kv)
        # The CPU platform turns async scheduling off (vllm/platforms/cpu.py:346-348), which would
        # leave VllmConfig.max_concurrent_batches at 1 (config/vllm.py:588-598) while the host runs
        # the AsyncScheduler at depth 1 as a GPU engine does; max_in_flight_tokens (two batches,
        # config/vllm.py:600-609) sets a windowed group's admission cap (kv_cache_interface.py:864-945).
        vc.scheduler_config.async_scheduling = self.async_scheduling
        cc.num_gpu_blocks = G + 1
        kv = KVCacheConfig(num_blocks=G + 1, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
            ["layer0"], FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32))])
        self.hybrid = len(config.get("kv_groups") or ()) > 1  # KV cache groups (vllm_hybrid_groups.py)
        block_sizes = {"block_size": bs}
        if self.hybrid:
            import vllm_hybrid_groups

            cc.mamba_cache_mode = vllm_hybrid_groups.mamba_mode(config) or cc.mamba_cache_mode
            kv = vllm_hybrid_groups.kv_cache_config(config)
            block_sizes = vllm_hybrid_groups.scheduler_block_sizes(kv, vc)
        scheduler_cls = self.scheduler_cls
        if config.get("drop_eagle_block"):  # EAGLE's block drop without its drafter (vllm_hybrid_groups.py)
            import vllm_hybrid_groups

            scheduler_cls = vllm_hybrid_groups.with_eagle_block_drop(scheduler_cls, self.k)
        self.sched = scheduler_cls(vllm_config=vc, kv_cache_config=kv, structured_output_manager=vllm_budgets.scripted_structured_outputs(vc),
                               log_stats=False, **block_sizes)
        vllm_budgets.install(self.sched, config)  # the encoder budget and cache, the LoRA slots
        self.block_hasher = None
        if caching:  # as vllm/v1/engine/core.py: EngineCore.__init__ builds it
            hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.block_hasher = get_request_block_hasher(bs, hash_fn)
        self.decoding: set[str] = set()  # sampled a token since (re)admission
        self.reqs: dict[str, Request] = {}
        self.final: dict[str, str] = {}
        self.rejected: list[str] = []
        self.arrivals = 0
        self.step_no = 0
        self.pending = None
        self.kv = self.sched.connector  # the scripted KV connector, or None
        self.grammars: dict[str, int] = {}  # request -> the step its grammar is ready (vllm_budgets.py)
        self.sessions = vllm_budgets.SessionClient()  # the streaming sessions' later inputs (vllm_budgets.py)

    def add_request(self, request: dict) -> dict | None:
        rid = request["id"]
        if rid in self.reqs or rid in self.final:
            raise ValueError(f"duplicate request id {rid!r}")
        if request.get("n", 1) != 1:
            raise ValueError("V1's scheduler has no parallel sampling: the engine splits n > 1 into separate requests")
        if request["prompt_len"] >= self.cfg["max_model_len"]:
            # vllm/v1/engine/input_processor.py: InputProcessor._validate_prompt_len raises before the
            # scheduler for a prompt over max_model_len, and for a generate prompt of exactly
            # max_model_len (no room for one output token): refused at the door.
            self.final[rid] = "FINISHED_IGNORED"
            return {"request": rid, "status": "FINISHED_IGNORED"}
        sp = SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True, stop_token_ids=[STOP_TOKEN],
                            **vllm_budgets.structured_outputs(request))
        tokens = request.get("prompt_tokens") or default_prompt_tokens(request["prompt_len"])
        if self.kv is not None and request.get("kv") is not None:  # its KV connector script (spec/connector.py)
            self.kv.scripts[rid] = dict(request["kv"])
        r = Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp, pooling_params=None,
                    arrival_time=float(self.arrivals), priority=request.get("priority", 0),
                    block_hasher=self.block_hasher, **vllm_budgets.request_extras(request),
                    **vllm_budgets.session_extras(request))
        self.arrivals += 1
        self.sessions.add(request)
        self.reqs[rid] = r
        if request.get("grammar_ready_step") is not None:
            self.grammars[rid] = int(request["grammar_ready_step"])
        self.sched.add_request(r)

    def abort_request(self, request_id: str):
        r = self.reqs.get(request_id)
        if r is None or r.is_finished():
            return None
        self.sched.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        self.final[request_id] = "FINISHED_ABORTED"
        return {"request": request_id, "status": "FINISHED_ABORTED"}

    def abort_requests(self, request_ids: list) -> list:
        """One batched abort, as EngineCore.abort_requests passes a client's list to
        Scheduler.finish_requests (vllm/v1/engine/core.py:564-569), which skips unknown and finished
        ids; the requests it aborted, as it returns them."""
        done = self.sched.finish_requests(list(request_ids), RequestStatus.FINISHED_ABORTED)
        for r in done:
            self.final[r.request_id] = "FINISHED_ABORTED"
        return [{"request": r.request_id, "status": "FINISHED_ABORTED"} for r in done]

    def reset_prefix_cache(self) -> bool:
        """EngineCore.reset_prefix_cache -> Scheduler.reset_prefix_cache() with its defaults (no
        reset_running_requests, no connector): refuses while blocks are in use."""
        return bool(self.sched.reset_prefix_cache())

    # Pause and resume (vllm_budgets.py): Scheduler.set_pause_state, as EngineCore.pause_scheduler calls it.
    def pause_new(self) -> bool:
        return vllm_budgets.set_pause(self.sched, "pause_new")

    def pause_all(self) -> bool:
        return vllm_budgets.set_pause(self.sched, "pause_all")

    def resume(self) -> bool:
        return vllm_budgets.set_pause(self.sched, "resume")

    def schedule(self) -> dict:
        if self.kv is not None:
            self.kv.step, self.kv.reported = self.step_no, {}
        self.clients_before_schedule(self.step_no)
        out = self.sched.schedule()
        self.decoding -= set(out.preempted_req_ids or ())
        spec = out.scheduled_spec_decode_tokens
        scheduled = [{"seq": f"{rid}#0", "request": rid, "tokens": n, "prefill": rid not in self.decoding,
                      **({"drafts": len(spec[rid])} if spec.get(rid) else {})}
                     for rid, n in out.num_scheduled_tokens.items()]
        ignored, self.rejected = self.rejected, []
        self.pending = (out, ignored)
        result = {"step": self.step_no, "scheduled": scheduled,
                  "preempted": [{"request": rid, "mode": "recompute"} for rid in sorted(out.preempted_req_ids or ())],
                  "swapped_in": [], "swap_out": [], "swap_in": [], "copies": [], "ignored": ignored}
        encoder = vllm_budgets.encoder_inputs_of(out)
        if encoder:
            result["encoder_inputs"] = encoder
        self.step_no += 1
        if self.kv is not None:
            self.kv.next_step = self.step_no
        return result

    def update(self, stopped: list, drafts: dict | None = None) -> list:
        if self.pending is None:
            return []
        out, ignored = self.pending
        self.pending = None
        finished = [{"request": rid, "status": "FINISHED_IGNORED"} for rid in ignored]
        stop = set(stopped)
        drafts = drafts or {}
        req_ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            r = self.reqs[rid]
            if r.num_computed_tokens >= r.num_tokens:  # prompt complete: tokens sampled
                spec = out.scheduled_spec_decode_tokens.get(rid, ())
                valid = next((i for i, t in enumerate(spec) if t < 0), len(spec))  # -1: a placeholder, never proposed
                sampled.append(self.sample(rid, r.num_tokens, len(spec), valid, f"{rid}#0" in stop,
                                           drafts.get(f"{rid}#0", {})))
                self.decoding.add(rid)
            else:
                sampled.append([])
        mro = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled)
        grown = {rid: self.reqs[rid].num_tokens for rid in req_ids}
        ran = req_ids  # the requests of this step's batch, in the order of `sampled`
        if self.kv is not None:  # the workers' transfer reports for this step (vllm_kv_connector.py)
            self.kv.ran.update(req_ids)
            mro.kv_connector_output = self.kv.report(self.step_no - 1)
        self.sched.update_from_output(out, mro)
        if self.kv is not None:
            # a request whose KV load failed sampled nothing (vLLM skips it): still a prefill
            self.decoding -= {rid for rid in req_ids if self.reqs[rid].num_tokens == grown[rid]}
            req_ids = list(dict.fromkeys([*req_ids, *self.reqs]))  # FINISHED_ERROR reaches unscheduled ones too
        if self.k:  # the drafter proposes for every request that sampled (EngineCore.post_step)
            proposing = [(rid, toks) for rid, toks in zip(ran, sampled, strict=True) if toks and not self.reqs[rid].is_finished()]
            proposals = [self.propose(rid, drafts.get(f"{rid}#0", {})) for rid, _ in proposing]
            self.sched.update_draft_token_ids(DraftTokenIds([rid for rid, _ in proposing], proposals))
        self.relabel_resumed_sessions(ran)
        for rid in req_ids:
            r = self.reqs[rid]
            if r.is_finished() and rid not in self.final:
                self.final[rid] = STATUS.get(r.status, r.status.name)
                finished.append({"request": rid, "status": self.final[rid]})
        return finished

    def clients_before_schedule(self, step: int) -> None:
        """What the engine's clients do before ``step``'s schedule(): the grammar compiler's futures
        that are done, and the streaming sessions' inputs due."""
        for rid, ready in list(self.grammars.items()):
            if ready <= step:
                vllm_budgets.grammar_ready(self.reqs[rid])
                del self.grammars[rid]
        if self.sessions.pending:
            self.sessions.send_due(self.sched, step, self._session_input)

    def relabel_resumed_sessions(self, ran) -> None:  # type: ignore[no-untyped-def]
        """A streaming session of ``ran`` that stopped and goes on is a prefill again once admitted."""
        for rid in ran:
            r = self.reqs[rid]
            if getattr(r, "resumable", False) and not r.is_finished() and r.status != RequestStatus.RUNNING:
                self.decoding.discard(rid)

    def _session_input(self, rid: str, tokens: list, max_tokens: int, resumable: bool, extras: dict) -> Request:
        """A session's next input (or, not resumable, its end) as the client sends it; ``extras``: its
        encoder inputs (`vllm_budgets.request_extras`)."""
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=[STOP_TOKEN])
        update = Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp, pooling_params=None,
                         arrival_time=float(self.arrivals), block_hasher=self.block_hasher, resumable=resumable,
                         **extras)
        self.arrivals += 1
        return update

    def sample(self, rid: str, position: int, num_drafts: int, valid: int, stopped: bool, decision: dict) -> list:
        """The rejection sampler: the accepted drafts and the bonus, by position from ``position``;
        the stop token where the trace puts it; nothing for an ``empty`` decision."""
        if decision.get("empty"):
            return []
        accepted = min(int(decision.get("accepted", 0)), num_drafts, valid)
        tokens = [generated_token(rid, position + i) for i in range(accepted + 1)]
        if stopped:
            at = decision.get("stop_at")
            tokens[accepted if at is None else min(int(at), accepted)] = STOP_TOKEN
        return tokens

    def propose(self, rid: str, decision: dict) -> list:
        """The drafter's proposal after this step: ``proposed`` (default k) draft ids. Their values
        do not matter to the scheduler; the rejection sampler above decides acceptance."""
        count = self.k if decision.get("proposed") is None else min(int(decision["proposed"]), self.k)
        position = self.reqs[rid].num_tokens
        return [generated_token(rid, position + i) for i in range(count)]

    def snapshot(self) -> dict:
        sched = self.sched
        kvm = sched.kv_cache_manager
        pool = kvm.block_pool
        tables = kvm.coordinator.single_type_managers[0].req_to_blocks
        mid = {}
        if self.pending is not None:
            mid = dict(self.pending[0].num_scheduled_tokens)
        statuses, views = {}, {}
        for rid in self.final:
            if rid not in self.reqs:
                statuses[rid] = self.final[rid]
        for rid, r in self.reqs.items():
            status = self.final.get(rid) or STATUS.get(r.status, r.status.name)
            statuses[rid] = status
            blocks = [b.block_id - 1 for b in tables.get(rid, ()) if not b.is_null] if not r.is_finished() else []
            views[f"{rid}#0"] = {"request": rid, "status": status, "num_tokens": r.num_tokens,
                                 "num_computed": r.num_computed_tokens - mid.get(rid, 0),
                                 "blocks": blocks, "device": "gpu" if blocks else None}
        G = self.cfg["num_gpu_blocks"]
        snap = {
            "statuses": statuses, "seqs": views,
            # vLLM serves kv_holding_waiting first (scheduler.py:1063-1068): a streaming session's KV
            "waiting": [r.request_id for r in getattr(sched, "kv_holding_waiting", ())] +
                       [r.request_id for r in sched.waiting],
            "running": [r.request_id for r in sched.running],
            "swapped": [],
            "gpu_ref_counts": [pool.blocks[i].ref_cnt for i in range(1, G + 1)],
            "cpu_ref_counts": [0] * self.cfg.get("num_cpu_blocks", 0),
            "gpu_free": pool.get_num_free_blocks(),
            "cpu_free": self.cfg.get("num_cpu_blocks", 0),
            "gpu_free_ids": [b.block_id - 1 for b in pool.free_block_queue.get_all_free_blocks()],
            # a block cached under a hash holds the content the hash names (COW-001 lets such a block be
            # shared while it is written in the step that cached it); V1's hash, not the reference's key
            "gpu_block_keys": [None if pool.blocks[i].block_hash is None else bytes(pool.blocks[i].block_hash).hex()
                               for i in range(1, G + 1)],
            "cpu_free_ids": list(range(self.cfg.get("num_cpu_blocks", 0))),
            **({"group_tables": {"version": 1, "seqs": self._group_tables()}} if self.hybrid else {}),
            **vllm_budgets.snapshot_parts(sched),
        }
        if self.kv is not None:
            import vllm_kv_connector

            vllm_kv_connector.snapshot_parts(sched, snap, tables)
        return snap

    def transfers_in_flight(self) -> bool:
        """A KV connector's transfer still holds blocks (kvsched_host's steps loop runs on until it reports)."""
        return bool(self.kv is not None and self.kv.transfers)

    def _group_tables(self) -> dict:
        import vllm_hybrid_groups

        live = {rid: r for rid, r in self.reqs.items() if not r.is_finished()}
        return vllm_hybrid_groups.group_tables(self.sched, self.cfg, live)


def v1_watermark(watermark: float, num_gpu_blocks: int) -> float:
    """The fraction to give V1 so that its ``watermark_blocks = int(watermark * num_blocks)``
    (kv_cache_manager.py:210), over the ``num_gpu_blocks + 1`` blocks the host passes (block 0 is
    V1's null block), is the spec's ``int(watermark * num_gpu_blocks)``: 0.1 of 9 blocks is 0 spec
    blocks, but 0.1 of V1's 10 would be 1."""
    blocks = int(watermark * num_gpu_blocks)
    return (blocks + 0.5) / (num_gpu_blocks + 1) if blocks else 0.0


CAPABILITIES = ["output", "statuses", "queues", "block_tables", "ref_counts", "free_counts", "free_lists",
                "seq_lengths", "computed_tokens", "mid_step", "kv_transfers"]  # kv_transfers: with a KV connector
# The synchronous host's own: encoder inputs, LoRA slots and pause (vllm_budgets.py). Not in
# CAPABILITIES, which the async host shares: its reference has not been checked against them.
BUDGET_CAPABILITIES = ["encoder", "lora", "pause", "grammar", "streaming"]

if __name__ == "__main__":
    sys.exit(kvsched_host.serve(V1Engine(), "vllm-v1", ("safety",), [*CAPABILITIES, *BUDGET_CAPABILITIES]))
