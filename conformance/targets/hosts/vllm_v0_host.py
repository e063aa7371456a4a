"""kvsched adapter host for vLLM 0.10.2's V0 scheduler (vllm/core/scheduler.py) and its
SelfAttnBlockSpaceManager, on CPU, with no model and no tokenizer.

Run with the target venv's Python (VLLM_USE_V1=0):  python vllm_v0_host.py

The host plays ``LLMEngine._process_model_outputs`` around the real ``Scheduler``:
``schedule()`` -> for each scheduled group ``update_num_computed_tokens(token_chunk_size)`` ->
one token per running sequence (``append_token_id``) -> vLLM's own ``StopChecker`` ->
``free_seq`` for finished sequences -> ``free_finished_seq_groups()``. A sequence the trace
stops samples a token listed in its ``SamplingParams.stop_token_ids``, so vLLM's stop checker
finishes it.

Parallel sampling (``n > 1``): vLLM 0.10.2's engine splits such a request into n independent
groups; the scheduler and block manager still support multi-sequence groups (fork, shared
blocks, copy-on-write, swap of a group), which is what kvsched's spec models. The host builds
the group with one sequence and, at its prompt step, forks ``n - 1`` children with
``Sequence.fork`` + ``Scheduler.fork_seq`` before the sampled tokens are appended, as V0's
sampling engine did.

Observation: block tables are absolute in vLLM (CPU ids start at num_gpu_blocks); the snapshot
reports CPU ids relative to the CPU pool, like vLLM's own swap maps. Preemptions are recorded by
wrapping ``Scheduler._preempt`` (it returns the mode and changes nothing).
"""

from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("VLLM_USE_V1", "0")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402

logging.disable(logging.WARNING)

from vllm.config import CacheConfig, SchedulerConfig  # noqa: E402
from vllm.core.scheduler import Scheduler  # noqa: E402
from vllm.engine.output_processor.stop_checker import StopChecker  # noqa: E402
from vllm.inputs.data import token_inputs  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.sequence import Sequence, SequenceGroup, SequenceStatus  # noqa: E402
from vllm.utils import Device  # noqa: E402

STOP_TOKEN = 3
_FINAL = {
    SequenceStatus.FINISHED_STOPPED: "FINISHED_STOPPED",
    SequenceStatus.FINISHED_LENGTH_CAPPED: "FINISHED_LENGTH_CAPPED",
    SequenceStatus.FINISHED_ABORTED: "FINISHED_ABORTED",
    SequenceStatus.FINISHED_IGNORED: "FINISHED_IGNORED",
}


class V0Engine:
    def hello_extra(self) -> dict:
        import vllm

        return {"version": f"vllm=={vllm.__version__}", "source": os.path.dirname(vllm.__file__)}

    def reset(self, config: dict) -> None:
        if abs(config["watermark"] - 0.01) > 1e-12:
            raise ValueError(f"vLLM V0's block manager watermark is fixed at 0.01, got {config['watermark']}")
        mode = config["preemption_mode"]
        self.cfg = config
        sc = SchedulerConfig(runner_type="generate", max_num_batched_tokens=config["max_num_batched_tokens"],
                             max_num_seqs=config["max_num_seqs"], max_model_len=config["max_model_len"],
                             enable_chunked_prefill=False, preemption_mode=None if mode == "auto" else mode,
                             policy=config["policy"])
        cc = CacheConfig(block_size=config["block_size"], swap_space=0, cache_dtype="auto", enable_prefix_caching=False)
        cc.num_gpu_blocks = config["num_gpu_blocks"]
        cc.num_cpu_blocks = config["num_cpu_blocks"]
        self.sched = Scheduler(sc, cc, lora_config=None)
        self.stop_checker = StopChecker(config["max_model_len"], lambda seq: None)
        self.G = config["num_gpu_blocks"]
        self.groups: dict[str, SequenceGroup] = {}
        self.sid: dict[int, str] = {}  # vLLM seq id -> "<request>#<index>"
        self.n: dict[str, int] = {}
        self.forked: set[str] = set()
        self.final: dict[str, str] = {}
        self.next_seq = 0
        self.arrivals = 0
        self.step_no = 0
        self.pending = None
        self.pending_ignored: list[dict] = []
        self.preempted: list[tuple[str, str]] = []
        original = self.sched._preempt

        def recording_preempt(seq_group, blocks_to_swap_out):
            mode = original(seq_group, blocks_to_swap_out)
            self.preempted.append((seq_group.request_id, "swap" if mode.name == "SWAP" else "recompute"))
            return mode

        self.sched._preempt = recording_preempt

    def _new_seq(self, rid: str, index: int, tokens: list[int]) -> Sequence:
        seq = Sequence(self.next_seq, token_inputs(tokens), self.cfg["block_size"])
        self.sid[self.next_seq] = f"{rid}#{index}"
        self.next_seq += 1
        return seq

    def add_request(self, request: dict) -> None:
        rid = request["id"]
        if rid in self.groups:
            raise ValueError(f"duplicate request id {rid!r}")
        seq = self._new_seq(rid, 0, kvsched_host.token_ids(rid, request["prompt_len"]))
        params = SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True, detokenize=False,
                                stop_token_ids=[STOP_TOKEN])
        group = SequenceGroup(rid, [seq], arrival_time=float(self.arrivals), sampling_params=params,
                              priority=request.get("priority", 0))
        self.arrivals += 1
        self.groups[rid] = group
        self.n[rid] = request.get("n", 1)
        self.sched.add_seq_group(group)

    def abort_request(self, request_id: str):
        group = self.groups.get(request_id)
        if group is None or request_id in self.final:
            return None
        self.sched.abort_seq_group(request_id)
        self.final[request_id] = "FINISHED_ABORTED"
        return {"request": request_id, "status": "FINISHED_ABORTED"}

    def schedule(self) -> dict:
        swapped_before = {g.request_id for g in self.sched.swapped}
        self.preempted = []
        metas, out, _ = self.sched.schedule()
        scheduled = []
        for s, m in zip(out.scheduled_seq_groups, metas, strict=True):
            g = s.seq_group
            for seq in g.get_seqs(status=SequenceStatus.RUNNING):
                scheduled.append({"seq": self.sid[seq.seq_id], "request": g.request_id,
                                  "tokens": s.token_chunk_size if m.is_prompt else 1, "prefill": bool(m.is_prompt)})
        swapped_in = [s.seq_group.request_id for s in out.scheduled_seq_groups
                      if s.seq_group.request_id in swapped_before]
        ignored = [g.request_id for g in out.ignored_seq_groups]
        for rid in ignored:
            self.final[rid] = "FINISHED_IGNORED"
            self.pending_ignored.append({"request": rid, "status": "FINISHED_IGNORED"})
        self.pending = (out, metas)
        result = {
            "step": self.step_no, "scheduled": scheduled,
            "preempted": [{"request": r, "mode": mode} for r, mode in self.preempted],
            "swapped_in": swapped_in,
            "swap_out": [list(p) for p in out.blocks_to_swap_out],
            "swap_in": [list(p) for p in out.blocks_to_swap_in],
            "copies": [list(p) for p in out.blocks_to_copy],
            "ignored": ignored,
            "extra": {"num_batched_tokens": out.num_batched_tokens, "preempted_count": out.preempted},
        }
        self.step_no += 1
        return result

    def update(self, stopped: list) -> list:
        finished, self.pending_ignored = self.pending_ignored, []
        if self.pending is None:
            return finished
        out, metas = self.pending
        self.pending = None
        stop = set(stopped)
        touched = []
        for s, m in zip(out.scheduled_seq_groups, metas, strict=True):
            g = s.seq_group
            g.update_num_computed_tokens(s.token_chunk_size)
            if not m.do_sample:
                continue
            rid = g.request_id
            if m.is_prompt and rid not in self.forked:
                self.forked.add(rid)
                parent = g.first_seq
                for index in range(1, self.n[rid]):
                    child = parent.fork(self.next_seq)
                    self.sid[self.next_seq] = f"{rid}#{index}"
                    self.next_seq += 1
                    g.seqs.append(child)
                    g.seqs_dict[child.seq_id] = child
                    g.is_single_seq = False
                    self.sched.fork_seq(parent, child)
            for seq in g.get_seqs(status=SequenceStatus.RUNNING):
                sid = self.sid[seq.seq_id]
                tok = STOP_TOKEN if sid in stop else kvsched_host.token_ids(sid, 1, start=seq.get_len())[0]
                seq.append_token_id(tok, {tok: Logprob(0.0)})
                self.stop_checker.maybe_stop_sequence(seq, 0, g.sampling_params)
                if seq.is_finished():
                    self.sched.free_seq(seq)
            touched.append(g)
        self.sched.free_finished_seq_groups()
        for g in touched:
            if g.is_finished() and g.request_id not in self.final:
                statuses = {_FINAL.get(seq.status, seq.status.name) for seq in g.seqs}
                status = "FINISHED_LENGTH_CAPPED" if statuses == {"FINISHED_LENGTH_CAPPED"} else "FINISHED_STOPPED"
                self.final[g.request_id] = status
                finished.append({"request": g.request_id, "status": status})
        return finished

    def snapshot(self) -> dict:
        sched, G = self.sched, self.G
        bm = sched.block_manager
        tables = bm.block_tables
        statuses, views = {}, {}
        for rid, g in self.groups.items():
            if rid in self.final:
                statuses[rid] = self.final[rid]
            else:
                live = [s.status for s in g.seqs if not s.is_finished()]
                statuses[rid] = live[0].name if live else "FINISHED_STOPPED"
            for seq in g.seqs:
                sid = self.sid[seq.seq_id]
                blocks, device = [], None
                if seq.seq_id in tables:  # a finished sequence whose blocks were never freed shows them
                    ids = [b for b in tables[seq.seq_id].physical_block_ids if b is not None]
                    if ids:
                        device = "cpu" if min(ids) >= G else "gpu"
                        blocks = [b - G if b >= G else b for b in ids] if device == "cpu" else ids
                status = _FINAL.get(seq.status, seq.status.name)
                if seq.is_finished() and rid in self.final and self.final[rid] in ("FINISHED_ABORTED", "FINISHED_IGNORED"):
                    status = self.final[rid]
                views[sid] = {"request": rid, "status": status, "num_tokens": seq.get_len(),
                              "num_computed": seq.data.get_num_computed_tokens(), "blocks": blocks, "device": device}
        gpu = bm.block_allocator._allocators[Device.GPU]
        cpu = bm.block_allocator._allocators[Device.CPU]
        gref = [0] * G
        for b, c in gpu.refcounter._refcounts.items():
            gref[b] = c
        cref = [0] * self.cfg["num_cpu_blocks"]
        for b, c in cpu.refcounter._refcounts.items():
            cref[b - G] = c
        return {
            "statuses": statuses, "seqs": views,
            "waiting": [g.request_id for g in sched.waiting],
            "running": [g.request_id for g in sched.running],
            "swapped": [g.request_id for g in sched.swapped],
            "gpu_ref_counts": gref, "cpu_ref_counts": cref,
            "gpu_free": bm.get_num_free_gpu_blocks(), "cpu_free": bm.get_num_free_cpu_blocks(),
            "gpu_free_ids": list(gpu._free_block_indices),
            "cpu_free_ids": [b - G for b in cpu._free_block_indices],
        }


CAPABILITIES = ["output", "statuses", "queues", "block_tables", "ref_counts", "free_counts", "free_lists",
                "seq_lengths", "computed_tokens", "mid_step"]

if __name__ == "__main__":
    sys.exit(kvsched_host.serve(V0Engine(), "vllm-v0", ("vllm-v0", "safety"), CAPABILITIES))
