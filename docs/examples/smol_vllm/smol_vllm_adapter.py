"""kvsched adapter for smol-vllm 0.1.2 (pip install --no-deps smol-vllm), from docs/ADAPTERS.md.

smol-vllm's LLMEngine.step() schedules, runs its model and samples in one call, so the domain
says fused_step: schedule(outcome) runs the step with a model that samples the trace's stops.
SMOL_VLLM_SITE names the venv's site-packages (default below); see STRANGER.md.
"""

import glob
import os
import sys

sys.path.append(os.environ.get("SMOL_VLLM_SITE") or glob.glob(os.path.expanduser("~/.cache/kvsched/stranger/smol/lib/python3*/site-packages"))[0])
from smol_vllm.engine import LLMEngine  # noqa: E402
from smol_vllm.sequence import SequenceStatus  # noqa: E402

from conformance.runner.adapter import SchedulerAdapter  # noqa: E402
from spec.domain import ConfigDomain  # noqa: E402
from spec.observation import Capability as C  # noqa: E402
from spec.observation import SeqView, Snapshot  # noqa: E402
from spec.status import PreemptionMode, Status  # noqa: E402
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput  # noqa: E402

STOP, TOKEN = 0, 7  # smol-vllm's default stop id, and any other id
LIVE = {SequenceStatus.WAITING: Status.WAITING, SequenceStatus.RUNNING: Status.RUNNING,
        SequenceStatus.SWAPPED: Status.SWAPPED}


class Smol:
    capabilities = frozenset({C.OUTPUT, C.STATUSES, C.QUEUES, C.BLOCK_TABLES, C.REF_COUNTS, C.FREE_COUNTS,
                              C.FREE_LISTS, C.SEQ_LENGTHS})

    def __init__(self, config):
        self.engine = LLMEngine(num_gpu_blocks=config.num_gpu_blocks, block_size=config.block_size,
                                max_batch_size=config.max_num_seqs, enable_metrics=False)
        self.engine.model = self  # its model: prefill/decode return one token per group
        self.rid, self.gid, self.final, self.done, self.step, self.stopping = {}, {}, {}, [], 0, frozenset()
        real = self.engine.scheduler.schedule  # its own SchedulerOutputs, kept for schedule() to report
        self.engine.scheduler.schedule = lambda: setattr(self, "sched", real()) or self.sched

    def prefill(self, groups):
        return [STOP if f"{self.rid[g.group_id]}#0" in self.stopping else TOKEN for g in groups]

    def decode(self, groups, tables):
        return self.prefill(groups)

    def add_request(self, request):
        self.engine.add_request([TOKEN] * request.prompt_len, max_tokens=request.max_tokens, stop_token_ids=[STOP])
        gid = self.engine.request_counter - 1
        self.rid[gid], self.gid[request.request_id] = request.request_id, gid

    def schedule(self, outcome):
        self.stopping = outcome.stopped
        results = self.engine.step()
        out, rid = self.sched, self.rid
        scheduled = tuple(ScheduledSeq(f"{rid[g.group_id]}#0", rid[g.group_id],
                                       1 if g.sequences[0].output_tokens[:-1] else len(g.sequences[0].prompt_tokens),
                                       not g.sequences[0].output_tokens[:-1]) for g in out.scheduled_groups)
        for r in results:
            if r.finished:
                status = Status.FINISHED_STOPPED if r.output_tokens[-1] == STOP else Status.FINISHED_LENGTH_CAPPED
                self.final[rid[r.group_id]] = status
                self.done.append(Finished(rid[r.group_id], status))
        output = SchedulerOutput(step=self.step, scheduled=scheduled,
                                 preempted=tuple(Preempted(rid[g], PreemptionMode.SWAP) for g in out.blocks_to_swap_out),
                                 swapped_in=tuple(rid[g] for g in out.blocks_to_swap_in))
        self.step += 1
        return output

    def update(self, outcome):
        done, self.done = self.done, []
        return done

    def snapshot(self):
        e, bm = self.engine, self.engine.block_manager
        statuses, seqs = {}, {}
        for gid, group in e.groups.items():
            rid, seq = self.rid[gid], group.sequences[0]
            status = self.final.get(rid) or LIVE[seq.status]
            blocks = tuple(bm.get_block_table(gid))
            statuses[rid] = status
            seqs[f"{rid}#0"] = SeqView(f"{rid}#0", rid, status, seq.num_tokens, None, blocks, "gpu" if blocks else None)
        queue = lambda q: tuple(self.rid[g.group_id] for g in q)  # noqa: E731
        return Snapshot(statuses=statuses, seqs=seqs, waiting=queue(e.scheduler.waiting),
                        running=queue(e.scheduler.running), swapped=queue(e.scheduler.swapped),
                        gpu_ref_counts=tuple(bm._ref_count.get(b, 0) for b in range(bm.num_blocks)), cpu_ref_counts=(),
                        gpu_free=bm.num_free_blocks(), cpu_free=0, gpu_free_ids=tuple(bm._free_blocks), cpu_free_ids=())


# No max_model_len, no token budget, no abort, FCFS, one sequence, no CPU pool: its "swap" frees
# the blocks (STRANGER.md), and schedule and sample are one call.
DOMAIN = ConfigDomain(length_limit=False, token_budget=False, aborts=False, priority=False, max_n=1, cpu_pool=False,
                      watermark=0.0, preemption_mode="swap", fused_step=True)


def make():
    return SchedulerAdapter("smol-vllm", Smol, profiles=("safety", "liveness"), capabilities=Smol.capabilities,
                            domain=DOMAIN)
