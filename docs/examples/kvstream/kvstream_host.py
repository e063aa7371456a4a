"""A kvsched wire host for kvstream 0.1.0's scheduler, run in kvstream's own venv (see STRANGER.md).

The engine loop is kvstream's own (engine.py: generate and _scheduler_loop): schedule() is one
tick of ContinuousBatchScheduler, update() appends each scheduled sequence's token and grows its
page table (BlockManager.append_slot), as a backend stream does, and finishes it at its stop or
max_new_tokens (the scheduler frees it at its next tick).
"""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "conformance" / "targets" / "hosts"))
import kvsched_host  # noqa: E402
from kvstream.memory.block_manager import BlockManager  # noqa: E402
from kvstream.scheduler.continuous_batch import ContinuousBatchScheduler, SeqStatus, SequenceGroup  # noqa: E402

LIVE = {SeqStatus.WAITING: "WAITING", SeqStatus.RUNNING: "RUNNING", SeqStatus.SWAPPED: "SWAPPED",
        SeqStatus.ABORTED: "FINISHED_ABORTED"}


class KvStream:
    def reset(self, config):
        self.loop, self.c = asyncio.new_event_loop(), config
        self.bm = BlockManager(config["num_gpu_blocks"], config["num_cpu_blocks"], config["block_size"])
        mode = "swap" if config["preemption_mode"] == "swap" else "recompute"  # "auto" with n = 1 is recompute
        self.s = ContinuousBatchScheduler(self.bm, max_batch_size=config["max_num_seqs"], preemption_policy=mode)
        self.seqs, self.final, self.batch, self.step, self.maps = {}, {}, [], 0, {"out": [], "in": []}
        for way, move in (("out", self.bm.swap_out), ("in", self.bm.swap_in)):  # the scheduler drops their maps
            self._keep(way, move)

    def _keep(self, way, move):
        n = self.c["num_gpu_blocks"]
        shift = (0, n) if way == "out" else (n, 0)
        setattr(self.bm, f"swap_{way}", lambda rid: self.maps[way].extend(
            [a - shift[0], b - shift[1]] for a, b in move(rid).items()))

    def add_request(self, request):
        seq = SequenceGroup(request["id"], [7] * request["prompt_len"], request["max_tokens"])
        self.seqs[seq.seq_id] = seq
        self.loop.run_until_complete(self.s.add_request(seq))

    def abort_request(self, request_id):
        if request_id in self.final or request_id not in self.seqs:
            return None
        self.loop.run_until_complete(self.s.abort_request(request_id))
        self.final[request_id] = "FINISHED_ABORTED"
        return {"request": request_id, "status": "FINISHED_ABORTED"}

    def _blocks(self, rid):
        state = self.bm._seq_states.get(rid)
        return list(state.logical_to_physical) if state else []

    def schedule(self):
        held = {rid for rid in self.seqs if self._blocks(rid)}
        self.maps = {"out": [], "in": []}
        out = self.loop.run_until_complete(self.s.schedule())
        self.batch = out.prefill + out.decode
        result = {"step": self.step, "scheduled": [{"seq": f"{q.seq_id}#0", "request": q.seq_id, "tokens": q.prompt_len,
                                                    "prefill": True} for q in out.prefill]
                  + [{"seq": f"{q.seq_id}#0", "request": q.seq_id, "tokens": 1, "prefill": False} for q in out.decode],
                  "preempted": [{"request": q.seq_id, "mode": "swap"} for q in out.swapped_out],
                  "swapped_in": [q.seq_id for q in out.swapped_in],
                  "swap_out": self.maps["out"], "swap_in": self.maps["in"]}
        result["preempted"] += [{"request": rid, "mode": "recompute"} for rid, q in self.seqs.items()
                                if rid in held and q.status is SeqStatus.WAITING]
        self.step += 1
        return result

    def update(self, stopped):
        finished = []
        for q in self.batch:
            q.output_tokens.append(8)
            try:
                self.bm.append_slot(q.seq_id)
            except MemoryError:
                pass  # engine.py:226-227: "KV page pool saturated mid-decode", and the stream goes on
            stop = f"{q.seq_id}#0" in stopped
            if stop or q.num_generated >= q.max_new_tokens:
                q.status = SeqStatus.FINISHED
                self.final[q.seq_id] = "FINISHED_STOPPED" if stop else "FINISHED_LENGTH_CAPPED"
                finished.append({"request": q.seq_id, "status": self.final[q.seq_id]})
        return finished

    def snapshot(self):
        n, seqs, statuses = self.c["num_gpu_blocks"], {}, {}
        for rid, q in self.seqs.items():
            statuses[rid] = self.final.get(rid) or LIVE[q.status]
            blocks = self._blocks(rid)
            device = None if not blocks else "cpu" if blocks[0] >= n else "gpu"
            seqs[f"{rid}#0"] = {"request": rid, "status": statuses[rid], "num_tokens": q.total_tokens,
                                "blocks": [b - n if device == "cpu" else b for b in blocks], "device": device}
        live = lambda queue: [q.seq_id for q in queue if q.seq_id not in self.final]  # noqa: E731
        cpu = sorted(self.bm._cpu_blocks)
        return {"statuses": statuses, "seqs": seqs, "waiting": live(self.s.waiting), "running": live(self.s.running),
                "swapped": live(self.s.swapped), "gpu_ref_counts": [self.bm._gpu_blocks[b].ref_count for b in range(n)],
                "cpu_ref_counts": [self.bm._cpu_blocks[b].ref_count for b in cpu], "gpu_free": len(self.bm._gpu_free),
                "cpu_free": len(self.bm._cpu_free), "gpu_free_ids": list(self.bm._gpu_free),
                "cpu_free_ids": [b - n for b in self.bm._cpu_free]}


if __name__ == "__main__":
    kvsched_host.serve(KvStream(), "kvstream", ["safety", "liveness"],
                       ["output", "statuses", "queues", "block_tables", "ref_counts", "free_counts", "free_lists",
                        "seq_lengths", "mid_step"])
