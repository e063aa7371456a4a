"""The config domain of a scheduler: which configs and traces its engine can be given at all.

A real engine accepts only part of `spec.config.SchedulerConfig`'s space: nano-vllm has no swap
space and no abort API, vLLM V0 fixes its watermark at 0.01, vLLM V1 refuses a token budget
below ``max_model_len`` without chunked prefill, a toy engine may have no sequence limit at
all. A trace outside that space tests the adapter's translation, not the scheduler, so an
adapter declares its domain (``domain = ConfigDomain(...)``) and the runner keeps generation
(`conformance.generation.domain.traces_in`) and shrinking (`conformance.runner.shrink.shrink`) inside it.

The domain is data: `to_dict` / `from_dict` carry it from the adapter's process to the runner's
(which never imports the adapter), and `why_not` says, in one line naming the field, why a
config or trace is outside it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from spec.config import MAX_PIPELINE_DEPTH, SchedulerConfig
from spec.errors import InputError

VERSION = 1
FLOWS = ("v0", "v1", "nano")  # which trace family: V0's (groups, swap) or the token flows' (prompt ids)
# A "no limit" engine is given a limit it can never reach: generated traces have at most
# 6 requests of at most 3 sequences, far below this many.
UNBOUNDED_SEQS = 64


@dataclass(frozen=True)
class ConfigDomain:
    """The configs and traces an adapter supports. The defaults are the whole V0 space."""

    flow: str = "v0"  # trace family: "v0" (n > 1 groups, no prompt ids), "v1" or "nano" (prompt ids)
    swap: bool = True  # preemption by swap ("swap" and "auto" modes)
    cpu_pool: bool = True  # num_cpu_blocks > 0
    watermark: float | None = None  # None: any watermark; a number: only that one
    priority: bool = True  # the priority policy (else FCFS only)
    lpm: bool = False  # SGLang's lpm policy (longest cached prefix first)
    aborts: bool = True  # abort_request is called
    max_n: int = 3  # parallel sequences per request
    seq_limit: bool = True  # False: the engine has no sequence limit (max_num_seqs >= UNBOUNDED_SEQS)
    token_budget: bool = True  # False: no per-step token budget (it never binds)
    chunked_prefill: bool = False
    # False: the engine always splits a prompt past the step's budget (tokasaurus), so every
    # config has chunked prefill on; only read when chunked_prefill is True.
    unchunked: bool = True
    # False: no long_prefill_token_threshold and no max_num_partial_prefills (both vLLM V1 knobs)
    prefill_caps: bool = True
    prefix_caching: bool = False
    budget_covers_model_len: bool = False  # without chunked prefill, budget >= max_model_len (vLLM, nano-vllm)
    cache_holds_model_len: bool = False  # the GPU cache holds one max_model_len sequence (vLLM V1)
    pipeline_depth: int = 0  # the engine's pipeline depth (config.pipeline_depth): fixed, not drawn
    speculative: bool = False  # the engine schedules draft tokens (config.num_speculative_tokens > 0)
    encoder: bool = False  # encoder inputs under an encoder budget and cache (spec/encoder.py)
    lora: bool = False  # LoRA requests under max_loras (spec/encoder.py)

    def __post_init__(self) -> None:
        if self.flow not in FLOWS:
            raise InputError("domain.flow", f"must be one of {', '.join(FLOWS)}, got {self.flow!r}")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise InputError(f"domain.{f.name}", f"must be true or false, got {value!r}")
        if isinstance(self.max_n, bool) or not isinstance(self.max_n, int) or self.max_n < 1:
            raise InputError("domain.max_n", f"must be an integer >= 1, got {self.max_n!r}")
        if isinstance(self.pipeline_depth, bool) or not isinstance(self.pipeline_depth, int) \
                or not 0 <= self.pipeline_depth <= MAX_PIPELINE_DEPTH:
            raise InputError("domain.pipeline_depth", f"must be an integer in 0..{MAX_PIPELINE_DEPTH}, "
                             f"got {self.pipeline_depth!r}")
        if self.watermark is not None:
            if isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float)) \
                    or not 0.0 <= self.watermark < 1.0:
                raise InputError("domain.watermark", f"must be null or a number in [0, 1), got {self.watermark!r}")
        if self.flow != "v0" and self.max_n != 1:
            raise InputError("domain.max_n", f"the {self.flow} flow's traces have one sequence per request, got {self.max_n}")

    # -- membership ----------------------------------------------------------------------------
    def why_not(self, item: SchedulerConfig | Any) -> str | None:
        """None when ``item`` (a config or a `spec.trace.Trace`) is inside the domain; else one
        line naming the first field that is not."""
        config = item if isinstance(item, SchedulerConfig) else item.config
        reason = self._config_why_not(config)
        if reason or isinstance(item, SchedulerConfig):
            return reason
        for arrival in item.arrivals:
            if arrival.request.n > self.max_n:
                return f"request {arrival.request.request_id}.n: {arrival.request.n} > the domain's max_n {self.max_n}"
            if self.flow != "v0" and arrival.request.prompt_tokens is None:
                return f"request {arrival.request.request_id}.prompt_tokens: the {self.flow} flow needs prompt ids"
        if item.aborts and not self.aborts:
            return f"aborts: the domain has no aborts, the trace has {len(item.aborts)}"
        return None

    def admits(self, item: SchedulerConfig | Any) -> bool:
        return self.why_not(item) is None

    def _config_why_not(self, c: SchedulerConfig) -> str | None:
        if c.pipeline_depth != self.pipeline_depth:
            return f"config.pipeline_depth: the domain's engine runs at depth {self.pipeline_depth}, got {c.pipeline_depth}"
        if not self.speculative and c.num_speculative_tokens:
            return f"config.num_speculative_tokens: the domain has no speculative decoding, got {c.num_speculative_tokens}"
        if not self.encoder and c.encoder_cache_size:
            return f"config.encoder_cache_size: the domain has no encoder, got {c.encoder_cache_size}"
        if not self.lora and c.max_loras:
            return f"config.max_loras: the domain has no LoRA, got {c.max_loras}"
        if not self.swap and c.preemption_mode != "recompute":
            return f"config.preemption_mode: the domain has no swap, got {c.preemption_mode!r}"
        if not self.cpu_pool and c.num_cpu_blocks:
            return f"config.num_cpu_blocks: the domain has no CPU pool, got {c.num_cpu_blocks}"
        if self.watermark is not None and c.watermark != self.watermark:
            return f"config.watermark: the domain fixes it at {self.watermark}, got {c.watermark}"
        if c.policy == "priority" and not self.priority or c.policy == "lpm" and not self.lpm:
            allowed = ["FCFS"] + ["priority"] * self.priority + ["lpm"] * self.lpm
            return f"config.policy: the domain is {' or '.join(allowed)} only, got {c.policy!r}"
        if not self.seq_limit and c.max_num_seqs < UNBOUNDED_SEQS:
            return f"config.max_num_seqs: the domain has no sequence limit (>= {UNBOUNDED_SEQS}), got {c.max_num_seqs}"
        if not self.token_budget and c.max_num_batched_tokens < c.max_num_seqs * c.max_model_len:
            return (f"config.max_num_batched_tokens: the domain has no token budget "
                    f"(>= max_num_seqs * max_model_len = {c.max_num_seqs * c.max_model_len}), got {c.max_num_batched_tokens}")
        if not self.chunked_prefill and c.enable_chunked_prefill:
            return "config.enable_chunked_prefill: the domain has no chunked prefill"
        if self.chunked_prefill and not self.unchunked and not c.enable_chunked_prefill:
            return "config.enable_chunked_prefill: the domain always chunks prefills"
        if not self.prefill_caps and (c.long_prefill_token_threshold or c.max_num_partial_prefills):
            return ("config.long_prefill_token_threshold: the domain has no prefill caps, got "
                    f"{c.long_prefill_token_threshold} (max_num_partial_prefills {c.max_num_partial_prefills})")
        if not self.prefix_caching and c.enable_prefix_caching:
            return "config.enable_prefix_caching: the domain has no prefix caching"
        if self.budget_covers_model_len and not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
            return (f"config.max_num_batched_tokens: the domain needs >= max_model_len ({c.max_model_len}) "
                    f"without chunked prefill, got {c.max_num_batched_tokens}")
        if self.cache_holds_model_len and c.num_gpu_blocks < c.blocks_for(c.max_model_len):
            return (f"config.num_gpu_blocks: the domain needs room for one max_model_len sequence "
                    f"({c.blocks_for(c.max_model_len)} blocks), got {c.num_gpu_blocks}")
        return None

    # -- files and the wire --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "domain") -> ConfigDomain:
        if not isinstance(data, Mapping):
            raise InputError(where, f"must be an object, got {type(data).__name__}")
        if data.get("version") != VERSION:
            raise InputError(f"{where}.version", f"must be {VERSION}, got {data.get('version')!r}")
        known = {f.name for f in fields(cls)}
        for key in data:
            if key != "version" and key not in known:
                raise InputError(f"{where}.{key}", f"unknown field (known: {', '.join(sorted(known))})")
        try:
            return cls(**{k: v for k, v in data.items() if k != "version"})
        except InputError as err:
            raise InputError(err.where.replace("domain", where, 1), err.message) from None
