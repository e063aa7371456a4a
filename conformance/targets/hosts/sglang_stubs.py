"""Import SGLang's scheduler modules on a CPU-only machine without running its heavy ``__init__``s.

Used by ``sglang_host.py`` and by the ``sglang`` target's smoke test (run with the target venv's
Python; standard library only here). Two stubs, nothing in SGLang itself is changed:

* ``sglang/__init__.py`` applies HF patches and imports the whole ``sglang.lang`` frontend: a stub
  parent package (same ``__path__``) is put in ``sys.modules`` so submodules import from the real
  files but that ``__init__`` never runs.
* ``torchvision`` is imported at module level by multimodal helpers reached from
  ``sglang.srt.configs`` (``multimodal/internvl_utils.py``: ``import torchvision.transforms as T``);
  the only wheel pulls a CUDA torch. A meta-path finder answers ``torchvision.*`` with modules
  whose attributes are inert placeholders. transformers is asked first whether torchvision is
  available (its answer is cached: no), so transformers never takes the stub for the real thing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

STUBBED = ("torchvision",)


class _Meta(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _Placeholder(metaclass=_Meta):
    """Stands for any torchvision class/function; never called on the scheduler's paths."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        return _Placeholder()

    def __getattr__(self, name: str):
        return _Placeholder()


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module) -> None:
        module.__path__ = []


def load() -> dict:
    """Install the stubs and import the scheduler modules; returns them by short name."""
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")  # locates the package without executing __init__
        if spec is None or spec.origin is None:
            raise SystemExit(f"sglang is not installed in {sys.executable}")
        parent = types.ModuleType("sglang")
        parent.__path__ = [os.path.dirname(spec.origin)]
        parent.__file__ = spec.origin
        sys.modules["sglang"] = parent
        from transformers.utils import import_utils

        import_utils.is_torchvision_available()  # cache "no" before the stub exists
        import_utils.is_torchvision_greater_or_equal("0.27")
        sys.meta_path.insert(0, _StubFinder())
    names = {
        "policy": "sglang.srt.managers.schedule_policy",
        "batch": "sglang.srt.managers.schedule_batch",
        "radix": "sglang.srt.mem_cache.radix_cache",
        "scheduler": "sglang.srt.managers.scheduler",
    }
    return {short: importlib.import_module(full) for short, full in names.items()}


if __name__ == "__main__":
    mods = load()
    print(mods["policy"].PrefillAdder.__name__, mods["scheduler"].Scheduler.__name__)
