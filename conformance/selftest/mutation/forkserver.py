"""A fork server in the vllm-v1 target venv: import torch and vLLM once, fork one child per job.

Importing ``vllm.config`` costs 15-30 s of wall time here; a mutation run starts a fresh process
for each mutant and each judge (a mutated module must be imported from scratch), which would
spend most of the run importing. The server imports everything the judges need *except* the
mutable modules (`MUTABLE_PREFIXES`: the eight files of the scheduler stack and their importers),
then waits on a Unix socket. Each job forks a child that serves the mutated file in place of its
module through a meta-path finder (an overlay: the installed package is not touched), takes the
client's stdin/stdout/stderr (passed over the socket, SCM_RIGHTS) and runs either a host script
(the kvsched judge: a wire-protocol host) or pytest (vLLM's own tests).

Runs with the target venv's Python; imports nothing of kvsched (kvsched is not installed there).

    python forkserver.py SOCKET [--pytest-path DIR] [--preload-pytest]

Protocol: the client connects and sends one JSON line ``{"kind": "host"|"pytest", "overlay":
{module: file} , "argv": [...], "cwd": DIR, "env": {...}, "client_pid": PID, "cpu_file": PATH}`` with its three
standard fds; the server answers ``pid <child>\\n``; when the job ends the child answers ``rc <n>\\n``.
The child exits by itself when the client process is gone (checked twice a second). With a
``cpu_file`` the child appends its CPU seconds to it as it ends (not when it is killed).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import os
import signal
import socket
import sys
import threading
import time

# Modules that must be imported in the child (after the overlay is in place): the mutable files
# and every module that imports one of them. Found by importing the preloads below and checking
# that none of these is in sys.modules (`preload` asserts it).
MUTABLE_PREFIXES = (
    "vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler", "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.kv_cache_manager", "vllm.v1.core.block_pool", "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager", "vllm.v1.core.encoder_cache_manager", "vllm.v1.engine.",
)
PRELOAD = (
    "torch", "vllm.config", "vllm.sampling_params", "vllm.utils.hashing", "vllm.v1.kv_cache_interface",
    "vllm.v1.outputs", "vllm.v1.request", "vllm.v1.structured_output", "vllm.v1.core.kv_cache_utils",
    "vllm.multimodal.inputs", "vllm.lora.request", "vllm.distributed.kv_events", "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.utils",
)


class Overlay(importlib.abc.MetaPathFinder):
    """Serve ``module -> file`` from the overlay before the installed package is searched."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib's signature
        if fullname in self.files:
            return importlib.util.spec_from_file_location(fullname, self.files[fullname])
        return None


def preload(with_pytest: bool) -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    if with_pytest:
        import pytest  # noqa: F401
    loaded = [m for m in sys.modules if m.startswith(MUTABLE_PREFIXES)]
    if loaded:
        raise SystemExit(f"forkserver: preloads imported mutable modules {loaded}")


def write_cpu(job: dict) -> None:
    """Append this child's CPU seconds (its own and its waited-for children's) to the job's
    ``cpu_file``: the server does not wait for its children, so nobody else sees their CPU time."""
    path = job.get("cpu_file")
    if not path:
        return
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        with open(path, "a") as out:
            out.write(f"{own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime:.3f}\n")
    except OSError:
        pass


def watch_client(job: dict) -> None:
    """End the child when its client is gone (a killed client cannot forward the kill)."""
    while True:
        time.sleep(0.5)
        try:
            os.kill(job["client_pid"], 0)
        except ProcessLookupError:
            write_cpu(job)
            os._exit(3)


def run_child(conn: socket.socket, job: dict, fds: list[int]) -> None:
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.update(job.get("env", {}))
    if job.get("cwd"):
        os.chdir(job["cwd"])
    threading.Thread(target=watch_client, args=(job,), daemon=True).start()
    if job.get("overlay"):
        sys.meta_path.insert(0, Overlay(job["overlay"]))
    rc = 1
    try:
        sys.argv = list(job["argv"])
        if job["kind"] == "pytest":
            import pytest

            # The tests' root on the path, as ``python -m pytest`` from there would put it: a test
            # directory without __init__.py (tests/v1/core/prefix_cache) is otherwise its own root
            # and its ``from tests.v1.core...`` imports fail.
            sys.path.insert(0, os.getcwd())
            rc = int(pytest.main(sys.argv[1:]))
        else:
            import runpy

            sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
            runpy.run_path(sys.argv[0], run_name="__main__")
            rc = 0
    except SystemExit as exit_:
        rc = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - a crash at import is a result (the judge classifies it)
        import traceback

        traceback.print_exc()
        rc = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            write_cpu(job)
            conn.sendall(f"rc {rc}\n".encode())
        finally:
            os._exit(rc if 0 <= rc < 256 else 1)


def serve(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    print(f"forkserver ready {os.getpid()}", flush=True)
    while True:
        conn, _ = listener.accept()
        try:
            header, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
            job = json.loads(header.decode())
        except Exception as err:  # noqa: BLE001 - one bad client must not end the server
            print(f"forkserver: bad job: {err}", file=sys.stderr, flush=True)
            conn.close()
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            listener.close()
            run_child(conn, job, fds)
        for fd in fds:
            os.close(fd)
        try:
            conn.sendall(f"pid {pid}\n".encode())
        except OSError:
            pass
        conn.close()


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket")
    parser.add_argument("--pytest-path", action="append", default=[], help="prepended to sys.path (pytest's home)")
    parser.add_argument("--preload-pytest", action="store_true")
    args = parser.parse_args(argv)
    sys.path[:0] = args.pytest_path
    preload(args.preload_pytest)
    serve(args.socket)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
