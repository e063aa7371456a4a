"""Scheduler configuration: the knobs of a vLLM-V0-style scheduler, validated on construction.

A bad value never reaches a scheduler: `SchedulerConfig(...)` and `SchedulerConfig.from_dict`
raise `InputError` naming the field, so a user sees ``config.block_size: must be an integer
>= 1, got 0`` and nothing else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from spec.connector import check_config as check_connector_config
from spec.errors import InputError, shown
from spec.kv_groups import KVGroup, check_with_config, parse_groups

# Upper limits on the sizes a config may ask for. The reference keeps a Python object per block
# and the torch twin a tensor row per block and per sequence, so an absurd count (10**12 blocks)
# would fill memory or hang instead of being refused; these are far above any real engine's
# (2**20 blocks of 16 tokens is 16M tokens of KV on one GPU; vLLM caps max_num_seqs at 1024).
MAX_BLOCKS = 2**20
MAX_TOKENS = 2**24
MAX_SEQS = 2**16

# Steps whose outcomes may still be in flight when the next step is scheduled. vLLM without
# pipeline parallelism keeps two batches in flight (depth 1, vllm/config/vllm.py:588-598); 2 stands
# for deeper queues (pipeline parallelism keeps pp_size + 1). The async reference implements both.
MAX_PIPELINE_DEPTH = 2

# Draft tokens per request and step (spec/speculative.py). vLLM accepts any k, but EAGLE/MTP drafters
# use 1-7 and every draft costs a token of budget and a KV slot; 16 is above every published setting.
MAX_SPECULATIVE_TOKENS = 16

PREEMPTION_MODES = ("auto", "recompute", "swap")
# "lpm" (longest prefix match first) is SGLang's cache-aware order; only the sglang flow's
# reference implements it (reference_impl.sglang_scheduler), the others refuse or read it as FCFS.
POLICIES = ("fcfs", "priority", "lpm")


@dataclass(frozen=True)
class SchedulerConfig:
    """One engine's scheduler settings.

    ``preemption_mode="auto"`` is vLLM V0's default: recompute a group that has a single live
    sequence, swap a group with several (their shared blocks would be recomputed many times).
    ``watermark`` is a fraction of the GPU blocks kept free at admission, as in vLLM
    (``watermark_blocks = int(watermark * num_gpu_blocks)``).
    """

    block_size: int = 16
    num_gpu_blocks: int = 64
    num_cpu_blocks: int = 64
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    max_model_len: int = 256
    watermark: float = 0.01
    preemption_mode: str = "auto"
    policy: str = "fcfs"
    # Today's engines (vLLM V1, nano-vllm); the defaults keep the V0 behaviour above.
    enable_chunked_prefill: bool = False  # split prompts over steps under one token budget
    max_num_partial_prefills: int = 0  # requests mid-prefill at once; 0 = no limit (vLLM V1)
    long_prefill_token_threshold: int = 0  # cap on one prefill chunk; 0 = no cap
    enable_prefix_caching: bool = False  # share full blocks across requests by content key
    # The async flow (docs/ASYNC.md): a step's outcome is processed this many steps after the step
    # was scheduled; 0 is the synchronous flow of every other scheduler.
    pipeline_depth: int = 0
    # Speculative decoding (spec/speculative.py): draft tokens a running request may be scheduled
    # with besides its next token; 0 is today's one-token decode.
    num_speculative_tokens: int = 0
    # Hybrid KV cache groups (spec/kv_groups.py, docs/HYBRID.md): group 0 is full attention (the
    # sequence's blocks), the others sliding window, chunked local, Mamba or shared, all over the
    # one GPU pool; () is today's one full-attention group.
    kv_groups: tuple[KVGroup, ...] = ()
    # An EAGLE/MTP drafter reads the hidden states of the block before the first new token, so a
    # prefix hit leaves the last matched block to be recomputed (vLLM ``use_eagle``; HYB-006).
    drop_eagle_block: bool = False
    # Multimodal and LoRA budgets (spec/encoder.py): encoder embeddings computed per step, encoder
    # outputs cached at once, distinct LoRA adapters per step. 0: the engine has no encoder (no
    # LoRA), and a trace with encoder inputs (LoRA ids) is refused.
    encoder_compute_budget: int = 0
    encoder_cache_size: int = 0
    max_loras: int = 0
    # KV connectors (spec/connector.py, docs/CONNECTORS.md): a connector supplies external KV per
    # the trace's script; a load that fails is recomputed or fails its request, as the policy says.
    kv_connector: bool = False
    kv_load_failure_policy: str = "recompute"

    def __post_init__(self) -> None:
        _positive_int("config.block_size", self.block_size, maximum=MAX_TOKENS)
        _positive_int("config.num_gpu_blocks", self.num_gpu_blocks, maximum=MAX_BLOCKS)
        _positive_int("config.num_cpu_blocks", self.num_cpu_blocks, minimum=0, maximum=MAX_BLOCKS)
        _positive_int("config.max_num_seqs", self.max_num_seqs, maximum=MAX_SEQS)
        _positive_int("config.max_num_batched_tokens", self.max_num_batched_tokens, maximum=MAX_TOKENS)
        _positive_int("config.max_model_len", self.max_model_len, maximum=MAX_TOKENS)
        if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)):
            raise InputError("config.watermark", f"must be a number in [0, 1), got {shown(self.watermark)}")
        if not (0.0 <= float(self.watermark) < 1.0) or math.isnan(self.watermark):
            raise InputError("config.watermark", f"must be in [0, 1), got {shown(self.watermark)}")
        if not isinstance(self.preemption_mode, str) or self.preemption_mode not in PREEMPTION_MODES:
            raise InputError(
                "config.preemption_mode",
                f"must be one of {', '.join(PREEMPTION_MODES)}, got {shown(self.preemption_mode)}",
            )
        if not isinstance(self.policy, str) or self.policy not in POLICIES:
            raise InputError("config.policy", f"must be one of {', '.join(POLICIES)}, got {shown(self.policy)}")
        for name in ("enable_chunked_prefill", "enable_prefix_caching"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"config.{name}", f"must be true or false, got {shown(getattr(self, name))}")
        _positive_int("config.max_num_partial_prefills", self.max_num_partial_prefills, minimum=0, maximum=MAX_SEQS)
        _positive_int("config.long_prefill_token_threshold", self.long_prefill_token_threshold, minimum=0,
                      maximum=MAX_TOKENS)
        for name in ("max_num_partial_prefills", "long_prefill_token_threshold"):
            if getattr(self, name) and not self.enable_chunked_prefill:
                raise InputError(f"config.{name}", f"limits prefill chunks, so it needs enable_chunked_prefill "
                                 f"(got {getattr(self, name)} without it)")
        _positive_int("config.pipeline_depth", self.pipeline_depth, minimum=0, maximum=MAX_PIPELINE_DEPTH)
        _positive_int("config.num_speculative_tokens", self.num_speculative_tokens, minimum=0,
                      maximum=MAX_SPECULATIVE_TOKENS)
        object.__setattr__(self, "kv_groups", parse_groups(self.kv_groups))
        check_with_config(self.kv_groups, self.enable_prefix_caching, self.enable_chunked_prefill)
        if not isinstance(self.drop_eagle_block, bool):
            raise InputError("config.drop_eagle_block", f"must be true or false, got {shown(self.drop_eagle_block)}")
        for name in ("encoder_compute_budget", "encoder_cache_size"):
            _positive_int(f"config.{name}", getattr(self, name), minimum=0, maximum=MAX_TOKENS)
        if bool(self.encoder_compute_budget) != bool(self.encoder_cache_size):
            raise InputError("config.encoder_cache_size", "an encoder needs both encoder_compute_budget and "
                             f"encoder_cache_size (got {self.encoder_compute_budget} and {self.encoder_cache_size})")
        _positive_int("config.max_loras", self.max_loras, minimum=0, maximum=MAX_SEQS)
        check_connector_config(self.kv_connector, self.kv_load_failure_policy)
        if self.kv_connector and (self.encoder_compute_budget or self.max_loras or self.kv_groups):
            # the connector's waiting pass (reference_impl/kv_connector.py) plans no encoder input,
            # adapter or extra KV group: refused rather than checked against a flow it does not follow
            raise InputError("config.kv_connector", "a KV connector beside an encoder, LoRA or hybrid KV groups is not "
                             "modelled (set encoder_compute_budget, max_loras to 0 and kv_groups to [])")
        # vLLM's SchedulerConfig refuses this too: a decode step schedules one token per running
        # sequence, so a token budget below the sequence budget could not be honoured.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise InputError(
                "config.max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}), got {self.max_num_batched_tokens}",
            )

    @property
    def watermark_blocks(self) -> int:
        """GPU blocks that admission and swap-in must leave free."""
        return int(self.watermark * self.num_gpu_blocks)

    @property
    def prompt_limit(self) -> int:
        """The longest prefill that can ever be scheduled (vLLM's ``_get_prompt_limit``).

        Without chunked prefill a prompt is prefilled in one step, so it must fit both the model
        and the step's token budget; a longer prompt is finished as ignored. With chunked prefill
        a prompt is split over steps, so only the model length limits it.
        """
        if self.enable_chunked_prefill:
            return self.max_model_len
        return min(self.max_model_len, self.max_num_batched_tokens)

    @property
    def is_hybrid(self) -> bool:
        """Whether the config names KV cache groups besides the one full-attention group."""
        return len(self.kv_groups) > 1

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens of KV."""
        return -(-num_tokens // self.block_size)

    def to_dict(self) -> dict[str, Any]:
        """Every field; the newer optional ones only when they differ from their defaults, so a
        V0 config reads and writes exactly as before they existed."""
        data = asdict(self)
        data["kv_groups"] = [g.to_dict() for g in self.kv_groups]
        for name, default in _OPTIONAL_DEFAULTS.items():
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Any, where: str = "config") -> SchedulerConfig:
        if not isinstance(data, Mapping):
            raise InputError(where, f"must be an object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise InputError(f"{where}.{str(key)[:40]}",
                                 f"unknown field (known: {', '.join(sorted(known))})")
        try:
            return cls(**dict(data))
        except InputError as err:
            if where != "config":
                raise InputError(err.where.replace("config", where, 1), err.message) from None
            raise


_OPTIONAL_DEFAULTS: dict[str, Any] = {
    "enable_chunked_prefill": False,
    "max_num_partial_prefills": 0,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": False,
    "pipeline_depth": 0,
    "num_speculative_tokens": 0,
    "kv_groups": [],
    "drop_eagle_block": False,
    "encoder_compute_budget": 0,
    "encoder_cache_size": 0,
    "max_loras": 0,
    "kv_connector": False,
    "kv_load_failure_policy": "recompute",
}


def _positive_int(where: str, value: Any, minimum: int = 1, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(where, f"must be an integer >= {minimum}, got {shown(value)}")
    if maximum is not None and value > maximum:
        raise InputError(where, f"must be at most {maximum}, got {shown(value)}")
