"""Slow fills left by their clients, and an origin that hangs up (issue 23, items 4 and 11):
each test fails on the code before its fix. Real daemon, real aiohttp origins, raw sockets
and curl as clients."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer

MiB = 1024 * 1024
SLOW_FILLS = 40


@pytest.fixture
def servers() -> Iterator[dict[str, OriginServer]]:
    started = {name: OriginServer() for name in ("slow", "good")}
    for server in started.values():
        server.start()
    yield started
    for server in started.values():
        server.stop()


def test_a_hang_up_costs_one_get_per_counted_attempt(
    origin: OriginServer, start_daemon: Callable[..., Daemon]
) -> None:
    """With `--origin-retries 2`, an origin closing connections without answering got more
    GETs than 1 + the retries the metric counted: a failure on a pooled connection was sent
    again, uncounted, on a new one."""
    origin.put("ok.tar", os.urandom(MiB))
    origin.put("bad.tar", os.urandom(MiB), hang_up=True)
    daemon = start_daemon({"web": origin.url}, "--origin-retries", "2")
    assert curl(f"{daemon.url}/web/ok.tar").exit_code == 0  # leaves a pooled connection
    time.sleep(0.6)  # quiet long enough to be reused (origins.pool.QUIET_S)

    result = curl(f"{daemon.url}/web/bad.tar")

    assert result.status == 502
    retries = daemon.metric("shardcache_origin_retries_total", origin="web")
    assert (origin.gets["bad.tar"], retries) == (3, 2)


def _leave_after_headers(daemon: Daemon, path: str) -> None:
    """A client that reads the answer's first bytes and goes (`curl … | head -c 1`)."""
    with socket.create_connection(("127.0.0.1", daemon.port)) as client:
        client.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert client.recv(65536).startswith(b"HTTP/1.1 200")


def test_fills_every_client_left_stop_and_other_origins_are_answered_at_once(
    servers: dict[str, OriginServer], start_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    """Item 4: 40 slow fills (4 MiB at 80 KB/s each: 50 s) whose clients leave at their
    first bytes. Nobody wants them any more and no prefetch asked for them: they stop, and
    their connections to the slow mirror close within seconds (before: they ran on, holding
    an origin thread each). Meanwhile the healthy origin answers at once, and the healthy
    home behind the slow mirror stays up."""
    slow, good = servers["slow"], servers["good"]
    for i in range(SLOW_FILLS):
        data = os.urandom(4 * MiB)
        slow.put(f"s/{i}.tar", data, chunk_bytes=16 << 10, chunk_delay_s=0.2)
        good.put(f"s/{i}.tar", data)
    good.put("h/a.tar", os.urandom(4 * MiB))
    config = tmp_path / "c.toml"
    config.write_text(
        f'[origins.s]\nurls = ["{slow.url}/s", "{good.url}/s"]\n'
        f'[origins.h]\nurls = ["{good.url}/h"]\n'
    )
    daemon = start_daemon({}, "--config", str(config), "--readahead", "0")

    for i in range(SLOW_FILLS):
        _leave_after_headers(daemon, f"/s/{i}.tar")
    wait_for("the abandoned fills' connections closed", lambda: slow.sending == 0, 10)

    started = time.monotonic()
    healthy = curl(f"{daemon.url}/h/a.tar")
    healthy_s = time.monotonic() - started
    print(f"healthy origin answered 4 MiB in {healthy_s:.3f} s beside {SLOW_FILLS} slow fills")
    assert healthy.exit_code == 0 and healthy_s < 2.0, healthy_s
    upstreams = daemon.get_json("/_/status")[1]["origins"]["s"]["upstreams"]  # type: ignore[index]
    assert upstreams[1]["state"] == "up" and upstreams[1]["failures"] == 0, upstreams
    assert sum(slow.served.values()) < SLOW_FILLS * 4 * MiB / 4  # far from fetched in full
    assert "Traceback" not in daemon.log()
