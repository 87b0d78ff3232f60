"""The HTTP transport's exchanges with origins that misbehave on the wire (issue 23, items 4
and 11): interim answers, late answers, hang-ups, and one origin's share of the threads."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from shardcache import errors
from shardcache.cluster.breaker import BreakerState, CircuitBreaker
from shardcache.cluster.tier import Upstream
from shardcache.cluster.upstreams import FailoverOrigin
from shardcache.config import OriginSpec
from shardcache.errors import OriginUnavailable
from shardcache.fetch.segments import Segment
from shardcache.origins import http
from shardcache.origins.base import Timeouts
from shardcache.origins.http import HttpOrigin, HttpTransport
from shardcache.origins.receivers import ReceiverPool
from tests.unit.waiting import until

# An answer: the bytes to write for (method, path), or None to hang up without answering.
Answer = Callable[[str, str], Awaitable[bytes | None]]


def response(body: bytes, etag: str = '"e"') -> bytes:
    head = b"HTTP/1.1 200 OK\r\nETag: %s\r\nContent-Length: %d\r\n\r\n"
    return head % (etag.encode(), len(body)) + body


class RawOrigin:
    """A loopback origin that writes what `answer` returns, as is; it notes every request
    (method and path) by connection."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections: list[list[str]] = []
        self._server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        asked: list[str] = []
        self.connections.append(asked)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.decode().split(" ")[:2]
                asked.append(f"{method} {path}")
                written = await self.answer(method, path)
                if written is None:
                    break
                writer.write(written)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def requests(self, path: str) -> int:
        return sum(asked.count(f"GET {path}") for asked in self.connections)

    async def __aenter__(self) -> RawOrigin:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=512)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def url(self, path: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}{path}"


async def read(transport: HttpTransport, url: str) -> bytes:
    stream = await transport.get(url, url, 0, None, None)
    try:
        return b"".join([chunk async for chunk in stream])
    finally:
        await stream.aclose()


async def test_an_interim_103_answer_is_skipped_not_a_502(receiver_pool: ReceiverPool) -> None:
    """RFC 9110 §15.2: a client must accept any number of 1xx answers before the final one.
    http.client skips only `100 Continue`; a `103 Early Hints` became the answer (a 502)."""
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    body = os.urandom(1000)

    async def answer(method: str, path: str) -> bytes:
        return hints + hints + response(b"" if method == "HEAD" else body)

    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), receiver_pool)
        try:
            assert await read(transport, origin.url("/a.tar")) == body
            assert await read(transport, origin.url("/a.tar")) == body
            info = await transport.head(origin.url("/a.tar"), "a.tar")
            assert info.etag == '"e"'
        finally:
            await transport.aclose()


class LateAnswerOrigin(RawOrigin):
    """Answers each request, and after /a.tar writes a forged answer `late_s` later."""

    def __init__(self, late_s: float) -> None:
        super().__init__(self._answer)
        self.late_s = late_s
        self.real = os.urandom(3000)
        self._writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        await super()._serve(reader, writer)

    async def _answer(self, method: str, path: str) -> bytes:
        if path == "/a.tar":
            writer = self._writers[-1]
            forged = response(b"F" * 3000, '"b"')
            asyncio.get_running_loop().call_later(self.late_s, writer.write, forged)
            return response(b"a" * 1000)
        await asyncio.sleep(2 * self.late_s)  # the late answer comes first
        return response(self.real, '"b"')


@pytest.mark.parametrize("late_s", [0.03, 0.2])
async def test_a_late_answer_is_never_read_as_the_next_ones(
    late_s: float, receiver_pool: ReceiverPool
) -> None:
    """Found by the attack: an origin that sends one more answer 30-200 ms after a complete
    one. The connection went back to the pool with nothing waiting on it yet, the next
    request took it, and read the late answer as its own: another key's bytes."""
    async with LateAnswerOrigin(late_s) as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), receiver_pool)
        try:
            await read(transport, origin.url("/a.tar"))
            assert await read(transport, origin.url("/b.tar")) == origin.real
        finally:
            await transport.aclose()


async def test_a_hang_up_costs_one_request_per_attempt(receiver_pool: ReceiverPool) -> None:
    """With `--origin-retries 2`, an origin that closes connections without answering got
    5 GETs a segment while the metric said 2 retries: a failure on a pooled connection was
    sent again, uncounted, on a new one. One request per attempt; the fill's retry loop
    (`OriginRequests`) counts every one."""

    async def answer(method: str, path: str) -> bytes | None:
        return response(b"ok") if path == "/ok" else None

    async with RawOrigin(answer) as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), receiver_pool)
        try:
            await read(transport, origin.url("/ok"))  # a pooled connection
            with pytest.raises(OriginUnavailable):
                await read(transport, origin.url("/bad"))
        finally:
            await transport.aclose()
    assert origin.requests("/bad") == 1


async def _drip(method: str, path: str) -> bytes | None:
    """Headers at once, then one byte of a 1000-byte body: a slow origin's fill."""
    if path == "/ok":
        return response(b"ok")
    return b'HTTP/1.1 200 OK\r\nETag: "e"\r\nContent-Length: 1000\r\n\r\nx'


async def _land(transport: HttpTransport, url: str, path: Path) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        stream = await transport.get(url, url, 0, None, None)
        try:
            await stream.land(fd, Segment(0, 1000), lambda count: None, 3.0)
        finally:
            await stream.aclose()
    finally:
        os.close(fd)


def _small_receivers(monkeypatch: pytest.MonkeyPatch, threads: int) -> ReceiverPool:
    """One receiving process with `threads` request threads (against 512), and each
    transport's share 4 (against 64)."""
    pool = ReceiverPool(1, threads)
    monkeypatch.setattr(http, "MAX_IN_USE", 4, raising=False)
    monkeypatch.setattr(http, "MAX_ASKING", 4, raising=False)
    return pool


@pytest.fixture
def few_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReceiverPool]:
    """The receiving threads and each transport's share scaled down (16 and 4, against 512
    and 64), their ratio kept. MAX_ASKING is the name the share had before it bounded
    receiving."""
    pool = _small_receivers(monkeypatch, 16)
    yield pool
    pool.kill_all()


async def test_one_origin_receiving_slowly_cannot_take_another_origins_threads(
    few_threads: ReceiverPool, tmp_path: Path
) -> None:
    """Item 4: 40 fills of an origin whose bodies stall after their headers, then a read
    from a healthy origin: answered at once. The share bounded only the requests waiting for
    their headers; once answered, each slow body held a thread, and the healthy origin
    waited for one (in the issue: 504 after 17 s)."""
    async with RawOrigin(_drip) as slow, RawOrigin(_drip) as healthy_origin:
        hung = HttpTransport(Timeouts(connect_s=1.0, read_s=3.0), few_threads)
        healthy = HttpTransport(Timeouts(connect_s=1.0, read_s=5.0), few_threads)
        landing = [
            asyncio.create_task(_land(hung, slow.url(f"/{i}"), tmp_path / str(i)))
            for i in range(40)
        ]
        try:
            await until("its share is busy", lambda: sum(map(len, slow.connections)) >= 4)
            # Without a share on receiving, every thread is taken within moments: wait for
            # that (or half a second, when the share holds them back).
            deadline = time.monotonic() + 0.5
            while sum(map(len, slow.connections)) < 16 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            started = time.monotonic()
            assert await read(healthy, healthy_origin.url("/ok")) == b"ok"
            assert time.monotonic() - started < 1.0  # not the stalled bodies' 3 s
            assert sum(map(len, slow.connections)) <= 4  # at most its share at once
        finally:
            for task in landing:
                task.cancel()
            await asyncio.gather(*landing, return_exceptions=True)
            await hung.aclose()
            await healthy.aclose()


async def test_waiting_for_a_share_is_not_the_upstreams_time(
    monkeypatch: pytest.MonkeyPatch,
    receiver_pool: ReceiverPool,
) -> None:
    """Item 4: the read timeout starts when the request is sent. With one connection to
    share, a request that waited 0.3 s for it and was then answered in 0.3 s (0.6 s in all,
    against a 0.5 s read timeout) is answered, not timed out."""
    monkeypatch.setattr(http, "MAX_IN_USE", 1, raising=False)
    monkeypatch.setattr(http, "MAX_ASKING", 1, raising=False)

    async def slowish(method: str, path: str) -> bytes:
        await asyncio.sleep(0.3)
        return response(b"ok")

    async with RawOrigin(slowish) as origin:
        transport = HttpTransport(Timeouts(connect_s=1.0, read_s=0.5), receiver_pool)
        try:
            bodies = await asyncio.gather(
                read(transport, origin.url("/a")), read(transport, origin.url("/b"))
            )
        finally:
            await transport.aclose()
    assert bodies == [b"ok", b"ok"]


async def test_a_local_wait_too_long_is_local_and_marks_no_upstream_down(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Item 4: every receiving thread busy (here, more origins hung than the threads cover),
    a healthy home waits for one past its read timeout: a local 503, not the home's 504, and
    its breaker stays up (in the issue the healthy home was marked down)."""
    pool = _small_receivers(monkeypatch, 4)
    async with RawOrigin(_drip) as slow, RawOrigin(_drip) as home_server:
        hung = HttpTransport(Timeouts(connect_s=1.0, read_s=3.0), pool)
        home = HttpOrigin(OriginSpec("web", home_server.url("")), Timeouts(1.0, 0.3), pool)
        breaker = CircuitBreaker("home")
        failover = FailoverOrigin(
            "web", [Upstream(home, breaker, "home")], None, timeouts=Timeouts(1.0, 0.3)
        )
        landing = [
            asyncio.create_task(_land(hung, slow.url(f"/{i}"), tmp_path / str(i))) for i in range(4)
        ]
        try:
            await until("4 hung", lambda: sum(map(len, slow.connections)) >= 4)
            # Answered is not yet landing (each landing takes a thread again for the body),
            # so the home may still get a thread at first: ask until it waits for one.
            deadline = time.monotonic() + 2.0
            local_busy = None
            while local_busy is None and time.monotonic() < deadline:
                try:
                    await (await failover.open("ok")).aclose()
                except errors.OriginShed as exc:
                    assert exc.is_local and exc.kind == "busy"
                    local_busy = exc
            assert local_busy is not None, "the home always found a receiving thread"
            health = breaker.health()
            assert (health.state, health.failures_total) == (BreakerState.CLOSED, 0)
        finally:
            for task in landing:
                task.cancel()
            await asyncio.gather(*landing, return_exceptions=True)
            await hung.aclose()
            await failover.aclose()
            pool.kill_all()
