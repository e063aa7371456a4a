"""kvsched adapter for tinyserve, written from docs/ADAPTERS.md alone (see README.md here)."""

import tinyserve

from conformance.runner.adapter import SchedulerAdapter
from spec.domain import ConfigDomain
from spec.observation import Capability, SeqView, Snapshot
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput

ENDED = {"stop": Status.FINISHED_STOPPED, "length": Status.FINISHED_LENGTH_CAPPED,
         "rejected": Status.FINISHED_IGNORED, "cancelled": Status.FINISHED_ABORTED}
C = Capability
DONE_WITH_KV = (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH_CAPPED)


def _sid(rid):
    return f"{rid}#0"  # tinyserve runs one sequence per request


class TinyServeAdapter:
    capabilities = frozenset({C.OUTPUT, C.STATUSES, C.QUEUES, C.BLOCK_TABLES, C.REF_COUNTS, C.FREE_COUNTS,
                              C.FREE_LISTS, C.SEQ_LENGTHS, C.COMPUTED_TOKENS, C.MID_STEP})

    def __init__(self, config):
        self.ts = tinyserve.TinyServe(block_size=config.block_size, num_blocks=config.num_gpu_blocks,
                                      max_batch=config.max_num_seqs, token_budget=config.max_num_batched_tokens,
                                      max_len=config.max_model_len)
        self.step = 0

    def add_request(self, request):
        self.ts.submit(request.request_id, request.prompt_len, request.max_tokens)

    def abort_request(self, request_id):
        return Finished(request_id, Status.FINISHED_ABORTED) if self.ts.cancel(request_id) else None

    def schedule(self):
        plan = self.ts.plan()
        scheduled = [ScheduledSeq(_sid(r), r, n, True) for r, n in plan.prefill]
        scheduled += [ScheduledSeq(_sid(r), r, 1, False) for r in plan.decode]
        out = SchedulerOutput(step=self.step, scheduled=tuple(scheduled), ignored=tuple(plan.rejected),
                              preempted=tuple(Preempted(r, PreemptionMode.RECOMPUTE) for r in plan.evicted))
        self.step += 1
        return out

    def update(self, outcome):
        stopped = {sid.split("#")[0] for sid in outcome.stopped}
        return [Finished(r, ENDED[why]) for r, why in self.ts.commit(stopped)]

    @staticmethod
    def _status(s):
        if s.state.startswith("done:"):
            return ENDED[s.state[5:]]
        return Status.RUNNING if s.state == "active" else Status.WAITING

    def snapshot(self):
        ts = self.ts
        prefilling = {r for r, _ in ts.plan_.prefill}  # between schedule() and update(): nothing computed yet
        seqs, refs = {}, [0] * ts.num_blocks
        for s in ts.seqs.values():
            status = self._status(s)
            # tinyserve keeps no computed count: every token but the last sampled one has its KV, and a
            # finished sequence keeps the count it reached. A waiting, rejected or cancelled one has none.
            computed = s.length - 1 if status in DONE_WITH_KV or (status is Status.RUNNING and s.rid not in prefilling) else 0
            seqs[_sid(s.rid)] = SeqView(_sid(s.rid), s.rid, status, s.length, computed, tuple(s.table),
                                        "gpu" if s.table else None)
            for b in s.table:
                refs[b] += 1
        return Snapshot(
            statuses={r: self._status(s) for r, s in ts.seqs.items()}, seqs=seqs,
            waiting=tuple(ts.queue), running=tuple(ts.active), swapped=(),
            gpu_ref_counts=tuple(refs), cpu_ref_counts=(), gpu_free=len(ts.free_blocks), cpu_free=0,
            gpu_free_ids=tuple(sorted(ts.free_blocks)), cpu_free_ids=(),
        )


# tinyserve has no swap space, no watermark, no priorities and one sequence per request.
DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, priority=False, max_n=1)


def make():
    return SchedulerAdapter("tinyserve", TinyServeAdapter, capabilities=TinyServeAdapter.capabilities,
                            profiles=("safety",), domain=DOMAIN)
