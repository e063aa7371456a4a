"""Real third-party schedulers as conformance targets, each in its own cached virtual environment.

A target is installed by ``kvsched targets install NAME`` into
``$KVSCHED_TARGETS_DIR/<name>/venv`` (default ``~/.cache/kvsched/targets``) with pinned
versions and the least set of packages that imports the real scheduler, and is reached as
``kvsched conform --adapter NAME``: a `conformance.wire.WireAdapter` that starts the host
script ``conformance/targets/hosts/<host>.py`` with the target venv's Python. The host scripts
import the third-party package from that venv; no third-party source is copied here.

`TARGETS` maps each name to a factory (`conformance.runner.adapter.load_adapter` consults it).
Each target's `trace_strategy` keeps generated traces to configs and features its engine
accepts (documented per target below and in docs/CONFORMANCE.md).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from conformance.targets.reach import (
    ANY_ENGINE,
    CORE_EDGES,
    EAGER_FREE,
    NO_ABORTS,
    NO_DRAFTS,
    NO_PARTIAL_LIMIT,
    NO_PREFILL_CAP,
    NO_SWAP,
    ONE_SEQUENCE,
    Reach,
)
from spec.config import SchedulerConfig
from spec.domain import ConfigDomain
from spec.errors import InputError

HOSTS_DIR = Path(__file__).parent / "hosts"
TORCH_PIN = "torch==2.13.0"


def targets_dir() -> Path:
    return Path(os.environ.get("KVSCHED_TARGETS_DIR") or Path.home() / ".cache" / "kvsched" / "targets")


# ------------------------------------------------------------------------------ config strategies
@st.composite
def engine_configs(
    draw: st.DrawFn,
    *,
    watermark: float | None = None,
    cpu_blocks: bool = True,
    modes: tuple[str, ...] = ("auto", "recompute", "swap"),
    policies: tuple[str, ...] = ("fcfs", "priority"),
    budget_covers_model_len: bool = True,
    cache_holds_model_len: bool = False,
    block_sizes: tuple[int, ...] = (1, 2, 4, 8),
    max_len_blocks: int = 12,
    roomy_swap: bool = False,
    tight_cache: bool = False,
) -> SchedulerConfig:
    """Like `conformance.generation.v0.configs`, within what a real engine's config validation accepts.

    ``budget_covers_model_len``: vLLM V0/V1 without chunked prefill and nano-vllm's Config all
    refuse ``max_num_batched_tokens < max_model_len``. ``cache_holds_model_len``: vLLM V1 refuses
    at start-up a KV cache that cannot hold one max_model_len sequence
    (vllm/v1/core/kv_cache_planning.py: check_enough_kv_cache_memory). ``roomy_swap``: half the
    configs get a CPU pool at least as large as the GPU pool, so a swap victim usually fits and
    swapped groups live on to be swapped in, aborted or ignored (vLLM V0 raises when a victim does
    not fit: with pools of 0-24 blocks most swap-mode traces ended at their first swap).
    ``tight_cache``: half the configs get a GPU pool of at most 3 blocks more than one
    max_model_len sequence needs, so a few requests outgrow it and preemption (and with swap, swap-in)
    happens in a small campaign.
    """
    block_size = draw(st.sampled_from(block_sizes))
    max_num_seqs = draw(st.integers(1, 6))
    max_model_len = draw(st.integers(block_size, block_size * max_len_blocks))
    low = max(max_num_seqs, max_model_len if budget_covers_model_len else max_model_len // 2)
    need = max(2, -(-max_model_len // block_size))
    least = need if cache_holds_model_len else 2
    most = least + 3 if tight_cache and draw(st.booleans()) else max(24, need)
    num_gpu_blocks = draw(st.integers(least, most))
    num_cpu_blocks = 0
    if cpu_blocks:
        roomy = roomy_swap and draw(st.booleans())
        num_cpu_blocks = draw(st.integers(num_gpu_blocks, 2 * num_gpu_blocks + 8) if roomy else st.integers(0, 24))
    return SchedulerConfig(
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=draw(st.integers(low, max(low, max_model_len * 2 + 8))),
        max_model_len=max_model_len,
        watermark=watermark if watermark is not None else draw(st.sampled_from([0.0, 0.0, 0.05, 0.1, 0.25])),
        preemption_mode=draw(st.sampled_from(modes)),
        policy=draw(st.sampled_from(policies)),
    )


def engine_traces(config_strategy: st.SearchStrategy, *, max_n: int = 3, allow_aborts: bool = True,
                  abort_odds: int = 6, max_requests: int = 6,
                  group_limit: Callable[[SchedulerConfig], int] | None = None,
                  abort_burst: bool = False, forks_copy_on_write: bool = False,
                  min_requests: int = 1) -> st.SearchStrategy:
    from conformance.generation.v0 import traces

    return config_strategy.flatmap(lambda config: traces(config=config, max_n=max_n, allow_aborts=allow_aborts,
                                                         abort_odds=abort_odds, max_requests=max_requests,
                                                         group_limit=group_limit, abort_burst=abort_burst,
                                                         forks_copy_on_write=forks_copy_on_write,
                                                         min_requests=min_requests))


# ------------------------------------------------------------------------------ the targets
@dataclass(frozen=True)
class Target:
    name: str
    version: str  # the pinned distribution, as pip spells it
    summary: str
    host: str  # host script in conformance/targets/hosts/
    host_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    pip_steps: tuple[tuple[str, ...], ...] = ()  # each a `pip install` argument list, in order
    smoke: str = ""  # Python run in the venv after install; must print nothing on failure
    profiles: tuple[str, ...] = ("safety",)
    strategy: Callable[[], st.SearchStrategy] | None = None
    domain: ConfigDomain | None = None  # the config space `strategy` draws from; shrinking stays inside it
    files: dict[str, Any] = field(default_factory=dict)  # extra files written into the target dir
    timeout: float = 60.0
    venv_of: str = ""  # another target whose venv (and install) this one shares
    lookahead_tokens: int = 0  # slots the engine holds past a sequence's last token (CAP-006)
    # "default": `kvsched targets install all` (and CI) installs it; "nightly": too slow to install
    # from scratch within CI's budget, installed by name or by `kvsched targets install nightly`.
    install_profile: str = "default"
    # What the engine can do, so what a small campaign must reach (conformance/selftest/campaigns/coverage_gate.py);
    # None: not gated yet.
    reach: Reach | None = None

    @property
    def root(self) -> Path:
        return targets_dir() / (self.venv_of or self.name)

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.root / "installed.json"

    def installed(self) -> bool:
        return self.python.exists() and self.marker.exists()

    def command(self) -> list[str]:
        return [str(self.python), str(HOSTS_DIR / self.host), *self.host_args]

    def adapter(self):
        from conformance.wire import WireAdapter

        if not self.python.exists():
            raise InputError("--adapter", f"target {self.name!r} is not installed: run `kvsched targets install {self.name}`")
        env = {**self.env, "KVSCHED_TARGET_DIR": str(self.root)}
        adapter = WireAdapter(self.name, self.command(), profiles=self.profiles, env=env, timeout=self.timeout,
                              trace_strategy=self.strategy, lookahead_tokens=self.lookahead_tokens)
        adapter.domain = self.domain
        try:
            # Start (or reuse) the host now, outside the runner's per-call timeout: importing
            # vLLM takes 20-40 s; later adapters of the same target share this process.
            return adapter.start()
        except Exception as err:  # noqa: BLE001 - any start failure is one line for the user
            raise InputError("--adapter", f"target {self.name!r} did not start: {err}") from None


_NANO_DEPS = ("xxhash==4.1.0", "numpy==2.4.6")


def _nano_strategy() -> st.SearchStrategy:
    # nano-vllm: no watermark, no swap, no priority, no abort API, no parallel sampling.
    return engine_traces(engine_configs(watermark=0.0, cpu_blocks=False, modes=("recompute",), policies=("fcfs",)),
                         max_n=1, allow_aborts=False)


def _v0_strategy() -> st.SearchStrategy:
    # vLLM V0: the block manager's watermark is fixed at 0.01 (the Scheduler passes none).
    # n > 1: vLLM 0.10.2's LLMEngine splits such a request into n single-sequence groups before the
    # scheduler sees it (ParallelSampleSequenceGroup), but its Scheduler and block manager still
    # fork, share blocks, copy on write and swap whole groups (auto mode swaps a multi-sequence
    # group), and the host forks at the prompt step as V0's sampler did: up to 3 sequences, so
    # those paths are driven (issue 21), within what V0 takes (`_v0_group_limit`). Roomy swap spaces
    # so swapped groups live on, tight GPU caches and up to 8 requests so they are preempted and
    # swapped, aborts of one request in three plus a burst abort in half the traces so every state
    # gets aborted, and block size 1 (no partial block, so no copy-on-write) drawn less often.
    # Two traces in three are forked groups under memory pressure (`_v0_fork_pressure`), which
    # drive fork, copy-on-write after the fork and swap-in on most traces (issue 29, item 7: the
    # coverage gate wants each on at least 50 steps per 100 examples).
    everything = engine_traces(engine_configs(watermark=0.01, roomy_swap=True, tight_cache=True,
                                              block_sizes=(1, 2, 4, 4, 8)),
                               max_n=3, abort_odds=3, max_requests=8, group_limit=_v0_group_limit, abort_burst=True,
                               forks_copy_on_write=True)
    pressure = _v0_fork_pressure()
    return st.one_of(everything, pressure, pressure)


def _v0_fork_pressure() -> st.SearchStrategy:
    """Forked groups and swaps under memory pressure (`_v0_pressure_configs`), three to six
    requests each: the n > 1 groups' prompts end in a partly filled block, so the first decode
    after the fork copies on write, and single-sequence requests are swapped out and back in
    cleanly (a swapped forked group comes back only when its flattened tables fit: the
    group-swap-flattens-sharing defect in the vllm-v0 expectations)."""
    return engine_traces(_v0_pressure_configs(), max_n=3, abort_odds=4, max_requests=8, min_requests=4,
                         group_limit=_v0_group_limit, forks_copy_on_write=True, abort_burst=True)


@st.composite
def _v0_pressure_configs(draw: st.DrawFn) -> SchedulerConfig:
    """vLLM V0 configs that swap: swap or auto mode (V0 swaps a multi-sequence group), FCFS,
    blocks of 2-8 slots, a GPU pool at most 3 blocks over one max_model_len sequence, a CPU pool
    at least twice the GPU's (a victim always fits: V0 raises when one does not), and a sequence
    limit no trace reaches: V0 counts an unforked group as one seat (the group-seats deviation in
    the vllm-v0 expectations), so a binding limit would end the lockstep run at the first
    admission."""
    block_size = draw(st.sampled_from((2, 4, 8)))
    max_model_len = draw(st.integers(2 * block_size, 6 * block_size))
    need = -(-max_model_len // block_size)
    num_gpu_blocks = draw(st.integers(need, need + 3))
    return SchedulerConfig(
        block_size=block_size, num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=draw(st.integers(2 * num_gpu_blocks, 3 * num_gpu_blocks + 8)),
        max_num_seqs=16, max_num_batched_tokens=draw(st.integers(max(16, max_model_len), 2 * max_model_len + 16)),
        max_model_len=max_model_len, watermark=0.01, preemption_mode=draw(st.sampled_from(("swap", "swap", "auto"))),
        policy="fcfs")


def _v0_group_limit(config: SchedulerConfig) -> int:
    """vLLM 0.10.2 preempts a multi-sequence group by swap only (vllm/core/scheduler.py:
    Scheduler._preempt_by_recompute asserts one running sequence; auto mode swaps such groups), so
    n > 1 only outside 'recompute' mode; and at most max_num_seqs: V0 counts an unforked group as
    one seat, so a larger group, once swapped out, could never be swapped back in."""
    return 1 if config.preemption_mode == "recompute" else config.max_num_seqs


def _v1_strategy() -> st.SearchStrategy:
    # vLLM V1: recompute only (no CPU swap space), no scheduler-level parallel sampling (the
    # engine splits n>1 into independent requests), watermark 0; default path (no chunked
    # prefill, no prefix caching).
    return engine_traces(engine_configs(watermark=0.0, cpu_blocks=False, modes=("recompute",),
                                        cache_holds_model_len=True, tight_cache=True), max_n=1, abort_odds=3,
                         abort_burst=True)


def _sglang_strategy() -> st.SearchStrategy:
    # SGLang (hosts/sglang_host.py): page size 1 (block_size 1, one KV slot per token), recompute
    # only (retract_decode), no CPU pool, no watermark, FCFS, no aborts, n = 1, prompt ids (the
    # radix cache matches on them), chunked prefill off. max_model_len up to 32 tokens: with one
    # token per block the default 12 leaves SGLang's input limit (max_req_len - 5, tp_worker.py:572)
    # at 8 or less, and most prompts would be refused at the door.
    # A third of the traces are bursts that make retract_decode run (`_retraction_bursts`): the
    # plain traces never did (0 retractions in 60 traces).
    # A quarter are LoRA traces with chunked prefill (`sglang_lora_traces`, and half of those
    # `sglang_carried_chunk_lora_traces`: issue 32, the shape of sgl-project/sglang #25865), driving
    # SGLang's own can_schedule_lora_req and LoRAManager.
    from conformance.generation.sglang import sglang_carried_chunk_lora_traces, sglang_lora_traces

    plain = engine_traces(engine_configs(watermark=0.0, cpu_blocks=False, modes=("recompute",), policies=("fcfs",),
                                         block_sizes=(1,), max_len_blocks=32, cache_holds_model_len=True), max_n=1,
                          allow_aborts=False)
    lora = st.one_of(sglang_lora_traces("fcfs", roomy=True), sglang_carried_chunk_lora_traces("fcfs"))
    return st.one_of(plain, plain, _retraction_bursts(), lora)


@st.composite
def _retraction_bursts(draw: st.DrawFn):
    """k one-token prompts arriving together, each of m new tokens, on a pool of P slots, with m
    about P / 2.8. SGLang's PrefillAdder reserves a new request's whole max_new_tokens but only
    new_token_ratio (0.7, decaying) of a running one's remaining tokens, so the request admitted
    once the first batch has decoded a while overcommits the pool and the decodes retract
    (ScheduleBatch.retract_decode). The window is narrow: a sweep of P = 12..32 and m = P/4..P/2
    (k = 4, max_model_len P - 1) retracted at (P, m) = (20, 7), (22, 8), (26, 9), (28, 10),
    (30, 11), (32, 11), (32, 12) only, 7 of 74; k = 3 and 5 retract at (20, 7) and (30, 11) too."""
    from spec.trace import Arrival, Trace
    from spec.types import Request

    pool, m = draw(st.sampled_from([(20, 7), (22, 8), (26, 9), (28, 10), (30, 11), (32, 11), (32, 12)]))
    k = draw(st.integers(3, 5))
    config = SchedulerConfig(block_size=1, num_gpu_blocks=pool, num_cpu_blocks=0, max_num_seqs=6,
                             max_num_batched_tokens=2 * (pool - 1), max_model_len=pool - 1, watermark=0.0,
                             preemption_mode="recompute", policy="fcfs")
    arrivals = tuple(Arrival(0, Request(f"r{i}", 1, m)) for i in range(k))
    return Trace(config, arrivals, max_steps=30 + (k + 2) * (k * m + k + 2))


def _lmdeploy_strategy() -> st.SearchStrategy:
    # LMDeploy's PyTorch engine (hosts/lmdeploy_host.py): recompute eviction only (no swap in
    # 0.18.0's Scheduler), no CPU pool, no watermark, FCFS by arrival, n = 1; the prefill budget
    # (max_prefill_token_num) covers max_model_len so the long-context chunker never engages.
    # Block size 16: PytorchEngineConfig asserts kernel_block_size >= 16, a power of two, dividing
    # block_size (lmdeploy/messages.py:623-629); 16 is the smallest block LMDeploy accepts.
    # Half the traces share prompt prefixes (`conformance.generation.v1.token_traces` under a shared
    # system prompt, `_system_prompt`) with prefix caching on in two thirds of them, so the
    # scheduler's BlockTrie (paging/block_trie) matches, shares and evicts cached blocks; the other
    # half are the plain traces (distinct prompts, abort bursts), two thirds of them made bursts of
    # longer outputs (`_longer_outputs`) so that schedule_running preempts. The cache holds one
    # max_model_len sequence: LMDeploy's max_session_len is (num_gpu_blocks - 1) * block_size, so a
    # pool of 2-4 blocks refused almost every prompt at the door.
    from conformance.generation.v1 import token_traces

    configs = engine_configs(watermark=0.0, cpu_blocks=False, modes=("recompute",), policies=("fcfs",),
                             block_sizes=(16,), max_len_blocks=6, tight_cache=True, cache_holds_model_len=True)
    cached = configs.flatmap(lambda c: st.sampled_from([True, True, False]).map(lambda on: _prefix_cached(c, on)))
    shared = cached.flatmap(lambda c: st.tuples(token_traces(config=c, max_requests=6), st.integers(0, 2)))
    plain = st.tuples(engine_traces(configs, max_n=1), st.sampled_from([0, 24, 48]))
    return st.one_of(plain.map(lambda drawn: _longer_outputs(*drawn)), shared.map(lambda drawn: _system_prompt(*drawn)))


def _longer_outputs(trace, extra: int):
    """``trace`` as a burst of chat turns: every request arriving at the first arrival's step,
    its prompt cut to one block, with ``extra`` more tokens allowed to each (and the steps to
    finish them). LMDeploy allocates 16 tokens past a sequence's end at every allocation
    (prefill_interval), so a request of at most 12 new tokens never needs a block after its
    prefill, and it admits a second request while one runs only after 16 decode rounds or when
    fewer than half its seats are taken (``InputsMakerAsync.do_prefill_default``): without such
    bursts no trace preempted anything (0 of 200), with them 22 of 200 do."""
    import dataclasses

    if not extra:
        return trace
    first, short = trace.arrivals[0].step, trace.config.block_size
    arrivals = tuple(dataclasses.replace(a, step=first, request=dataclasses.replace(
        a.request, prompt_len=min(a.request.prompt_len, short), max_tokens=a.request.max_tokens + extra))
        for a in trace.arrivals)
    count = len(arrivals)
    return dataclasses.replace(trace, arrivals=arrivals, max_steps=trace.max_steps + (count + 2) * extra * count)


def _prefix_cached(config: SchedulerConfig, on: bool) -> SchedulerConfig:
    return SchedulerConfig(**{**config.to_dict(), "enable_prefix_caching": on})


def _system_prompt(trace, blocks: int):
    """``trace`` with the first ``blocks`` blocks of every prompt made one shared "system
    prompt" (prompt lengths unchanged). LMDeploy caches whole 16-token blocks only, and the
    token flow's stems rarely share one: 8 of 63 prefix-cached traces had a cache hit without it,
    31 of 56 with it (`BlockTrie.stats.num_hit_tokens`)."""
    import dataclasses

    head = [3 + k % 5 for k in range(blocks * trace.config.block_size)]
    arrivals = tuple(dataclasses.replace(a, request=dataclasses.replace(
        a.request, prompt_tokens=tuple(head[:a.request.prompt_len]) + a.request.prompt_tokens[len(head):]))
        for a in trace.arrivals)
    return dataclasses.replace(trace, arrivals=arrivals)


def _without_stops(trace):
    import dataclasses

    return dataclasses.replace(trace, stops=())


def _chunked(config: SchedulerConfig) -> SchedulerConfig:
    return SchedulerConfig(**{**config.to_dict(), "enable_chunked_prefill": True})


def _vidur_strategy(chunked: bool = False) -> Callable[[], st.SearchStrategy]:
    # Vidur's replica schedulers (hosts/vidur_host.py): no stop tokens (a request runs its
    # max_tokens), no aborts, no priorities, n = 1, recompute only, no CPU pool; watermark 0.01 as
    # Vidur's CacheConfig and vLLM V0 default it. Sarathi always chunks prefills at its chunk size
    # (the token budget); the vLLM and Orca schedulers never do.
    def strategy() -> st.SearchStrategy:
        configs = engine_configs(watermark=0.01, cpu_blocks=False, modes=("recompute",), policies=("fcfs",),
                                 budget_covers_model_len=not chunked)
        if chunked:
            configs = configs.map(_chunked)
        return engine_traces(configs, max_n=1, allow_aborts=False).map(_without_stops)

    return strategy


# Each target's domain, as its strategy above draws it (tests/test_config_domain.py checks that).
_NANO_DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, priority=False, aborts=False, max_n=1,
                            budget_covers_model_len=True)
_V0_DOMAIN = ConfigDomain(watermark=0.01, max_n=3, budget_covers_model_len=True)
_SGLANG_DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, priority=False, aborts=False, max_n=1,
                              budget_covers_model_len=True, cache_holds_model_len=True, chunked_prefill=True,
                              prefix_caching=True, lora=True)  # `sglang_lora_traces`: chunked, radix cache, LoRA
_LMDEPLOY_DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, priority=False, max_n=1,
                                budget_covers_model_len=True, prefix_caching=True)
_VIDUR_DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.01, priority=False, aborts=False, max_n=1,
                             budget_covers_model_len=True)
_VIDUR_CHUNKED_DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.01, priority=False, aborts=False, max_n=1,
                                     chunked_prefill=True)
_V1_DOMAIN = ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, max_n=1, budget_covers_model_len=True,
                          cache_holds_model_len=True, speculative=True)  # k > 0: an n-gram SpeculativeConfig
# vLLM V1 async: the token flow's traces (prompt ids), chunked prefill and prefix caching on or off,
# depth 1 (`conformance.selftest.campaigns.lockstep_async.path_strategy`).
_V1_ASYNC_DOMAIN = ConfigDomain(flow="v1", swap=False, cpu_pool=False, watermark=0.0, max_n=1,
                                budget_covers_model_len=True, cache_holds_model_len=True, chunked_prefill=True,
                                prefix_caching=True, pipeline_depth=1, speculative=True)


# The lifecycle edges each engine takes (the coverage gate holds a campaign to all of them).
_V0_REACH = Reach(tuple(e for e in CORE_EDGES if e != "RUNNING->FINISHED_IGNORED (preempt_then_ignore)"),
                  least_steps={"fork": 50, "copy_on_write": 50, "swap_in": 50})  # 74-219 at seeds 20261130, 1, 3
# V1 and nano-vllm: recompute only, n = 1. V1 refuses an over-long prompt at the door (an ignore
# that is no lifecycle edge: the request never waits); nano-vllm has no ignore path and no abort API.
_V1_REACH = Reach(("WAITING->RUNNING (admit)", "WAITING->FINISHED_ABORTED (abort)", "RUNNING->RUNNING (decode)",
                   "RUNNING->WAITING (preempt_recompute)", "RUNNING->FINISHED_STOPPED (finish_stop)",
                   "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)", "RUNNING->FINISHED_ABORTED (abort)"),
                  {**NO_SWAP, **ONE_SEQUENCE})
# The vllm-v1 host honours encoder inputs, LoRA, pause, grammar waits and streaming sessions (issue 32), which the target's
# own strategy never draws: their campaign is conformance.selftest.campaigns.lockstep_budgets.
_V1_BUDGETS_UNDRAWN = {i: "the target's traces draw no encoder inputs, adapters, pauses, grammar waits or "
                          "streaming sessions (the lockstep_budgets campaign does)"
                       for i in ("ENC-001", "ENC-002", "ENC-003", "ENC-004", "ENC-005", "LORA-001", "PAU-001",
                                 "GRM-001", "GRM-002", "SES-001", "SES-002", "SES-003")}
_NANO_REACH = Reach(("WAITING->RUNNING (admit)", "RUNNING->RUNNING (decode)", "RUNNING->WAITING (preempt_recompute)",
                     "RUNNING->FINISHED_STOPPED (finish_stop)", "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)"),
                    {**NO_SWAP, **ONE_SEQUENCE,
                     **{i: "no ignore path: an over-long or never-fitting prompt is admitted or waits (the LEN-002/003 "
                           "findings)" for i in ("LEN-002", "LEN-003")}})


# Vidur's replica schedulers: recompute only, n = 1, no aborts, no stop tokens (a request runs its
# max_tokens), no ignore path (LEN-002/003); Orca reserves each request's whole length at admission
# (_max_blocks_per_sequence) and so never preempts.
_VIDUR_UNEXERCISED = {**NO_SWAP, **ONE_SEQUENCE,
                      **{i: "no ignore path: an over-long prompt is run (the LEN-002/003 findings)" for i in ("LEN-002", "LEN-003")},
                      "REQ-005": "no stop tokens: a Vidur request runs exactly its max_tokens, so nothing finishes stopped"}
_VIDUR_REACH = Reach(("WAITING->RUNNING (admit)", "RUNNING->RUNNING (decode)", "RUNNING->WAITING (preempt_recompute)",
                      "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)"), _VIDUR_UNEXERCISED)
_VIDUR_ORCA_REACH = Reach(("WAITING->RUNNING (admit)", "RUNNING->RUNNING (decode)",
                           "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)"),
                          {**_VIDUR_UNEXERCISED,
                           "REQ-004": "never preempts: Orca reserves a request's whole length (max_model_len) at admission, "
                                      "so the preempted-sequence steps REQ-004 counts never come"})


# SGLang: recompute only (retract_decode), n = 1, no abort API in the host; a prompt over SGLang's
# input limit is refused in the next schedule's `ignored` (hosts/sglang_host.py: it waits until
# then), the WAITING -> FINISHED_IGNORED edge.
_SGLANG_REACH = Reach(("WAITING->RUNNING (admit)", "WAITING->FINISHED_IGNORED (ignore)", "RUNNING->RUNNING (decode)",
                       "RUNNING->WAITING (preempt_recompute)", "RUNNING->FINISHED_STOPPED (finish_stop)",
                       "RUNNING->FINISHED_LENGTH_CAPPED (finish_length)"), {**NO_SWAP, **ONE_SEQUENCE})

# Every engine above frees a finished request's blocks in the step that finishes it, and none but
# the async targets' (whose strategy draws speculative steps) schedules drafts.
# The async targets' strategy (`conformance.generation.async_paths`) draws no drafts either, and
# neither does any campaign set a limit on requests mid-prefill.
_V1_ASYNC_REACH = _V1_REACH.without(ANY_ENGINE, EAGER_FREE, NO_DRAFTS, NO_PARTIAL_LIMIT)
_V0_REACH, _V1_REACH, _NANO_REACH, _VIDUR_REACH, _VIDUR_ORCA_REACH, _SGLANG_REACH = (
    reach.without(ANY_ENGINE, EAGER_FREE, NO_DRAFTS, NO_PREFILL_CAP, NO_PARTIAL_LIMIT)
    for reach in (_V0_REACH, _V1_REACH, _NANO_REACH, _VIDUR_REACH, _VIDUR_ORCA_REACH, _SGLANG_REACH))
# Engines without an abort API in their host; vLLM V0's watermark of 0.01 keeps no block free on the
# pools its campaign draws (under 100 blocks), so the watermark rules' trigger never holds there.
_NANO_REACH, _VIDUR_REACH, _VIDUR_ORCA_REACH, _SGLANG_REACH = (
    reach.without(NO_ABORTS) for reach in (_NANO_REACH, _VIDUR_REACH, _VIDUR_ORCA_REACH, _SGLANG_REACH))
_V0_REACH = _V0_REACH.without({i: "a watermark of 0.01 keeps no block free on the pools the campaign draws (under "
                                  "100 blocks): the watermark is 0 there" for i in ("ADM-002", "ADM-004")})


def _v1_async_strategy() -> st.SearchStrategy:
    from conformance.generation.async_paths import all_paths_strategy

    return all_paths_strategy()


_V0_DEPS = (
    "regex==2026.11.19", "pydantic==2.11.9", "pydantic-core==2.33.2", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "safetensors==0.8.0", "cachetools==8.0.2", "cbor2==6.3.0", "cloudpickle==3.1.3",
    "numpy==2.2.6", "psutil==7.2.2", "setproctitle==1.3.8", "pyyaml==6.0.4", "pyzmq==27.3.0", "packaging==26.4",
    "transformers==4.56.2", "huggingface-hub==0.35.3", "tokenizers==0.22.1", "tqdm==4.70.1", "requests==2.34.2",
    "urllib3==2.8.0", "idna==3.20", "certifi==2026.10.19.post1", "msgspec==0.23.0", "blake3==1.0.11",
    "pillow==13.0.0", "pybase64==1.5.1",
)
_V1_DEPS = (
    "packaging==26.4", "pydantic==2.14.4", "pydantic-core==2.50.5", "typing-inspection==0.4.5",
    "annotated-types==0.8.0", "regex==2026.11.19", "numpy==2.4.6", "psutil==7.2.2", "cbor2==6.3.0", "pyzmq==27.3.0",
    "urllib3==2.8.0", "tqdm==4.70.1", "httpx==0.28.1", "httpcore==1.0.9", "h11==0.16.0", "idna==3.20",
    "certifi==2026.10.19.post1", "anyio==4.16.0", "sniffio==1.3.1", "pyyaml==6.0.4", "transformers==5.20.2",
    "huggingface-hub==1.33.0", "tokenizers==0.23.3", "safetensors==0.8.0", "aiohttp==3.14.5",
    "aiohappyeyeballs==2.7.1", "aiosignal==1.4.0", "attrs==26.1.0", "frozenlist==1.8.0", "multidict==7.2.1",
    "yarl==1.25.1", "propcache==0.5.4", "xgrammar==0.2.8", "apache-tvm-ffi==0.1.11", "llguidance==1.7.3",
    "fastapi==0.165.0", "starlette==1.10.0", "annotated-doc==0.0.7", "opentelemetry-api==1.45.2",
    "partial-json-parser==0.2.1.1.post7", "einops==0.8.2", "cachetools==8.0.2", "cloudpickle==3.1.3",
    "msgspec==0.23.0", "requests==2.34.2", "pillow==13.0.0", "pybase64==1.5.1", "blake3==1.0.11",
    "setproctitle==1.3.8", "py-cpuinfo==9.0.0", "openai-harmony==0.0.8", "openai==3.57.0", "uvloop==0.23.0",
    "httpx2==2.16.2", "prometheus-client==0.26.0",
)

# SGLang 0.5.23's scheduler modules import these at module level (found by importing
# sglang.srt.managers.scheduler with the stubs of hosts/sglang_stubs.py until nothing was missing).
_SGLANG_DEPS = (
    "aiohappyeyeballs==2.7.1", "aiohttp==3.14.5", "aiosignal==1.4.0", "annotated-doc==0.0.7",
    "annotated-types==0.8.0", "anyio==4.16.0", "apache-tvm-ffi==0.1.11", "attrs==26.1.0",
    "certifi==2026.10.19.post1", "click==8.5.1", "compressed-tensors==0.20.1", "dill==0.4.1", "einops==0.8.2",
    "fastapi==0.165.0", "frozenlist==1.8.0", "gguf==0.19.0", "h11==0.16.0", "httpcore2==2.16.2", "httpx2==2.16.2",
    "huggingface_hub==2.4.0", "idna==3.20", "ipython==9.18.1", "loguru==0.7.3", "msgspec==0.23.0",
    "multidict==7.2.1", "numpy==2.4.6", "openai==3.57.0", "opentelemetry-api==1.45.2", "orjson==3.13.0",
    "packaging==26.4", "partial-json-parser==0.2.1.1.post7", "pillow==13.0.0", "propcache==0.5.4", "psutil==7.2.2",
    "pybase64==1.5.1", "pydantic==2.14.4", "pydantic_core==2.50.5", "Pygments==2.21.0", "PyYAML==6.0.4",
    "pyzmq==27.3.0", "regex==2026.11.19", "requests==2.34.2", "safetensors==0.8.0", "sentencepiece==0.2.3",
    "setproctitle==1.3.8", "sniffio==1.3.1", "starlette==1.10.0", "tokenizers==0.23.3", "tqdm==4.70.1",
    "traitlets==5.16.1", "transformers==5.24.0", "triton==3.9.0", "truststore==0.10.5", "typing-inspection==0.4.5",
    "urllib3==2.8.0", "uvicorn==0.54.0", "yarl==1.25.1",
)

# LMDeploy 0.18.0's paging scheduler imports these (found by importing hosts/lmdeploy_host.py in a
# venv holding only torch and lmdeploy until nothing was missing); torch brings filelock, fsspec,
# jinja2, networkx, sympy and typing_extensions itself.
_LMDEPLOY_DEPS = (
    "annotated-types==0.8.0", "certifi==2026.10.19.post1", "h11==0.16.0", "httpcore2==2.16.2", "httpx2==2.16.2",
    "huggingface_hub==2.4.0", "idna==3.20", "numpy==2.4.6", "packaging==26.4", "pillow==13.0.0", "psutil==7.2.2",
    "pybase64==1.5.1", "pydantic==2.14.4", "pydantic_core==2.50.5", "PyYAML==6.0.4", "regex==2026.11.19",
    "requests==2.34.2", "safetensors==0.8.0", "tokenizers==0.23.3", "tqdm==4.70.1", "transformers==5.24.0",
    "truststore==0.10.5", "typing-inspection==0.4.5", "urllib3==2.8.0",
)

# vidur 0.0.26's replica schedulers and events import these (found by importing hosts/vidur_host.py
# in a venv holding only vidur until nothing was missing): its metrics (pandas, plotly, wandb,
# ddsketch) and execution-time predictors (scikit-learn) are imported at module level.
_VIDUR_DEPS = (
    "annotated-types==0.8.0", "anyio==4.16.0", "certifi==2026.10.19.post1", "charset-normalizer==3.5.3",
    "click==8.5.1", "cloudpickle==3.1.3", "ddsketch==3.0.1", "distro==1.9.0", "fasteners==0.20", "filelock==4.3.1",
    "formulaic==1.2.2", "fsspec==2026.9.0", "googleapis-common-protos==1.76.0", "h11==0.16.0", "hf-xet==1.8.0",
    "httpcore==1.0.9", "httpcore2==2.16.2", "httpx==0.28.1", "httpx2==2.16.2", "huggingface_hub==2.4.0",
    "idna==3.20", "interface_meta==2.0.1", "joblib==1.6.0", "narwhals==2.29.0", "numpy==2.4.6",
    "opentelemetry-api==1.45.2", "opentelemetry-exporter-http-transport==0.66b2",
    "opentelemetry-exporter-otlp-common==0.66b2", "opentelemetry-exporter-otlp-proto-common==1.45.2",
    "opentelemetry-exporter-otlp-proto-http==1.45.2", "opentelemetry-proto==1.45.2", "opentelemetry-sdk==1.45.2",
    "opentelemetry-semantic-conventions==0.66b2", "packaging==26.4", "pandas==3.1.1", "patsy==1.0.3",
    "platformdirs==4.14.9", "plotly==7.1.0", "plotly-express==0.4.1", "protobuf==7.36.2", "pydantic==2.14.4",
    "pydantic_core==2.50.5", "python-dateutil==4.0.0", "PyYAML==6.0.4", "requests==2.34.2", "scikit-learn==1.9.1",
    "scipy==1.17.1", "six==1.17.0", "sniffio==1.3.1", "statsmodels==0.15.0", "threadpoolctl==3.8.0", "tqdm==4.70.1",
    "truststore==0.10.5", "typing-inspection==0.4.5", "typing_extensions==4.16.0", "tzdata==2026.6",
    "urllib3==2.8.0", "wandb==0.31.0", "wrapt==2.5.2", "xxhash==4.1.0",
)

# A tiny llama config: vLLM V1's ModelConfig reads only config.json (no weights, no tokenizer).
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1024,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "float32", "bos_token_id": 1,
    "eos_token_id": 2,
}

_TARGET_LIST = [
    Target(
        "nano-vllm", "nano-vllm-npu==0.0.2", "nano-vllm's scheduler core (engine/scheduler.py, block_manager.py)",
        "nano_vllm_host.py", ("--pkg", "nanovllmnpu", "--name", "nano-vllm"),
        pip_steps=(("--no-deps", "nano-vllm-npu==0.0.2", *_NANO_DEPS),),
        smoke="import importlib.util; assert importlib.util.find_spec('nanovllmnpu')",
        strategy=_nano_strategy, domain=_NANO_DOMAIN, timeout=30.0, reach=_NANO_REACH,
    ),
    Target(
        "nano-vllm-fork", "nano-vllm-fork==20260210", "nano-vllm fork with CFG pairing (package nanovllm)",
        "nano_vllm_host.py", ("--pkg", "nanovllm", "--name", "nano-vllm-fork"),
        pip_steps=(("--no-deps", "nano-vllm-fork==20260210", *_NANO_DEPS),),
        smoke="import importlib.util; assert importlib.util.find_spec('nanovllm')",
        strategy=_nano_strategy, domain=_NANO_DOMAIN, timeout=30.0, reach=_NANO_REACH,
    ),
    Target(
        "vllm-v0", "vllm==0.10.2", "vLLM V0 Scheduler + SelfAttnBlockSpaceManager (vllm/core/scheduler.py)",
        "vllm_v0_host.py", env={"VLLM_USE_V1": "0", "VLLM_TARGET_DEVICE": "cpu"},
        pip_steps=((TORCH_PIN,), ("--no-deps", "vllm==0.10.2"), ("--no-deps", *_V0_DEPS)),
        smoke="from vllm.core.scheduler import Scheduler; from vllm.config import SchedulerConfig, CacheConfig",
        profiles=("vllm-v0", "safety"), strategy=_v0_strategy, domain=_V0_DOMAIN, reach=_V0_REACH,
    ),
    Target(
        "vllm-v1", "vllm==0.33.0", "vLLM V1 Scheduler + KVCacheManager (vllm/v1/core/sched/scheduler.py)",
        "vllm_v1_host.py", env={"VLLM_TARGET_DEVICE": "cpu"},
        pip_steps=((TORCH_PIN,), ("--no-deps", "vllm==0.33.0"), ("--no-deps", *_V1_DEPS)),
        smoke="from vllm.v1.core.sched.scheduler import Scheduler; from vllm.config import ModelConfig, VllmConfig",
        strategy=_v1_strategy, domain=_V1_DOMAIN, files={"tiny-llama/config.json": TINY_LLAMA},
        profiles=("safety", "vllm-v1"), reach=_V1_REACH.without(_V1_BUDGETS_UNDRAWN),
    ),
    Target(
        "vllm-v1-async", "vllm==0.33.0",
        "vLLM V1 AsyncScheduler driven as EngineCore.step_with_batch_queue drives it: outcomes one step late "
        "(vllm/v1/core/sched/async_scheduler.py); shares the vllm-v1 venv",
        "vllm_v1_async_host.py", env={"VLLM_TARGET_DEVICE": "cpu"}, venv_of="vllm-v1",
        smoke="from vllm.v1.core.sched.async_scheduler import AsyncScheduler",
        strategy=_v1_async_strategy, domain=_V1_ASYNC_DOMAIN, profiles=("safety", "async"),
        lookahead_tokens=1,  # the in-flight token's slot is allocated when its step is scheduled
        reach=_V1_ASYNC_REACH,
    ),
    Target(
        "vllm-v1-async-0.29", "vllm==0.29.0",
        "vLLM 0.29.0's AsyncScheduler (the version vllm-project/vllm#57562 was reported on), driven as "
        "vllm-v1-async drives 0.33.0; own venv",
        "vllm_v1_async_host.py", ("--name", "vllm-v1-async-0.29"), env={"VLLM_TARGET_DEVICE": "cpu"},
        pip_steps=((TORCH_PIN,), ("--no-deps", "vllm==0.29.0"), ("--no-deps", *_V1_DEPS)),
        smoke="from vllm.v1.core.sched.async_scheduler import AsyncScheduler",
        strategy=_v1_async_strategy, domain=_V1_ASYNC_DOMAIN, profiles=("safety", "async"),
        files={"tiny-llama/config.json": TINY_LLAMA}, lookahead_tokens=1, reach=_V1_ASYNC_REACH,
    ),
    Target(
        "sglang", "sglang==0.5.23", "SGLang scheduler: PrefillAdder, SchedulePolicy, ScheduleBatch, RadixCache",
        "sglang_host.py", pip_steps=((TORCH_PIN,), ("--no-deps", "sglang==0.5.23"), ("--no-deps", *_SGLANG_DEPS)),
        smoke=f"import sys; sys.path.insert(0, {str(HOSTS_DIR)!r}); import sglang_stubs; sglang_stubs.load()",
        strategy=_sglang_strategy, domain=_SGLANG_DOMAIN, install_profile="nightly", reach=_SGLANG_REACH,
        files={"tiny-llama/config.json": TINY_LLAMA},
    ),
]
_TARGET_LIST.append(Target(
    "lmdeploy", "lmdeploy==0.18.0",
    "LMDeploy PyTorch engine: paging.Scheduler, its prefill scheduler, recompute eviction, block manager",
    "lmdeploy_host.py", pip_steps=((TORCH_PIN,), ("--no-deps", "lmdeploy==0.18.0"), ("--no-deps", *_LMDEPLOY_DEPS)),
    smoke=f"import sys; sys.path.insert(0, {str(HOSTS_DIR)!r}); import lmdeploy_host; lmdeploy_host.load()",
    strategy=_lmdeploy_strategy, domain=_LMDEPLOY_DOMAIN, reach=_V1_REACH,  # V1's edges: recompute, n = 1, aborts
    # AREngineStrategy.get_prealloc_size (strategies/ar/engine.py:14): every allocation, prefill
    # and decode, reserves prefill_interval (16) tokens past the sequence's last one.
    lookahead_tokens=16,
    install_profile="nightly",  # 190 s from scratch here (load 12; torch is most of it)
))
_TARGET_LIST.append(Target(
    "aphrodite", "aphrodite-engine==0.24.1",
    "Aphrodite V1 Scheduler + KVCacheManager (aphrodite/v1/core/sched/scheduler.py; a vLLM fork)",
    "aphrodite_host.py", env={"APHRODITE_TARGET_DEVICE": "cpu", "VLLM_TARGET_DEVICE": "cpu"},
    pip_steps=((TORCH_PIN,), ("--no-deps", "aphrodite-engine==0.24.1"), ("--no-deps", *_V1_DEPS)),
    smoke="from aphrodite.v1.core.sched.scheduler import Scheduler; from aphrodite.config import AphroditeConfig",
    strategy=_v1_strategy, domain=_V1_DOMAIN, files={"tiny-llama/config.json": TINY_LLAMA},
    profiles=("safety", "vllm-v1"), reach=_V1_REACH,
    install_profile="nightly",  # a large wheel: 389 s from scratch here (load 12)
))
for _kind, _what in (("vllm", "vLLM (V0)"), ("sarathi", "Sarathi-Serve (chunked prefill)"), ("orca", "Orca")):
    _TARGET_LIST.append(Target(
        f"vidur-{_kind}", "vidur==0.0.26",
        f"Vidur simulator's {_what} replica scheduler, driven through its own batch events "
        f"(vidur/scheduler/replica_scheduler/{_kind}_replica_scheduler.py)",
        "vidur_host.py", ("--scheduler", _kind), venv_of="" if _kind == "vllm" else "vidur-vllm",
        pip_steps=(("--no-deps", "vidur==0.0.26"), ("--no-deps", *_VIDUR_DEPS)) if _kind == "vllm" else (),
        smoke=("from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler; "
               "from vidur.events.batch_end_event import BatchEndEvent"),
        strategy=_vidur_strategy(chunked=_kind == "sarathi"),
        domain=_VIDUR_CHUNKED_DOMAIN if _kind == "sarathi" else _VIDUR_DOMAIN, timeout=30.0,
        reach=_VIDUR_ORCA_REACH if _kind == "orca" else _VIDUR_REACH,
    ))
TARGET_SPECS: dict[str, Target] = {t.name: t for t in _TARGET_LIST}
TARGETS: dict[str, Callable[[], Any]] = {t.name: t.adapter for t in _TARGET_LIST}


def install_names(names: list[str]) -> list[str]:
    """Expand ``all`` (every target of the default install profile) and ``nightly`` (the slow ones)."""
    out: list[str] = []
    for name in names:
        if name in ("all", "nightly"):
            profile = "default" if name == "all" else "nightly"
            out += [t.name for t in _TARGET_LIST if t.install_profile == profile]
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def get_target(name: str) -> Target:
    if name not in TARGET_SPECS:
        raise InputError("NAME", f"unknown target {name!r} (known: {', '.join(TARGET_SPECS)})")
    return TARGET_SPECS[name]


def install(name: str, *, log: Callable[[str], None] = print, force: bool = False) -> dict[str, Any]:
    """Create the target's venv (reused when present unless ``force``), pip-install its pinned
    packages, write its extra files, smoke-test the import and write ``installed.json``.
    Raises `RuntimeError` with one line naming the step that failed."""
    target = get_target(name)
    if target.venv_of:  # the same pinned packages: installing it installs the target it shares
        return install(target.venv_of, log=log, force=force)
    root = target.root
    venv = root / "venv"
    started = time.monotonic()
    if force and venv.exists():
        shutil.rmtree(venv)
    root.mkdir(parents=True, exist_ok=True)
    if not target.python.exists():
        log(f"{name}: creating {venv}")
        _run([sys.executable, "-m", "venv", str(venv)], f"{name}: python -m venv")
    for args in target.pip_steps:
        log(f"{name}: pip install {' '.join(args[:3])}{' ...' if len(args) > 3 else ''}")
        _run([str(target.python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
             f"{name}: pip install {' '.join(args[:2])}")
    for rel, content in target.files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=2) + "\n")
    if target.smoke:
        log(f"{name}: smoke test (import the scheduler)")
        _run([str(target.python), "-c", target.smoke], f"{name}: smoke import", env={**os.environ, **target.env})
    info = {"version": 1, "target": name, "package": target.version, "venv": str(venv),
            "seconds": round(time.monotonic() - started, 1), "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    target.marker.write_text(json.dumps(info, indent=2) + "\n")
    return info


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): {lines[-1] if lines else 'no output'}")


def status(name: str) -> dict[str, Any]:
    target = get_target(name)
    info: dict[str, Any] = {"name": name, "package": target.version, "venv": str(target.root / "venv"),
                            "installed": target.installed(), "summary": target.summary}
    if target.marker.exists():
        try:
            info["install"] = json.loads(target.marker.read_text())
        except (OSError, json.JSONDecodeError):
            info["installed"] = False
    elif target.python.exists():
        info["note"] = "venv present but not verified: run `kvsched targets install`"
    return info
