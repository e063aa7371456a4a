"""The mutation benchmark's workspace under ``~/.cache/kvsched/mutation`` (``$KVSCHED_MUTATION_DIR``):
everything third-party it needs, fetched through the ordinary clients and never committed.

* ``venv/``: Cosmic Ray 8.7.0, for `cosmic_tool.py` (its own venv: its dependencies, SQLAlchemy
  and aiohttp among them, have no business in kvsched's or the target's environment);
* ``pydeps/``: pytest, installed with ``pip --target`` for the target venv's Python, put on the
  fork server's path (the shared vllm-v1 target venv is left as ``kvsched targets install`` made it);
* ``sdist/vllm-0.33.0/tests/``: vLLM's own tests, only ``tests/v1/core`` and the few helper
  modules it imports, extracted from the 0.33.0 sdist (sha256 pinned below);
* ``hf/``: an offline Hugging Face cache holding only the model configs vLLM's tests ask for
  (`hf_configs`);
* ``scratch/<mutant>/vllm/...``: the mutated files (overlays), one per mutant.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

COSMIC_RAY = "cosmic-ray==8.7.0"
PYTEST = "pytest==8.4.2"
SDIST = "vllm-0.33.0.tar.gz"
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
SIMPLE_INDEX = "https://pypi.org/simple/vllm/"
# What of the sdist the tests need: tests/v1/core and the helpers its modules import.
SDIST_MEMBERS = ("tests/__init__.py", "tests/utils.py", "tests/v1/__init__.py", "tests/v1/core/",
                 "tests/v1/kv_connector/__init__.py", "tests/v1/kv_connector/unit/__init__.py",
                 "tests/v1/kv_connector/unit/utils.py", "pyproject.toml")


def root() -> Path:
    return Path(os.environ.get("KVSCHED_MUTATION_DIR") or Path.home() / ".cache" / "kvsched" / "mutation")


def tool_python() -> Path:
    return root() / "venv" / "bin" / "python"


def pydeps() -> Path:
    return root() / "pydeps"


def sdist_root() -> Path:
    return root() / "sdist" / "vllm-0.33.0"


def scratch() -> Path:
    return root() / "scratch"


def ensure_tool(log=print) -> Path:
    if not tool_python().exists():
        log(f"mutation: creating {root() / 'venv'} with {COSMIC_RAY}")
        subprocess.run([sys.executable, "-m", "venv", str(root() / "venv")], check=True)
        subprocess.run([str(tool_python()), "-m", "pip", "install", "-q", COSMIC_RAY], check=True)
    return tool_python()


def ensure_pytest(target_python: Path, log=print) -> Path:
    if not (pydeps() / "pytest").exists():
        log(f"mutation: pip install --target {pydeps()} {PYTEST}")
        subprocess.run([str(target_python), "-m", "pip", "install", "-q", "--target", str(pydeps()), PYTEST],
                       check=True)
    return pydeps()


def _sdist_url() -> str:
    request = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        index = json.load(answer)
    for f in index["files"]:
        if f["filename"] == SDIST:
            return f["url"]
    raise RuntimeError(f"{SDIST} not in {SIMPLE_INDEX}")


def ensure_tests(log=print) -> Path:
    """Download the sdist (checked against its sha256) and extract the test files we run."""
    if (sdist_root() / "tests" / "v1" / "core").is_dir():
        return sdist_root()
    archive = root() / "sdist" / SDIST
    archive.parent.mkdir(parents=True, exist_ok=True)
    if not archive.exists():
        log(f"mutation: downloading {SDIST}")
        urllib.request.urlretrieve(_sdist_url(), archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise RuntimeError(f"{archive}: sha256 {digest}, expected {SDIST_SHA256}")
    prefix = "vllm-0.33.0/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and m.name.startswith(prefix)
                   and any(m.name[len(prefix):] == s or (s.endswith("/") and m.name[len(prefix):].startswith(s))
                           for s in SDIST_MEMBERS)]
        tar.extractall(root() / "sdist", members=members, filter="data")
    return sdist_root()


def ensure_hf() -> Path:
    from conformance.selftest.mutation.hf_configs import write_cache

    return write_cache(root() / "hf")
