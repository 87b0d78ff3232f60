"""The HTTP transport against a real aiohttp server on loopback, in the test's own loop."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from shardcache.checksums import crc32c
from shardcache.errors import OriginTimeout, OriginUnavailable
from shardcache.fetch.segments import Segment
from shardcache.origins import http, pool
from shardcache.origins.base import Timeouts
from shardcache.origins.http import HttpTransport
from shardcache.origins.receivers import ReceiverPool
from tests.unit.waiting import until

BODY = b"x" * (8 << 20)


async def test_a_pooled_connection_is_not_poisoned_by_an_old_read_timeout(
    receiver_pool: ReceiverPool,
) -> None:
    """Found by the fault soak: right after a busy minute, requests failed at once with "timed
    out", three retries in a row. aiohttp 3.14 re-arms `sock_read` on a connection already
    back in the keep-alive pool (aio-libs/aiohttp#12953); when it fires, the next request on
    that connection fails immediately. The transport keeps its own read timeouts instead."""

    async def shard(request: web.Request) -> web.Response:
        return web.Response(body=BODY, headers={"ETag": '"e"'})

    app = web.Application()
    app.router.add_get("/{key}", shard)
    server = TestServer(app)
    await server.start_server()
    transport = HttpTransport(Timeouts(connect_s=1.0, read_s=0.2), receiver_pool)
    try:
        for _ in range(3):
            stream = await transport.get(str(server.make_url("/a.tar")), "a.tar", 0, None, None)
            received = 0
            async for chunk in stream:  # a slow writer: the transport pauses for backpressure
                received += len(chunk)
                await asyncio.sleep(0.002)
            await stream.aclose()
            assert received == len(BODY)
            await asyncio.sleep(0.4)  # idle in the pool past the read timeout
    finally:
        await transport.aclose()
        await server.close()


class _Origin:
    """A loopback aiohttp origin whose one route serves BODY, or stalls after `stall_after`
    bytes, or ends `short_by` bytes early; it notes the client port of every request."""

    def __init__(self, close_idle_after_s: float | None = None) -> None:
        self.close_idle_after_s = close_idle_after_s
        self.ports: list[int] = []
        self.idle_closed = 0  # connections closed for their idleness
        self.stall_after: int | None = None
        self.short_by = 0
        app = web.Application()
        app.router.add_get("/{key}", self._shard)
        self.server = TestServer(app)

    async def _shard(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append(peer[1] if peer else -1)
        response = web.StreamResponse(headers={"ETag": '"e"', "Content-Length": str(len(BODY))})
        await response.prepare(request)
        if self.stall_after is not None:
            await response.write(BODY[: self.stall_after])
            await asyncio.sleep(3600)
        await response.write(BODY[: len(BODY) - self.short_by])
        if self.short_by:
            assert request.transport is not None
            request.transport.close()  # cut: the client must see a short body
        if self.close_idle_after_s is not None and request.transport is not None:
            asyncio.get_running_loop().call_later(
                self.close_idle_after_s, self._close_idle, request.transport
            )  # as a server's keep-alive timeout does
        return response

    def _close_idle(self, transport: asyncio.BaseTransport) -> None:
        transport.close()
        self.idle_closed += 1

    async def __aenter__(self) -> _Origin:
        await self.server.start_server()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.close()

    def url(self, key: str = "a.tar") -> str:
        return str(self.server.make_url(f"/{key}"))


async def _land_all(
    transport: HttpTransport, url: str, path: Path, read_timeout_s: float = 5.0
) -> Segment:
    segment = Segment(0, len(BODY))
    landed: list[int] = []
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        stream = await transport.get(url, "a.tar", 0, None, None)
        try:
            await stream.land(fd, segment, landed.append, read_timeout_s)
        finally:
            await stream.aclose()
    finally:
        os.close(fd)
    assert sum(landed) == segment.done_bytes  # every landed byte announced, once
    return segment


async def test_a_landed_body_is_written_whole_with_its_crc_and_its_connection_reused(
    tmp_path: Path,
    receiver_pool: ReceiverPool,
) -> None:
    async with _Origin() as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), receiver_pool)
        try:
            for _ in range(2):
                segment = await _land_all(transport, origin.url(), tmp_path / "a")
                assert (tmp_path / "a").read_bytes() == BODY
                assert segment.crc32c == crc32c(BODY)
                await asyncio.sleep(pool.QUIET_S)  # reused once quiet that long (`pool`)
        finally:
            await transport.aclose()
    assert len(origin.ports) == 2 and origin.ports[0] == origin.ports[1]  # kept alive


async def test_a_connection_the_server_closed_while_idle_is_replaced_not_failed(
    tmp_path: Path,
    receiver_pool: ReceiverPool,
) -> None:
    """The pool cannot see a server's idle timeout: the request on the dead connection is
    sent again on a new one, once."""
    async with _Origin(close_idle_after_s=0.1) as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), receiver_pool)
        try:
            await _land_all(transport, origin.url(), tmp_path / "a")
            await until("the server closes the idle connection", lambda: origin.idle_closed == 1)
            await _land_all(transport, origin.url(), tmp_path / "a")
        finally:
            await transport.aclose()
    assert (tmp_path / "a").read_bytes() == BODY
    assert len(origin.ports) == 2 and origin.ports[0] != origin.ports[1]


async def test_a_body_stalled_mid_way_times_out_and_a_short_one_fails(
    tmp_path: Path, receiver_pool: ReceiverPool
) -> None:
    async with _Origin() as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=0.3), receiver_pool)
        try:
            origin.stall_after = 1 << 20
            started = time.monotonic()
            with pytest.raises(OriginTimeout, match="no byte for"):
                await _land_all(transport, origin.url(), tmp_path / "a", read_timeout_s=0.3)
            assert time.monotonic() - started < 3
            origin.stall_after, origin.short_by = None, 1000
            with pytest.raises(OriginUnavailable, match="short"):
                await _land_all(transport, origin.url(), tmp_path / "a")
        finally:
            await transport.aclose()


async def test_a_cancelled_landing_stops_its_thread_before_the_file_can_close(
    tmp_path: Path,
    receiver_pool: ReceiverPool,
) -> None:
    """The fill closes its file right after a cancelled landing: the thread writing it must
    be stopped by then (its socket is shut down), or its next pwrite would land in whatever
    file reuses the descriptor."""
    async with _Origin() as origin:
        origin.stall_after = 1 << 20
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=30.0), receiver_pool)
        path = tmp_path / "a"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            stream = await transport.get(origin.url(), "a.tar", 0, None, None)
            segment = Segment(0, len(BODY))
            landing = asyncio.create_task(stream.land(fd, segment, lambda count: None, 30.0))
            stall_after = origin.stall_after
            await until("the bytes before the stall", lambda: segment.done_bytes >= stall_after)
            started = time.monotonic()
            landing.cancel()
            with pytest.raises(asyncio.CancelledError):
                await landing
            assert time.monotonic() - started < 2  # not the 30 s read timeout
            written = segment.done_bytes
            await stream.aclose()
        finally:
            os.close(fd)
            await transport.aclose()
        await asyncio.sleep(0.2)
        assert path.stat().st_size == written == origin.stall_after


async def test_closing_the_transport_stops_a_request_waiting_for_its_answer(
    receiver_pool: ReceiverPool,
) -> None:
    asked = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        asked.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/{key}", hang)
    server = TestServer(app)
    await server.start_server()
    transport = HttpTransport(Timeouts(connect_s=1.0, read_s=30.0), receiver_pool)
    try:
        asking = asyncio.create_task(
            transport.get(str(server.make_url("/a.tar")), "a.tar", 0, None, None)
        )
        await asyncio.wait_for(asked.wait(), 10)
        started = time.monotonic()
        await transport.aclose()
        with pytest.raises(OriginUnavailable):
            await asking
        assert time.monotonic() - started < 2
    finally:
        await server.close()


class _RawOrigin:
    """An origin that writes raw bytes: `answers[path]` is sent for each request of `path`,
    as is, on whichever connection asked; it notes each connection's requested paths."""

    def __init__(self, answers: dict[str, bytes]) -> None:
        self.answers = answers
        self.connections: list[list[str]] = []
        self.closed = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        paths: list[str] = []
        self.connections.append(paths)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                paths.append(path)
                writer.write(self.answers[path])
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()

    async def __aenter__(self) -> _RawOrigin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def url(self, path: str, scheme: str = "http") -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"{scheme}://127.0.0.1:{port}{path}"


def _response(body: bytes) -> bytes:
    return b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: %d\r\n\r\n' % len(body) + body


async def test_bytes_past_a_body_never_answer_the_next_request_on_that_connection(
    receiver_pool: ReceiverPool,
) -> None:
    """Found by the attack: an origin sending more than its Content-Length (here, a whole
    forged response) left those bytes on the pooled connection, and the next key's request
    read them as its answer: another key's bytes, served and cached as a success."""
    real, forged = os.urandom(300_000), b"E" * 300_000
    answers = {"/a.tar": _response(os.urandom(1000)) + _response(forged), "/b.tar": _response(real)}
    async with _RawOrigin(answers) as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), receiver_pool)
        try:
            for path in ("/a.tar", "/b.tar"):
                stream = await transport.get(origin.url(path), path, 0, None, None)
                received = b"".join([chunk async for chunk in stream])
                await stream.aclose()
        finally:
            await transport.aclose()
    assert received == real
    assert origin.connections == [["/a.tar"], ["/b.tar"]]  # not reused past the extra bytes


async def test_a_tls_handshake_that_never_ends_is_stopped_with_its_request(
    receiver_pool: ReceiverPool,
) -> None:
    """A server that accepts and then says nothing (or drips its handshake): the request's
    time runs out after the read timeout, and its thread's socket is shut down then, not
    after the 30 s connect timeout."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the client gives up: EOF
        closed.set()
        writer.close()

    closed = asyncio.Event()
    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = HttpTransport(Timeouts(connect_s=30.0, read_s=0.5), receiver_pool)
    try:
        with pytest.raises(OriginTimeout):
            await transport.get(f"https://127.0.0.1:{port}/a.tar", "a.tar", 0, None, None)
        async with asyncio.timeout(2):
            await closed.wait()
    finally:
        await transport.aclose()
        server.close()


async def test_an_origin_that_never_answers_cannot_take_every_origin_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """More requests than there are origin threads to an origin that accepts and never
    answers, then one to a healthy origin: it is answered at once, not after a hung request's
    read timeout frees a thread. The pool and the cap are scaled down here (16 threads, 4
    waiting per transport, against 512 and 64), their ratio kept."""
    small = ReceiverPool(1, threads=16)
    monkeypatch.setattr(http, "MAX_IN_USE", 4)

    accepted, open_now = 0, 0

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted, open_now
        accepted, open_now = accepted + 1, open_now + 1
        try:
            await reader.read()  # until the client gives up
        finally:
            open_now -= 1
            writer.close()

    hung_server = await asyncio.start_server(never_answer, "127.0.0.1", 0, backlog=512)
    hung_port = hung_server.sockets[0].getsockname()[1]
    hung = HttpTransport(Timeouts(connect_s=5.0, read_s=3.0), small)
    async with _Origin() as origin:
        healthy = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), small)
        asking = [
            asyncio.create_task(hung.get(f"http://127.0.0.1:{hung_port}/{i}", "x", 0, 10, None))
            for i in range(40)
        ]
        try:
            # All 40 take their places in the first steps; the 4 allowed at once connect.
            await until("the hung origin's 4 connections", lambda: accepted >= 4)
            started = time.monotonic()
            stream = await healthy.get(origin.url(), "a.tar", 0, None, None)
            await stream.aclose()
            assert time.monotonic() - started < 1.0  # not the hung ones' 3 s
        finally:
            for task in asking:
                task.cancel()
            await asyncio.gather(*asking, return_exceptions=True)
            await hung.aclose()
            await healthy.aclose()
            hung_server.close()
            await until("the handlers see their clients go", lambda: open_now == 0)
            small.kill_all()
