"""Clients that hold connections without progress (issue 10, client timeouts): idle keep-alive
connections, connections that never send, slowloris headers, announced bodies that never come,
and clients that stop reading a response are closed within the configured timeouts, connections
past the cap are answered 503, and other clients keep being served throughout. On the code before,
400 non-reading clients held 1,300 descriptors with no end and idle connections stayed open."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import wait_for
from tests.origin_server import OriginServer

SHARD = os.urandom(16 << 20)  # far more than the socket buffers of a client that never reads
TIMEOUTS = (
    "--client-idle-timeout",
    "2",
    "--client-header-timeout",
    "1",
    "--client-body-timeout",
    "1",
    "--client-send-timeout",
    "2",
    "--max-connections-per-client",
    "1000",  # every client of these tests is 127.0.0.1
)


def _fds(daemon: Daemon) -> int:
    """The daemon's descriptors other than the index's SQLite handles (one set per worker
    thread that has touched the index, so they grow with the pool, not with clients)."""
    return sum(n for kind, n in _fd_kinds(daemon).items() if ".db" not in kind)


def _fd_kinds(daemon: Daemon) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for name in os.listdir(f"/proc/{daemon.process.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{daemon.process.pid}/fd/{name}").split(":")[0]
        except OSError:
            continue
        kinds[target] = kinds.get(target, 0) + 1
    return kinds


def _accepted(daemon: Daemon, clients: list[socket.socket]) -> int:
    """How many of `clients` the daemon accepted: its sockets whose peer is one of theirs
    (matched by inode in /proc/net/tcp), not those still queued in the listen backlog."""
    inodes = set()
    for name in os.listdir(f"/proc/{daemon.process.pid}/fd"):
        try:
            target = os.readlink(f"/proc/{daemon.process.pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = {sock.getsockname()[1] for sock in clients}
    accepted = 0
    with open(f"/proc/{daemon.process.pid}/net/tcp") as table:
        for row in table.readlines()[1:]:
            fields = row.split()
            peer_port = int(fields[2].split(":")[1], 16)
            accepted += fields[9] in inodes and peer_port in ports
    return accepted


def _connect(daemon: Daemon, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:  # before connect, so the window stays small
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect(("127.0.0.1", daemon.port))
    return sock


TCP_ESTABLISHED = 1


def _is_closed_by_peer(sock: socket.socket) -> bool:
    """True once the daemon has closed (FIN) or reset (RST) the connection. Reads the kernel's
    TCP state instead of the socket: reading would make a non-reading client a reading one."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != TCP_ESTABLISHED


def _wait_all_closed(sockets: list[socket.socket], within_s: float) -> float:
    began = time.monotonic()
    pending = list(sockets)
    while pending and time.monotonic() - began < within_s:
        pending = [s for s in pending if not _is_closed_by_peer(s)]
        time.sleep(0.1)
    assert not pending, f"{len(pending)} of {len(sockets)} connections still open"
    return time.monotonic() - began


@contextmanager
def _served_meanwhile(daemon: Daemon) -> Iterator[list[float]]:
    """Read the shard whole, over and over, while the test runs; yields the read times."""
    times: list[float] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    digest = hashlib.sha256(SHARD).hexdigest()

    def read_forever() -> None:
        while not stop.is_set():
            began = time.monotonic()
            try:
                with urllib.request.urlopen(daemon.url + "/web/big.tar", timeout=10) as response:
                    assert hashlib.sha256(response.read()).hexdigest() == digest
            except BaseException as exc:  # noqa: BLE001 - reported below
                failures.append(exc)
                return
            times.append(time.monotonic() - began)

    reader = threading.Thread(target=read_forever)
    reader.start()
    try:
        yield times
    finally:
        stop.set()
        reader.join(30)
    assert not failures, failures
    assert times, "no read completed meanwhile"


@pytest.fixture
def daemon(origin: OriginServer, start_daemon) -> Daemon:
    origin.put("big.tar", SHARD)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", *TIMEOUTS)
    with urllib.request.urlopen(daemon.url + "/web/big.tar", timeout=30) as response:
        assert response.read() == SHARD  # cached: the stalled clients below are hits
    return daemon


def test_non_reading_idle_and_slowloris_clients_are_closed(daemon: Daemon) -> None:
    # The warm-up's connection closed with its answer (urllib asks for that); its fill's file
    # closes when the fill commits:
    wait_for("the warm-up's commit", lambda: daemon.metric("shardcache_cache_entries") == 1)
    baseline = _fds(daemon)
    non_reading: list[socket.socket] = []
    idle: list[socket.socket] = []
    slowloris: list[socket.socket] = []
    try:
        for _ in range(400):
            sock = _connect(daemon, receive_buffer=4096)
            sock.sendall(b"GET /web/big.tar HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            non_reading.append(sock)
        idle.extend(_connect(daemon) for _ in range(100))
        slowloris.extend(_connect(daemon) for _ in range(20))
        with _served_meanwhile(daemon) as read_times:
            for sock in slowloris:
                sock.sendall(b"GET /web/big.tar HTTP/1.1\r\n")
            # With the system's listen backlog a connect returns once the kernel queued it, not
            # once the daemon accepted it: wait for the daemon to hold them.
            held = _fds(daemon)
            accepted_by = time.monotonic() + 10
            while held <= baseline + 500 and time.monotonic() < accepted_by:
                time.sleep(0.05)
                held = _fds(daemon)
            for byte in b"X-Slow: 1":  # a header byte every 0.3 s: never a whole request
                for sock in slowloris:
                    sock.send(bytes([byte]))
                time.sleep(0.3)
                if all(_is_closed_by_peer(s) for s in slowloris):
                    break
            closed_in = _wait_all_closed(non_reading + idle + slowloris, within_s=10)
        assert held > baseline + 500, (baseline, held)  # they really held the daemon's descriptors
        deadline = time.monotonic() + 5
        while _fds(daemon) > baseline + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _fds(daemon) <= baseline + 2, (baseline, _fds(daemon), _fd_kinds(daemon))
        assert max(read_times) < 5, read_times  # others were served throughout
        assert daemon.metric("shardcache_client_timeouts_total", phase="send") >= 400
        assert daemon.metric("shardcache_client_timeouts_total", phase="idle") >= 100
        assert daemon.metric("shardcache_client_timeouts_total", phase="header") >= 20
        print(f"520 stalled connections closed within {closed_in:.1f} s; {len(read_times)} reads")
    finally:  # a failure above must not leave 520 sockets to the next test's GC
        for sock in non_reading + idle + slowloris:
            sock.close()
    log = daemon.log()
    assert "Traceback" not in log and "unhandled error" not in log


def test_an_announced_body_that_never_comes_is_a_408(daemon: Daemon) -> None:
    sock = _connect(daemon)
    began = time.monotonic()
    sock.sendall(
        b"POST /_/prefetch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    sock.settimeout(10)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    elapsed = time.monotonic() - began
    sock.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b'"error"' in answer and 0.9 < elapsed < 4, elapsed

    huge = _connect(daemon)  # 99 GB announced: refused before a byte of it is read
    huge.sendall(
        b"POST /_/prefetch HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99000000000\r\n\r\n"
    )
    huge.settimeout(5)
    assert huge.recv(65536).startswith(b"HTTP/1.1 413")
    huge.close()


def test_one_client_cannot_take_every_slot(origin: OriginServer, start_daemon) -> None:
    origin.put("s.tar", b"s" * 1000)
    daemon = start_daemon({"web": origin.url}, "--max-connections-per-client", "10")
    held = [_connect(daemon) for _ in range(10)]
    wait_for("the daemon accepts the 10", lambda: _accepted(daemon, held) == 10)
    refused = _connect(daemon)
    refused.settimeout(5)
    assert refused.recv(65536).startswith(b"HTTP/1.1 503")
    refused.close()
    daemon.wait_for_log("client 127.0.0.1 holds 10 connections, the per-client limit")
    # Another address (a loopback alias here) is still served, probes included.
    other = socket.socket()
    other.bind(("127.0.0.2", 0))
    other.connect(("127.0.0.1", daemon.port))
    other.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    other.settimeout(5)
    assert other.recv(65536).startswith(b"HTTP/1.1 200")
    other.close()
    for sock in held:
        sock.close()
    assert daemon.metric("shardcache_client_refused_total", reason="client_connection_limit") == 1


def test_connections_past_the_cap_get_a_503(origin: OriginServer, start_daemon) -> None:
    origin.put("s.tar", b"s" * 1000)
    daemon = start_daemon({"web": origin.url}, "--max-connections", "50", *TIMEOUTS[:2])
    held = [_connect(daemon) for _ in range(50)]
    wait_for("the daemon accepts the 50", lambda: _accepted(daemon, held) == 50)
    refused = _connect(daemon)
    refused.settimeout(5)
    answer = refused.recv(65536)
    assert answer.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in answer, answer
    assert b'"error"' in answer
    refused.close()
    daemon.wait_for_log("connection limit reached: 50 client connections open")
    for sock in held:
        sock.close()

    def served() -> bool:
        with urllib.request.urlopen(daemon.url + "/web/s.tar", timeout=5) as response:
            return bool(response.read() == b"s" * 1000)

    wait_for("room again after the held connections closed", served)
    daemon.wait_for_log("below the connection limit again")
    assert daemon.metric("shardcache_client_refused_total", reason="connection_limit") >= 1


def test_a_stalled_reader_does_not_stop_a_shared_fill(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    origin.put("cold.tar", SHARD)
    daemon = start_daemon({"web": origin.url}, "--readahead", "0", *TIMEOUTS)
    stalled = _connect(daemon, receive_buffer=4096)
    stalled.sendall(b"GET /web/cold.tar HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    wait_for("the stalled reader's fill asks the origin", lambda: origin.gets["cold.tar"] >= 1)
    with urllib.request.urlopen(daemon.url + "/web/cold.tar", timeout=30) as response:
        assert response.read() == SHARD
    _wait_all_closed([stalled], within_s=8)
    stalled.close()
    with urllib.request.urlopen(daemon.url + "/web/cold.tar", timeout=30) as response:
        assert response.headers["X-Shardcache"] == "hit" and response.read() == SHARD
    assert origin.gets["cold.tar"] >= 1


def test_a_slow_reader_is_not_a_stalled_one(daemon: Daemon) -> None:
    """16 KB/s is slow, but it is reading: the send timeout (2 s here) counts time without
    progress, not time until the socket turns writable (half its 4 MiB buffer drained)."""
    sock = _connect(daemon, receive_buffer=16384)
    sock.sendall(b"GET /web/big.tar HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    sock.settimeout(5)
    received = 0
    began = time.monotonic()
    while time.monotonic() - began < 8:
        chunk = sock.recv(16384)
        assert chunk, f"closed after {received} bytes and {time.monotonic() - began:.1f} s"
        received += len(chunk)
        time.sleep(1)
    sock.close()
    assert daemon.metric("shardcache_client_timeouts_total", phase="send") == 0
    assert received >= 8 * 16384 // 2, received
