"""kvsched adapter host for nano-vllm's scheduler core (nano-vllm-npu, nano-vllm-fork, wicky-vllm).

Run with the target venv's Python:  python nano_vllm_host.py --pkg nanovllmnpu|nanovllm [--name NAME]

Drives the real ``<pkg>/engine/scheduler.py`` + ``block_manager.py`` + ``sequence.py`` the way
nano-vllm's ``LLMEngine.step`` does: ``schedule()`` -> one token per scheduled sequence ->
``postprocess(seqs, token_ids)``. The package ``__init__`` (torch, transformers, model code) is
never executed: a stub parent package and a stub ``<pkg>.config`` are put in ``sys.modules``
(the scheduler reads five attributes of the config). A sequence the trace stops samples the
EOS token, so nano-vllm's own EOS rule finishes it.

Token ids matter here: nano-vllm's prefix cache is always on. A request that carries
``prompt_tokens`` runs on exactly those ids and samples ``spec.types.generated_token`` (the ids
the references use, so block hashes match theirs in lockstep); a request without them runs on
ids distinct per request (``kvsched_host.token_ids``: no sharing between requests).

nano-vllm has no abort, no parallel sampling (n) and no priority: the adapter's trace strategy
keeps those out, and this host refuses them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import types
import zlib
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402

EOS = 2**31 - 1  # outside both id schemes below
VOCAB_SIZE = 50  # spec.types.VOCAB_SIZE


def generated_token(request_id: str, position: int) -> int:
    """spec.types.generated_token(request_id, 0, position) (this host cannot import kvsched)."""
    return zlib.crc32(f"{request_id}#0@{position}".encode()) % VOCAB_SIZE


def load(pkg: str):
    spec = importlib.util.find_spec(pkg)  # locates the package without executing __init__
    if spec is None or spec.origin is None:
        raise SystemExit(f"package {pkg!r} is not installed in {sys.executable}")
    parent = types.ModuleType(pkg)
    parent.__path__ = [os.path.dirname(spec.origin)]
    parent.__file__ = spec.origin
    sys.modules[pkg] = parent
    cfg = types.ModuleType(pkg + ".config")
    cfg.Config = type("Config", (SimpleNamespace,), {})
    sys.modules[pkg + ".config"] = cfg
    sched = importlib.import_module(pkg + ".engine.scheduler")
    seq = importlib.import_module(pkg + ".engine.sequence")
    sp = importlib.import_module(pkg + ".sampling_params")
    return sched.Scheduler, seq.Sequence, seq.SequenceStatus, sp.SamplingParams


class NanoEngine:
    def __init__(self, pkg: str) -> None:
        self.pkg = pkg
        self.Scheduler, self.Sequence, self.Status, self.SamplingParams = load(pkg)
        self.sched = None

    def hello_extra(self) -> dict:
        from importlib.metadata import PackageNotFoundError, version

        dist = {"nanovllmnpu": "nano-vllm-npu", "nanovllm": "nano-vllm-fork", "wickyvllm": "wicky-vllm"}.get(self.pkg, self.pkg)
        try:
            ver = version(dist)
        except PackageNotFoundError:
            ver = "unknown"
        return {"version": f"{dist}=={ver}", "source": os.path.dirname(sys.modules[self.pkg].__file__)}

    def reset(self, config: dict) -> None:
        self.config = config
        self.Sequence.block_size = config["block_size"]  # LLMEngine sets it from kvcache_block_size
        self.sched = self.Scheduler(SimpleNamespace(
            max_num_seqs=config["max_num_seqs"], max_num_batched_tokens=config["max_num_batched_tokens"],
            eos=EOS, num_kvcache_blocks=config["num_gpu_blocks"], kvcache_block_size=config["block_size"]))
        self.seqs = {}  # sid -> Sequence
        self.rid_of = {}  # nano seq_id -> request id
        self.final = {}  # request id -> final status
        self.step_no = 0
        self.pending = None  # (seqs, is_prefill, tokens per seq) between schedule and update
        self.spec_tokens = set()  # requests that came with prompt_tokens: they sample spec ids

    def add_request(self, request: dict) -> None:
        rid = request["id"]
        if request.get("n", 1) != 1:
            raise ValueError("nano-vllm has no parallel sampling (n must be 1)")
        if rid in self.final or f"{rid}#0" in self.seqs:
            raise ValueError(f"duplicate request id {rid!r}")
        params = self.SamplingParams(temperature=1.0, max_tokens=request["max_tokens"], ignore_eos=False)
        tokens = request.get("prompt_tokens")
        if tokens is None:
            tokens = kvsched_host.token_ids(rid, request["prompt_len"])
        else:
            self.spec_tokens.add(rid)
        seq = self.Sequence(list(tokens), params)
        self.seqs[f"{rid}#0"] = seq
        self.rid_of[seq.seq_id] = rid
        self.sched.add(seq)

    def abort_request(self, request_id: str):
        raise NotImplementedError("nano-vllm has no abort")

    def _sid(self, seq) -> str:
        return f"{self.rid_of[seq.seq_id]}#0"

    def schedule(self) -> dict:
        running_before = {id(s) for s in self.sched.running if s.status == self.Status.RUNNING}
        if self.sched.is_finished():
            seqs, is_prefill = [], False  # LLMEngine.generate steps only while work is left
        else:
            seqs, is_prefill = self.sched.schedule()
        scheduled = []
        for s in seqs:
            tokens = len(s) - s.num_cached_tokens if is_prefill else 1
            scheduled.append({"seq": self._sid(s), "request": self.rid_of[s.seq_id], "tokens": tokens,
                              "prefill": bool(is_prefill)})
        preempted = []
        for sid, s in self.seqs.items():
            if id(s) in running_before and s.status == self.Status.WAITING:
                preempted.append({"request": sid.rsplit("#", 1)[0], "mode": "recompute"})
        self.pending = (seqs, is_prefill)
        out = {"step": self.step_no, "scheduled": scheduled, "preempted": preempted, "swapped_in": [],
               "swap_out": [], "swap_in": [], "copies": [], "ignored": []}
        self.step_no += 1
        return out

    def update(self, stopped: list) -> list:
        if self.pending is None:
            return []
        seqs, _ = self.pending
        self.pending = None
        stop = set(stopped)
        tokens = []
        for s in seqs:
            sid = self._sid(s)
            rid = self.rid_of[s.seq_id]
            if sid in stop:
                tokens.append(EOS)
            elif rid in self.spec_tokens:
                tokens.append(generated_token(rid, len(s)))
            else:
                tokens.append(kvsched_host.token_ids(sid, 1, start=len(s))[0])
        self.sched.postprocess(seqs, tokens)
        finished = []
        for s, tok in zip(seqs, tokens, strict=True):
            rid = self.rid_of[s.seq_id]
            if s.status == self.Status.FINISHED and rid not in self.final:
                status = "FINISHED_STOPPED" if tok == EOS else "FINISHED_LENGTH_CAPPED"
                self.final[rid] = status
                finished.append({"request": rid, "status": status})
        return finished

    def snapshot(self) -> dict:
        sched = self.sched
        bm = sched.block_manager
        mid = {}
        if self.pending is not None:
            seqs, is_prefill = self.pending
            mid = {id(s): (s.num_cached_tokens if is_prefill else len(s) - 1) for s in seqs}
        statuses, views = {}, {}
        for sid, s in self.seqs.items():
            rid = sid.rsplit("#", 1)[0]
            if s.status == self.Status.FINISHED:
                status = self.final.get(rid, "FINISHED_STOPPED")
                computed = len(s) - 1
            elif s.status == self.Status.RUNNING:
                status = "RUNNING"
                computed = mid.get(id(s), len(s) - 1)
            else:
                status = "WAITING"
                computed = s.num_cached_tokens
            statuses[rid] = status
            table = list(s.block_table)
            views[sid] = {"request": rid, "status": status, "num_tokens": len(s), "num_computed": computed,
                          "blocks": table, "device": "gpu" if table else None}
        return {
            "statuses": statuses,
            "seqs": views,
            "waiting": [self._sid(s).rsplit("#", 1)[0] for s in sched.waiting],
            "running": [self._sid(s).rsplit("#", 1)[0] for s in sched.running],
            "swapped": [],
            "gpu_ref_counts": [b.ref_count for b in bm.blocks],
            "cpu_ref_counts": [0] * self.config.get("num_cpu_blocks", 0),
            "gpu_free": len(bm.free_block_ids),
            "cpu_free": self.config.get("num_cpu_blocks", 0),
            "gpu_free_ids": list(bm.free_block_ids),
            # nano's own hash per block (docs/PROTOCOL.md): a hashed block's content is fixed, so
            # COW-001 lets two requests admitted in one step share a block the first one writes
            "gpu_block_keys": [None if b.hash == -1 else f"{b.hash:016x}" for b in bm.blocks],
            "cpu_free_ids": list(range(self.config.get("num_cpu_blocks", 0))),
        }


CAPABILITIES = ["output", "statuses", "queues", "block_tables", "ref_counts", "free_counts", "free_lists",
                "seq_lengths", "computed_tokens", "mid_step"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pkg", default="nanovllmnpu")
    parser.add_argument("--name", default="nano-vllm")
    args = parser.parse_args()
    return kvsched_host.serve(NanoEngine(args.pkg), args.name, ("safety",), CAPABILITIES)


if __name__ == "__main__":
    sys.exit(main())
