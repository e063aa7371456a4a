"""Triggers: when an invariant has something to check, as statements about its subject.

An invariant declares its trigger with ``when=`` (`spec.rules`): a function of the run's context
(the config, the requests) and the subject. For a rule about one sequence,
request or pool the trigger chooses the subjects it is handed (a rule about running sequences is
handed running sequences); for a rule about the step it says which steps count. Either way the
runner counts, per rule, the subjects whose trigger held: what a run exercised, and a rule that
never had its trigger hold in a run is vacuous there, never a pass. Each trigger's docstring is
how reports and docs name it. tests/test_subjects.py holds every trigger to its rule: a rule finds
nothing on a subject its trigger does not hold for.
"""

from __future__ import annotations

from spec.invariants._evaluation import PoolAt, RequestAt, SeqAt
from spec.invariants._views import (
    admitted,
    finished_holders,
    keyed_blocks,
    returned_step,
    running_seq_count,
    shared_blocks,
    snapshots,
    tables,
    waiting_holders,
)
from spec.observation import StepRecord
from spec.rules import CheckContext
from spec.status import QUEUES, PreemptionMode, Status

# -- one sequence ------------------------------------------------------------------------------


def holds_blocks(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence holds a block"""
    return bool(seq.view.blocks)


def running_or_swapped(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence is running or swapped"""
    return seq.view.status is Status.RUNNING or seq.view.status is Status.SWAPPED


def unfinished(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence is unfinished"""
    return not seq.view.status.is_finished


def running(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence is running"""
    return seq.view.status is Status.RUNNING


def swapped(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence is swapped"""
    return seq.view.status is Status.SWAPPED


def waiting(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence is waiting and is no streaming session's (spec/session.py: it keeps its KV)"""
    return seq.view.status is Status.WAITING and seq.view.request_id not in ctx.sessions


def finished(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence is finished"""
    return seq.view.status.is_finished


def has_tokens(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence's token ids are observed"""
    return seq.view.token_ids is not None


# -- one request -------------------------------------------------------------------------------


def known_or_queued(ctx: CheckContext, req: RequestAt) -> bool:
    """the scheduler knows the request or a queue names it"""
    return req.status is not None or bool(req.queues)


def added(ctx: CheckContext, req: RequestAt) -> bool:
    """the request was added"""
    return req.added


def reported_finished(ctx: CheckContext, req: RequestAt) -> bool:
    """the request was reported finished before this step"""
    return req.reported is not None


# -- the step's output -------------------------------------------------------------------------


def names_requests(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step's output schedules, preempts or swaps in a request"""
    return bool(rec.output.scheduled or rec.output.preempted or rec.output.swapped_in)


# -- one pool ----------------------------------------------------------------------------------


def gpu_pool(ctx: CheckContext, pool: PoolAt) -> bool:
    """the GPU pool"""
    return pool.device == "gpu"


def cpu_pool_in_use(ctx: CheckContext, pool: PoolAt) -> bool:
    """the CPU pool is not all free: a block referenced, not counted free, or named by a table"""
    if pool.device != "cpu":
        return False
    refs, free, free_ids = pool.refs or (), pool.free, pool.free_ids or ()
    if any(refs) or (free is not None and free != len(refs)) or len(free_ids) != len(refs):
        return True
    return pool.snap.seqs is not None and bool(tables(pool.snap, "cpu"))


def pool_in_use(ctx: CheckContext, pool: PoolAt) -> bool:
    """the GPU pool, or a CPU pool that is not all free"""
    return pool.device == "gpu" or cpu_pool_in_use(ctx, pool)


# -- the step ----------------------------------------------------------------------------------


def finished_holders_at_start(ctx: CheckContext, rec: StepRecord) -> bool:
    """a finished sequence holds blocks when the step begins"""
    return rec.before.seqs is not None and bool(finished_holders(rec.before))


def runs(ctx: CheckContext, rec: StepRecord) -> bool:
    """a sequence is running after schedule() or after the step"""
    return any(running_seq_count(snap) for _, snap in snapshots(rec) if snap.seqs is not None)


def running_or_named(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request was running when the step began, or the step's output names one"""
    return bool(rec.before.running) or names_requests(ctx, rec)


def admits(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step admits a waiting request"""
    return bool(admitted(rec))


def admits_or_waiting_holds(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step admits a waiting request, or a waiting sequence holds blocks after schedule()"""
    return bool(admitted(rec)) or (rec.mid is not None and rec.mid.seqs is not None and bool(waiting_holders(rec.mid)))


def admits_under_watermark(ctx: CheckContext, rec: StepRecord) -> bool:
    """the watermark is above zero and the step admits a prompt or swaps a request in"""
    return ctx.config.watermark_blocks > 0 and bool(admitted(rec) or rec.output.swapped_in)


def admits_beside_running_under_watermark(ctx: CheckContext, rec: StepRecord) -> bool:
    """the watermark is above zero and the step admits beside running requests (or more than one)"""
    entered = admitted(rec)
    return ctx.config.watermark_blocks > 0 and bool(entered) and (len(entered) > 1 or bool(rec.before.running))


def finishes_or_ignores(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished or ignored"""
    return bool(rec.finished or rec.output.ignored)


def long_prefill_contended(ctx: CheckContext, rec: StepRecord) -> bool:
    """long_prefill_token_threshold is set, more than one request is running or waiting, and the step schedules"""
    return (ctx.config.long_prefill_token_threshold > 0 and bool(rec.output.scheduled)
            and len(rec.before.running or ()) + len(rec.before.waiting or ()) > 1)


def partial_prefills_limited(ctx: CheckContext, rec: StepRecord) -> bool:
    """max_num_partial_prefills is set and a sequence is running"""
    return ctx.config.max_num_partial_prefills > 0 and bool(rec.after.running)


def schedules(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step schedules a sequence"""
    return bool(rec.output.scheduled)


def schedules_a_prefill(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step schedules a prefill"""
    return any(item.is_prefill for item in rec.output.scheduled)


def swaps_out(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step swaps a request out (a swap-out map, or a preemption by swap)"""
    return bool(rec.output.swap_out) or any(p.mode is PreemptionMode.SWAP for p in rec.output.preempted)


def swaps_in(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step swaps a request in (a swap-in map, or a request named swapped in)"""
    return bool(rec.output.swap_in or rec.output.swapped_in)


def swaps(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step swaps a request out or in"""
    return swaps_out(ctx, rec) or swaps_in(ctx, rec)


def copies(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step copies a block (copy-on-write)"""
    return bool(rec.output.copies)


def preempts(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step preempts a request"""
    return bool(rec.output.preempted)


def preempts_by_recompute(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step preempts a request by recompute"""
    return any(p.mode is PreemptionMode.RECOMPUTE for p in rec.output.preempted)


def finishes(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished"""
    return bool(rec.finished)


def finishes_or_preempts(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished or preempts one"""
    return bool(rec.finished or rec.output.preempted)


def finishes_stopped(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished as stopped"""
    return any(f.status is Status.FINISHED_STOPPED for f in rec.finished)


def finishes_length_capped(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished as length-capped"""
    return any(f.status is Status.FINISHED_LENGTH_CAPPED for f in rec.finished)


def finishes_aborted(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished as aborted"""
    return any(f.status is Status.FINISHED_ABORTED for f in rec.finished)


def ignores_or_refuses(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step ignores a request, or one is refused at add_request"""
    return bool(rec.output.ignored or rec.refused)


def drafts(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step schedules draft tokens"""
    return any(item.num_drafts for item in rec.output.scheduled)


def decides_drafts(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step's outcome decides on drafts (accepts, rejects or empties a speculative step)"""
    return bool(rec.drafts)


def resets_prefix_cache(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step calls reset_prefix_cache"""
    return any(op == "reset_prefix_cache" for op, _ in rec.admin)


def others_wait(ctx: CheckContext, rec: StepRecord) -> bool:
    """more than one request is waiting when the step begins"""
    return len(rec.before.waiting or ()) > 1


def some_swapped(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request is swapped when the step begins"""
    return bool(rec.before.swapped)


def prefills_beside_running(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step schedules a prefill while requests are running"""
    return bool(rec.before.running) and any(item.is_prefill for item in rec.output.scheduled)


def a_queue_holds_two(ctx: CheckContext, rec: StepRecord) -> bool:
    """a queue holds more than one request after schedule() or after the step"""
    return any(len(snap.queue(name) or ()) > 1 for _, snap in snapshots(rec) for name in QUEUES)


def runnable_work(ctx: CheckContext, rec: StepRecord) -> bool:
    """a request is waiting, running or swapped when the step begins"""
    return bool(rec.before.waiting or rec.before.running or rec.before.swapped)


def only_waiting(ctx: CheckContext, rec: StepRecord) -> bool:
    """requests wait while none runs or is swapped"""
    return bool(rec.before.waiting) and not rec.before.running and not rec.before.swapped


def requests_added(ctx: CheckContext, run: CheckContext) -> bool:
    """a request was added in the run"""
    return bool(run.requests)


def speculative(ctx: CheckContext, rec: StepRecord) -> bool:
    """speculative decoding is on (num_speculative_tokens > 0) and the step schedules or returns an outcome"""
    return ctx.config.num_speculative_tokens > 0 and (bool(rec.output.scheduled) or returned_step(ctx, rec) is not None)


def returns_speculative(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step processes the outcome of a step that scheduled drafts (or whose outcome was empty)"""
    if not ctx.config.num_speculative_tokens:
        return False
    returned = returned_step(ctx, rec)
    return returned is not None and any(item.num_drafts or returned.decision(item.seq_id).empty
                                        for item in returned.scheduled.values())


def speculative_keys(ctx: CheckContext, rec: StepRecord) -> bool:
    """speculative decoding is on and a GPU block carries a prefix-cache key after the step"""
    return bool(ctx.config.num_speculative_tokens) and rec.after.gpu_block_keys is not None \
        and bool(keyed_blocks(rec.after))


def finishes_delivered(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished stopped or length-capped"""
    return any(f.status in (Status.FINISHED_STOPPED, Status.FINISHED_LENGTH_CAPPED) for f in rec.finished)


def in_flight_observed(ctx: CheckContext, rec: StepRecord) -> bool:
    """outcomes are pipelined (pipeline_depth > 0), or a sequence shows an in-flight counter"""
    if ctx.config.pipeline_depth:
        return True
    return any(any(c) for _, snap in snapshots(rec) if snap.in_flight for c in snap.in_flight.values()) \
        or any(any(c) for c in (rec.before.in_flight or {}).values())


def pipelined_writes(ctx: CheckContext, rec: StepRecord) -> bool:
    """outcomes are pipelined (pipeline_depth > 0) and the step schedules"""
    return ctx.config.pipeline_depth > 0 and bool(rec.output.scheduled)


def finishes_delivered_in_flight(ctx: CheckContext, rec: StepRecord) -> bool:
    """the step reports a request finished stopped or length-capped, with in-flight counters shown"""
    return rec.mid is not None and rec.mid.in_flight is not None and finishes_delivered(ctx, rec)


def keyed(ctx: CheckContext, rec: StepRecord) -> bool:
    """a GPU block carries a prefix-cache key after schedule() or after the step"""
    return any(snap.gpu_block_keys is not None and keyed_blocks(snap) for _, snap in snapshots(rec))


def shares_blocks(ctx: CheckContext, rec: StepRecord) -> bool:
    """two table entries name one GPU block after schedule() or after the step"""
    return any(snap.seqs is not None and shared_blocks(snap, "gpu", ctx.config.num_gpu_blocks) != frozenset()
               for _, snap in snapshots(rec))


# -- one sequence, with the run's context ------------------------------------------------------


def has_generated(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence has a generated token"""
    request = ctx.requests.get(seq.view.request_id)
    tokens = seq.view.token_ids
    return request is not None and tokens is not None and len(tokens) > request.prompt_len


def of_finished_request(ctx: CheckContext, seq: SeqAt) -> bool:
    """the sequence's request was reported finished before this step"""
    return seq.view.request_id in ctx.finished
