# myengine_adapter.py
import myengine

from conformance.runner.adapter import SchedulerAdapter
from spec.domain import ConfigDomain
from spec.observation import Capability, SeqView, Snapshot
from spec.status import PreemptionMode, Status
from spec.types import Finished, Preempted, ScheduledSeq, SchedulerOutput

FINISHED = {"stop": Status.FINISHED_STOPPED, "length": Status.FINISHED_LENGTH_CAPPED, "ignored": Status.FINISHED_IGNORED}


class MyEngine:
    capabilities = frozenset({Capability.OUTPUT, Capability.QUEUES, Capability.STATUSES})

    def __init__(self, config):
        self.engine = myengine.Scheduler(block_size=config.block_size, num_blocks=config.num_gpu_blocks,
                                         max_seqs=config.max_num_seqs, max_tokens=config.max_num_batched_tokens,
                                         max_len=config.max_model_len)
        self.step = 0

    def add_request(self, request):
        self.engine.add(request.request_id, prompt_len=request.prompt_len, max_new=request.max_tokens)

    def abort_request(self, request_id):
        return Finished(request_id, Status.FINISHED_ABORTED) if self.engine.abort(request_id) else None

    def schedule(self):
        batch = self.engine.schedule()
        out = SchedulerOutput(
            step=self.step,
            scheduled=tuple(ScheduledSeq(sid, sid.split("#")[0], n, prompt) for sid, n, prompt in batch.items),
            preempted=tuple(Preempted(r, PreemptionMode.RECOMPUTE) for r in batch.preempted),
            ignored=tuple(batch.ignored),
        )
        self.step += 1
        return out

    def update(self, outcome):
        return [Finished(r, FINISHED[why]) for r, why in self.engine.step_done(stopped=outcome.stopped)]

    def snapshot(self):
        e = self.engine
        statuses = {r: Status[s] for r, s in e.statuses().items()}
        return Snapshot(
            statuses=statuses,  # STATUSES: each request's status and each sequence's (one per request here)
            seqs={f"{r}#0": SeqView(f"{r}#0", r, s) for r, s in statuses.items()},
            waiting=tuple(e.waiting), running=tuple(e.running), swapped=(),
        )


# No swap space, no watermark, FCFS only, one sequence per request: the runner generates and
# shrinks only traces inside this domain.
DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, priority=False, max_n=1)


def make():
    return SchedulerAdapter("myengine", MyEngine, profiles=("safety",), capabilities=MyEngine.capabilities,
                            domain=DOMAIN)
