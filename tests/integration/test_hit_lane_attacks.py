"""The hit lane attacked as a hostile client and a flaky disk would (issue 36): heads the lane
must leave to aiohttp's parser, which answers them at once, and the attacks that held (kept as
guards). Every answer is read off a raw connection to a real daemon."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable

import pytest

from tests.daemon_process import Daemon
from tests.integration.disk_helpers import MiB
from tests.integration.helpers import curl, wait_for
from tests.integration.test_hit_lane import LANE, Connection, _cached, request
from tests.origin_server import OriginServer

PIPELINED = 20_000


@pytest.mark.parametrize(
    "raw",
    [
        b"GET /o/k.tar HTTP/1.1\nHost: H\n\n",
        b"GET /o/k.tar HTTP/1.1\r\nHost: H\n\r\n",
        b"GET /o/k.tar HTTP/1.1\r\nHost: H\r\nAccept: */*\n\n",
        b"GET /o/k.tar HTTP/1.1\r\nHost: H\rX\r\n\n",
    ],
    ids=["bare-lf", "lf-crlf", "lf-lf-after-crlf", "bare-cr"],
)
def test_a_head_with_a_bare_lf_or_cr_is_aiohttps_to_refuse_at_once_not_held_by_the_lane(
    start_daemon: Callable[..., Daemon], origin: OriginServer, raw: bytes
) -> None:
    daemon = start_daemon({"o": origin.url}, "--client-header-timeout", "60")
    _cached(daemon, origin, "k.tar", os.urandom(10_000))
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        connection.send(raw.replace(b"Host: H", f"Host: {connection.host}".encode()))
        answer = connection.read()  # the lane waited for a CRLF CRLF that never comes
    finally:
        connection.close()
    assert answer.status_line.split()[1] == "400", (answer.status_line, answer.body[:200])
    assert daemon.metric(LANE) == before


@pytest.mark.parametrize("control", [b"\x00", b"\x01", b"\x1b", b"\x7f"])
def test_a_field_value_with_a_control_byte_gets_aiohttps_400_not_the_lanes_200(
    start_daemon: Callable[..., Daemon], origin: OriginServer, control: bytes
) -> None:
    daemon = start_daemon({"o": origin.url})
    _cached(daemon, origin, "k.tar", os.urandom(10_000))
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        connection.send(
            b"GET /o/k.tar HTTP/1.1\r\nHost: "
            + connection.host.encode()
            + b"\r\nUser-Agent: a"
            + control
            + b"b\r\n\r\n"
        )
        answer = connection.read()
    finally:
        connection.close()
    assert answer.status_line.split()[1] == "400", (answer.status_line, answer.body[:200])
    assert daemon.metric(LANE) == before


def test_a_long_pipelined_run_of_lane_hits_does_not_hold_the_loop_for_other_clients(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """20,000 pipelined small hits in one write: the lane answers them in turns, so another
    client's requests keep their round trips meanwhile (one 256 KiB read of heads held the
    loop about 2 s, its buffer re-copied after every answer)."""
    daemon = start_daemon({"o": origin.url}, "--log-level", "warning")
    _cached(daemon, origin, "k.tar", b"x" * 1000)
    before = daemon.metric(LANE)
    round_trips: list[float] = []
    probing = threading.Event()
    flood_done = threading.Event()

    def probe() -> None:
        other = Connection(daemon)
        try:
            while not flood_done.is_set():
                began = time.monotonic()
                assert other.get("/readyz").status_line == "HTTP/1.1 200 OK"
                round_trips.append(time.monotonic() - began)
                probing.set()
        finally:
            other.close()

    prober = threading.Thread(target=probe)
    prober.start()
    connection = Connection(daemon)
    try:
        assert probing.wait(30)
        connection.send(request("/o/k.tar", connection.host) * PIPELINED)
        for _ in range(PIPELINED):
            assert connection.read().body == b"x" * 1000
    finally:
        flood_done.set()
        prober.join(60)
        connection.close()
    assert daemon.metric(LANE) == before + PIPELINED
    assert max(round_trips) < 1.0, sorted(round_trips)[-5:]


def test_requests_pipelined_behind_a_lane_body_are_answered_after_the_client_half_closes(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    """GET big, GET small, then shutdown(SHUT_WR) (a client done sending still reads): both
    answers come, whole, then the daemon closes (the lane closed after the first, with the
    second unanswered, where aiohttp alone answers both)."""
    daemon = start_daemon({"o": origin.url})
    big, small = os.urandom(16 * MiB), os.urandom(1000)
    _cached(daemon, origin, "big.tar", big)
    _cached(daemon, origin, "small.tar", small)
    before = daemon.metric(LANE)
    connection = Connection(daemon)
    try:
        connection.send(
            request("/o/big.tar", connection.host) + request("/o/small.tar", connection.host)
        )
        connection.shut_write()
        assert connection.read().body == big
        assert connection.read().body == small
        assert connection.read_until_closed() == b""
    finally:
        connection.close()
    assert daemon.metric(LANE) == before + 2


# -- attacks that held: kept as guards ------------------------------------------------------


def test_a_remembered_entry_is_never_the_lanes_when_reads_need_the_token(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    token = "lane-attack-token-0123456789"
    daemon = start_daemon(
        {"o": origin.url}, "--admin-token", token, "--require-token-for-reads", token=token
    )
    origin.put("k.tar", b"k" * 5000)
    bearer = f"Authorization: Bearer {token}"
    for _ in range(2):  # a miss, then a hit through aiohttp: the entry is remembered
        assert curl(f"{daemon.url}/o/k.tar", "-H", bearer).body == b"k" * 5000
    before = daemon.metric(LANE)
    signed = (
        "Authorization: AWS4-HMAC-SHA256 Credential=x/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=00",
        "x-amz-date: 20260101T000000Z",
        "x-amz-content-sha256: UNSIGNED-PAYLOAD",
    )
    for fields, status in (((), "401"), (signed, "403")):
        connection = Connection(daemon)  # a fresh one each: the lane's until it declines
        try:
            assert connection.get("/o/k.tar", *fields).status_line.split()[1] == status
        finally:
            connection.close()
    assert daemon.metric(LANE) == before


def test_a_slowloris_head_that_may_still_become_the_lanes_is_closed_by_the_header_timeout(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url}, "--client-header-timeout", "2")
    _cached(daemon, origin, "k.tar", b"k" * 1000)
    before = daemon.metric("shardcache_client_timeouts_total", phase="header")
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=0.2)
    trickle = b"GET /o/k.tar HTTP/1.1\r\nUser-Agent: " + b"a" * 1000
    deadline = time.monotonic() + 30
    try:
        for byte in trickle:  # one byte each 0.2 s: a head that never ends
            assert time.monotonic() < deadline, "still open after 30 s"
            try:
                sock.sendall(bytes([byte]))
                if sock.recv(1024) == b"":
                    break  # closed
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    finally:
        sock.close()
    wait_for(
        "the header timeout counted",
        lambda: daemon.metric("shardcache_client_timeouts_total", phase="header") == before + 1,
    )


def test_sigterm_lets_a_lane_body_in_flight_finish_whole(
    start_daemon: Callable[..., Daemon], origin: OriginServer
) -> None:
    daemon = start_daemon({"o": origin.url})
    data = os.urandom(32 * MiB)
    _cached(daemon, origin, "big.tar", data)
    before = daemon.metric(LANE)
    sock = socket.create_connection(("127.0.0.1", daemon.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # the body cannot go at once
    try:
        sock.sendall(request("/o/big.tar", f"127.0.0.1:{daemon.port}"))
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536)
        wait_for("the lane's answer", lambda: daemon.metric(LANE) == before + 1)
        os.kill(daemon.process.pid, signal.SIGTERM)
        daemon.wait_for_log("shutting down: 1 response in flight")
        while chunk := sock.recv(1 << 20):
            received += chunk
    finally:
        sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and body == data
    assert daemon.process.wait(30) == 0
