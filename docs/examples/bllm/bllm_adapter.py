"""kvsched adapter for bllm-inference 0.1.0's scheduler (pip install --no-deps bllm-inference), from
docs/ADAPTERS.md. BLLM_SITE names its venv's site-packages (default below); see STRANGER.md.

bllm reserves a request's prompt + max_new_tokens when it admits it and never preempts; it refuses
at add_request a request that needs more blocks than the pool has. The engine loop is its own
(InferenceEngine: schedule, the model's one token per request, process_outputs).
"""

import glob
import os
import sys

sys.path.append(os.environ.get("BLLM_SITE") or glob.glob(os.path.expanduser("~/.cache/kvsched/stranger/bllm/lib/python3*/site-packages"))[0])
from bllm.core.block_allocator import BlockAllocator  # noqa: E402
from bllm.core.config import InferenceConfig, PagedCacheConfig  # noqa: E402
from bllm.core.page_table import PageTable  # noqa: E402
from bllm.scheduler.request import InferenceRequest, RequestStatus  # noqa: E402
from bllm.scheduler.scheduler import Scheduler  # noqa: E402

from conformance.runner.adapter import SchedulerAdapter  # noqa: E402
from spec.domain import ConfigDomain  # noqa: E402
from spec.observation import Capability as C  # noqa: E402
from spec.observation import SeqView, Snapshot  # noqa: E402
from spec.reservation import Reservation  # noqa: E402
from spec.status import Status  # noqa: E402
from spec.types import Finished, ScheduledSeq, SchedulerOutput  # noqa: E402

EOS, TOKEN = 0, 7


class Bllm:
    capabilities = frozenset({C.OUTPUT, C.STATUSES, C.QUEUES, C.BLOCK_TABLES, C.REF_COUNTS, C.FREE_COUNTS,
                              C.FREE_LISTS, C.SEQ_LENGTHS, C.MID_STEP})

    def __init__(self, config):
        n, bs, seats = config.num_gpu_blocks, config.block_size, config.max_num_seqs
        self.alloc = BlockAllocator(n, bs)
        self.pages = PageTable(seats, n, bs, device="cpu")
        self.s = Scheduler(PagedCacheConfig(1, 1, 1, block_size=bs, num_blocks=n, max_batch_size=seats, device="cpu"),
                           InferenceConfig(max_batch_size=seats), self.alloc, self.pages)
        self.requests, self.final, self.batch, self.step = {}, {}, [], 0

    def add_request(self, request):
        req = InferenceRequest(request.request_id, [TOKEN] * request.prompt_len, max_new_tokens=request.max_tokens,
                               stop_token_ids=[EOS])
        self.requests[request.request_id] = req
        if not self.s.add_request(req):
            self.final[request.request_id] = Status.FINISHED_IGNORED
            return Finished(request.request_id, Status.FINISHED_IGNORED)

    def abort_request(self, request_id):
        if request_id in self.final or not self.s.abort_request(request_id):
            return None
        self.final[request_id] = Status.FINISHED_ABORTED
        return Finished(request_id, Status.FINISHED_ABORTED)

    def schedule(self):
        out = self.s.schedule()
        self.batch = out.prefill_requests + out.decode_requests
        scheduled = [ScheduledSeq(f"{r.request_id}#0", r.request_id, len(r.prompt_tokens), True)
                     for r in out.prefill_requests]
        scheduled += [ScheduledSeq(f"{r.request_id}#0", r.request_id, 1, False) for r in out.decode_requests]
        self.step += 1
        return SchedulerOutput(step=self.step - 1, scheduled=tuple(scheduled))

    def update(self, outcome):
        tokens = {r.request_id: EOS if f"{r.request_id}#0" in outcome.stopped else TOKEN for r in self.batch}
        done, _ = self.s.process_outputs(tokens, eos_token_id=EOS)
        for r in done:
            stopped = r.sequence.generated_tokens[-1] == EOS
            self.final[r.request_id] = Status.FINISHED_STOPPED if stopped else Status.FINISHED_LENGTH_CAPPED
        return [Finished(r.request_id, self.final[r.request_id]) for r in done]

    def snapshot(self):
        live = {RequestStatus.PENDING: Status.WAITING, RequestStatus.RUNNING: Status.RUNNING}
        statuses, seqs, refs = {}, {}, [0] * self.alloc.num_blocks
        for rid, r in self.requests.items():
            statuses[rid] = self.final.get(rid) or live[r.status]
            active = rid in self.s._active_requests
            blocks = tuple(self.pages.get_physical_blocks(r.sequence.batch_slot)) if active else ()
            for b in blocks:
                refs[b] += 1
            seqs[f"{rid}#0"] = SeqView(f"{rid}#0", rid, statuses[rid], r.sequence.total_len, None, blocks,
                                       "gpu" if blocks else None)
        return Snapshot(statuses=statuses, seqs=seqs, waiting=tuple(r.request_id for r in self.s._pending_queue),
                        running=tuple(self.s._active_requests), swapped=(), gpu_ref_counts=tuple(refs),
                        cpu_ref_counts=(), gpu_free=self.alloc.num_free_blocks, cpu_free=0,
                        gpu_free_ids=tuple(self.alloc._free_blocks), cpu_free_ids=())


# No max_model_len, no token budget, no swap, no CPU pool, FCFS, one sequence per request.
DOMAIN = ConfigDomain(length_limit=False, token_budget=False, swap=False, cpu_pool=False, priority=False, max_n=1,
                      watermark=0.0)


def make():
    return SchedulerAdapter("bllm", Bllm, profiles=("safety", "liveness"), capabilities=Bllm.capabilities,
                            domain=DOMAIN, reservation=Reservation(whole_request=True))
