"""The client of `forkserver.py`: run one job in a forked child as if it were this process.

Standard library only, so any Python starts it in milliseconds. It hands its own stdin, stdout
and stderr to the server (SCM_RIGHTS), so the child reads and writes them directly (a wire
adapter that started this client talks to the child), then waits for the child's exit status and
exits with it. SIGTERM or SIGINT kill the child first.

    python forkclient.py SOCKET JOB_JSON
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys


def main(argv: list[str]) -> int:
    path, job = argv[0], json.loads(argv[1])
    job["client_pid"] = os.getpid()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    socket.send_fds(conn, [json.dumps(job).encode()], [0, 1, 2])
    child: list[int] = []

    def stop(signum, _frame) -> None:  # noqa: ANN001 - signal handler signature
        for pid in child:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rc, buffer = None, b""
    while True:
        chunk = conn.recv(256)
        if not chunk:
            break
        buffer += chunk
        for line in buffer.split(b"\n")[:-1]:
            word, _, value = line.decode().partition(" ")
            if word == "pid":
                child.append(int(value))
            elif word == "rc":
                rc = int(value)
        buffer = buffer.rsplit(b"\n", 1)[-1]
        if rc is not None:
            break
    return 1 if rc is None else rc


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
