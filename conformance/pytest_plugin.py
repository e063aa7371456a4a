"""pytest plugin: ``--kvsched-adapter=module:factory`` adds one conformance test per invariant.

Loaded automatically through the ``pytest11`` entry point once kvsched is installed; it does
nothing unless the option (or ``kvsched_adapter`` in the ini file) is given.
"""

from __future__ import annotations


def pytest_addoption(parser):
    group = parser.getgroup("kvsched", "kvsched scheduler conformance")
    group.addoption("--kvsched-adapter", default=None, help="adapter spec: a built-in name or module:factory")
    group.addoption("--kvsched-profile", default=None, help="conformance profile (default: the adapter's own)")
    group.addoption("--kvsched-examples", type=int, default=None, help="fuzzed traces to run (default 100)")
    group.addoption("--kvsched-seed", type=int, default=None, help="seed for the fuzzed traces")
    parser.addini("kvsched_adapter", "adapter spec for kvsched conformance tests", default=None)
