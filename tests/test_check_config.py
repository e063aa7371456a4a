"""kvsched check-config: Z3 finds requests a config can never run, and explains why."""

from __future__ import annotations

import json

from conformance.commands.cli import main
from spec.config import SchedulerConfig
from spec.proofs.config_check import check_config

SMALL = dict(block_size=4, num_gpu_blocks=16, num_cpu_blocks=8, max_num_seqs=2, max_num_batched_tokens=32,
             max_model_len=24, watermark=0.0)


def _reasons(report):
    return {f.reason: f for f in report.findings}


def test_feasible_config_has_no_blocking_finding():
    report = check_config(SchedulerConfig(**SMALL))
    assert report.feasible, report.to_dict()
    # 2 sequences of 24 tokens (6 blocks each) fit 16 blocks together; max_num_seqs caps it at 2
    assert report.guaranteed_concurrency == 2
    assert check_config(SchedulerConfig(**{**SMALL, "max_num_seqs": 4, "max_num_batched_tokens": 32})).guaranteed_concurrency == 2


def test_sequences_that_cannot_grow():
    report = check_config(SchedulerConfig(**{**SMALL, "num_gpu_blocks": 8}))
    finding = _reasons(report)["cannot_grow"]
    assert finding.request["n"] == 2 and sorted(finding.conflicting) == ["block_size", "num_gpu_blocks"]


def test_watermark_makes_a_prompt_never_fit():
    report = check_config(SchedulerConfig(**{**SMALL, "watermark": 0.75}))
    finding = _reasons(report)["never_fits"]
    assert not report.feasible
    assert finding.request["prompt_len"] == 4 * 4 + 1  # 5 blocks > 16 - 12
    assert finding.conflicting == ["block_size", "num_gpu_blocks", "watermark_blocks"]


def test_prompt_over_token_budget():
    report = check_config(SchedulerConfig(**{**SMALL, "max_num_batched_tokens": 8}))
    finding = _reasons(report)["over_token_budget"]
    assert finding.request["prompt_len"] == 9 and finding.conflicting == ["max_num_batched_tokens"]


def test_n_over_sequence_budget_and_swap_space():
    report = check_config(SchedulerConfig(**{**SMALL, "num_cpu_blocks": 2, "preemption_mode": "swap"}), max_n=3)
    reasons = _reasons(report)
    assert reasons["too_many_seqs"].request["n"] == 3
    assert reasons["too_many_seqs"].conflicting == ["max_num_seqs"]
    assert "num_cpu_blocks" in reasons["swap_space_short"].conflicting
    assert not reasons["swap_space_short"].blocking


def test_cli_flags_json_and_exit_codes(tmp_path, capsys):
    flags = ["--block-size", "4", "--num-gpu-blocks", "16", "--num-cpu-blocks", "8", "--max-num-seqs", "2",
             "--max-num-batched-tokens", "32", "--max-model-len", "24", "--watermark", "0"]
    assert main(["check-config", *flags]) == 0
    assert "guaranteed to run concurrently" in capsys.readouterr().out
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"version": 1, "config": {**SMALL, "watermark": 0.75}}))
    assert main(["check-config", "--config", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["version"] == 1 and not out["feasible"]
    assert main(["check-config", "--block-size", "0"]) == 2
    assert main(["check-config", "--config", str(tmp_path / "missing.json")]) == 2


def test_chunked_prefill_lifts_the_token_budget_rule():
    """With chunked prefill a prompt is split over steps, so no prompt is over the token budget."""
    cfg = SchedulerConfig(**{**SMALL, "max_num_batched_tokens": 8, "enable_chunked_prefill": True})
    assert "over_token_budget" not in _reasons(check_config(cfg))


# -- part 8: the verdict explains itself, and every flag it names can be set -----------------------

def _json_run(capsys, *argv):
    code = main(["check-config", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _non_default(f) -> list[str]:
    """argv that sets field ``f`` to a valid value other than its default."""
    flag = "--" + f.name.replace("_", "-")
    if isinstance(f.default, bool):
        return [flag]
    if f.name in ("encoder_compute_budget", "encoder_cache_size"):  # an encoder needs both (spec/config.py)
        return ["--encoder-compute-budget", "8", "--encoder-cache-size", "8"]
    if f.name == "kv_load_failure_policy":
        return ["--kv-connector", flag, "fail"]
    if f.name == "kv_groups":  # full attention beside a sliding window of 8 tokens (spec/kv_groups.py)
        return [flag, '[{"kind": "full"}, {"kind": "sliding_window", "window": 8}]']
    if f.name in ("max_num_partial_prefills", "long_prefill_token_threshold"):
        return ["--enable-chunked-prefill", flag, "3"]
    other = {"watermark": "0.05", "preemption_mode": "swap", "policy": "priority", "pipeline_depth": "1"}
    return [flag, other[f.name] if f.name in other else str(f.default + 8)]


def test_every_config_field_is_a_flag_that_sets_it(capsys):
    from dataclasses import fields

    for f in fields(SchedulerConfig):
        argv = _non_default(f)
        code, out = _json_run(capsys, *argv)
        assert code in (0, 1), argv
        value = SchedulerConfig.from_dict({**out["config"]}).__getattribute__(f.name)
        assert value != f.default and out["sources"][f.name] == "--" + f.name.replace("_", "-"), (argv, value)
    # the switches can be turned off again, and a flag wins over the file
    code, out = _json_run(capsys, "--enable-chunked-prefill", "--no-enable-chunked-prefill")
    assert out["sources"]["enable_chunked_prefill"] == "--enable-chunked-prefill"
    assert "enable_chunked_prefill" not in out["config"]  # back at its default (to_dict omits it)


def test_defaults_are_explained(capsys):
    """No flags at all: the report says where the config came from, what was checked, each rule's
    verdict with its numbers, and the overall verdict, consistent with the exit code."""
    code = main(["check-config"])
    text = capsys.readouterr().out
    report = check_config(SchedulerConfig())
    assert code == (0 if report.feasible else 1)
    assert "kvsched's defaults (no --config, no flags)" in text
    assert "prompt_len + max_tokens <= max_model_len = 256" in text and "1 <= n <= 8 (from max_num_seqs" in text
    for reason in ("never_fits", "over_token_budget", "too_many_seqs", "cannot_grow", "swap_space_short"):
        assert f"  {reason}: " in text
    # today's defaults: 5 sequences of 193 tokens need 5 x 13 = 65 blocks of the 64
    assert not report.feasible
    assert "cannot_grow: FAILS" in text and "need 65 > 64" in text and "verdict: INFEASIBLE" in text
    assert "never_fits: passes" in text and "needs 16 <= 64" in text


FAILING = [
    [],  # the defaults
    ["--watermark", "0.9"],
    ["--max-num-batched-tokens", "64"],
    ["--max-n", "12"],
    ["--num-cpu-blocks", "4", "--preemption-mode", "swap"],
    ["--max-num-batched-tokens", "4", "--max-num-seqs", "2", "--max-n", "4", "--num-gpu-blocks", "8"],
    # at the limits: no pool is big enough, so only a shorter model length (or fewer sequences) helps
    ["--num-gpu-blocks", "1048576", "--num-cpu-blocks", "1048576", "--max-model-len", "16777216",
     "--max-num-batched-tokens", "16777216", "--max-num-seqs", "65536", "--block-size", "1", "--watermark", "0.5"],
]


def test_every_fix_it_lists_is_a_flag_that_clears_its_rule(capsys):
    """Each "cleared by" setting parses as a check-config flag, and adding it clears that rule."""
    tried = 0
    for argv in FAILING:
        _, out = _json_run(capsys, *argv)
        failing = [c for c in out["checks"] if c["holds"]]
        assert failing, argv
        for check in failing:
            assert check["fixes"], (argv, check)
            for fix in check["fixes"]:
                code, after = _json_run(capsys, *argv, *fix.split())
                assert code in (0, 1), (argv, fix)
                again = {c["reason"]: c for c in after["checks"]}[check["reason"]]
                assert not again["holds"], (argv, fix, again)
                tried += 1
    assert tried >= 10
