"""Config feasibility with Z3: can some admissible request never run under a config?

An *admissible* request is one a client may send: ``1 <= prompt_len``, ``prompt_len +
max_tokens <= max_model_len`` (the engine would refuse anything longer up front), ``1 <= n <=
max_n``. It *can never run* (or never finish) when one of these holds, each the reference's own
rule:

- ``never_fits``: its prompt blocks (n = 1 before the fork) exceed the GPU blocks above the
  watermark, so admission answers NEVER and the request is finished as ignored;
- ``over_token_budget``: its prompt exceeds ``max_num_batched_tokens`` and there is no chunked
  prefill, so it is ignored as too long;
- ``too_many_seqs``: its n exceeds ``max_num_seqs``, so it is ignored;
- ``cannot_grow``: its n sequences at full length need more GPU blocks than the pool has, so
  it is preempted again and again and never finishes (recompute re-admission then answers NEVER);
- ``swap_space_short`` (swap or auto with n > 1): its blocks exceed the CPU pool, so preemption
  by swap is impossible and falls back to recompute (reported as a conflict, not a hang).

The witness is found by Z3 over the request's fields with the config pinned by named
assumptions; the settings that conflict are an unsat core of "this witness can run" against those
assumptions. The guaranteed concurrency is the largest k (found by `z3.Optimize`) such that k
sequences of full length fit the GPU pool, the sequence budget and the token budget at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import z3

from spec.config import SchedulerConfig

CHECK_VERSION = 1
REASONS = ("never_fits", "over_token_budget", "too_many_seqs", "cannot_grow", "swap_space_short")
BLOCKING = ("never_fits", "over_token_budget", "too_many_seqs", "cannot_grow")


@dataclass
class Finding:
    reason: str
    request: dict[str, int]
    conflicting: list[str]
    blocking: bool

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "blocking": self.blocking, "witness": self.request,
                "conflicting_settings": self.conflicting}


@dataclass
class ConfigReport:
    config: SchedulerConfig
    max_n: int
    findings: list[Finding] = field(default_factory=list)
    guaranteed_concurrency: int = 0

    @property
    def feasible(self) -> bool:
        return not any(f.blocking for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {"version": CHECK_VERSION, "config": self.config.to_dict(), "max_n": self.max_n,
                "feasible": self.feasible, "findings": [f.to_dict() for f in self.findings],
                "guaranteed_concurrent_seqs": self.guaranteed_concurrency}


def _settings(cfg: SchedulerConfig) -> dict[str, int]:
    return {
        "block_size": cfg.block_size, "num_gpu_blocks": cfg.num_gpu_blocks, "num_cpu_blocks": cfg.num_cpu_blocks,
        "watermark_blocks": cfg.watermark_blocks, "max_num_seqs": cfg.max_num_seqs,
        "max_num_batched_tokens": cfg.max_num_batched_tokens, "max_model_len": cfg.max_model_len,
    }


class _Model:
    def __init__(self, cfg: SchedulerConfig, max_n: int) -> None:
        self.cfg = cfg
        self.k = {name: z3.Int(name) for name in _settings(cfg)}
        self.p, self.mt, self.n = z3.Ints("prompt_len max_tokens n")
        self.max_n = max_n
        k = self.k
        self.admissible = z3.And(self.p >= 1, self.mt >= 1, self.p + self.mt <= k["max_model_len"],
                                 self.n >= 1, self.n <= max_n)

        def blocks(tokens: Any) -> Any:
            return (tokens + k["block_size"] - 1) / k["block_size"]

        swap_mode = cfg.preemption_mode == "swap"
        auto = cfg.preemption_mode == "auto"
        full = self.p + self.mt
        self.reasons = {
            "never_fits": k["num_gpu_blocks"] - blocks(self.p) < k["watermark_blocks"],
            # with chunked prefill a prompt is split over steps (`SchedulerConfig.prompt_limit`)
            "over_token_budget": (z3.BoolVal(False) if cfg.enable_chunked_prefill
                                  else self.p > k["max_num_batched_tokens"]),
            "too_many_seqs": self.n > k["max_num_seqs"],
            # n sequences sharing the prompt's full blocks, each with its own tail, at full length
            "cannot_grow": self.n * blocks(full) - (self.n - 1) * (self.p / k["block_size"]) > k["num_gpu_blocks"],
            "swap_space_short": z3.And(
                z3.BoolVal(swap_mode) if not auto else self.n > 1,
                self.n * blocks(full) - (self.n - 1) * (self.p / k["block_size"]) > k["num_cpu_blocks"],
            ) if (swap_mode or auto) else z3.BoolVal(False),
        }

    def pins(self) -> dict[str, Any]:
        return {name: self.k[name] == value for name, value in _settings(self.cfg).items()}


def check_config(cfg: SchedulerConfig, max_n: int | None = None) -> ConfigReport:
    max_n = max_n if max_n is not None else max(1, cfg.max_num_seqs)
    m = _Model(cfg, max_n)
    report = ConfigReport(cfg, max_n)
    positive = [m.k[name] >= 1 for name in ("block_size", "num_gpu_blocks", "max_num_seqs",
                                             "max_num_batched_tokens", "max_model_len")]
    for reason in REASONS:
        s = z3.Solver()
        s.add(*positive, m.admissible, m.reasons[reason], *m.pins().values())
        # the smallest witness is the clearest one
        if s.check() != z3.sat:
            continue
        opt = z3.Optimize()
        opt.add(*positive, m.admissible, m.reasons[reason], *m.pins().values())
        opt.minimize(m.n)
        opt.minimize(m.p + m.mt)
        opt.check()
        model = opt.model()
        witness = {"prompt_len": model[m.p].as_long(), "max_tokens": model[m.mt].as_long(), "n": model[m.n].as_long()}
        report.findings.append(Finding(reason, witness, _core(m, reason, witness), reason in BLOCKING))
    report.guaranteed_concurrency = _concurrency(cfg)
    return report


def _core(m: _Model, reason: str, witness: dict[str, int]) -> list[str]:
    """The settings that, together, make ``reason`` hold for the witness (an unsat core of
    'the witness does not hit this reason' under the pinned settings)."""
    s = z3.Solver()
    s.add(m.p == witness["prompt_len"], m.mt == witness["max_tokens"], m.n == witness["n"])
    s.add(z3.Not(m.reasons[reason]))
    names = {}
    for name, pin in m.pins().items():
        flag = z3.Bool(f"set_{name}")
        names[str(flag)] = name
        s.add(z3.Implies(flag, pin))
    assumptions = [z3.Bool(f"set_{name}") for name in m.pins()]
    if s.check(*assumptions) != z3.unsat:
        return []
    core = [names[str(c)] for c in s.unsat_core()]
    # shrink to a minimal core
    for name in list(core):
        trial = [z3.Bool(f"set_{c}") for c in core if c != name]
        if s.check(*trial) == z3.unsat:
            core.remove(name)
    return sorted(core)


def _concurrency(cfg: SchedulerConfig) -> int:
    """The largest k such that k sequences at max_model_len fit together without preemption."""
    k = z3.Int("k")
    opt = z3.Optimize()
    per_seq = -(-cfg.max_model_len // cfg.block_size)
    opt.add(k >= 0, k * per_seq <= cfg.num_gpu_blocks, k <= cfg.max_num_seqs, k <= cfg.max_num_batched_tokens)
    opt.maximize(k)
    opt.check()
    return opt.model()[k].as_long()
