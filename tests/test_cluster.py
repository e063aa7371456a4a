"""`kvsched conform --ray ADDRESS --redis URL`, for real: a local Ray head and a real `redis-server`
on this machine, a campaign against a broken adapter, then a second run with a fresh ``--out``
that only Redis can have told about the failure.

Skipped when ray (``kvsched[cluster]``) or ``redis-server`` (Debian's package) is missing, unless
``KVSCHED_REQUIRE_CLUSTER=1`` (CI sets it), where a missing piece fails the test instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis.database import InMemoryExampleDatabase

from conformance.commands.cli import main
from conformance.generation.v0 import traces
from conformance.runner.example_db import SharedExamples, key_for
from conformance.runner.workers import draw
from spec.trace import Trace

TESTS = Path(__file__).parent
ROOT = TESTS.parent
BROKEN = f"{TESTS / 'broken_adapters.py'}:fork_without_incref"  # finds BLK-003 within a few traces
REQUIRED = os.environ.get("KVSCHED_REQUIRE_CLUSTER") == "1"
RAY_WORKER_PORTS = range(10002, 20000)  # `ray start`'s default worker ports: the head's port must be elsewhere


def _missing(what: str) -> None:
    if REQUIRED:
        pytest.fail(f"KVSCHED_REQUIRE_CLUSTER=1 but {what} is missing")
    pytest.skip(f"{what} is missing (pip install 'kvsched[cluster]'; apt-get install redis-server)")


def _free_port() -> int:
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in RAY_WORKER_PORTS:
            return port


def _stop_group(proc: subprocess.Popen) -> None:
    """End the process group this test started (its own session), and nothing else. Ray's head
    may take its time over SIGTERM on a loaded machine; a few seconds, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; anything left in its group goes too
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None or importlib.util.find_spec("redis") is None:
        _missing("redis-server or the redis client")
    import redis

    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        _stop_group(proc)


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    ray_cli = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if importlib.util.find_spec("ray") is None or not Path(ray_cli).exists():
        _missing("ray")
    port = _free_port()
    folder = tempfile.mkdtemp(prefix="kvr-")  # short: Ray's socket paths must fit in 107 bytes
    # The head's workers inherit this environment: this checkout's kvsched importable there too.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "RAY_USAGE_STATS_ENABLED": "0"}
    started = time.monotonic()
    proc = subprocess.Popen(
        [ray_cli, "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=2",
         "--include-dashboard=false", "--disable-usage-stats", "--object-store-memory=100000000",
         f"--temp-dir={folder}", "--block"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env,
    )
    try:
        said = []
        for line in proc.stdout:  # type: ignore[union-attr]
            said.append(line)
            if "Ray runtime started" in line:
                break
        else:
            pytest.fail("ray start --head did not start:\n" + "".join(said[-20:]))
        print(f"ray head started in {time.monotonic() - started:.1f} s")
        _drain(proc)
        yield f"127.0.0.1:{port}"
    finally:
        stopping = time.monotonic()
        _stop_group(proc)
        print(f"ray head stopped in {time.monotonic() - stopping:.1f} s")
        shutil.rmtree(folder, ignore_errors=True)


def _drain(proc: subprocess.Popen) -> None:
    """Keep reading the head's output so a full pipe never stalls it."""
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]


def _conform(out: Path, *extra: str) -> tuple[int, dict]:
    report = out.parent / f"{out.name}.json"
    code = main(["conform", "--adapter", BROKEN, "--quiet", "--out", str(out), "--json", str(report), *extra])
    return code, json.loads(report.read_text())


def _stored(url: str) -> list[Trace]:
    import redis
    from hypothesis.extra.redis import RedisExampleDatabase

    database = RedisExampleDatabase(redis.Redis.from_url(url), key_prefix=b"kvsched:")
    return list(SharedExamples(database, BROKEN, "safety").traces())


def test_a_campaign_on_ray_is_shared_through_redis(redis_url, ray_address, tmp_path):
    started = time.monotonic()
    code, report = _conform(tmp_path / "first", "--seed", "11", "--max-examples", "24", "--ray", ray_address,
                            "--redis", redis_url)
    first_s = time.monotonic() - started
    statuses = {r["id"]: r["status"] for r in report["invariants"]}
    assert code == 1 and statuses["BLK-003"] == "fail" and report["examples"] == 24
    saved = Trace.load(tmp_path / "first" / "counterexamples" / "BLK-003.json")
    assert saved.meta["shrunk"] is True and len(saved.requests) <= 2
    stored = {t.meta["problem"]: t for t in _stored(redis_url)}
    assert stored["BLK-003"].to_json() == saved.to_json()  # the shrunk one, and only it, for BLK-003
    assert all(t.meta["shrunk"] for t in stored.values())
    assert (tmp_path / "first" / "counterexamples" / "BLK-003.html").is_file()  # written on the node, sent back

    # A fresh --out and one trace of budget: the first failing trace it sees is the one Redis held.
    started = time.monotonic()
    code, again = _conform(tmp_path / "second", "--seed", "99", "--max-examples", "1", "--ray", ray_address,
                           "--workers", "1", "--redis", redis_url)
    second_s = time.monotonic() - started
    assert code == 1 and again["replayed"] == len(stored)
    found = Trace.load(tmp_path / "second" / "found" / "BLK-003.json")
    assert found.to_dict()["requests"] == saved.to_dict()["requests"]
    print(f"first run {first_s:.1f} s, second {second_s:.1f} s")


def test_shared_examples_keep_the_shrunk_trace_in_place_of_the_unshrunk():
    database = InMemoryExampleDatabase()
    shared = SharedExamples(database, "spec:f", "safety")
    one, two = draw(traces(), 5, 2)
    assert one.to_json() != two.to_json()
    shared.found("BLK-003", one)
    shared.found("BLK-003", two)
    assert len(list(shared.traces())) == 2
    shared.shrunk("BLK-003", one)
    assert [t.to_json() for t in shared.traces()] == [one.to_json()]
    database.save(key_for("spec:f", "safety"), b"not json")  # passed over, not an error
    assert [t.to_json() for t in shared.traces()] == [one.to_json()]
    assert list(SharedExamples(database, "spec:f", "liveness").traces()) == []  # keyed by profile too


def test_ray_without_the_extra_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    code = main(["conform", "--adapter", "reference", "--out", str(tmp_path / "o"), "--ray", "auto"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--ray" in err and "kvsched[cluster]" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("address", ["127.0.0.1:{port}", "not-an-address"])
def test_ray_address_that_does_not_answer_is_one_line_at_once(address, tmp_path, capsys):
    if importlib.util.find_spec("ray") is None:
        _missing("ray")
    started = time.monotonic()
    code = main(["conform", "--adapter", "reference", "--out", str(tmp_path / "o"),
                 "--ray", address.format(port=_free_port())])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--ray" in err
    assert time.monotonic() - started < 10 and not (tmp_path / "o").exists()  # ray.init alone retries for minutes


def test_redis_that_does_not_answer_is_one_line(tmp_path, capsys):
    if importlib.util.find_spec("redis") is None:
        _missing("the redis client")
    code = main(["conform", "--adapter", "reference", "--out", str(tmp_path / "o"),
                 "--redis", f"redis://127.0.0.1:{_free_port()}/0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--redis" in err
    assert not (tmp_path / "o").exists()


def test_fuzz_feeds_and_replays_a_shared_database_without_a_cluster(tmp_path):
    """The same contract as the Redis test, in process: what one run stores, a run with a fresh
    ``--out`` replays first."""
    import broken_adapters

    from conformance.flows.profiles import get_profile
    from conformance.runner.fuzz import fuzz
    from conformance.runner.plan import RunPlan

    database = InMemoryExampleDatabase()
    first = fuzz(broken_adapters.fork_without_incref, RunPlan(get_profile("safety"), max_examples=24, seed=11, out_dir=tmp_path / "a"), shared=SharedExamples(database, "x", "safety"))
    stored = {t.meta["problem"]: t for t in SharedExamples(database, "x", "safety").traces()}
    assert "BLK-003" in first.findings and set(stored) == set(first.findings)
    assert stored["BLK-003"].to_json() == (tmp_path / "a" / "counterexamples" / "BLK-003.json").read_text().strip()
    again = fuzz(broken_adapters.fork_without_incref, RunPlan(get_profile("safety"), max_examples=1, seed=99, out_dir=tmp_path / "b"), shared=SharedExamples(database, "x", "safety"))
    assert again.replayed == len(stored) and "BLK-003" in again.findings
    found = Trace.load(tmp_path / "b" / "found" / "BLK-003.json")
    assert found.to_dict()["requests"] == stored["BLK-003"].to_dict()["requests"]


def test_a_batch_whose_actor_died_runs_again_on_a_fresh_one(ray_address):
    """An actor dies with its node (the cluster's doing): the seeded batch runs again elsewhere
    with the same verdicts."""
    import ray

    from conformance.cluster.ray_search import RayRunner, connect, disconnect

    connect(ray_address)
    runner = RayRunner(BROKEN)
    try:
        runner.start()
        first = [(i, s.problem_ids) for i, s, _ in runner.search(7, 4, ["BLK-003"])]
        ray.kill(runner._actor)  # noqa: SLF001 - standing in for a node that went away
        again = [(i, s.problem_ids) for i, s, _ in runner.search(7, 4, ["BLK-003"])]
        assert again == first and len(first) == 4
    finally:
        runner.close()
        disconnect()


def test_more_workers_than_the_cluster_has_cpus_is_one_line(ray_address, tmp_path, capsys):
    code = main(["conform", "--adapter", "reference", "--out", str(tmp_path / "o"), "--ray", ray_address,
                 "--workers", "3"])  # the head has 2 CPUs
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--workers" in err and "2 CPUs" in err
    assert not (tmp_path / "o").exists()
