"""Start and reach the fork server (`forkserver.py`) from kvsched's side.

`ForkServer` starts the server in the vllm-v1 target venv and builds the command line of one
job (`forkclient.py` with the job as JSON): a wire adapter runs that command as if it were the
host script, and the pytest judge runs it as if it were pytest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent


class ForkServer:
    def __init__(self, python: Path, socket: Path, *, pytest_path: Path | None = None, log: Path | None = None,
                 env: dict[str, str] | None = None, hf_home: Path | None = None) -> None:
        self.python, self.socket, self.pytest_path = python, socket, pytest_path
        self.log = log or socket.with_suffix(".log")
        # One OpenMP thread: libgomp's pool does not survive fork(), and the judges need no
        # parallel kernels (the machine's cores are shared anyway).
        # No PYTHONPATH: kvsched's own tests/ would shadow vLLM's ``tests`` package in pytest jobs.
        inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        # Offline: nothing outside is reachable here, and a test that asks the Hugging Face hub for
        # a model's config otherwise waits for the network to time out before failing.
        # HF_HOME: the offline cache of model configs that vLLM's tests read (`hf_configs`).
        # PYTHONHASHSEED: vLLM frees a step's finished requests in the order of a set of their ids
        # (the connector campaign's frees-in-set-order), so a run's findings follow the string hash;
        # every run's children share one fixed seed, so a resumed run's baselines are its own.
        self.env = {**inherited, "VLLM_TARGET_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                    "PYTHONHASHSEED": "0",
                    "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(hf_home or socket.parent / "hf"), **(env or {})}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 300.0) -> ForkServer:
        """Start the server (nice'd) and wait until it has imported vLLM and listens."""
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        args = [str(self.python), str(HERE / "forkserver.py"), str(self.socket)]
        if self.pytest_path is not None:
            args += ["--pytest-path", str(self.pytest_path), "--preload-pytest"]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(["nice", "-n", "10", *args], stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fork server exited: {self.log.read_text().strip().splitlines()[-1:]}")
            if "forkserver ready" in self.log.read_text():
                return self
            time.sleep(0.5)
        raise RuntimeError(f"fork server not ready after {timeout:.0f} s (log: {self.log})")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None

    def command(self, kind: str, argv: list[str], *, overlay: dict[str, str] | None = None, cwd: str | None = None,
                env: dict[str, str] | None = None, cpu_file: Path | None = None) -> list[str]:
        """The command line that runs ``argv`` (a host script, or pytest's arguments after
        ``pytest``) in a forked child, with ``overlay`` (module -> mutated file) in place; the child
        appends its CPU seconds to ``cpu_file`` as it ends (`read_cpu`)."""
        job = {"kind": kind, "argv": argv, "overlay": overlay or {}, "cwd": cwd, "env": env or {}}
        if cpu_file is not None:
            job["cpu_file"] = str(cpu_file)
        return [sys.executable, str(HERE / "forkclient.py"), str(self.socket), json.dumps(job, sort_keys=True)]


def read_cpu(cpu_file: Path) -> float:
    """The CPU seconds the forked children of one judge wrote to ``cpu_file`` (summed; 0 if none)."""
    try:
        return round(sum(float(x) for x in cpu_file.read_text().split()), 1)
    except (OSError, ValueError):
        return 0.0
