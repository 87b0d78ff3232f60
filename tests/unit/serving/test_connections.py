"""The connection guard's rules and the access policy, without a network: a fake clock and
transports that record what was done to them (no socket is involved in these rules; the
integration tests in test_client_timeouts.py drive the same code through real sockets)."""

from __future__ import annotations

import asyncio

import pytest

from shardcache.serving.access import AccessPolicy
from shardcache.serving.connections import REFUSAL, ConnectionGuard, ConnectionLimits


class RecordingTransport(asyncio.Transport):
    def __init__(self, client: str = "10.0.0.1") -> None:
        super().__init__(extra={"peername": (client, 40000)})
        self.written = b""
        self.is_closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.is_closed = True

    def is_closing(self) -> bool:
        return self.is_closed


class RecordingProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.events: list[str] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.events.append("made")

    def data_received(self, data: bytes) -> None:
        self.events.append(f"data:{data.decode()}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.events.append("lost")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _guard(
    max_connections: int = 10, max_per_client: int = 10
) -> tuple[ConnectionGuard, Clock, list[str]]:
    clock = Clock()
    closed: list[str] = []
    guard = ConnectionGuard(
        ConnectionLimits(
            idle_s=60, header_s=15, max_connections=max_connections, max_per_client=max_per_client
        ),
        on_close=closed.append,
        clock=clock,
    )
    return guard, clock, closed


def _open(
    guard: ConnectionGuard, client: str = "10.0.0.1"
) -> tuple[asyncio.Protocol, RecordingTransport, RecordingProtocol]:
    inner = RecordingProtocol()
    protocol = guard.protocol_factory(lambda: inner)()
    transport = RecordingTransport(client)
    protocol.connection_made(transport)
    return protocol, transport, inner


def test_idle_connections_close_after_the_idle_timeout_only() -> None:
    guard, clock, closed = _guard()
    _, transport, _ = _open(guard)
    clock.now += 59
    assert guard.sweep() == 0 and not transport.is_closed
    clock.now += 1
    assert guard.sweep() == 1 and transport.is_closed and closed == ["idle"]
    assert guard.open_count == 0


def test_a_request_in_progress_is_never_swept_and_its_end_restarts_the_idle_clock() -> None:
    guard, clock, closed = _guard()
    protocol, transport, inner = _open(guard)
    protocol.data_received(b"GET / HTTP/1.1\r\n\r\n")
    guard.request_started(transport)
    clock.now += 3600  # a long download: the handler bounds it, not the guard
    assert guard.sweep() == 0
    guard.request_finished(transport)
    clock.now += 59
    assert guard.sweep() == 0
    clock.now += 1
    assert guard.sweep() == 1 and closed == ["idle"]
    assert inner.events[:2] == ["made", "data:GET / HTTP/1.1\r\n\r\n"]


async def test_a_handler_asking_after_its_connection_closed_hears_the_client_left() -> None:
    """Found in the full suite (test_fetch_bounds, 2 runs of 2): under load a request's
    handler ran after its client had gone, aiohttp gave it no transport, `lost` answered
    None ('unknown'), and the fill it started waited for a turn at a rate cap, then sent a
    GET for nobody."""
    guard, _, _ = _guard()
    protocol, transport, _ = _open(guard)
    open_left = guard.lost(transport)
    assert open_left is not None and not open_left.is_set()  # open: watched
    protocol.connection_lost(None)
    assert open_left.is_set()
    gone = guard.lost(None)  # aiohttp's request.transport once the connection is lost
    assert gone is not None and gone.is_set()
    transport.close()
    closing = guard.lost(transport)
    assert closing is not None and closing.is_set()
    assert guard.lost(RecordingTransport()) is None  # open, but not this guard's: unknown


def test_a_slow_header_closes_on_the_header_timeout() -> None:
    guard, clock, closed = _guard()
    protocol, transport, _ = _open(guard)
    clock.now += 30  # idle a while first: the header clock starts at the first byte
    protocol.data_received(b"GET / HT")
    clock.now += 14
    protocol.data_received(b"TP/1.1\r\n")  # more bytes do not restart it
    assert guard.sweep() == 0
    clock.now += 1
    assert guard.sweep() == 1 and closed == ["header"] and transport.is_closed


def test_connections_past_the_limit_are_answered_503_and_not_handed_on() -> None:
    guard, _, closed = _guard(max_connections=2)
    opened = [_open(guard) for _ in range(3)]
    refused_transport, refused_inner = opened[2][1], opened[2][2]
    assert refused_transport.written == REFUSAL and refused_transport.is_closed
    assert refused_inner.events == []  # the HTTP layer never saw it
    assert guard.refused == 1 and closed == ["limit"] and guard.open_count == 2
    assert REFUSAL.startswith(b"HTTP/1.1 503 ") and REFUSAL.endswith(b'"}')
    opened[0][0].connection_lost(None)
    assert guard.open_count == 1 and opened[0][2].events[-1] == "lost"
    fourth = _open(guard)
    assert fourth[1].written == b"" and fourth[2].events == ["made"]


def test_one_client_address_gets_at_most_its_share() -> None:
    guard, _, closed = _guard(max_connections=10, max_per_client=2)
    first = [_open(guard, "10.0.0.1") for _ in range(3)]
    assert first[2][1].written == REFUSAL and closed == ["client_limit"]
    other = _open(guard, "10.0.0.2")
    assert other[1].written == b"" and guard.open_count == 3
    first[0][0].connection_lost(None)  # one of 10.0.0.1's closes: room for it again
    assert _open(guard, "10.0.0.1")[1].written == b""


TOKEN = "0123456789abcdef0123"


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        (f"Bearer {TOKEN}", True),
        (f"bearer {TOKEN}", True),
        (f"Bearer  {TOKEN} ", True),
        (None, False),
        ("", False),
        ("Bearer", False),
        (f"Basic {TOKEN}", False),
        (f"Bearer {TOKEN}x", False),
        (f"Bearer {TOKEN[:-1]}", False),
        (f"Bearer {TOKEN.upper()}", False),
        ("Bearer \udcff", False),  # undecodable bytes, as aiohttp hands them on
    ],
)
def test_the_token_check(header: str | None, allowed: bool) -> None:
    assert AccessPolicy(TOKEN).is_authorized(header) is allowed


def test_what_the_token_protects() -> None:
    admin_only = AccessPolicy(TOKEN)
    reads_too = AccessPolicy(TOKEN, require_for_reads=True)
    no_token = AccessPolicy(None, require_for_reads=True)
    for path in ("/_/status", "/_/prefetch", "/_/cache/o/k", "/_/anything"):
        assert admin_only.is_protected(path) and reads_too.is_protected(path)
        assert not no_token.is_protected(path)
    for path in ("/healthz", "/readyz", "/metrics"):
        assert not admin_only.is_protected(path) and not reads_too.is_protected(path)
    assert not admin_only.is_protected("/web/s_000.tar")
    assert reads_too.is_protected("/web/s_000.tar")
    assert no_token.is_authorized(None)
