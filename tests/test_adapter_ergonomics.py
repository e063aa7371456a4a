"""Adapter ergonomics, tried as a stranger would: ADAPTERS.md's commands run as written from the
example's folder, every printed command runs as printed, adapter specs load from a file or the
current folder, traces remember their adapter and profile, and bad specs are one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.runner.adapter import canonical_spec, load_adapter
from conformance.selftest.docs_gen import EXAMPLE_COMMANDS, EXAMPLES
from spec.domain import ConfigDomain
from spec.errors import InputError
from spec.trace import Trace

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "80"}  # a narrow terminal: long lines must not wrap

# A correct engine made to lie about its statuses (QUE-002), printing as it goes.
BROKEN = '''
import myengine
import myengine_adapter


class Lying(myengine.Scheduler):
    def statuses(self):
        print("NOISE-FROM-ADAPTER")
        return {r: ("WAITING" if s == "RUNNING" else s) for r, s in super().statuses().items()}


myengine.Scheduler = Lying
make = myengine_adapter.make
'''


def _sh(command: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def example(tmp_path: Path) -> Path:
    folder = tmp_path / "myengine"
    shutil.copytree(EXAMPLES / "myengine", folder, ignore=shutil.ignore_patterns("__pycache__", "kvsched-out"))
    return folder


def test_adapters_md_runs_exactly_as_written(example):
    text = (ROOT / "docs" / "ADAPTERS.md").read_text()
    assert (EXAMPLES / "myengine" / "myengine_adapter.py").read_text() in text  # the code shown is the code run
    block = text.split("From that folder, exactly as written", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip()]
    assert commands == list(EXAMPLE_COMMANDS)
    for command in commands:
        done = _sh(command, example)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        assert "Traceback" not in done.stdout + done.stderr
    report = json.loads((example / "report.json").read_text())
    assert report["conforming"] and report["examples"] <= 200
    assert (example / "junit.xml").exists() and (example / "view.html").exists()


def test_printed_commands_run_as_printed_and_traces_remember_their_adapter(example, tmp_path):
    (example / "broken_adapter.py").write_text(BROKEN)
    done = _sh("kvsched conform --adapter broken_adapter:make --max-examples 30 --quiet --out out --json r.json", example)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "NOISE-FROM-ADAPTER" not in done.stdout + done.stderr  # the adapter's output stays out of the report
    assert "NOISE-FROM-ADAPTER" in (example / "out" / "adapter-output.log").read_text()
    report = json.loads((example / "r.json").read_text())
    assert report["examples"] <= 30
    replays = re.findall(r"^  replay: (.+)$", done.stdout, re.M)
    assert replays, done.stdout
    saved = Trace.load(example / "out" / "counterexamples" / "QUE-002.json")
    assert saved.meta["adapter_spec"] == f"{example / 'broken_adapter.py'}:make"
    assert saved.meta["profile"] == "safety"
    assert ConfigDomain(swap=False, cpu_pool=False, watermark=0.0, priority=False, max_n=1).admits(saved)
    for command in replays:
        again = _sh(command, example)
        assert again.returncode == 1 and "VIOLATION" in again.stdout, f"{command}\n{again.stdout}{again.stderr}"
    # From another folder, with nothing but the trace: a file adapter the trace names is not run
    # (exit 2, nothing loaded); the refusal prints the command that runs it, whose profile comes from the meta.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    alone = _sh(f"kvsched replay {example / 'out' / 'counterexamples' / 'QUE-002.json'}", elsewhere)
    assert alone.returncode == 2 and "NOISE-FROM-ADAPTER" not in alone.stdout + alone.stderr, alone.stderr
    named = _sh(alone.stderr.split("to run it: ", 1)[1].strip(), elsewhere)
    assert named.returncode == 1 and "on myengine (profile safety)" in named.stdout and "QUE-002" in named.stdout
    # A rerun replays what was saved first and still counts no more than --max-examples new traces.
    rerun = _sh("kvsched conform --adapter broken_adapter:make --max-examples 3 --quiet --out out --json r.json", example)
    again = json.loads((example / "r.json").read_text())
    assert rerun.returncode == 1 and again["replayed"] >= 1 and again["examples"] <= 3


def test_the_pytest_plugin_runs_from_the_adapter_folder(example):
    (example / "broken_adapter.py").write_text(BROKEN)
    done = _sh("pytest -q -p no:cacheprovider --kvsched-adapter=broken_adapter:make --kvsched-examples=20", example)
    assert done.returncode == 1, done.stdout[-3000:]
    command = re.search(r"replay: (kvsched replay .+)$", done.stdout, re.M).group(1)
    assert _sh(command, example).returncode == 1
    listed = _sh("pytest -q -p no:cacheprovider --collect-only --kvsched-adapter=broken_adapter.py:make", example)
    for item in ("kvsched[QUE-002]", "kvsched[FAULT-checker]", "kvsched[FAULT-config-rejected]", "kvsched[other]"):
        assert item in listed.stdout  # every problem the runner can report fails some test
    bad = _sh("pytest -q -p no:cacheprovider --kvsched-adapter=no_such_module:make", example)
    assert bad.returncode == 4 and "INTERNALERROR" not in bad.stdout + bad.stderr
    assert "kvsched: --adapter: cannot import 'no_such_module'" in bad.stderr


@pytest.fixture
def isolated_imports(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def _write_adapter(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}_helper.py").write_text("from reference_impl.scheduler import Scheduler\n")
    (folder / f"{name}.py").write_text(
        f"from {name}_helper import Scheduler\n"
        "from conformance.runner.adapter import SchedulerAdapter\n"
        "from spec.domain import ConfigDomain\n\n"
        "def make():\n"
        "    return SchedulerAdapter('mine', Scheduler, domain=ConfigDomain(swap=False))\n")


def test_specs_load_from_a_file_or_the_current_folder(tmp_path, monkeypatch, isolated_imports):
    _write_adapter(tmp_path / "sub", "ergo_file_ad")
    monkeypatch.chdir(tmp_path)
    adapter = load_adapter("sub/ergo_file_ad.py:make")  # its sibling module imports too
    assert adapter.name == "mine" and adapter.domain == ConfigDomain(swap=False)
    assert canonical_spec("sub/ergo_file_ad.py:make") == f"{tmp_path / 'sub' / 'ergo_file_ad.py'}:make"
    _write_adapter(tmp_path, "ergo_mod_ad")
    assert load_adapter("ergo_mod_ad:make").name == "mine"
    assert canonical_spec("ergo_mod_ad:make") == f"{tmp_path / 'ergo_mod_ad.py'}:make"
    for unchanged in ("reference", "reference-v1", "conformance.runner.adapter:load_adapter", "vllm-v0"):
        assert canonical_spec(unchanged) == unchanged


@pytest.mark.parametrize("spec, words", [
    ("missing.py:make", "no file 'missing.py'"),
    ("ergo_nothere:make", "cannot import 'ergo_nothere'"),
    ("sub/ergo_bad_ad.py:nope", "has no callable 'nope'"),
    ("sub/ergo_bad_ad.py:make", "ergo_bad_ad.py"),  # the factory raises: the message names its file:line
    ("nonsense", "unknown adapter 'nonsense'"),
])
def test_bad_specs_are_one_line(tmp_path, monkeypatch, isolated_imports, spec, words):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "ergo_bad_ad.py").write_text("def make():\n    raise RuntimeError('no engine here')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as err:
        load_adapter(spec)
    assert err.value.where == "--adapter" and words in err.value.message and "\n" not in err.value.message


def test_a_syntax_error_is_reported_with_its_line(tmp_path):
    (tmp_path / "ergo_syntax.py").write_text("def make():\n    return (\n")
    done = _sh("kvsched conform --adapter ergo_syntax.py:make --max-examples 1 --quiet --out out", tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    assert f"{tmp_path / 'ergo_syntax.py'}:" in done.stdout + done.stderr


def test_the_child_declares_its_domain_in_its_hello():
    from conformance.runner.isolated import ChildRunner

    runner = ChildRunner(f"{EXAMPLES / 'myengine' / 'myengine_adapter.py'}:make")
    try:
        info = runner.start()
    finally:
        runner.close()
    assert ConfigDomain.from_dict(info.domain) == ConfigDomain(swap=False, cpu_pool=False, watermark=0.0,
                                                                priority=False, max_n=1)


LEAKY = '''
import tinyserve
import tinyserve_adapter


class Leaky(tinyserve.TinyServe):
    def cancel(self, rid):
        s = self.seqs.get(rid)
        if s is not None and s.state == "active":
            s.table = []  # forgets to give the blocks back
        return super().cancel(rid)


tinyserve.TinyServe = Leaky
make = tinyserve_adapter.make
'''


def test_tinyserve_adapter_is_short_conforms_and_catches_a_leak(tmp_path):
    """The stranger's adapter (docs/examples/tinyserve) fits in under 100 lines, conforms to
    liveness, and a scheduler that leaks blocks on cancel fails it."""
    folder = tmp_path / "tinyserve"
    shutil.copytree(EXAMPLES / "tinyserve", folder, ignore=shutil.ignore_patterns("__pycache__"))
    assert len((folder / "tinyserve_adapter.py").read_text().splitlines()) < 100
    ok = _sh("kvsched conform --adapter tinyserve_adapter.py:make --profile liveness --max-examples 150 --seed 1 "
             "--quiet --json r.json", folder)
    report = json.loads((folder / "r.json").read_text())
    passed = {row["id"] for row in report["invariants"] if row["status"] == "pass"}
    assert ok.returncode == 0 and report["summary"]["fail"] == 0, ok.stdout
    assert {"BLK-001", "BLK-003", "STR-001", "QUE-001", "REQ-001"} <= passed, sorted(passed)  # the tables are checked
    (folder / "leaky.py").write_text(LEAKY)
    bad = _sh("kvsched conform --adapter leaky.py:make --max-examples 150 --seed 1 --quiet --out leak", folder)
    assert bad.returncode == 1 and "BLK-001" in bad.stdout


def test_a_fault_names_the_adapter_line(tmp_path):
    (tmp_path / "ergo_raises.py").write_text(
        "from conformance.runner.adapter import SchedulerAdapter\n"
        "from reference_impl.scheduler import Scheduler\n\n\n"
        "class Raising(Scheduler):\n"
        "    def schedule(self):\n"
        "        raise RuntimeError('boom')\n\n\n"
        "def make():\n"
        "    return SchedulerAdapter('raises', Raising)\n")
    done = _sh("kvsched conform --adapter ergo_raises:make --max-examples 2 --quiet --out out", tmp_path)
    assert done.returncode == 1
    saved = Trace.load(tmp_path / "out" / "counterexamples" / "FAULT-raised.json")
    assert saved.meta["location"] == f"{tmp_path / 'ergo_raises.py'}:7"
    assert f"at {tmp_path / 'ergo_raises.py'}:7" in done.stdout


def test_a_crash_in_kvsched_checks_is_not_blamed_on_the_adapter():
    """The child answers a crash in kvsched's own code with FAULT-checker (kvsched's file:line,
    the trace kept), not by dying as though the adapter had exited."""
    from conformance.reports.report import _FAULT_CATEGORY
    from conformance.runner.summary import TraceSummary
    from conformance.runner.worker import _checker_failed

    try:
        {}["missing"]
    except KeyError as err:
        answer = _checker_failed(err, 3)
    problem = TraceSummary.from_dict(answer["summary"]).problems["FAULT-checker"]
    assert problem.step == 3 and "kvsched bug" in problem.message
    assert problem.location.startswith(__file__ + ":") and _FAULT_CATEGORY["FAULT-checker"] == "kvsched"


def test_a_file_inside_a_package_loads_with_its_package_imports(tmp_path):
    """`--adapter pkg/sub/mod.py:make` where mod imports its package absolutely and relatively:
    imported by its dotted name, as pytest imports test files in packages."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "helpers.py").write_text("from conformance.runner.adapter import load_adapter\n"
                                    "def make():\n    return load_adapter('reference')\n")
    (pkg / "sub" / "mod.py").write_text("from pkg.helpers import make as _make\nfrom .. import helpers\n"
                                        "def make():\n    assert helpers.make is _make\n    return _make()\n")
    report = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "conformance", "conform", "--adapter", "pkg/sub/mod.py:make",
                           "--max-examples", "3", "--quiet", "--out", "out", "--json", str(report)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_crash_on_a_feature_the_adapter_may_lack_points_to_the_config_domain():
    from conformance.reports.report import _domain_hint
    from conformance.runner.fuzz import Finding
    from spec.trace import Trace

    trace = Trace.from_dict({"version": 1, "config": {"preemption_mode": "recompute"}, "requests": [
        {"id": "a", "prompt_len": 4, "max_tokens": 2, "n": 2, "arrival_step": 0}], "max_steps": 4})
    hint = _domain_hint("FAULT-raised", Finding("FAULT-raised", "m", trace, 1))
    assert hint and "max_n" in hint and "Declaring the config domain" in hint
    assert _domain_hint("BLK-001", Finding("BLK-001", "m", trace, 1)) is None
    plain = Trace.from_dict({"version": 1, "config": {"preemption_mode": "recompute"}, "requests": [
        {"id": "a", "prompt_len": 4, "max_tokens": 2, "arrival_step": 0}], "max_steps": 4})
    assert _domain_hint("FAULT-raised", Finding("FAULT-raised", "m", plain, 1)) is None
