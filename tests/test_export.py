"""``kvsched export``: standalone reproducers and report drafts (conformance/export/).

The end-to-end tests export a committed trace and run the file with the target venv's Python, in
an empty folder without PYTHONPATH (so it cannot import kvsched), and with a fix descriptor applied
to a copy of the engine. Skipped when the target is not installed, unless KVSCHED_REQUIRE_TARGETS=1.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from conformance.commands.cli import main
from conformance.export import exporter_for, render_pytest, trace_property
from conformance.export.demonstrations import DEMONSTRATIONS, get_demonstration
from conformance.export.exporter import EXPORTERS
from conformance.export.findings import FINDINGS
from conformance.export.patching import Edit, Fix, load_fix, patched_copy
from conformance.export.unsupported import UNSUPPORTED
from conformance.selftest.campaigns.export_both_ways import reproducer_name, run_file
from spec.errors import InputError
from spec.trace import Trace
from tests.test_targets import need

ROOT = Path(__file__).resolve().parent.parent
CUT = ROOT / "docs/traces/specdec/sync-padded-admission-cut-by-threshold.json"
SEATS = ROOT / "docs/reports/traces/nano-vllm-seats-overfilled.json"
KVSCHED_PACKAGES = {"spec", "conformance", "reference_impl", "gpu_impl", "tests"}


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("argv, names", [
    (["export", "no/such/trace.json", "--to", "pytest"], "no/such/trace.json"),
    (["export", str(CUT), "--to", "pytest", "--target", "nosuch"], "unknown target 'nosuch'"),
    (["export", str(CUT), "--to", "pytest", "--target", "nano-vllm"], "found on vllm-v1, not nano-vllm"),
    (["export", str(CUT), "--to", "pytest", "--property", "PFX-002"], "no standalone check of 'PFX-002'"),
    (["export", str(CUT), "--to", "docx"], "--to"),
])
def test_bad_input_is_one_line_and_exit_2(argv, names, capsys):
    try:
        code = main(argv)
    except SystemExit as done:  # argparse's own refusals
        code = done.code
    assert code == 2
    assert names in one_error_line(capsys)


def test_a_target_without_exporter_says_why_in_one_line(tmp_path, capsys):
    path = ROOT / "docs/traces/sglang/handmade/retract-decode.json"
    assert main(["export", str(path), "--to", "pytest", "--target", "vllm-v1-async-0.29"]) == 2
    assert one_error_line(capsys).startswith("kvsched: error: --target: vllm-v1-async-0.29 cannot be exported: not yet")
    assert set(UNSUPPORTED) & set(EXPORTERS) == set()


def test_every_real_python_target_kvsched_drives_is_exported_or_says_why():
    from conformance.targets import TARGET_SPECS

    assert set(TARGET_SPECS) <= set(EXPORTERS) | set(UNSUPPORTED)
    assert {"vllm-v1", "vllm-v1-async", "vllm-v0", "nano-vllm", "sglang", "lmdeploy", "vidur-vllm", "aphrodite",
            "tokasaurus"} <= set(EXPORTERS)


def test_the_output_path_is_checked_before_anything_is_written(tmp_path, capsys):
    assert main(["export", str(CUT), "--to", "pytest", "--out", str(tmp_path)]) == 2
    assert "--out" in one_error_line(capsys)
    assert main(["export", "no/such.json", "--to", "pytest", "--out", str(tmp_path / "x.py")]) == 2
    assert not (tmp_path / "x.py").exists()


def kvsched_imports(text: str) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] in KVSCHED_PACKAGES]


def committed_reproducers():
    """The exported ones (a hand-written reproducer has no trace to export)."""
    return [(f.slug, r) for f in FINDINGS for r in f.reproducers if not r.handwritten]


def test_the_hand_written_reproducers_are_standalone_and_recorded():
    handwritten = [(f, r) for f in FINDINGS for r in f.reproducers if r.handwritten]
    assert handwritten  # vLLM's encoder-decoder cache (#55733): no host builds that scheduler
    runs = json.loads((ROOT / "docs/reports/both-ways.json").read_text())["findings"]
    for finding, rep in handwritten:
        text = (ROOT / rep.handwritten).read_text()
        assert kvsched_imports(text) == []
        assert "def test_reproducer()" in text and 'if __name__ == "__main__":' in text
        assert Path(rep.handwritten).parent.name == finding.slug
        assert rep.handwritten in [r["file"] for r in runs[finding.slug]["runs"]]


@pytest.mark.parametrize("slug, rep", committed_reproducers(), ids=lambda x: getattr(x, "trace", x))
def test_every_reproducer_exports_to_python_that_imports_no_kvsched(slug, rep):
    trace = Trace.load(ROOT / rep.trace)
    exporter = exporter_for(trace, rep.target)
    prop = trace_property(trace, exporter, rep.property)
    text = render_pytest(trace, exporter, prop, rep.trace)
    assert kvsched_imports(text) == []
    assert "def test_reproducer()" in text and 'if __name__ == "__main__":' in text
    compile(text, rep.trace, "exec")


@pytest.mark.parametrize("slug, rep", committed_reproducers(), ids=lambda x: getattr(x, "trace", x))
def test_the_committed_reproducers_are_what_export_writes_now(slug, rep):
    trace = Trace.load(ROOT / rep.trace)
    exporter = exporter_for(trace, rep.target)
    text = render_pytest(trace, exporter, trace_property(trace, exporter, rep.property), rep.trace)
    assert (ROOT / "docs/reports" / slug / reproducer_name(rep)).read_text() == text, (
        "stale: rerun python -m conformance.selftest.campaigns.export_both_ways")


def test_every_engine_fragment_defines_what_its_property_checks_call():
    """A property fragment reads the engine through methods (``engine.lengths()``, ...): each
    exporter's engine fragment (or its extra, hybrid, sessions or connector fragments) defines every one its
    properties call."""
    import re

    fragments = ROOT / "conformance/export/templates"
    for exporter in EXPORTERS.values():
        engine = (fragments / f"{exporter.engine}.py.in").read_text()
        for part in (exporter.extra, exporter.hybrid, exporter.sessions, *exporter.connector):
            if part:
                engine += (fragments / f"{part}.py.in").read_text()
        for prop in exporter.properties:
            called = set(re.findall(r"engine\.(\w+)\(", (fragments / "properties" / f"{prop}.py.in").read_text()))
            missing = {name for name in called if f"def {name}(" not in engine}
            assert not missing, (exporter.target, prop, missing)


def test_every_exporter_has_a_fragment_for_each_property():
    fragments = ROOT / "conformance/export/templates"
    for exporter in EXPORTERS.values():
        assert (fragments / f"{exporter.engine}.py.in").exists()
        for prop in exporter.properties:
            assert (fragments / "properties" / f"{prop}.py.in").exists(), (exporter.target, prop)


def test_the_report_draft_names_the_step_the_fix_and_the_upstream_pr(tmp_path):
    out = tmp_path / "report.md"
    assert main(["export", str(CUT), "--to", "report", "--out", str(out)]) == 0
    text = out.read_text()
    for section in ("## What breaks", "## The exact step", "## Expected and actual", "## Reproducer", "## Source",
                    "## Proposed fix", "## Checked both ways", "## Upstream"):
        assert section in text
    assert "vllm-project/vllm#54028" in text and "scheduler.py:1579" in text
    assert "+                        and not 0 < long_prefill_token_threshold < 1 + self.num_spec_tokens" in text


def test_every_finding_has_a_committed_report_and_reproducers():
    for finding in FINDINGS:
        assert (ROOT / "docs/reports" / f"{finding.slug}.md").exists(), finding.slug
        assert finding.reproducers, finding.slug
        for patch in {finding.fix_patch, *(r.fix_patch for r in finding.reproducers)} - {""}:
            assert load_fix(ROOT / "docs/reports/fixes" / patch).edits


def test_two_edits_of_one_file_both_apply(tmp_path):
    package = tmp_path / "site" / "engine"
    package.mkdir(parents=True)
    (package / "core.py").write_text("x = 1\ny = 2\n")
    fix = Fix("engine", "engine==1", "test", (Edit("core.py", "x = 1\n", "x = 3\n"), Edit("core.py", "y = 2\n", "y = 4\n")))
    out = patched_copy(fix, package, tmp_path / "out")
    assert (out / "engine" / "core.py").read_text() == "x = 3\ny = 4\n"


def test_a_connector_trace_exports_only_where_the_exporter_plays_a_connector(capsys):
    trace = ROOT / "docs/reports/traces/vllm-v1-connector-own-reservation-stall.json"
    text = render_pytest(Trace.load(trace), EXPORTERS["vllm-v1"], "LIV-001", str(trace))
    assert "class ScriptedConnector(KVConnectorBase_V1" in text and "KV_SCRIPTS = {'A'" in text
    unnamed = ROOT / "docs/traces/connector/own-reservation-stall.json"  # names no target
    assert main(["export", str(unnamed), "--to", "pytest", "--target", "aphrodite", "--property", "LIV-001"]) == 2
    assert "aphrodite's export has no scripted KV connector" in one_error_line(capsys)


def test_the_pipelined_export_plays_the_connector_one_step_late():
    """vllm-v1-async: the synchronous connector fragment, then AsyncScheduler's: a batch's reports
    are those of the step that scheduled it, handed over with its outcome."""
    trace = ROOT / "docs/reports/traces/vllm-v1-async-failed-load-keeps-placeholders.json"
    text = render_pytest(Trace.load(trace), EXPORTERS["vllm-v1-async"], "CHK-002", str(trace))
    assert text.index("class ScriptedConnector(") < text.index("class AsyncWorkerReportsScheduler(AsyncScheduler)")
    assert "Engine = AsyncConnectorEngine" in text and "KV_SCRIPTS = {'r0'" in text


def test_a_session_trace_exports_only_where_the_exporter_plays_the_client(tmp_path, capsys):
    trace = ROOT / "docs/reports/traces/vllm-v1-session-kv-held-deadlock.json"
    text = render_pytest(Trace.load(trace), EXPORTERS["vllm-v1"], "SES-003", str(trace))
    assert "Engine = SessionEngine" in text and "'session': [{'step': 12, 'prompt': [7, 8], 'max_tokens': 1}]" in text
    plain = render_pytest(Trace.load(SEATS), EXPORTERS["nano-vllm"], "BUD-003", str(SEATS))
    assert "SessionEngine" not in plain
    data = json.loads(trace.read_text())
    data["meta"] = {}
    unnamed = tmp_path / "session.json"  # names no target
    unnamed.write_text(json.dumps(data))
    assert main(["export", str(unnamed), "--to", "pytest", "--target", "vllm-v1-async", "--property", "LIV-001"]) == 2
    assert "vllm-v1-async's export plays no streaming-input session" in one_error_line(capsys)


def test_vllm_v1_async_failed_load_keeps_placeholders_fails_on_the_release(tmp_path):
    """vllm-v1-async with the scripted connector (about 17 s of CPU); the fix run is in both-ways.json."""
    target = need("vllm-v1-async")
    path = export_to(tmp_path, ROOT / "docs/reports/traces/vllm-v1-async-failed-load-keeps-placeholders.json")
    release = run_file(target.python, path, dict(target.env))
    assert release["exit"] == 1, release
    assert release["line"].startswith("FAILED: step 6: schedule() gives request r0 1 token(s)"), release


def test_vllm_v1_session_kv_held_deadlock_fails_on_the_release(tmp_path):
    """A streaming session exported with its client (about 17 s of CPU); the fix run is in both-ways.json."""
    target = need("vllm-v1")
    path = export_to(tmp_path, ROOT / "docs/reports/traces/vllm-v1-session-kv-held-deadlock.json")
    release = run_file(target.python, path, dict(target.env))
    assert release["exit"] == 1, release
    assert release["line"].startswith("FAILED: step 2: nothing is running and ['B'] wait(s)"), release


def test_vllm_v1_connector_own_reservation_stall_fails_on_the_release(tmp_path):
    """One run (about 17 s of CPU: vLLM's import); the run with the fix is in the both-ways record."""
    target = need("vllm-v1")
    path = export_to(tmp_path, ROOT / "docs/reports/traces/vllm-v1-connector-own-reservation-stall.json")
    release = run_file(target.python, path, dict(target.env))
    assert release["exit"] == 1, release
    assert release["line"].startswith("FAILED: step 1: waiting=['A'] running=[]"), release


def test_a_fix_whose_text_is_not_in_the_engine_is_refused(tmp_path):
    package = tmp_path / "site" / "engine"
    package.mkdir(parents=True)
    (package / "core.py").write_text("x = 1\n")
    fix = Fix("engine", "engine==1", "test", (Edit("core.py", "x = 2\n", "x = 3\n"),))
    with pytest.raises(InputError, match="occurs 0 times"):
        patched_copy(fix, package, tmp_path / "out")
    good = Fix("engine", "engine==1", "test", (Edit("core.py", "x = 1\n", "x = 3\n"),))
    out = patched_copy(good, package, tmp_path / "out2")
    assert (out / "engine" / "core.py").read_text() == "x = 3\n"
    assert (package / "core.py").read_text() == "x = 1\n"  # the installed file is never written


def export_to(tmp_path: Path, trace: Path, *extra: str) -> Path:
    out = tmp_path / f"test_{trace.stem.replace('-', '_')}.py"
    assert main(["export", str(trace), "--to", "pytest", "--out", str(out), *extra]) == 0
    return out


def test_nano_vllm_seat_overfill_fails_on_the_release_and_passes_with_the_fix(tmp_path):
    target = need("nano-vllm")
    path = export_to(tmp_path, SEATS)
    release = run_file(target.python, path, {})
    assert release["exit"] == 1, release
    assert release["line"].startswith("FAILED: step 1: after schedule(), 2 sequences are running")
    fix = load_fix(ROOT / "docs/reports/fixes/nano-vllm-count-running-seats.json")
    from conformance.export.patching import installed_package_dir

    copy = patched_copy(fix, installed_package_dir(target.python, fix.package), tmp_path / "fixed")
    fixed = run_file(target.python, path, {"PYTHONPATH": str(copy)})
    assert fixed["exit"] == 0 and fixed["line"].startswith("passed"), fixed
    assert str(copy) in fixed["engine"]


def test_vllm_v1_pr_54028_assert_fails_on_the_release_and_passes_with_the_pr(tmp_path):
    target = need("vllm-v1")
    path = export_to(tmp_path, CUT)
    release = run_file(target.python, path, dict(target.env))
    assert release["exit"] == 1, release
    assert "step 3: Scheduler.schedule() raised AssertionError at scheduler.py:1579" in release["line"]
    from conformance.export.patching import installed_package_dir

    fix = load_fix(ROOT / "docs/reports/fixes/vllm-54028-skip-padding-below-threshold.json")
    copy = patched_copy(fix, installed_package_dir(target.python, fix.package), tmp_path / "fixed")
    fixed = run_file(target.python, path, {**target.env, "PYTHONPATH": str(copy)})
    assert fixed["exit"] == 0 and fixed["line"].startswith("passed"), fixed


def test_an_engine_that_raises_first_is_an_error_of_the_run_not_the_property_s_failure(tmp_path):
    """nano-vllm asserts in may_append with block_size 1 (a size its Config refuses; docs/CONFORMANCE.md,
    class block-size-1): the REQ-004 reproducer of that trace says so on an ERROR line, exit 2."""
    target = need("nano-vllm")
    path = export_to(tmp_path, ROOT / "docs/traces/lockstep-nano/block-size-1.json", "--property", "REQ-004")
    run = run_file(target.python, path, {})
    assert run["exit"] == 2, run
    assert run["line"].startswith("ERROR: step 1: Scheduler.schedule() raised AssertionError at block_manager.py:"), run
    assert run["line"].endswith("before REQ-004 broke"), run


def test_the_exported_file_runs_under_pytest_too(tmp_path):
    """In a copy of the target's venv environment with pytest added on PYTHONPATH (the venv itself,
    whose packages `kvsched targets install` pins, is left as it is)."""
    target = need("nano-vllm")
    path = export_to(tmp_path, SEATS)
    pytest_dir = Path(pytest.__file__).resolve().parent.parent  # the pytest this suite runs with
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path / "pytest-only")
    (tmp_path / "pytest-only").mkdir()
    for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "pygments"):
        source = pytest_dir / name
        if source.exists():
            (tmp_path / "pytest-only" / name).symlink_to(source)
    for extra in pytest_dir.glob("py.py"):
        (tmp_path / "pytest-only" / extra.name).symlink_to(extra)
    done = subprocess.run([str(target.python), "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 sequences are running" in done.stdout and "1 failed" in done.stdout


def test_the_committed_both_ways_results_are_current_with_the_findings():
    data = json.loads((ROOT / "docs/reports/both-ways.json").read_text())
    assert data["version"] == 1
    for finding in FINDINGS:
        runs = data["findings"][finding.slug]["runs"]
        assert [r["trace"] for r in runs] == [r.trace for r in finding.reproducers], finding.slug
        for run in runs:
            assert run["release"]["verdict"] in ("fails", "not run (target not installed)"), run
            assert run.get("fixed", {"verdict": "passes"})["verdict"] == "passes", run


# -- the targets with no defect finding (SGLang, LMDeploy): demonstrations -------------------------
@pytest.mark.parametrize("demo", DEMONSTRATIONS, ids=lambda d: d.slug)
def test_the_committed_demonstrations_are_what_export_writes_now(demo):
    trace = Trace.load(ROOT / demo.trace)
    exporter = exporter_for(trace, demo.target)
    text = render_pytest(trace, exporter, trace_property(trace, exporter, demo.property), demo.trace)
    assert kvsched_imports(text) == []
    path = ROOT / "docs/reports/demonstrations" / demo.slug / reproducer_name(demo)
    assert path.read_text() == text, "stale: rerun python -m conformance.selftest.campaigns.export_both_ways " \
                                     "--demonstrations"


def test_the_committed_demonstration_results_did_what_their_kind_says():
    data = json.loads((ROOT / "docs/reports/both-ways.json").read_text())["demonstrations"]
    assert {d.target for d in DEMONSTRATIONS} >= {"lmdeploy", "sglang"}
    for demo in DEMONSTRATIONS:
        run = data[demo.slug]
        assert run["trace"] == demo.trace and run["kind"] == demo.kind
        if demo.kind == "deviation":
            assert run["release"]["verdict"] == "fails" and demo.fails_with in run["release"]["line"], run
        else:
            assert run["release"]["verdict"] == "passes" and run["seeded"]["verdict"] == "fails", run
            assert demo.fails_with in run["seeded"]["line"]
            assert load_fix(ROOT / "docs/reports/seeded" / demo.seeded).edits


def run_demonstration(demo, tmp_path: Path) -> None:
    """Export the demonstration's trace and run it on the installed release (and the seeded copy)."""
    from conformance.export.patching import installed_package_dir

    target = need(demo.target)
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = export_to(tmp_path, ROOT / demo.trace, *(["--property", demo.property] if demo.property else []))
    release = run_file(target.python, path, dict(target.env))
    if demo.kind == "deviation":
        assert release["exit"] == 1 and demo.fails_with in release["line"], release
        return
    assert release["exit"] == 0 and release["line"].startswith("passed"), release
    fix = load_fix(ROOT / "docs/reports/seeded" / demo.seeded)
    copy = patched_copy(fix, installed_package_dir(target.python, fix.package), tmp_path / "seeded")
    seeded = run_file(target.python, path, {**target.env, "PYTHONPATH": str(copy)})
    assert seeded["exit"] == 1 and demo.fails_with in seeded["line"], seeded
    assert str(copy) in seeded["engine"]


def test_lmdeploy_exports_fail_on_its_deviation_and_on_a_seeded_defect(tmp_path):
    for demo in (d for d in DEMONSTRATIONS if d.target == "lmdeploy"):
        run_demonstration(demo, tmp_path / demo.slug)


def test_sglang_export_fails_on_its_deviation(tmp_path):
    """One run only: importing SGLang's scheduler costs about 11 s of CPU a run (40 s wall at load 8);
    the seeded demonstration's two runs are in the both-ways record, checked above."""
    run_demonstration(get_demonstration("sglang-first-prefill-above-input-budget"), tmp_path)


# -- tokasaurus 0.0.4: a stranger adapter (docs/examples/tokasaurus/), exported like a target ------
TOKASAURUS_CRASH = ROOT / "docs/examples/tokasaurus/traces/FAULT-raised.json"


def test_tokasaurus_is_exported_though_it_is_no_registry_target():
    trace = Trace.load(TOKASAURUS_CRASH)
    exporter = exporter_for(trace, None)
    assert exporter.target == "tokasaurus" and trace_property(trace, exporter) == "FAULT-raised"
    text = render_pytest(trace, exporter, "FAULT-raised", str(TOKASAURUS_CRASH.relative_to(ROOT)))
    assert kvsched_imports(text) == [] and "tokasaurus==0.0.4" in text


def test_tokasaurus_crash_fails_on_the_release_and_passes_with_the_fix(tmp_path):
    from conformance.export.patching import installed_package_dir
    from conformance.export.strangers import STRANGERS

    target = STRANGERS["tokasaurus"]
    if not target.installed():
        pytest.skip(f"tokasaurus venv missing: {target.venv} ({target.how_to_install})")
    path = export_to(tmp_path, TOKASAURUS_CRASH)
    release = run_file(target.python, path, {})
    assert release["exit"] == 1, release
    assert "step 0: schedule_steps() raised AssertionError at scheduler.py:180" in release["line"]
    fix = load_fix(ROOT / "docs/reports/fixes/tokasaurus-count-one-token-completion-blocks.json")
    copy = patched_copy(fix, installed_package_dir(target.python, fix.package), tmp_path / "fixed")
    fixed = run_file(target.python, path, {"PYTHONPATH": str(copy)})
    assert fixed["exit"] == 0 and fixed["line"].startswith("passed"), fixed


def test_aphrodite_carries_vllm_s_padded_admission_assert(tmp_path):
    """vLLM's exported file, under Aphrodite's module names, fails on Aphrodite 0.24.1 at its copy of the
    assert. One run only (about 23 s of CPU: Aphrodite's import); the fix's run is in the both-ways record."""
    target = need("aphrodite")
    path = export_to(tmp_path, ROOT / "docs/reports/traces/aphrodite-padded-admission-cut-by-threshold.json")
    release = run_file(target.python, path, dict(target.env))
    assert release["exit"] == 1, release
    assert "step 3: Scheduler.schedule() raised AssertionError at scheduler.py:1102" in release["line"]
    assert "aphrodite" in release["engine"]
