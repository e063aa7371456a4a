"""kvsched check-config: Z3 finds requests a config can never run, and explains why."""

from __future__ import annotations

import json

from conformance.cli import main
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
