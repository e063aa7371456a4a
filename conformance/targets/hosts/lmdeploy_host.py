"""kvsched adapter host for LMDeploy 0.18.0's PyTorch-engine scheduler (run with the ``lmdeploy`` venv's Python).

What runs unmodified: ``lmdeploy.pytorch.paging.Scheduler`` with everything it owns
(``_PrefillScheduler`` and its reorderer and admission gates, ``RecomputeEvictionHelper``,
``DefaultBlockManager`` / ``LogicalAllocator``, ``BlockTrie``, the sequence state machine of
``paging/seq_states/states.py``) and ``SchedulerSequenceDefault.update_token_ids``
(strategies/ar/sequence.py). The package ``__init__`` (the pipeline API, mmengine, the
tokenizer) is never run: a stub parent package with the real ``__path__`` is put in
``sys.modules``, so submodules import from the real files.

Glue replayed here, because it lives on the engine objects that need a model executor:

* ``InputsMakerAsync.do_prefill_default`` (engine/inputs_maker.py:1286-1319): prefill when
  something waits and (decode ran ``prefill_interval`` times, or the waiting prompts reach
  ``max_prefill_token_num``, or fewer than half of ``max_batches`` are ready or running).
* ``_ForwardInputsTask.run`` (inputs_maker.py:339-407) on its no-long-context path:
  ``_schedule_prefill`` (563-602) calls ``Scheduler.schedule(is_prefill=True, prealloc_size=
  prefill_interval)`` (``AREngineStrategy.get_prealloc_size(True)``, strategies/ar/engine.py:14);
  with no prefill batch, ``_try_decode`` -> ``create_model_inputs_delta`` (1158-1207):
  ``Scheduler.schedule_running(running_seqs, 1, prefill_interval)``, whose rejects become
  ``to_evict_seqs``.
* ``EngineLoop.main_loop`` (engine/engine_loop.py:520-557): ``activate_seqs`` on the chosen
  batch, ``update_running_seqs`` (inputs_maker.py:1250-1267), then
  ``preempt_invalid_decode_seqs`` (1269-1275).
* ``ARSequenceStrategy.update_running`` (strategies/ar/sequence.py:148-182) with the stop rule of
  ``ARStoppingCriteria.step`` (strategies/ar/model_agent.py:48-66: stop when the appendable count
  reaches 0 or a stop word is sampled); a finished request's session is ended at once
  (``EngineInstance.async_stream_infer`` ends it when it sees FINISH, engine_instance.py:288).
* ``Engine._add_message`` / ``_get_max_session_len`` (engine/engine.py:328-341, 467-517) and
  ``EngineInstance.async_stream_infer`` (engine_instance.py:196): a prompt longer than
  ``max_session_len = min(max_model_len, (num_gpu_blocks - 1) * block_size)`` is refused at the
  door (INPUT_LENGTH_ERROR, answered here as FINISHED_IGNORED); ``max_new_tokens`` is clipped to
  ``max_session_len - prompt_len``.
* Aborts: ``Engine._on_stop_session`` then ``_on_end_session`` (engine.py:355-425).

Simplification: the real loop prefetches the next batch before the current forward's output
is applied (``_main_loop_get_outputs``, engine_loop.py:484-518), so LMDeploy decodes one step
behind its outputs; this host schedules, applies the output, then schedules again (pipeline
depth 0), which is the order the spec's runner drives. The long-context chunker is never
engaged: the trace strategy keeps ``max_model_len <= max_num_batched_tokens`` (=
``max_prefill_token_num``).

Observations LMDeploy has: block tables (``BaseBlockManager.get_block_table``: physical GPU
ids), the GPU allocator's free list and count, per-block ref counts (the logical allocator's
counts, mapped to physical GPU blocks), sequence lengths (``num_all_ids``) and the cached
prefix (``num_history_ids``, as ``num_computed``).

Prefix caching (``enable_prefix_caching``: ``BlockTrie``, paging/block_trie/trie.py) runs as
the engine runs it: ``Scheduler`` matches a waiting prompt against the trie at admission and
``schedule_running`` attaches every full block to it. One translation: each trie node owns one
reference on its block (block_trie/node.py:41), where the spec counts only block-table
entries (BLK-003) and vLLM V1 leaves a cached block unreferenced in its free queue. So the
host reports ref counts without the trie's references, and a block that only the trie holds
as free (and in the free list): nothing else can hold a block below one that only the trie
holds (a sequence holding a block holds its whole prefix path), so ``BlockTrie.evict`` can
hand every such block back when an allocation needs it, as V1 evicts a cached free block.
``lmdeploy_trie_blocks`` (informational) counts the blocks the trie holds.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402

EOS = 2
PREFILL_INTERVAL = 16  # lmdeploy.pytorch.config.SchedulerConfig default (prealloc and decode rounds)


def load() -> dict:
    """Import the paging scheduler without running ``lmdeploy/__init__.py``."""
    if "lmdeploy" not in sys.modules:
        spec = importlib.util.find_spec("lmdeploy")
        if spec is None or spec.origin is None:
            raise SystemExit(f"lmdeploy is not installed in {sys.executable}")
        parent = types.ModuleType("lmdeploy")
        parent.__path__ = [os.path.dirname(spec.origin)]
        parent.__file__ = spec.origin
        sys.modules["lmdeploy"] = parent
        # strategies/ar/sequence.py imports BatchedOutputs from the model agent for a type hint
        # only; the real module pulls the cache engine, mmengine and zmq (a model executor's parts).
        agent = types.ModuleType("lmdeploy.pytorch.engine.model_agent")
        agent.BatchedOutputs = object
        sys.modules[agent.__name__] = agent
    from lmdeploy.pytorch import config, messages
    from lmdeploy.pytorch.paging import Scheduler
    from lmdeploy.pytorch.strategies.ar.sequence import ARSequenceStrategy

    return {"Scheduler": Scheduler, "config": config, "messages": messages, "strategy": ARSequenceStrategy}


class LmdeployEngine:
    def __init__(self) -> None:
        mods = load()
        self.Scheduler, self.cfg, self.msgs, self.Strategy = mods["Scheduler"], mods["config"], mods["messages"], mods["strategy"]
        import numpy as np

        self.np = np

    def hello_extra(self) -> dict:
        from importlib.metadata import version

        return {"version": f"lmdeploy=={version('lmdeploy')}", "source": os.path.dirname(sys.modules["lmdeploy"].__file__)}

    # ------------------------------------------------------------------ lifecycle
    def reset(self, config: dict) -> None:
        bs = config["block_size"]
        if bs < 16 or bs & (bs - 1):  # PytorchEngineConfig.__post_init__ (lmdeploy/messages.py:623-629)
            raise ValueError(f"config.block_size: LMDeploy needs a power of two >= 16, got {bs}")
        for key, ok in (("num_cpu_blocks", not config.get("num_cpu_blocks")),
                        ("preemption_mode", config["preemption_mode"] == "recompute"),
                        ("policy", config["policy"] == "fcfs"),
                        ("enable_chunked_prefill", not config.get("enable_chunked_prefill")),
                        ("max_num_batched_tokens", config["max_num_batched_tokens"] >= config["max_model_len"])):
            if not ok:
                raise ValueError(f"config.{key}: the LMDeploy host supports recompute, fcfs, no CPU pool, no chunked "
                                 f"prefill and a prefill budget covering max_model_len; got {config.get(key)!r}")
        self.config = config
        gpu = config["num_gpu_blocks"]
        sched_cfg = self.cfg.SchedulerConfig(max_batches=config["max_num_seqs"], max_session_len=config["max_model_len"],
                                             prefill_interval=PREFILL_INTERVAL, eviction_type="recompute")
        cache_cfg = self.cfg.CacheConfig(max_batches=config["max_num_seqs"], block_size=bs, num_cpu_blocks=0,
                                         num_gpu_blocks=gpu, max_prefill_token_num=config["max_num_batched_tokens"],
                                         enable_prefix_caching=bool(config.get("enable_prefix_caching")),
                                         device_type="cpu")
        meta = self.msgs.SequenceMeta(bs, strategy=self.Strategy())
        self.sched = self.Scheduler(sched_cfg, cache_cfg, seq_meta=meta)
        # engine.py:328-341
        self.max_session_len = min(config["max_model_len"], gpu * bs - bs)
        self.max_batches = config["max_num_seqs"]
        self.max_prefill_token_num = config["max_num_batched_tokens"]
        self.decode_count = 0  # InputsMakerAsync._decode_count
        self.running_seqs: list = []  # InputsMakerAsync.running_seqs
        self.seqs: dict = {}  # rid -> SchedulerSequence
        self.sessions: dict = {}  # rid -> session id
        self.final: dict = {}  # rid -> status
        self.pending = None  # (batch, is_prefill) between schedule and update
        self.step_no = 0

    def add_request(self, request: dict):
        rid = request["id"]
        if request.get("n", 1) != 1:
            raise ValueError("request.n: the LMDeploy host has no parallel sampling (n must be 1)")
        if rid in self.seqs or rid in self.final:
            raise ValueError(f"duplicate request id {rid!r}")
        tokens = request.get("prompt_tokens") or kvsched_host.token_ids(rid, request["prompt_len"])
        if len(tokens) > self.max_session_len:  # engine_instance.py:196: INPUT_LENGTH_ERROR
            self.final[rid] = "FINISHED_IGNORED"
            return {"request": rid, "status": "FINISHED_IGNORED"}
        sid = len(self.sessions) + 1
        self.sessions[rid] = sid
        session = self.sched.add_session(sid)
        param = self.msgs.SamplingParam(max_new_tokens=request["max_tokens"], stop_words=[EOS])
        seq = session.add_sequence(self.np.array(tokens, dtype=self.np.int64), sampling_param=param)
        # engine.py:469-481 (__update_max_new_tokens)
        if param.max_new_tokens + seq.num_valid_ids > self.max_session_len:
            param.max_new_tokens = self.max_session_len - seq.num_valid_ids
        self.seqs[rid] = seq
        return None

    def abort_request(self, request_id: str):
        if request_id not in self.seqs or request_id in self.final:
            return None
        sid = self.sessions[request_id]
        self.sched.stop_session(sid)  # engine.py:355-377
        self.sched.end_session(sid)  # engine.py:410-425
        self.final[request_id] = "FINISHED_ABORTED"
        return {"request": request_id, "status": "FINISHED_ABORTED"}

    # ------------------------------------------------------------------ one step
    def _do_prefill(self) -> bool:
        """InputsMakerAsync.do_prefill_default (inputs_maker.py:1286-1319), no long-context chunk."""
        sched = self.sched
        if not sched.has_waiting():
            self.decode_count = 0
            return False
        if self.decode_count >= PREFILL_INTERVAL:
            return True
        count = 0
        for seq in sched.waiting:
            count += seq.num_token_ids
            if count >= self.max_prefill_token_num:
                return True
        if sched.num_ready() + sched.num_running() < self.max_batches * 0.5:
            return True
        self.decode_count += 1
        return False

    def schedule(self) -> dict:
        sched = self.sched
        status = self.msgs.MessageStatus
        batch, prefill, preempted, to_evict = [], False, [], []
        if self._do_prefill():
            batch = sched.schedule(is_prefill=True, prealloc_size=PREFILL_INTERVAL).running
            prefill = bool(batch)
            if prefill:
                self.decode_count = 0
        if not prefill and self.running_seqs:
            running = list(self.running_seqs)
            was_running = [seq.status == status.RUNNING for seq in running]
            valid = sched.schedule_running(running, num_required_tokens=1, prealloc_size=PREFILL_INTERVAL)
            batch = [seq for seq, ok in zip(running, valid, strict=True) if ok]
            to_evict = [seq for seq, ok in zip(running, valid, strict=True) if not ok]
            for seq, ok, was in zip(running, valid, was_running, strict=True):
                if was and not ok:  # schedule_running preempted it for want of blocks
                    preempted.append({"request": self._rid(seq), "mode": "recompute"})
        sched.activate_seqs(batch)  # engine_loop.py:551
        if batch:  # update_running_seqs (inputs_maker.py:1250-1267)
            if prefill:
                self.running_seqs += [seq for seq in batch if seq.sampling_param.max_new_tokens > 0]
            else:
                self.running_seqs = batch
        if to_evict:  # preempt_invalid_decode_seqs (inputs_maker.py:1269-1275)
            sched.preempt_seqs(to_evict)
        sched.tick()
        scheduled = [{"seq": f"{self._rid(seq)}#0", "request": self._rid(seq),
                      "tokens": int(seq.num_token_ids) if prefill else 1, "prefill": prefill} for seq in batch]
        self.pending = (batch, prefill) if batch else None
        out = {"step": self.step_no, "scheduled": scheduled, "preempted": preempted, "swapped_in": [],
               "swap_out": [], "swap_in": [], "copies": [], "ignored": []}
        self.step_no += 1
        return out

    def _rid(self, seq) -> str:
        return self.rid_of[seq.seq_id]

    @property
    def rid_of(self) -> dict:
        return {seq.seq_id: rid for rid, seq in self.seqs.items()}

    def update(self, stopped: list) -> list:
        if self.pending is None:
            return []
        batch, prefill = self.pending
        self.pending = None
        status = self.msgs.MessageStatus
        mode = self.msgs.UpdateTokenMode.PREFILL if prefill else self.msgs.UpdateTokenMode.DECODE
        stop = set(stopped)
        finished = []
        for seq in batch:  # ARSequenceStrategy.update_running
            if seq.status != status.RUNNING:
                continue
            rid = self._rid(seq)
            if prefill and seq.sampling_param.max_new_tokens == 0:
                seq.update_token_ids(self.np.empty((0,), dtype=self.np.int64), mode=mode)
                seq.finish()
                finished.append(self._end(rid, "FINISHED_LENGTH_CAPPED"))
                continue
            appendable = seq.sampling_param.max_new_tokens - seq.num_new_tokens - 1  # ARStoppingCriteria.step
            eos = f"{rid}#0" in stop
            tok = EOS if eos else kvsched_host.token_ids(rid, 1, start=int(seq.num_all_ids))[0]
            seq.update_token_ids(self.np.array([tok], dtype=self.np.int64), mode=mode)
            if eos or appendable <= 0:
                seq.finish()
                finished.append(self._end(rid, "FINISHED_STOPPED" if eos else "FINISHED_LENGTH_CAPPED"))
        return finished

    def _end(self, rid: str, status: str) -> dict:
        self.sched.end_session(self.sessions[rid])  # the client ends the session on FINISH
        self.final[rid] = status
        return {"request": rid, "status": status}

    # ------------------------------------------------------------------ observations
    def snapshot(self) -> dict:
        np, status = self.np, self.msgs.MessageStatus
        bm = self.sched.block_manager
        alloc = bm.allocator
        gpu = bm.num_gpu_blocks
        statuses, views, waiting, running = {}, {}, [], []
        for rid in list(self.final):
            if rid not in self.seqs:
                statuses[rid] = self.final[rid]
        for rid, seq in self.seqs.items():
            if rid in self.final:
                st, blocks = self.final[rid], []
            else:
                st = "RUNNING" if seq.status in (status.RUNNING, status.READY) else "WAITING"
                blocks = [int(b) for b in bm.get_block_table(seq)]
                (running if st == "RUNNING" else waiting).append(rid)
            statuses[rid] = st
            views[f"{rid}#0"] = {"request": rid, "status": st, "num_tokens": int(seq.num_all_ids),
                                 "num_computed": int(seq.num_history_ids) if rid not in self.final else 0,
                                 "blocks": blocks, "device": "gpu" if blocks else None}
        refs = [0] * gpu
        log_mem = alloc._log_mem
        cached = self._trie_blocks()
        used = np.flatnonzero(log_mem.ref_count > 0)
        for lb in used:
            phys = int(log_mem.phy_map[lb])
            if phys < gpu:
                refs[phys] += int(log_mem.ref_count[lb]) - cached.get(int(lb), 0)
        pa = alloc.get_phy_allocator("gpu")
        num_used = pa._num_blocks - pa._free_count
        free_ids = [int(b) for b in pa._free_blocks[num_used:]]
        # a block only the trie holds is free in the spec's terms: evict() hands it back on demand
        trie_only = [int(log_mem.phy_map[lb]) for lb in cached if int(log_mem.ref_count[lb]) == cached[lb]]
        waiting.sort(key=lambda r: self.seqs[r].arrive_time)
        return {"statuses": statuses, "seqs": views, "waiting": waiting, "running": running, "swapped": [],
                "gpu_ref_counts": refs, "cpu_ref_counts": [],
                "gpu_free": int(bm.get_num_free_gpu_blocks()) + len(trie_only), "cpu_free": 0,
                "gpu_free_ids": free_ids + trie_only, "cpu_free_ids": [], "lmdeploy_trie_blocks": len(cached)}

    def _trie_blocks(self) -> dict:
        """Logical block -> the references the prefix-cache trie holds on it: one per attached
        node (``Node`` "owns one trie KV-block reference", block_trie/node.py:41;
        ``KVBlockLifecycle.commit_path_extension`` adds it, ``evict`` frees it)."""
        trie = self.sched.block_trie
        held: dict = {}
        todo = [child for root in trie._roots.values() for child in root.children.values()]
        while todo:
            node = todo.pop()
            if node.block_id >= 0:
                held[int(node.block_id)] = held.get(int(node.block_id), 0) + 1
            todo.extend(node.children.values())
        return held


CAPABILITIES = ["output", "statuses", "queues", "block_tables", "ref_counts", "free_counts", "free_lists",
                "seq_lengths", "computed_tokens"]


def main() -> int:
    return kvsched_host.serve(LmdeployEngine(), "lmdeploy", ("safety",), CAPABILITIES)


if __name__ == "__main__":
    sys.exit(main())
