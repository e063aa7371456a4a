"""The stranger test's adapter (docs/examples/tokasaurus/): tokasaurus 0.0.4's manager over the wire.

The conform runs need tokasaurus' own venv (~/.cache/kvsched/stranger/tokasaurus, built as
docs/examples/tokasaurus/README.md says) and skip without it, as the nightly targets' tests do;
it is not a `kvsched targets` target, so CI does not install it. The domain and invariant checks
below it need nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spec.config import SchedulerConfig
from spec.domain import ConfigDomain

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "docs" / "examples" / "tokasaurus"
VENV_PYTHON = Path.home() / ".cache" / "kvsched" / "stranger" / "tokasaurus" / "bin" / "python"

needs_venv = pytest.mark.skipif(not VENV_PYTHON.exists(), reason=f"tokasaurus venv missing: {VENV_PYTHON}")


def _conform(tmp_path: Path, factory: str, profile: str, examples: int) -> tuple[int, dict]:
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "conformance", "conform",
           "--adapter", f"{EXAMPLE / 'tokasaurus_adapter.py'}:{factory}", "--profile", profile,
           "--expect", str(EXAMPLE / "expectations.json"), "--max-examples", str(examples),
           "--seed", "1", "--timeout", "60", "--out", str(tmp_path / "out"), "--json", str(report)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert report.exists(), proc.stderr[-2000:]
    return proc.returncode, json.loads(report.read_text())


@needs_venv
def test_tokasaurus_conforms_up_to_its_known_deviations(tmp_path: Path) -> None:
    """With precise onboarding (tokasaurus' default) every finding is one the expectations file
    explains; the crash on max_tokens=1 requests (scheduler.py:180) is among them."""
    code, report = _conform(tmp_path, "make", "safety", 15)
    assert report["new_findings"] == [], report["new_findings"]
    assert code == 0


@needs_venv
def test_tokasaurus_coarse_onboarding_is_live(tmp_path: Path) -> None:
    """Without the precise pass (which crashes), every request finishes: the liveness profile."""
    code, report = _conform(tmp_path, "make_coarse", "liveness", 15)
    assert report["new_findings"] == [], report["new_findings"]
    assert code == 0


def _config(**kw) -> SchedulerConfig:
    base = dict(block_size=4, num_gpu_blocks=8, num_cpu_blocks=0, max_num_seqs=2, max_num_batched_tokens=8,
                max_model_len=16, preemption_mode="recompute", enable_prefix_caching=True)
    return SchedulerConfig(**{**base, **kw})


def test_domain_that_always_chunks_refuses_unchunked_configs() -> None:
    domain = ConfigDomain(flow="v1", max_n=1, swap=False, cpu_pool=False, chunked_prefill=True,
                          unchunked=False, prefill_caps=False, prefix_caching=True)
    assert domain.why_not(_config(enable_chunked_prefill=True)) is None
    assert "always chunks" in domain.why_not(_config())
    assert "long_prefill_token_threshold" in domain.why_not(
        _config(enable_chunked_prefill=True, long_prefill_token_threshold=3))
    # The defaults keep the old meaning: chunked prefill may be on or off, with or without caps.
    assert ConfigDomain(chunked_prefill=True, prefix_caching=True).why_not(_config()) is None


def test_generated_configs_stay_in_an_always_chunked_domain() -> None:
    from hypothesis import given, settings

    from conformance.generation.domain import domain_configs

    domain = ConfigDomain(flow="v1", max_n=1, swap=False, cpu_pool=False, priority=False, chunked_prefill=True,
                          unchunked=False, prefill_caps=False, prefix_caching=True)

    @settings(max_examples=40, deadline=None)
    @given(domain_configs(domain))
    def check(config: SchedulerConfig) -> None:
        assert config.enable_chunked_prefill
        assert config.long_prefill_token_threshold == 0 and config.max_num_partial_prefills == 0
        assert domain.why_not(config) is None

    check()


def test_prefill_shortened_by_a_cache_hit_is_complete_without_computed_counts() -> None:
    """REQ-004 with chunked prefill and no `computed_tokens`: a prefill of prompt - cached tokens
    that samples a token is not a partial chunk that grew (the stranger test's first false
    positive: num_computed None was read as 0)."""
    from types import SimpleNamespace

    from spec.invariants.requests import _partial_chunk_ok

    def view(tokens, computed=None):
        return SimpleNamespace(num_tokens=tokens, num_computed=computed)

    rec = SimpleNamespace(mid=SimpleNamespace(seqs={"r0#0": view(14)}),
                          output=SimpleNamespace(scheduled=(SimpleNamespace(seq_id="r0#0", num_tokens=2),)))
    assert _partial_chunk_ok(rec, "r0#0", view(14), view(15))
    rec.mid.seqs["r0#0"] = view(14, computed=12)  # reported: 12 cached + 2 given completes it
    assert _partial_chunk_ok(rec, "r0#0", view(14), view(15))
    rec.mid.seqs["r0#0"] = view(14, computed=0)  # reported 0: a partial chunk, which grows nothing
    assert not _partial_chunk_ok(rec, "r0#0", view(14), view(15))


def test_expectations_hold_only_the_engine_defect() -> None:
    """The safety audit (README.md "Findings" 2-4): the early free and the restarted completion
    are allowed by the claims the host makes (ordered_steps, output_at_finish), and a deferred
    abort is reported when it is carried out; what is left expected is the manager's crash."""
    expected = json.loads((EXAMPLE / "expectations.json").read_text())["expected"]
    assert [e["id"] for e in expected] == ["FAULT-raised"]
    host = (EXAMPLE / "tokasaurus_host.py").read_text()
    assert '"ordered_steps"' in host and '"output_at_finish"' in host
