"""pytest plugin: ``--kvsched-adapter=module:factory`` adds one conformance test per invariant.

Loaded automatically through the ``pytest11`` entry point once kvsched is installed; it does
nothing unless ``--kvsched-adapter`` (or ``kvsched_adapter`` in the ini file) is given. The
conformance run happens once per session, on the first kvsched test; each invariant then
passes, fails (the message names the shrunk counterexample trace to replay), or is skipped as
not applicable to what the adapter exposes.

It works from the adapter's own folder: the adapter's process has the current folder importable
(`conformance.runner.adapter.load_adapter`), ``path/to/file.py:factory`` is accepted too, and a bad
spec, profile or option stops pytest with one usage line instead of an INTERNALERROR.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("kvsched", "kvsched scheduler conformance")
    group.addoption("--kvsched-adapter", default=None, help="adapter spec: a built-in name, a target, path/to/file.py:factory or module:factory")
    group.addoption("--kvsched-profile", default=None, help="conformance profile (default: the adapter's own)")
    group.addoption("--kvsched-examples", type=int, default=None, help="fuzzed traces to run (default 100)")
    group.addoption("--kvsched-seed", type=int, default=None, help="seed for the fuzzed traces")
    group.addoption("--kvsched-workers", default="1", help="adapter processes searching at once (N or auto; default 1)")
    group.addoption("--kvsched-out", default="kvsched-out", help="folder for counterexample traces")
    group.addoption("--kvsched-skip", default=None, help="invariant IDs (or LOCKSTEP) not to check, comma-separated")
    group.addoption("--kvsched-expect", default=None,
                    help="an expectations file (docs/ADAPTERS.md): its known failures are xfail, its skips skipped")
    parser.addini("kvsched_adapter", "adapter spec for kvsched conformance tests", default=None)


class _Run:
    """The session's one conformance run, made on first use."""

    def __init__(self, config) -> None:
        from conformance.flows.profiles import get_profile
        from conformance.runner.isolated import ChildRunner
        from spec.errors import InputError

        self.spec = config.getoption("kvsched_adapter") or config.getini("kvsched_adapter")
        self.examples = config.getoption("kvsched_examples") or 100
        if self.examples < 1:
            raise InputError("--kvsched-examples", f"must be >= 1, got {self.examples}")
        from conformance.commands.arguments import parse_workers

        self.workers = parse_workers(config.getoption("kvsched_workers"), "--kvsched-workers")
        from conformance.runner.expectations import load_expectations, parse_skip, target_expectations

        expect = config.getoption("kvsched_expect")
        try:
            # A real target's own expectations file unless --kvsched-expect names one (as `kvsched conform`).
            known = load_expectations(Path(expect)) if expect else target_expectations(self.spec)
            self.expectations = known.with_skips(parse_skip(config.getoption("kvsched_skip")))
        except InputError as err:  # name the plugin's own flags
            where = {"--skip": "--kvsched-skip", "--expect": "--kvsched-expect"}.get(err.where, err.where)
            raise InputError(where, err.message) from None
        name = config.getoption("kvsched_profile")
        if name is not None:
            get_profile(name)  # a bad name fails before the adapter's process starts
        # The adapter runs in its own process, as under `kvsched conform`: nothing it does can
        # end or hang the test session.
        self.runner = ChildRunner(self.spec)
        self.adapter = self.runner.start()
        self.profile = get_profile(name or (self.adapter.profiles[0] if self.adapter.profiles else "safety"))
        self.seed = config.getoption("kvsched_seed")
        if self.seed is None:
            self.seed = random.randrange(2**31)
        self.out = Path(config.getoption("kvsched_out"))
        self.item_ids: list[str] = []
        self._result = None

    @property
    def result(self):
        if self._result is None:
            from conformance.runner.fuzz import fuzz
            from conformance.runner.plan import RunPlan

            try:
                plan = RunPlan(self.profile, self.out, max_examples=self.examples, seed=self.seed,
                               workers=self.workers, adapter_spec=self.spec, expectations=self.expectations)
                self._result = fuzz(self.runner, plan)
            finally:
                self.runner.close()
        return self._result


class KvschedItem(pytest.Item):
    def __init__(self, *, run: _Run, invariant_id: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.run = run
        self.invariant_id = invariant_id

    def runtest(self) -> None:
        result = self.run.result
        if self.invariant_id == OTHER:  # a problem no item above names must still fail the session
            unlisted = sorted(set(result.findings) - set(self.run.item_ids))
            if unlisted:
                raise KvschedFailure(unlisted[0], result.findings[unlisted[0]], result)
            return
        if self.invariant_id in result.not_applicable:
            pytest.skip(f"{self.invariant_id}: not applicable (the adapter does not expose what it needs)")
        finding = result.findings.get(self.invariant_id)
        if finding is not None:
            raise KvschedFailure(self.invariant_id, finding, self.run.result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, KvschedFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return "kvsched", 0, f"kvsched[{self.run.adapter.name}] {self.invariant_id}"


class KvschedFailure(AssertionError):
    def __init__(self, invariant_id: str, finding, result) -> None:
        from conformance.reports.report import replay_command
        from spec.catalogue import get

        statement = get(invariant_id).statement if "-" in invariant_id and not invariant_id.startswith("FAULT") else ""
        super().__init__(
            f"{invariant_id}: {statement}\n{finding.message}\n"
            f"counterexample ({finding.steps} steps): {finding.path}\n"
            f"replay: {replay_command(result, finding)}"
            + (f"\nat {finding.location}" if getattr(finding, "location", None) else "")
        )


OTHER = "other"  # the item that fails on any problem the others do not name


def pytest_collection_modifyitems(session, config, items):
    spec = config.getoption("kvsched_adapter") or config.getini("kvsched_adapter")
    if not spec:
        return
    from spec.errors import InputError

    try:
        run = _Run(config)
    except InputError as err:  # a usage error: one line, not an INTERNALERROR
        raise pytest.UsageError(f"kvsched: {err.where}: {err.message}") from None
    ids = [inv.id for inv in run.profile.invariants()]
    if run.profile.lockstep and run.profile.name in run.adapter.profiles:
        ids.append("LOCKSTEP")
    from conformance.runner.summary import FAULT_KINDS

    ids += [f"FAULT-{kind}" for kind in FAULT_KINDS]
    run.item_ids = list(ids)
    expectations = run.expectations
    for invariant_id in [*ids, OTHER]:
        item = KvschedItem.from_parent(session, name=f"kvsched[{invariant_id}]", run=run, invariant_id=invariant_id)
        if invariant_id in expectations.skip:
            item.add_marker(pytest.mark.skip(reason=f"kvsched: skipped: {expectations.skip[invariant_id]}"))
        elif invariant_id in expectations.expected:  # a pass is XPASS: a hint to update the file, not a failure
            item.add_marker(pytest.mark.xfail(reason=f"kvsched: expected: {expectations.expected[invariant_id]}",
                                              strict=False))
        items.append(item)


def pytest_report_header(config):
    spec = config.getoption("kvsched_adapter", default=None)
    if spec:
        return f"kvsched: conformance of adapter {spec!r}"
    return None
