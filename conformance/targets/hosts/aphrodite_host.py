"""kvsched adapter host for Aphrodite 0.24.1's V1 scheduler (run with the ``aphrodite`` venv's Python).

Aphrodite (PyPI ``aphrodite-engine``; ``pip install aphrodite`` is an unrelated package) is a
vLLM fork: ``aphrodite/v1/core/sched/scheduler.py`` is vLLM's V1 ``Scheduler`` with its
``KVCacheManager``, under the package name ``aphrodite``, with the same module paths. The two
renames this host meets are ``VllmConfig`` -> ``AphroditeConfig`` (aphrodite/config) and the
scheduler's keyword ``vllm_config`` -> ``aphrodite_config`` (v1/core/sched/scheduler.py:80-90).

So this host does not copy the vLLM V1 host: it answers every ``vllm`` / ``vllm.*`` import with
the ``aphrodite`` module of the same path (a meta-path finder; nothing of Aphrodite is changed),
exposes ``AphroditeConfig`` under the name the V1 host imports, and runs ``vllm_v1_host.V1Engine``
with a scheduler factory that passes the config under Aphrodite's keyword. Everything the V1 host
documents (the model-runner loop, the null block, the translations) holds here unchanged.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault("APHRODITE_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvsched_host  # noqa: E402

SOURCE, ALIAS = "aphrodite", "vllm"


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``vllm.X`` is the already-imported (or freshly imported) ``aphrodite.X``."""

    def find_spec(self, name, path, target=None):
        if name == ALIAS or name.startswith(ALIAS + "."):
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def __init__(self) -> None:
        self.own_specs: dict[int, object] = {}

    def create_module(self, spec):
        module = importlib.import_module(SOURCE + spec.name[len(ALIAS):])
        self.own_specs[id(module)] = module.__spec__
        return module

    def exec_module(self, module) -> None:
        # the import system stamped the alias's spec on the real module: give it back its own
        module.__spec__ = self.own_specs.pop(id(module), module.__spec__)


def load():
    """Install the alias and return (V1Engine, CAPABILITIES) of the V1 host, bound to Aphrodite."""
    sys.meta_path.insert(0, _AliasFinder())
    config = importlib.import_module(SOURCE + ".config")
    config.VllmConfig = config.AphroditeConfig  # the name vllm_v1_host imports; same class
    import vllm_v1_host

    scheduler = importlib.import_module(SOURCE + ".v1.core.sched.scheduler").Scheduler

    def make_scheduler(*, vllm_config, **kwargs):
        return scheduler(aphrodite_config=vllm_config, **kwargs)

    class AphroditeEngine(vllm_v1_host.V1Engine):
        scheduler_cls = staticmethod(make_scheduler)

        def hello_extra(self) -> dict:
            from importlib.metadata import version

            return {"version": f"aphrodite-engine=={version('aphrodite-engine')}",
                    "source": os.path.dirname(sys.modules[SOURCE].__file__)}

    return AphroditeEngine, vllm_v1_host.CAPABILITIES


def main() -> int:
    # Aphrodite logs to stdout while it is imported, before `serve` would take fd 1 for the
    # protocol: take it first and hand serve the protocol stream.
    protocol = kvsched_host.protocol_stream()
    engine_cls, capabilities = load()
    return kvsched_host.serve(engine_cls(), "aphrodite", ("safety",), capabilities, stdout=protocol)


if __name__ == "__main__":
    sys.exit(main())
