"""A burst of connections (hundreds of loader workers starting at once) is queued, not dropped:
the daemon listens with the system's backlog (`net.core.somaxconn`) or `--listen-backlog`.
Before, it listened with asyncio's 100: 600 connects at once overflowed the accept queue, the
kernel dropped the SYNs past it (TcpExt ListenDrops), and a `/healthz` behind them waited for a
SYN retransmission, one second or more: a kubelet probe with a 1 s timeout failed."""

from __future__ import annotations

import errno
import select
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.origin_server import OriginServer

BURST = 600
TRIES = 3
HEALTHZ_WITHIN_S = 0.1
CONNECT_DEADLINE_S = 30.0
# Every client here is 127.0.0.1; a connection left half-open by a dropped handshake (the
# bug) is closed by the idle timeout, so each try starts with none.
LIMITS = (
    "--max-connections",
    "2000",
    "--max-connections-per-client",
    "2000",
    "--client-idle-timeout",
    "2",
)


def _listen_drops() -> int:
    """The network namespace's TcpExt ListenDrops: SYNs dropped at a full accept queue."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=True):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return int(table["ListenDrops"])
    raise AssertionError("no TcpExt line in /proc/net/netstat")


def _start_connects(port: int, count: int) -> list[socket.socket]:
    """`count` non-blocking connects, started as fast as one thread can: on loopback each
    handshake completes (or its SYN is dropped) inside connect(), so they land together."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(("127.0.0.1", port))
        assert code in (0, errno.EINPROGRESS), errno.errorcode.get(code, code)
        socks.append(sock)
    return socks


def _healthz_s(port: int) -> float:
    """Seconds from connecting to the end of a `/healthz` answer."""
    began = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_DEADLINE_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return time.monotonic() - began


def _wait_connected(socks: list[socket.socket]) -> None:
    """Wait (with a deadline) until every connect finished, so the next try starts clean."""
    deadline = time.monotonic() + CONNECT_DEADLINE_S
    pending = list(socks)
    while pending and time.monotonic() < deadline:
        _, writable, _ = select.select([], pending[:512], [], 1.0)
        for sock in writable:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
            pending.remove(sock)
    assert not pending, f"{len(pending)} connects unfinished after {CONNECT_DEADLINE_S} s"


def _burst(port: int) -> tuple[int, float]:
    """One try: BURST connects at once, then a `/healthz` behind them. Returns the
    ListenDrops counted meanwhile and the `/healthz` time."""
    drops_before = _listen_drops()
    socks = _start_connects(port, BURST)
    try:
        healthz_s = _healthz_s(port)
        _wait_connected(socks)
    finally:
        for sock in socks:
            sock.close()
    return _listen_drops() - drops_before, healthz_s


def _bursts(daemon: Daemon) -> list[tuple[int, float]]:
    """TRIES bursts, each after the last one's connections are gone from the daemon (the
    machine is shared: a try disturbed by another process's drops is not the only one)."""
    tries = []
    for _ in range(TRIES):
        tries.append(_burst(daemon.port))
        _wait_closed(daemon)
    return tries


def _wait_closed(daemon: Daemon) -> None:
    deadline = time.monotonic() + CONNECT_DEADLINE_S
    while (open_now := daemon.metric("shardcache_client_connections")) > 1:  # the scrape's own
        assert time.monotonic() < deadline, f"{open_now:.0f} connections still open"
        time.sleep(0.05)


def test_a_burst_of_connects_is_queued_not_dropped(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, *LIMITS)
    tries = _bursts(daemon)
    drops = min(d for d, _ in tries)
    healthz_s = min(s for _, s in tries)
    assert drops == 0, f"ListenDrops per burst of {BURST} connects: {tries}"
    assert healthz_s < HEALTHZ_WITHIN_S, f"/healthz behind {BURST} connects: {tries}"


def test_the_backlog_setting_is_used(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """`--listen-backlog 8`: the listening socket's accept queue is that long (ss's Send-Q)."""
    daemon = start_daemon({"o": origin.url}, *LIMITS, "--listen-backlog", "8")
    assert _listen_queue_limit(daemon.port) == 8


def _listen_queue_limit(port: int) -> int:
    """The backlog of the socket listening on `port`: Send-Q of its row in `ss -l`."""
    out = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.split()
    if not out:
        pytest.fail(f"nothing listens on {port}")
    return int(out[2])
