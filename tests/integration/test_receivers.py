"""The receiving processes (issue 25): a miss's bytes are received, written and hashed in a pool
of processes beside the daemon. Real daemon, real aiohttp origin, curl and raw sockets as
clients, real SIGKILL and SIGHUP.

What must hold: a receiver killed mid-body fails only its requests (retried, the client gets
the object exact), is replaced and counted; many misses at once are bounded and never
deadlock while other clients are served; a reload and a stop end the old processes."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer

MiB = 1024 * 1024


def _receivers(daemon: Daemon) -> dict[str, object]:
    status, document = daemon.get_json("/_/status")
    assert status == 200
    receivers = document["receivers"]
    assert isinstance(receivers, dict)
    return receivers


def _pids(daemon: Daemon) -> list[int]:
    pids = _receivers(daemon)["pids"]
    assert isinstance(pids, list)
    return [int(pid) for pid in pids]


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def _is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_the_pool_is_sized_by_its_setting_and_shown_in_status_metrics_and_stats(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    daemon = start_daemon({"web": origin.url}, "--receivers", "3")
    wait_for("three receivers", lambda: len(_pids(daemon)) == 3)
    assert set(_pids(daemon)) <= _children(daemon.process.pid)  # the daemon's own children
    assert daemon.metric("shardcache_receivers") == 3
    assert daemon.metric("shardcache_receivers_alive") == 3
    assert daemon.metric("shardcache_receiver_deaths_total") == 0
    stats = subprocess.run(
        ["shardcache", "stats", "--daemon", daemon.url], capture_output=True, text=True, timeout=30
    )
    assert stats.returncode == 0, stats.stderr
    assert "receivers      3 of 3 processes" in stats.stdout


def test_a_receiver_killed_mid_body_fails_only_its_segment_and_is_replaced(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    """SIGKILL to every receiver while a 24 MiB miss lands (slowly: 64 KiB every 20 ms): the
    segment in flight fails like a dropped connection and is resumed on a new receiver, so
    the client gets the object exact; the dead are counted and replaced; the cached copy is
    the exact object, and nothing of the dead receivers' bytes is left unverified."""
    data = os.urandom(24 * MiB)
    origin.put("big.tar", data, chunk_bytes=64 * 1024, chunk_delay_s=0.02)
    daemon = start_daemon({"web": origin.url}, "--receivers", "2", "--origin-retries", "3")
    wait_for("two receivers", lambda: len(_pids(daemon)) == 2)
    before = _pids(daemon)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(curl, f"{daemon.url}/web/big.tar")
        wait_for("a body landing", lambda: origin.served["big.tar"] > 4 * MiB)
        for pid in before:
            os.kill(pid, signal.SIGKILL)
        result = reading.result(timeout=120)
    assert result.exit_code == 0, result
    assert hashlib.sha256(result.body).hexdigest() == hashlib.sha256(data).hexdigest()
    wait_for("both replaced", lambda: len(_pids(daemon)) == 2)
    assert not set(_pids(daemon)) & set(before)
    assert daemon.metric("shardcache_receiver_deaths_total") == 2
    assert daemon.metric("shardcache_origin_retries_total", origin="web") >= 1
    gets = origin.gets["big.tar"]
    again = curl(f"{daemon.url}/web/big.tar")  # a hit, verified when it was committed
    assert (again.exit_code, again.sha256) == (0, hashlib.sha256(data).hexdigest())
    assert origin.gets["big.tar"] == gets
    assert not any(_is_running(pid) for pid in before)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_300_misses_at_once_are_bounded_never_deadlock_and_others_are_served(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    """300 cold shards asked at once of one receiver, each answered after 0.3 s: every one
    arrives exact, at most one origin's share is open in the receiver at any time, its
    memory stays bounded, and a hit and the status page are answered meanwhile."""
    objects = {f"s_{i:03d}.tar": os.urandom(64 * 1024 + i) for i in range(300)}
    for key, data in objects.items():
        origin.put(key, data, delay_s=0.3)
    origin.put("hot.tar", b"h" * 4096)
    daemon = start_daemon(
        {"web": origin.url},
        "--receivers",
        "1",
        "--readahead",
        "0",
        "--origin-read-timeout",
        "30",
        "--max-connections-per-client",
        "400",  # 300 readers, and the test's own checks, from one address
    )
    assert curl(f"{daemon.url}/web/hot.tar").exit_code == 0  # cached
    (receiver,) = _pids(daemon)
    peak_in_flight, peak_rss = 0, 0
    with concurrent.futures.ThreadPoolExecutor(300) as pool:
        futures = {pool.submit(_get, f"{daemon.url}/web/{key}"): key for key in objects}
        deadline = time.monotonic() + 90
        while not all(f.done() for f in futures):
            assert time.monotonic() < deadline, "300 misses not done in 90 s"
            peak_in_flight = max(peak_in_flight, int(str(_receivers(daemon)["in_flight"])))
            rss = Path(f"/proc/{receiver}/status").read_text().split("VmRSS:")[1].split()[0]
            peak_rss = max(peak_rss, int(rss) * 1024)
            started = time.monotonic()
            hit = curl(f"{daemon.url}/web/hot.tar")
            assert (hit.exit_code, hit.body) == (0, b"h" * 4096)
            assert time.monotonic() - started < 2.0, "a hit waited on the misses"
            time.sleep(0.1)
        answers = {futures[f]: f.result() for f in futures}
    assert {key: answers[key] for key in objects} == {key: (200, objects[key]) for key in objects}
    assert 0 < peak_in_flight <= 64  # one origin's share (origins.http.MAX_IN_USE)
    assert peak_rss < 200 * MiB, f"receiver RSS {peak_rss / MiB:.0f} MiB"
    assert _pids(daemon) == [receiver]


def test_a_reload_restarts_the_pool_and_a_stop_ends_it(
    origin: OriginServer, start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """SIGHUP: new receivers (of the reloaded size) take new requests, the old ones exit. A
    stop (SIGTERM) leaves no receiver behind."""
    origin.put("a.tar", os.urandom(MiB))
    origin.put("b.tar", os.urandom(MiB))
    config = tmp_path / "shardcache.toml"
    config.write_text(f'receivers = 1\n[origins.web]\nurl = "{origin.url}"\n')
    daemon = start_daemon({}, "--config", str(config))
    assert curl(f"{daemon.url}/web/a.tar").exit_code == 0
    (old,) = _pids(daemon)
    config.write_text(f'receivers = 2\n[origins.web]\nurl = "{origin.url}"\n')
    os.kill(daemon.process.pid, signal.SIGHUP)
    wait_for("two new receivers", lambda: len(_pids(daemon)) == 2 and old not in _pids(daemon))
    wait_for("the old receiver gone", lambda: not _is_running(old))
    assert curl(f"{daemon.url}/web/b.tar").body == origin.objects["b.tar"]
    new = _pids(daemon)
    assert daemon.stop() == 0
    assert not any(_is_running(pid) for pid in new)


def test_a_receiver_never_outlives_a_daemon_killed_with_sigkill(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    daemon = start_daemon({"web": origin.url}, "--receivers", "2")
    wait_for("two receivers", lambda: len(_pids(daemon)) == 2)
    pids = _pids(daemon)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()
    for pid in pids:  # orphans of a killed daemon: reaped by init, once they read EOF
        wait_for(f"receiver {pid} to end with its daemon", lambda: not _is_running(pid), 10)  # noqa: B023


def test_an_overlong_body_landing_in_a_receiver_fails_and_is_never_cached(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    """A chunked 206 running 1 MiB past its Content-Range, landed into the cache by a
    receiver (no checksum published): the transfer fails, twice, and nothing is cached."""
    origin.put("over.tar", os.urandom(6 * MiB), overlong=MiB, no_md5=True)
    daemon = start_daemon({"web": origin.url}, "--receivers", "1", "--origin-retries", "1")
    for _ in range(2):
        assert curl(f"{daemon.url}/web/over.tar").exit_code != 0
    assert "longer than announced" in daemon.log()
    assert daemon.metric("shardcache_cache_entries") == 0


def test_a_forged_answer_after_a_body_on_a_receivers_connection_is_never_served(
    start_daemon: Callable[..., Daemon],
) -> None:
    """An origin that writes, right after a complete answer, a second forged one on the same
    connection: the receiver does not reuse that connection, so each key is served its own
    bytes and the forged ones never."""
    forged = b'HTTP/1.1 200 OK\r\nETag: "f"\r\nContent-Length: 5\r\n\r\nFORGE'

    def answer(name: bytes) -> bytes:
        head = b'HTTP/1.1 200 OK\r\nETag: "%s"\r\nContent-Length: 5\r\n\r\n' % name
        return head + name * 5

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(5)
                buffer = b""
                try:
                    while True:
                        while b"\r\n\r\n" not in buffer:
                            more = connection.recv(65536)
                            if not more:
                                raise ConnectionError
                            buffer += more
                        head, _, buffer = buffer.partition(b"\r\n\r\n")
                        method, path = head.split(b" ")[:2]
                        reply = answer(path[-1:])
                        if method == b"HEAD":
                            connection.sendall(reply[:-5])
                        else:
                            connection.sendall(reply + forged)
                except (OSError, ConnectionError):
                    continue

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        serving = pool.submit(serve)
        daemon = start_daemon({"web": f"http://127.0.0.1:{port}"}, "--receivers", "1")
        for name in (b"a", b"b", b"c"):
            result = curl(f"{daemon.url}/web/{name.decode()}")
            assert (result.exit_code, result.body) == (0, name * 5)
            time.sleep(0.6)  # quiet long enough to be reused (origins.pool.QUIET_S)
        assert daemon.stop() == 0
        done.set()
        serving.result(timeout=40)
        server.close()
