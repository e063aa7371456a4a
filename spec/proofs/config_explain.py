"""Why `check_config` passed or failed a config, in the config's own numbers.

Z3 answers "is there a request that can never run?" with a witness and an unsat core; a user
needs more than that to act: which rule was checked, the worst admissible request against it,
and the arithmetic that makes it fit or not. Each rule of `spec.proofs.config_check` gets one
paragraph here, computed directly from the config (the worst case of each rule has a closed
form; Z3 stays the judge, and `tests/test_check_config.py` holds this text to its verdict).
Where a rule fails, a hint names a flag of ``kvsched check-config`` and the value that would
clear that rule (each flag named is one the command accepts: a test parses every one).

The worst cases, for ``L = max_model_len``, ``N = max_n``, ``B(t) = ceil(t / block_size)``:

- never_fits: the longest admissible prompt has ``L - 1`` tokens (``max_tokens >= 1``); it
  needs ``B(L - 1)`` blocks against ``num_gpu_blocks - watermark_blocks``;
- over_token_budget: the same prompt against ``max_num_batched_tokens`` (no chunked prefill);
- too_many_seqs: ``N`` sequences against ``max_num_seqs``;
- cannot_grow: ``N`` sequences at full length ``L`` whose prompt shares no full block (prompt
  of one token) need ``N * B(L)`` blocks against ``num_gpu_blocks``;
- swap_space_short: the same ``N * B(L)`` against ``num_cpu_blocks`` (for ``auto`` only groups
  of two or more sequences swap, so ``N >= 2``).
"""

from __future__ import annotations

from dataclasses import dataclass

from spec.config import MAX_BLOCKS, MAX_SEQS, MAX_TOKENS, SchedulerConfig
from spec.proofs.config_check import ConfigReport, Finding


@dataclass(frozen=True)
class RuleExplanation:
    reason: str
    applies: bool  # False: the rule cannot bite under this config (said why in ``text``)
    holds: bool  # True: some admissible request hits it (a finding)
    text: str
    hints: tuple[str, ...] = ()  # for a finding: "--flag value" settings, each of which clears this rule


def explain(report: ConfigReport) -> list[RuleExplanation]:
    """One explanation per rule, in `REASONS` order, consistent with ``report.findings``."""
    cfg, n = report.config, report.max_n
    found = {f.reason: f for f in report.findings}
    if cfg.max_model_len < 2:  # prompt_len >= 1 and max_tokens >= 1 cannot both fit
        return [RuleExplanation(reason, False, False, f"max_model_len {cfg.max_model_len} < 2 admits no request")
                for reason in ("never_fits", "over_token_budget", "too_many_seqs", "cannot_grow", "swap_space_short")]
    return [
        _never_fits(cfg, found.get("never_fits")),
        _over_token_budget(cfg, found.get("over_token_budget")),
        _too_many_seqs(cfg, n, found.get("too_many_seqs")),
        _cannot_grow(cfg, n, found.get("cannot_grow")),
        _swap_space_short(cfg, n, found.get("swap_space_short")),
    ]


def admissible_text(report: ConfigReport, max_n_given: bool) -> str:
    """What "every admissible request" ranges over, with this config's numbers."""
    origin = "--max-n" if max_n_given else "max_num_seqs, since --max-n was not given"
    return (f"every admissible request: prompt_len >= 1, max_tokens >= 1, prompt_len + max_tokens <= "
            f"max_model_len = {report.config.max_model_len}, 1 <= n <= {report.max_n} (from {origin})")


def _blocks(cfg: SchedulerConfig, tokens: int) -> int:
    return cfg.blocks_for(tokens)


def _never_fits(cfg: SchedulerConfig, finding: Finding | None) -> RuleExplanation:
    prompt = cfg.max_model_len - 1
    need = _blocks(cfg, max(prompt, 1))
    room = cfg.num_gpu_blocks - cfg.watermark_blocks
    rule = (f"a prompt's blocks must fit the GPU blocks above the watermark: num_gpu_blocks {cfg.num_gpu_blocks} "
            f"- watermark_blocks {cfg.watermark_blocks} (int({cfg.watermark} * {cfg.num_gpu_blocks})) = {room}")
    if finding is None:
        return RuleExplanation("never_fits", True, False,
                               f"{rule}; the longest admissible prompt ({prompt} tokens) needs {need} <= {room}")
    p = finding.request["prompt_len"]
    hints = [f"--num-gpu-blocks {_smallest_pool(cfg, need)}", _max_model_len(cfg, room * cfg.block_size + 1)]
    if need <= cfg.num_gpu_blocks:
        hints.append("--watermark 0")
    return RuleExplanation("never_fits", True, True,
                           f"{rule}; a prompt of {p} tokens needs {_blocks(cfg, p)} > {room}, so it is "
                           "finished as ignored", _settable(hints))


def _smallest_pool(cfg: SchedulerConfig, need: int) -> int:
    """The fewest GPU blocks that leave ``need`` above the watermark."""
    pool = need
    while pool - int(cfg.watermark * pool) < need:
        pool += max(1, (need - (pool - int(cfg.watermark * pool))) // 2)
    return pool


def _over_token_budget(cfg: SchedulerConfig, finding: Finding | None) -> RuleExplanation:
    if cfg.enable_chunked_prefill:
        return RuleExplanation("over_token_budget", False, False,
                               "chunked prefill splits a prompt over steps, so the token budget never refuses one")
    prompt = cfg.max_model_len - 1
    rule = ("without chunked prefill a prompt is prefilled in one step, within max_num_batched_tokens "
            f"= {cfg.max_num_batched_tokens}")
    if finding is None:
        return RuleExplanation("over_token_budget", True, False,
                               f"{rule}; the longest admissible prompt has {prompt} tokens <= {cfg.max_num_batched_tokens}")
    return RuleExplanation("over_token_budget", True, True,
                           f"{rule}; a prompt of {finding.request['prompt_len']} tokens is more, so it is finished "
                           "as ignored",
                           _settable([f"--max-num-batched-tokens {max(prompt, cfg.max_num_seqs)}",
                                      "--enable-chunked-prefill",
                                      _max_model_len(cfg, cfg.max_num_batched_tokens + 1)]))


def _too_many_seqs(cfg: SchedulerConfig, max_n: int, finding: Finding | None) -> RuleExplanation:
    rule = f"a request's n sequences must fit max_num_seqs = {cfg.max_num_seqs} at once"
    if finding is None:
        return RuleExplanation("too_many_seqs", True, False, f"{rule}; n is at most {max_n} <= {cfg.max_num_seqs}")
    hints = [f"--max-n {cfg.max_num_seqs}"]
    if max_n <= cfg.max_num_batched_tokens:  # config: max_num_batched_tokens >= max_num_seqs
        hints.append(f"--max-num-seqs {max_n}")
    return RuleExplanation("too_many_seqs", True, True,
                           f"{rule}; n = {finding.request['n']} is more, so the request is finished as ignored",
                           _settable(hints))


def _cannot_grow(cfg: SchedulerConfig, max_n: int, finding: Finding | None) -> RuleExplanation:
    per_seq = _blocks(cfg, cfg.max_model_len)
    worst = max_n * per_seq
    rule = (f"n sequences at full length must fit num_gpu_blocks = {cfg.num_gpu_blocks} together, or they are "
            "preempted again and again and never finish")
    if finding is None:
        return RuleExplanation("cannot_grow", True, False,
                               f"{rule}; the worst case, {max_n} sequence(s) of {cfg.max_model_len} tokens "
                               f"({per_seq} blocks each, no shared prompt block), needs {worst} <= {cfg.num_gpu_blocks}")
    w = finding.request
    full = w["prompt_len"] + w["max_tokens"]
    shared = w["prompt_len"] // cfg.block_size
    need = w["n"] * _blocks(cfg, full) - (w["n"] - 1) * shared
    fits = cfg.num_gpu_blocks // per_seq
    hints = [f"--num-gpu-blocks {worst}", _max_model_len(cfg, cfg.num_gpu_blocks // max_n * cfg.block_size)]
    hints += [f"--max-n {fits}"] if fits >= 1 else []
    return RuleExplanation("cannot_grow", True, True,
                           f"{rule}; n = {w['n']} sequences of {full} tokens ({_blocks(cfg, full)} blocks each, "
                           f"{shared} prompt block(s) shared) need {need} > {cfg.num_gpu_blocks}", _settable(hints))


def _swap_space_short(cfg: SchedulerConfig, max_n: int, finding: Finding | None) -> RuleExplanation:
    if cfg.preemption_mode == "recompute":
        return RuleExplanation("swap_space_short", False, False,
                               "preemption_mode is recompute: nothing is swapped, so the CPU pool is never needed")
    if cfg.preemption_mode == "auto" and max_n < 2:
        return RuleExplanation("swap_space_short", False, False,
                               "preemption_mode auto swaps only groups of n >= 2, and n is at most 1")
    worst = max_n * _blocks(cfg, cfg.max_model_len)
    rule = (f"a swapped group's blocks must fit num_cpu_blocks = {cfg.num_cpu_blocks}, or preemption falls back "
            "to recompute (a warning: the request still runs)")
    if finding is None:
        return RuleExplanation("swap_space_short", True, False,
                               f"{rule}; the worst case, {max_n} sequence(s) at full length, needs {worst} <= "
                               f"{cfg.num_cpu_blocks}")
    return RuleExplanation("swap_space_short", True, True,
                           f"{rule}; n = {finding.request['n']} sequences at full length need more",
                           _settable([f"--num-cpu-blocks {worst}", "--preemption-mode recompute",
                                      _max_model_len(cfg, cfg.num_cpu_blocks // max_n * cfg.block_size)]))


_LIMITS = {"--num-gpu-blocks": MAX_BLOCKS, "--num-cpu-blocks": MAX_BLOCKS, "--max-num-seqs": MAX_SEQS,
           "--max-num-batched-tokens": MAX_TOKENS}


def _max_model_len(cfg: SchedulerConfig, length: int) -> str:
    """A --max-model-len hint, or "" where no length of two tokens or more would do."""
    return f"--max-model-len {length}" if 2 <= length < cfg.max_model_len else ""


def _settable(hints: list[str]) -> tuple[str, ...]:
    """The hints whose value the config accepts (a pool past MAX_BLOCKS is no advice)."""
    kept = []
    for hint in filter(None, hints):
        flag, _, value = hint.partition(" ")
        if flag in _LIMITS and int(value) > _LIMITS[flag]:
            continue
        kept.append(hint)
    return tuple(kept)
