"""A wire host on kvsched_host.serve (the raw host's engine) that does something at step 3: the
command line for it, and adapter factories for the runner's child process (`--adapter
helper_host:segfault_at_step_3`, with this folder on sys.path)."""

from __future__ import annotations

import sys
from pathlib import Path

from conformance.wire import WireAdapter

HERE = Path(__file__).parent
HOSTS = HERE.parents[1] / "conformance" / "targets" / "hosts"
SEGV = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"


def command(schedule_at_step_3: str = "pass", refuse_block_size: int = 0,
            refusal: str = "raise ValueError('no such block size')") -> list[str]:
    """A host whose ``schedule`` runs ``schedule_at_step_3`` (Python source) at step 3, and whose
    ``reset`` runs ``refusal`` for a config with ``block_size`` ``refuse_block_size``."""
    script = (f"import sys, time; sys.path.insert(0, {str(HOSTS)!r}); sys.path.insert(0, {str(HERE)!r})\n"
              "import kvsched_host, raw_host\n"
              "class Engine(raw_host.Engine):\n"
              "    add_request, abort_request = raw_host.Engine.add, raw_host.Engine.abort\n"
              "    def reset(self, config):\n"
              f"        if config['block_size'] == {refuse_block_size}: {refusal}\n"
              "        return super().reset(config)\n"
              "    def snapshot(self):  # a copy: the engine's dicts change later\n"
              "        return raw_host.json.loads(raw_host.json.dumps(super().snapshot()))\n"
              "    def schedule(self):\n"
              f"        if self.step == 3: {schedule_at_step_3}\n"
              "        return super().schedule()\n"
              "kvsched_host.serve(Engine(), 'helper', capabilities=['output', 'statuses', 'queues'])\n")
    return [sys.executable, "-c", script]


def segfault_at_step_3() -> WireAdapter:
    return WireAdapter("segfault-at-3", command(SEGV), timeout=60)


# Issue 35's hosts: a host that starts a helper in its own session (which must not outlive the run),
# and one that signals the runner (its grandparent: the adapter's process is its parent).
SETSID_HELPER = ("import subprocess, os; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
                 "start_new_session=True); open(os.environ.get('KVSCHED_TEST_PIDS', os.devnull), 'a').write(f'{p.pid}\\n')")
SIGNAL_RUNNER = ("import os, signal; runner = int(open(f'/proc/{os.getppid()}/stat').read().rsplit(')', 1)[1].split()[1]); "
                 "os.kill(runner, signal.SIGTERM); time.sleep(30)")


def setsid_helper_at_step_3() -> WireAdapter:
    return WireAdapter("setsid-helper-at-3", command(SETSID_HELPER), timeout=60)


def signals_runner_at_step_3() -> WireAdapter:
    return WireAdapter("signals-runner-at-3", command(SIGNAL_RUNNER), timeout=60)
