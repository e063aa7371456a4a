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

import operator
import re
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
# An engine without a length limit gets a max_model_len no generated trace can reach (prompts of
# at most a few dozen tokens, at most MAX_OUTPUT_UNLIMITED generated tokens each).
UNBOUNDED_LEN = 1 << 16
PREEMPTION_MODES = ("auto", "recompute", "swap")
# The config fields a precondition (`ConfigDomain.requires`) may name.
PRECONDITION_FIELDS = ("block_size", "num_gpu_blocks", "num_cpu_blocks", "max_num_seqs",
                       "max_num_batched_tokens", "max_model_len")
_PRECONDITION = re.compile(r"^\s*(.+?)\s*(>=|<=|==|>|<)\s*(.+?)\s*$")
_TERM = re.compile(r"^(?:[a-z_]+|\d+)$")


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
    chunked_prefill: bool = False  # chunked prefill configs (and configs without it, unless unchunked is False)
    # False: the engine always splits a prompt past the step's budget (tokasaurus), so every
    # config has chunked prefill on; only read when chunked_prefill is True.
    unchunked: bool = True
    # False: no long_prefill_token_threshold and no max_num_partial_prefills (both vLLM V1 knobs)
    prefill_caps: bool = True
    prefix_caching: bool = False  # prefix caching configs (and configs without it, unless uncached is False)
    budget_covers_model_len: bool = False  # without chunked prefill, budget >= max_model_len (vLLM, nano-vllm)
    cache_holds_model_len: bool = False  # the GPU cache holds one max_model_len sequence (vLLM V1)
    pipeline_depth: int = 0  # the engine's pipeline depth (config.pipeline_depth): fixed, not drawn
    speculative: bool = False  # the engine schedules draft tokens (config.num_speculative_tokens > 0)
    # --- what an engine lacks or always does (issue 34) ---
    # False: the engine has no max_model_len. Configs get UNBOUNDED_LEN, prompt lengths are drawn
    # on their own scale and outputs from max_tokens alone; LEN-001 is not applicable (the claim
    # `no_length_limit`). LEN-002/003 still speak for the prompt limit the token budget sets.
    length_limit: bool = True
    # False, with prefix_caching: the engine always caches prefixes (every config has it on).
    uncached: bool = True
    # None: every mode `swap` allows; a mode: the engine preempts that way only.
    preemption_mode: str | None = None
    # True: a prefix cache that keeps its own reference on the blocks it caches (a radix cache):
    # the adapter lists those holds in `Snapshot.gpu_cache_holds`, which BLK-003 counts as holders.
    cache_holds_refs: bool = False
    # True: the engine schedules and samples in one call. The runner hands schedule() the step's
    # outcome (`schedule(outcome)`) and takes no snapshot between schedule() and update().
    fused_step: bool = False
    # False: a count-only engine, which cannot be told that a sequence sampled a stop token:
    # traces have no stops, so every request ends by its length (or an abort or an ignore).
    stops: bool = True
    # True: the engine sizes its own GPU pool. reset() returns the config as the engine runs it
    # (the same config with its own num_gpu_blocks), and the checks read that one.
    engine_pool: bool = False
    # Preconditions between config fields the engine asserts, each "<sum or product of fields
    # and integers> <op> <the same>", e.g. "max_num_batched_tokens >= max_num_seqs" or
    # "num_gpu_blocks * block_size >= max_num_seqs * max_model_len". Op: >= <= == > <.
    requires: tuple[str, ...] = ()
    # The engine's first block id: 1 where block 0 is a null block that is never handed out. The
    # runner shifts every block id the adapter reports down by this much, so the checks see 0..N-1.
    first_block_id: int = 0
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
        if self.preemption_mode is not None and self.preemption_mode not in PREEMPTION_MODES:
            raise InputError("domain.preemption_mode", f"must be null or one of {', '.join(PREEMPTION_MODES)}, "
                             f"got {self.preemption_mode!r}")
        if self.preemption_mode in ("auto", "swap") and not self.swap:
            raise InputError("domain.preemption_mode", f"{self.preemption_mode!r} preempts by swap, but swap is false")
        if not self.length_limit and (self.budget_covers_model_len or self.cache_holds_model_len):
            raise InputError("domain.length_limit", "an engine without max_model_len cannot also need "
                             "budget_covers_model_len or cache_holds_model_len")
        if isinstance(self.first_block_id, bool) or self.first_block_id not in (0, 1):
            raise InputError("domain.first_block_id", f"must be 0 or 1, got {self.first_block_id!r}")
        if isinstance(self.requires, list):
            object.__setattr__(self, "requires", tuple(self.requires))
        if not isinstance(self.requires, tuple):
            raise InputError("domain.requires", f"must be a list of strings, got {type(self.requires).__name__}")
        for index, text in enumerate(self.requires):
            parse_precondition(text, f"domain.requires[{index}]")
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
        if item.stops and not self.stops:
            return f"stops: the domain's engine cannot be told a stop, the trace has {len(item.stops)}"
        return None

    def admits(self, item: SchedulerConfig | Any) -> bool:
        return self.why_not(item) is None

    def _config_why_not(self, c: SchedulerConfig) -> str | None:
        if c.pipeline_depth != self.pipeline_depth:
            return f"config.pipeline_depth: the domain's engine runs at depth {self.pipeline_depth}, got {c.pipeline_depth}"
        if not self.speculative and c.num_speculative_tokens:
            return f"config.num_speculative_tokens: the domain has no speculative decoding, got {c.num_speculative_tokens}"
        if self.preemption_mode is not None and c.preemption_mode != self.preemption_mode:
            return f"config.preemption_mode: the domain preempts by {self.preemption_mode!r} only, got {c.preemption_mode!r}"
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
        if not self.seq_limit and c.max_num_seqs < min(UNBOUNDED_SEQS, c.max_num_batched_tokens):
            return (f"config.max_num_seqs: the domain has no sequence limit (>= {UNBOUNDED_SEQS}, or the token "
                    f"budget {c.max_num_batched_tokens} where that is less), got {c.max_num_seqs}")
        if not self.length_limit and c.max_model_len < UNBOUNDED_LEN:
            return f"config.max_model_len: the domain has no length limit (>= {UNBOUNDED_LEN}), got {c.max_model_len}"
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
        if self.prefix_caching and not self.uncached and not c.enable_prefix_caching:
            return "config.enable_prefix_caching: the domain always caches prefixes"
        if self.budget_covers_model_len and not c.enable_chunked_prefill and c.max_num_batched_tokens < c.max_model_len:
            return (f"config.max_num_batched_tokens: the domain needs >= max_model_len ({c.max_model_len}) "
                    f"without chunked prefill, got {c.max_num_batched_tokens}")
        if self.cache_holds_model_len and c.num_gpu_blocks < c.blocks_for(c.max_model_len):
            return (f"config.num_gpu_blocks: the domain needs room for one max_model_len sequence "
                    f"({c.blocks_for(c.max_model_len)} blocks), got {c.num_gpu_blocks}")
        for index, text in enumerate(self.requires):
            left, op, right = parse_precondition(text, f"domain.requires[{index}]")
            if not _OPS[op](precondition_value(left, c), precondition_value(right, c)):
                terms = left[0]
                return (f"config.{terms[0] if len(terms) == 1 and isinstance(terms[0], str) else 'requires'}: "
                        f"the domain requires {text.strip()} ({precondition_value(left, c)} {op} {precondition_value(right, c)} is false)")
        return None

    def claims(self) -> frozenset[str]:
        """The claims (capability values, spec.observation) this domain makes for the checker:
        what an engine lacks or always does, which decides whether some invariants apply."""
        named = {"no_length_limit": not self.length_limit, "no_seq_limit": not self.seq_limit,
                 "cache_holds_refs": self.cache_holds_refs}
        return frozenset(name for name, held in named.items() if held)

    # -- files and the wire --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"version": VERSION, **asdict(self), "requires": list(self.requires)}

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
            values = {k: v for k, v in data.items() if k != "version"}
            if isinstance(values.get("requires"), list):
                values["requires"] = tuple(values["requires"])
            return cls(**values)
        except InputError as err:
            raise InputError(err.where.replace("domain", where, 1), err.message) from None


# -- preconditions ---------------------------------------------------------------------------
# A side of a precondition: terms joined by one operator, "+" or "*" (a term is a field or an int).
Side = tuple[tuple[str | int, ...], str]
_OPS = {">=": operator.ge, "<=": operator.le, "==": operator.eq, ">": operator.gt, "<": operator.lt}


def parse_precondition(text: Any, where: str) -> tuple[tuple[tuple[str | int, ...], str], str, tuple[tuple[str | int, ...], str]]:
    """``"a * b >= c"`` -> ((("a", "b"), "*"), ">=", (("c",), "+")); InputError naming ``where``."""
    match = _PRECONDITION.match(text) if isinstance(text, str) else None
    if match is None:
        raise InputError(where, f"must read '<fields> <op> <fields>' with op one of {' '.join(_OPS)}, got {text!r}")
    return _side(match.group(1), where), match.group(2), _side(match.group(3), where)


def _side(text: str, where: str) -> tuple[tuple[str | int, ...], str]:
    joiner = "*" if "*" in text else "+"
    if "*" in text and "+" in text:
        raise InputError(where, f"a side is a sum or a product, not both: {text!r}")
    terms: list[str | int] = []
    for raw in text.split(joiner):
        term = raw.strip()
        if not _TERM.match(term) or (not term.isdigit() and term not in PRECONDITION_FIELDS):
            raise InputError(where, f"{term!r} is neither an integer nor one of {', '.join(PRECONDITION_FIELDS)}")
        terms.append(int(term) if term.isdigit() else term)
    return tuple(terms), joiner


def precondition_value(side: tuple[tuple[str | int, ...], str], config: SchedulerConfig) -> int:
    terms, joiner = side
    values = [t if isinstance(t, int) else int(getattr(config, t)) for t in terms]
    if joiner == "*":
        product = 1
        for v in values:
            product *= v
        return product
    return sum(values)
