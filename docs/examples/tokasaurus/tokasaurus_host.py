"""kvsched wire host for tokasaurus 0.0.4's manager (its scheduler), run in tokasaurus' own venv.

Why a host and not an in-process adapter: tokasaurus pins torch 2.6 and imports transformers,
pydra and openai, none of which kvsched's Python has. Why the manager can run here at all: its
scheduling (tokasaurus/manager/manager.py `schedule_steps`) touches the model only through
`prepare_and_submit_to_model` and reads outputs only through `handle_output`; this host calls
those real functions with the model replaced by the trace (one step in flight, i.e.
`scheduling_steps_ahead=1`), so every queue move, block allocation, prefix match, bump and
free is tokasaurus' own code. What is stubbed, and why:

- `flashinfer` (GPU attention kernels): imported by model/types.py, never called by the manager;
- `ManagerState.__post_init__` loads a tokenizer and generation config from a model folder:
  replaced by an EOS id of 0 (the manager needs only the EOS ids, since requests carry no stop
  strings);
- `prepare_and_submit_to_model` builds torch inputs for the model process: replaced by keeping
  the decision for `update`.
"""

from __future__ import annotations

import hashlib
import os
import queue
import sys
import types
from pathlib import Path
from types import SimpleNamespace

# kvsched_host.py ships with kvsched (conformance/targets/hosts/); KVSCHED_HOSTS_DIR may point
# elsewhere, else the copy in this checkout (two folders up from docs/examples/tokasaurus/).
_HOSTS = Path(__file__).resolve().parents[3] / "conformance" / "targets" / "hosts"
sys.path.insert(0, str(_HOSTS))
import kvsched_host  # noqa: E402

_OUT = kvsched_host.protocol_stream()  # before tokasaurus' imports, which may print

_flashinfer = types.ModuleType("flashinfer")
_flashinfer.__getattr__ = lambda name: type(name, (), {}) if not name.startswith("__") else None
sys.modules.setdefault("flashinfer", _flashinfer)

import torch  # noqa: E402

torch.tensor([0])  # the first tensor is slow to make: here, not inside the first timed call
from tokasaurus.common_types import ServerConfig  # noqa: E402
from tokasaurus.manager import manager as tm  # noqa: E402
from tokasaurus.manager.allocator import BatchIndexAllocator, BlockAllocator  # noqa: E402
from tokasaurus.manager.types import ManagerState, SchedulingQueue  # noqa: E402
from tokasaurus.server.types import CancelledRequest, SamplingParams, TokasaurusRequest  # noqa: E402

EOS = 0
BUMP_SUFFIX = "-bumped"  # manager.py allocate_tokens_for_decode_bumping_seqs_if_necessary


class _State(ManagerState):
    """ManagerState without the model folder: tokasaurus reads only the EOS ids from it here."""

    def __post_init__(self) -> None:
        self.tokenizer = None
        self.generation_config = SimpleNamespace(eos_token_id=EOS)
        self.logger = tm.logger if hasattr(tm, "logger") else _NullLogger()


class _NullLogger:
    def info(self, *a, **k):
        pass

    debug = warning = info


def kv_seq_id(sid: str) -> str:
    """tokasaurus names sequences `<req>-part-<i>-of-<n>` (+ `-bumped` per bump); kvsched `<req>#<i>`."""
    while sid.endswith(BUMP_SUFFIX):
        sid = sid[: -len(BUMP_SUFFIX)]
    req, rest = sid.rsplit("-part-", 1)
    return f"{req}#{rest.split('-of-')[0]}"


class TokasaurusEngine:
    """The kvsched_host engine object: plain JSON in and out."""

    def hello_extra(self) -> dict:
        return {"version": "tokasaurus 0.0.4"}

    def reset(self, config: dict) -> None:
        bs, nblocks = config["block_size"], config["num_gpu_blocks"]
        cfg = ServerConfig()
        cfg.model = "none"
        cfg.page_size = bs
        cfg.kv_cache_num_tokens = bs * nblocks
        cfg.max_seqs_per_forward = config["max_num_seqs"]
        cfg.max_tokens_per_forward = config["max_num_batched_tokens"]
        cfg.max_num_tokens_per_request = min(config["max_model_len"], bs * nblocks)
        cfg.scheduling_steps_ahead = 1  # one step in flight: kvsched's synchronous step
        cfg.track_early_stopping = False  # no completion-length predictions: reserve max_tokens
        cfg.use_spec_allocation = False
        cfg.use_hydragen = False
        cfg.allocator_sanity_checks = True
        # TOKASAURUS_PRECISE_ONBOARD=0: tokasaurus' own switch for its second admission pass,
        # which crashes on max_tokens=1 requests (README.md here); off, traces run past it.
        cfg.enable_precise_onboard = os.environ.get("TOKASAURUS_PRECISE_ONBOARD", "1") != "0"
        self.config = cfg
        self.state = _State(
            config=cfg, scheduling_queue=SchedulingQueue(),
            block_allocator=BlockAllocator(num_blocks=nblocks, page_size=bs),
            batch_index_allocator=BatchIndexAllocator(cfg.max_seqs_per_forward),
            q_manager_to_model=queue.Queue(), q_model_to_manager=queue.Queue(),
            q_server_to_manager=queue.Queue(), q_manager_to_server=queue.Queue(), process_name="manager",
        )
        self.state.stats_tracker.reset()
        self.decision = None
        self.seqs: dict = {}  # kvsched seq id -> tokasaurus Sequence (the latest, after bumps)
        self.prompt_len: dict[str, int] = {}
        self.finished: dict[str, str] = {}  # request id -> kvsched status
        self.seq_status: dict[str, str] = {}
        # Aborts tokasaurus has not carried out yet (a sequence still prefilling), and those it
        # carried out in this step's schedule(), which this step's update() reports.
        self.cancelling: set[str] = set()
        self.cancelled_now: list[str] = []
        self.order: list[str] = []
        self.mid_step = False  # between schedule() and update(): the step is in flight
        self.step_no = 0  # each trace counts its steps from 0 (normalize.check_output checks it)
        tm.prepare_and_submit_to_model = self._submit

    def _submit(self, state, decision, hydragen_groups=None):
        self.decision = decision
        return decision

    def add_request(self, request: dict):
        rid, plen, maxt = request["id"], request["prompt_len"], request["max_tokens"]
        self.order.append(rid)
        self.prompt_len[rid] = plen
        # server/utils.py validate_length: the server refuses such a request with HTTP 400.
        if plen + maxt > self.config.max_num_tokens_per_request:
            self.finished[rid] = "FINISHED_IGNORED"
            return {"request": rid, "status": "FINISHED_IGNORED"}
        ids = request.get("prompt_tokens") or [1 + (hash(rid) % 100000) * 1000 + i for i in range(plen)]
        req = TokasaurusRequest(id=rid, input_ids=list(ids), max_num_tokens=maxt,
                                sampling_params=SamplingParams(temperature=0.0, top_p=1.0),
                                stop=[], n=request.get("n", 1), ignore_eos=False)
        self.state.q_server_to_manager.put(req)
        tm.handle_new_server_commands(self.state)
        for sid in self.state.req_id_to_seq_ids[rid]:
            self.seqs[kv_seq_id(sid)] = self.state.scheduling_queue.get(sid)
        return None

    def abort_request(self, request_id: str):
        if request_id not in self.prompt_len or request_id in self.finished or request_id in self.cancelling:
            return None
        # The server answers the client at once (server/utils.py cancel_request) and tells the
        # manager, which cancels at its next loop; a sequence still prefilling is cancelled
        # only once its prefill is done (manager.py try_cancelling_requests). Until then the
        # scheduler still runs the request (running, holding its blocks, scheduled), so it is
        # reported live, and FINISHED_ABORTED from the update() of the step whose schedule()
        # dropped it (docs/ADAPTERS.md: an abort an engine finishes later).
        self.state.q_server_to_manager.put(CancelledRequest(request_id))
        tm.handle_new_server_commands(self.state)
        tm.try_cancelling_requests(self.state)
        if request_id in self.state.req_ids_to_cancel:
            self.cancelling.add(request_id)
            return None
        self.finished[request_id] = "FINISHED_ABORTED"
        return {"request": request_id, "status": "FINISHED_ABORTED"}

    def schedule(self) -> dict:
        st = self.state
        tm.try_cancelling_requests(st)  # manager_loop: before schedule_steps
        for rid in sorted(self.cancelling - set(st.req_ids_to_cancel)):  # carried out just now
            self.cancelling.discard(rid)
            self.finished[rid] = "FINISHED_ABORTED"
            self.cancelled_now.append(rid)
        before = {s.id: s for s in st.scheduling_queue.running_seqs()}
        self.decision = None
        if st.scheduling_queue.num_unfinished_seqs() > 0:
            tm.schedule_steps(st, 1)
        d = self.decision
        # A bumped sequence is replaced by a fresh one named `<id>-bumped`, queued at the head and
        # possibly onboarded (even scheduled, even finished) within this same schedule().
        fresh = {s.id: s for s in st.scheduling_queue.unfinished_seqs()}
        if d is not None:
            fresh.update({s.id: s for s in d.decoding_seqs})
            fresh.update({s.id: s for s, _ in d.prefill_seqs})
        preempted = []
        for sid, seq in before.items():
            if seq.cancelled and sid + BUMP_SUFFIX in fresh:
                self.seqs[kv_seq_id(sid)] = fresh[sid + BUMP_SUFFIX]
                if seq.request.id not in preempted:
                    preempted.append(seq.request.id)
        self.mid_step = d is not None
        scheduled = []
        if d is not None:
            for seq, n in d.prefill_seqs:
                scheduled.append({"seq": kv_seq_id(seq.id), "request": seq.request.id, "tokens": n, "prefill": True})
            for seq in d.decoding_seqs:
                scheduled.append({"seq": kv_seq_id(seq.id), "request": seq.request.id, "tokens": 1, "prefill": False})
        out = {"step": self.step_no, "scheduled": scheduled,
               "preempted": [{"request": r, "mode": "recompute"} for r in preempted]}
        self.step_no += 1
        return out

    def update(self, stopped: list) -> list:
        d, st = self.decision, self.state
        self.mid_step = False
        if d is not None:
            stop = set(stopped)
            ids = []
            for seq in d.seqs_with_tokens_to_return:
                kv = kv_seq_id(seq.id)
                ids.append(EOS if kv in stop else 1 + len(seq.seq_output.completion_ids) + 7919 * (hash(seq.id) % 1000))
            out = SimpleNamespace(schedule_id=d.id, tensors=SimpleNamespace(
                output_ids=torch.tensor(ids, dtype=torch.long), chosen_logprobs=None,
                topk_indices=None, topk_logprobs=None))
            st.q_model_to_manager.put(out)
        # handle_new_model_outputs would also check stop strings, which needs a tokenizer:
        # requests here carry none, so handle_output + finish_sequences is the same path.
        newly, with_out = set(), set()
        for o in tm.queue_iterator(st.q_model_to_manager):
            tm.handle_output(st, o, newly, with_out)
        tm.finish_sequences(st, newly)
        done = [{"request": rid, "status": "FINISHED_ABORTED"} for rid in self.cancelled_now]
        self.cancelled_now = []
        for ro in tm.queue_iterator(st.q_manager_to_server):
            if ro.id in self.finished:
                continue  # aborted: the server already answered the client
            self.cancelling.discard(ro.id)  # it finished before its abort was carried out
            reasons = {so.finish_reason for so in ro.sequence_outputs}
            status = "FINISHED_LENGTH_CAPPED" if reasons == {"length"} else "FINISHED_STOPPED"
            self.finished[ro.id] = status
            done.append({"request": ro.id, "status": status})
        return done

    def _seq_status(self, kv: str, seq) -> str:
        rid = seq.request.id
        if self.finished.get(rid) == "FINISHED_ABORTED":
            return "FINISHED_ABORTED"
        if seq.seq_output.finish_reason is not None:
            return "FINISHED_STOPPED" if seq.seq_output.finish_reason == "stop" else "FINISHED_LENGTH_CAPPED"
        if seq.id in self.state.scheduling_queue.queued_seqs:
            return "WAITING"
        return "RUNNING"

    def _computed(self, seq) -> int:
        """Tokens with KV: tokasaurus counts what it has *scheduled* (prompt_scheduled, which starts
        at the prefix-cache hit, and completion_scheduled, whose last token has no KV yet). In
        flight (after schedule, before update) kvsched wants the count from before the step, the
        cached prefix included: subtract what this step gave."""
        done = seq.prompt_scheduled + max(seq.completion_scheduled - 1, 0)
        if self.mid_step and self.decision is not None:
            if any(s is seq for s in self.decision.decoding_seqs):
                done -= 1
            for s, n in self.decision.prefill_seqs:
                if s is seq:
                    done -= n
        return max(done, 0)

    def snapshot(self) -> dict:
        st, q = self.state, self.state.scheduling_queue
        seqs = {}
        for kv, seq in self.seqs.items():
            blocks = list(seq.kv_indices or [])
            seqs[kv] = {"request": seq.request.id, "status": self._seq_status(kv, seq),
                        "num_tokens": len(seq.input_ids) + len(seq.seq_output.completion_ids),
                        "num_computed": self._computed(seq),
                        "blocks": blocks, "device": "gpu" if blocks else None}
        statuses = {}
        for rid in self.order:
            if rid in self.finished:
                statuses[rid] = self.finished[rid]
                continue
            mine = [v["status"] for k, v in seqs.items() if v["request"] == rid]
            statuses[rid] = "RUNNING" if "RUNNING" in mine else ("WAITING" if "WAITING" in mine else mine[0])

        def reqs(d):
            out = []
            for s in d.values():
                if s.request.id not in out:
                    out.append(s.request.id)
            return out

        # A sequence whose last token this step samples has left tokasaurus' queues already
        # (scheduler.py apply_decision): it is in flight, so it is listed as running.
        in_flight = {}
        if self.mid_step and self.decision is not None:
            in_flight = {s.id: s for s in self.decision.seqs_with_tokens_to_return
                         if s.request.id not in self.finished and not s.cancelled}
        alloc = st.block_allocator
        # A block in tokasaurus' prefix tree has fixed content (its token path from the root):
        # sent as its key, so COW-001 knows that two holders of it need the same KV.
        keys = []
        for b in alloc.all_blocks:
            path, node = [], b
            while node is not None and not node.is_root():
                path.append(node.contents)
                node = node.parent
            keys.append(hashlib.sha1(repr(path[::-1]).encode()).hexdigest()[:16] if b.parent is not None else None)
        return {"gpu_block_keys": keys, "statuses": statuses, "seqs": seqs,
                "waiting": reqs(q.queued_seqs),
                "running": reqs({**q.decoding_seqs, **q.prefilling_seqs, **in_flight}),
                "swapped": [],
                "gpu_ref_counts": [len(b.seq_ids) for b in alloc.all_blocks], "cpu_ref_counts": [],
                "gpu_free": alloc.num_free_blocks, "cpu_free": 0}


CAPS = ("output", "statuses", "queues", "block_tables", "ref_counts", "free_counts", "seq_lengths", "computed_tokens", "mid_step",
        "ordered_steps",  # its model runs the steps in order on one stream (RES-001, CAP-005, ADM-003)
        "output_at_finish")  # a request's output goes out only when it finishes (REQ-004, CHK-003)

if __name__ == "__main__":
    sys.exit(kvsched_host.serve(TokasaurusEngine(), "tokasaurus", ("safety", "liveness"), CAPS, stdout=_OUT))
