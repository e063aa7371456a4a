"""kvsched adapter host for SGLang 0.5.23's scheduler (run with the ``sglang`` target venv's Python).

What runs unmodified: ``SchedulePolicy.calc_priority`` (fcfs or lpm), ``PrefillAdder`` (admission against
the new-token ratio and the radix cache's evictable size), ``Req.init_next_round_input`` (radix
match), ``ScheduleBatch.init_new`` / ``prepare_for_extend`` / ``filter_batch`` / ``merge_batch`` /
``check_decode_mem`` / ``retract_decode`` / ``prepare_for_decode``, ``Req.update_finish_state``,
``mem_cache.common.release_kv_cache`` / ``checkpoint_kv_cache``, ``RadixCache``,
``ReqToTokenPool``, ``TokenToKVPoolAllocator`` (page size 1) and ``NewTokenRatioTracker``.

Glue replayed here, because ``Scheduler.__init__`` builds a TP worker (a model) and the glue
lives on the Scheduler object:

* ``Scheduler.get_next_batch_to_run`` (managers/scheduler.py:3894-4035), the no-feature path:
  filter the last extend batch and merge it into the running batch, filter the running batch,
  try a new prefill batch, else decode the running batch.
* ``Scheduler._get_new_batch_prefill_raw`` (scheduler.py:4079-4457), without HiCache,
  mamba, mixed chunks or priority preemption; with LoRA when the config has ``max_loras``
  (`sglang_lora`: SGLang's own ``can_schedule_lora_req`` and ``LoRAManager``, no adapter weights;
  ``max_loras_per_batch`` is ``max_loras``); with chunked prefill when the config asks for it
  (``chunked_prefill_size`` and ``max_prefill_tokens`` are both the spec's token budget): the
  chunked request is stashed into the radix cache and kept out of the running batch between its
  chunks (scheduler.py:3911-3919), its next chunk goes first (4176-4184); ``get_num_allocatable_reqs``
  (scheduler.py:4027-4050) as ``min(max_running_requests - running, free req rows + rows held by the
  requests counted)``.
* ``Scheduler.update_running_batch`` (scheduler.py:4459-4545): retract on KV exhaustion, the
  new-token ratio after retraction, decay otherwise, retracted requests back to the waiting queue.
* ``BatchResultProcessor.process_batch_result_prefill`` / ``_decode`` (scheduler_components/
  batch_result_processor.py:258-420, 952-1110, 1377-1460): append the sampled token,
  ``update_finish_state``, then ``release_kv_cache`` (finished) or ``checkpoint_kv_cache``
  (an unfinished request after its prefill).
* ``Scheduler.handle_generate_request`` (scheduler.py:2700-2716, utils.py:259-289): a prompt
  at or over ``max_req_input_len`` is refused; ``max_new_tokens`` is clipped to
  ``max_req_len - input_len - 1``. The TP worker derives ``max_req_len`` from the model's context
  length and the KV pool (tp_worker.py:568-572); here the context length is ``max_model_len + 2``,
  so ``max_req_len = min(max_model_len + 1, num_gpu_blocks - 1)`` and ``max_req_input_len =
  max_req_len - 5``: SGLang's own limits, stricter than the spec's on small pools.

Observations SGLang has: per-request KV slot ids (``req_to_token`` rows; page size 1, so one
slot per token and the spec's blocks are slots shifted by one: SGLang's slot 0 is the padding
slot, never allocated), the allocator's free list, the radix cache's evictable and protected
sizes (sent as ``sglang_evictable`` / ``sglang_protected``, informational), and the committed KV
length of a running request (``req.kv.kv_committed_len``, as ``num_computed``; 0 while waiting).
With LoRA, the adapter pool's slots by slot (``sglang_lora_slots``) and the batches
``fetch_new_loras`` refused (``sglang_lora_overflows``), both informational. Ref counts are not
sent: a slot in the radix tree has no per-slot count (its node has a lock count), and a slot a
finished request left in the tree is neither free nor held by a request.
"""

from __future__ import annotations

import os
import sys
from array import array
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402
import sglang_lora  # noqa: E402
import sglang_stubs  # noqa: E402

EOS = 2


class SglangEngine:
    def __init__(self, lora_counterfactual: str | None = None) -> None:
        self.lora_counterfactual = lora_counterfactual  # sglang_lora.COUNTERFACTUALS; None: SGLang as released
        sglang_stubs.load()
        import torch
        from sglang.srt import runtime_context
        from sglang.srt.managers import schedule_batch, schedule_policy
        from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
        from sglang.srt.mem_cache import common
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        model = os.path.join(os.environ.get("KVSCHED_TARGET_DIR", "."), "tiny-llama")
        runtime_context.publish(ServerArgs(model_path=model, device="cpu", page_size=1, skip_tokenizer_init=True),
                                role="scheduler")
        self.torch, self.sb, self.sp, self.common = torch, schedule_batch, schedule_policy, common
        self.Allocator, self.CacheInitParams, self.ReqToTokenPool = TokenToKVPoolAllocator, CacheInitParams, ReqToTokenPool
        self.RadixCache, self.SamplingParams, self.Tracker = RadixCache, SamplingParams, NewTokenRatioTracker
        self.spec_none = SpeculativeAlgorithm.NONE
        self.model_config = SimpleNamespace(vocab_size=2**31 - 1, is_encoder_decoder=False,
                                            hf_text_config=SimpleNamespace(), is_multimodal=False)

    def hello_extra(self) -> dict:
        from importlib.metadata import version

        return {"version": f"sglang=={version('sglang')}", "source": os.path.dirname(sys.modules["sglang"].__file__)}

    def reset(self, config: dict) -> None:
        for key, ok in (("block_size", config["block_size"] == 1), ("num_cpu_blocks", not config.get("num_cpu_blocks")),
                        ("preemption_mode", config["preemption_mode"] == "recompute"),
                        ("policy", config["policy"] in ("fcfs", "lpm"))):
            if not ok:
                raise ValueError(f"config.{key}: SGLang host supports page size 1, recompute, fcfs or lpm, "
                                 f"no CPU pool; got {config[key]!r}")
        self.config = config
        self.max_running = config["max_num_seqs"]
        # chunked_prefill_size and max_prefill_tokens: both the spec's token budget
        self.chunk_size = config["max_num_batched_tokens"] if config.get("enable_chunked_prefill") else None
        self.chunked_req = None
        # tp_worker.py:568-572: max_req_len = min(context_len - 1, kv_capacity - 1), input limit 5 below;
        # context_len is max_model_len + 2 here, so with a large pool the spec's length cap holds.
        self.max_req_len = min(config["max_model_len"] + 1, config["num_gpu_blocks"] - 1)
        if self.max_req_len <= 0:  # tp_worker.py:425
            raise ValueError("config.num_gpu_blocks: SGLang asserts 'Memory pool size is too small' below 2 slots")
        self.max_req_input_len = self.max_req_len - 5
        self.req_pool = self.ReqToTokenPool(size=self.max_running, max_context_len=config["max_model_len"] + 4,
                                            device="cpu", enable_memory_saver=False)
        self.alloc = self.Allocator(size=config["num_gpu_blocks"], dtype=self.torch.float16, device="cpu",
                                    kvcache=SimpleNamespace(), need_sort=False)
        self.cache = self.RadixCache(self.CacheInitParams(disable=False, req_to_token_pool=self.req_pool,
                                                          token_to_kv_pool_allocator=self.alloc, page_size=1))
        self.policy = self.sp.SchedulePolicy(config["policy"], self.cache, False, False, False)
        self.ratio = self.Tracker.from_config()
        self.waiting: list = []
        self.running = self.sb.ScheduleBatch(reqs=[], batch_is_full=False)
        self.last_batch = None
        self.reqs: dict = {}  # rid -> Req
        self.final: dict = {}  # rid -> status
        self.ignored: list = []  # refused at the door, reported by the next schedule
        self.just_ignored: list = []
        self.pending = None  # (batch, is_prefill) between schedule and update
        self.step_no = 0
        self.lora = sglang_lora.LoraSlots(config["max_loras"], self.lora_counterfactual) \
            if config.get("max_loras") else None

    # ------------------------------------------------------------------ requests
    def add_request(self, request: dict) -> None:
        rid = request["id"]
        if request.get("n", 1) != 1:
            raise ValueError("request.n: the SGLang host has no parallel sampling (n must be 1)")
        if rid in self.reqs:
            raise ValueError(f"duplicate request id {rid!r}")
        tokens = request.get("prompt_tokens") or kvsched_host.token_ids(rid, request["prompt_len"])
        params = self.SamplingParams(max_new_tokens=request["max_tokens"])
        params.normalize(None)
        lora = int(request.get("lora_id", 0))
        if lora and self.lora is None:
            raise ValueError(f"request.lora_id: {lora} needs config.max_loras > 0")
        req = self.sb.Req(rid, "", array("q", tokens), params, eos_token_ids={EOS},
                          lora_id=sglang_lora.sglang_lora_id(lora))
        self.reqs[rid] = req
        if len(tokens) >= self.max_req_input_len:  # validate_input_length (managers/utils.py:272)
            # SGLang answers at the door; the wire's add_request has no result, so the refusal is
            # reported as the next schedule's `ignored` (the request waits until then).
            self.ignored.append(rid)
            return
        params.max_new_tokens = max(0, min(params.max_new_tokens, self.max_req_len - len(tokens) - 1))
        self.waiting.append(req)

    def abort_request(self, request_id: str):
        raise NotImplementedError("the SGLang host has no abort")

    # ------------------------------------------------------------------ one step
    def _allocatable(self, running_bs: int, held_rows: int = 0) -> int:
        return min(self.max_running - running_bs, self.req_pool.available_size() + held_rows)

    def _new_prefill_batch(self):
        running = self.running
        if running.is_empty():
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = len(running.reqs)
        if self._allocatable(running_bs) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting, running)
        adder = self.sp.PrefillAdder(1, self.cache, self.alloc, running, self.ratio.current,
                                     self.config["max_num_batched_tokens"], self.chunk_size, 0,
                                     max_running_requests=self.max_running)
        if self.chunked_req is not None:  # scheduler.py:4176-4184: the chunked request's next chunk first
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        if self.lora is not None:  # scheduler.py:4186-4191
            running_loras = self.lora.running_loras(running.reqs, adder.can_run_list)
        for req in self.waiting:
            if adder.budget_state() == self.sp.AddReqResult.OTHER:
                break
            if self.lora is not None and not self.lora.can_schedule(req, running_loras):  # scheduler.py:4209-4210
                continue
            held = sum(r.kv.holds_kv for r in adder.can_run_list)
            if len(adder.can_run_list) >= self._allocatable(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if self.lora is not None:  # scheduler.py:4276-4277: added whether or not the adder took it
                running_loras.add(req.lora_id)
            if res != self.sp.AddReqResult.CONTINUE:
                if res == self.sp.AddReqResult.NO_TOKEN:
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
        batch = self.sb.ScheduleBatch.init_new(adder.can_run_list, self.req_pool, self.alloc, self.cache,
                                               self.model_config, False, self.spec_none, chunked_req=self.chunked_req)
        batch.prepare_for_extend()
        return batch

    def _decode_batch(self, preempted: list):
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
                preempted.append({"request": req.rid, "mode": "recompute"})
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
        last = self.last_batch
        exclude = []
        if self.chunked_req is not None:  # scheduler.py:3911-3919: keep it out of the merge, stash its chunk
            exclude.append(self.chunked_req)
            if self.chunked_req.extend_end > self.chunked_req.prefix_len:
                self.common.checkpoint_kv_cache(self.chunked_req, self.cache)
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
        preempted: list = []
        batch = self._new_prefill_batch()
        prefill = batch is not None
        if batch is None and not self.running.is_empty():
            batch = self._decode_batch(preempted)
        self.last_batch = batch
        scheduled = []
        if batch is not None and self.lora is not None:
            self.lora.fetch(self.step_no, batch.reqs)  # forward_batch_info.py:1294, before the model runs
        if batch is not None:
            for req in batch.reqs:
                tokens = req.extend_len if prefill else 1
                scheduled.append({"seq": f"{req.rid}#0", "request": req.rid, "tokens": tokens, "prefill": prefill})
        self.pending = (batch, prefill) if batch is not None else None
        ignored, self.ignored = self.ignored, []
        for rid in ignored:
            self.final[rid] = "FINISHED_IGNORED"
        self.just_ignored = ignored
        out = {"step": self.step_no, "scheduled": scheduled, "preempted": preempted, "swapped_in": [],
               "swap_out": [], "swap_in": [], "copies": [], "ignored": ignored}
        self.step_no += 1
        return out

    def update(self, stopped: list) -> list:
        finished = [{"request": rid, "status": "FINISHED_IGNORED"} for rid in self.just_ignored]
        self.just_ignored = []
        if self.pending is None:
            return finished
        batch, prefill = self.pending
        self.pending = None
        stop = set(stopped)
        for req in batch.reqs:
            if req.finished() or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:  # batch_result_processor.py:424-432: a middle chunk samples nothing
                req.inflight_middle_chunks -= 1
                continue
            tok = EOS if f"{req.rid}#0" in stop else kvsched_host.token_ids(req.rid, 1, start=len(req.origin_input_ids) + len(req.output_ids))[0]
            req.output_ids.append(tok)
            req.update_finish_state()
            if req.finished():
                self.common.release_kv_cache(req, self.cache, checkpoint=True)
                status = "FINISHED_STOPPED" if tok == EOS else "FINISHED_LENGTH_CAPPED"
                self.final[req.rid] = status
                finished.append({"request": req.rid, "status": status})
            elif prefill:
                self.common.checkpoint_kv_cache(req, self.cache)
        return finished

    # ------------------------------------------------------------------ observations
    def snapshot(self) -> dict:
        running_ids = {r.rid for r in self.running.reqs if not r.finished()}
        if self.last_batch is not None:
            running_ids |= {r.rid for r in self.last_batch.reqs if not r.finished() and not r.is_retracted}
        waiting_ids = [r.rid for r in self.waiting] + list(self.ignored)
        statuses, views = {}, {}
        for rid, req in self.reqs.items():
            if rid in self.final:
                status = self.final[rid]
            elif rid in running_ids:
                status = "RUNNING"
            else:
                status = "WAITING"
            statuses[rid] = status
            slots = []
            idx = req.kv.req_pool_idx if status == "RUNNING" else None
            if idx is not None:
                n = req.kv.kv_allocated_len  # [0, kv_allocated_len) of the row holds this request's slots
                slots = [int(s) - 1 for s in self.req_pool.req_to_token[idx, :n].tolist()]
            views[f"{rid}#0"] = {"request": rid, "status": status,
                                 "num_tokens": len(req.origin_input_ids) + len(req.output_ids),
                                 "num_computed": int(req.kv.kv_committed_len) if status == "RUNNING" else 0,
                                 "blocks": slots, "device": "gpu" if slots else None}
        free = [int(s) - 1 for s in self.alloc.free_pages.tolist()] if self.alloc.free_pages is not None else []
        return {
            "statuses": statuses, "seqs": views, "waiting": waiting_ids,
            "running": [r for r in statuses if statuses[r] == "RUNNING"], "swapped": [],
            "gpu_free": len(free), "cpu_free": 0, "gpu_free_ids": free, "cpu_free_ids": [],
            "sglang_evictable": int(self.cache.evictable_size()), "sglang_protected": int(self.cache.protected_size()),
            **({"sglang_lora_slots": self.lora.resident(), "sglang_lora_overflows": list(self.lora.overflows)}
               if self.lora is not None else {}),
        }


CAPABILITIES = ["output", "statuses", "queues", "block_tables", "free_counts", "free_lists", "seq_lengths",
                "computed_tokens", "lora"]


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--lora-counterfactual", choices=sglang_lora.COUNTERFACTUALS, default=None,
                        help="take a fix out of the replayed LoRA glue (sglang_lora.COUNTERFACTUALS); never the default")
    args = parser.parse_args()
    return kvsched_host.serve(SglangEngine(args.lora_counterfactual), "sglang", ("safety",), CAPABILITIES)


if __name__ == "__main__":
    sys.exit(main())
