"""An HTTP(S) server as an origin: HTTP/1.1 over pooled keep-alive connections, on origin
threads (`origins.threads`), so that receiving, decrypting, writing and hashing a miss's bytes
use every core and not just the event loop's.

Bodies are taken as raw bytes (no transparent decompression), with optional per-origin headers
such as an `Authorization` token. Redirects are not followed unless the origin sets
`follow_redirects`, and then only to the origin's own scheme, host and port: a 3xx elsewhere
would serve another host's bytes as the shard. Checksums: `Content-MD5` and `x-amz-checksum-*`
on full reads, and the ETag as an MD5 only when the server is S3 itself (it sends
`x-amz-request-id`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from urllib.parse import quote, urlsplit

from shardcache import __version__
from shardcache.config import OriginSpec
from shardcache.errors import (
    LocalBusy,
    OriginChanged,
    OriginHeadUnsupported,
    OriginRedirected,
    OriginTimeout,
    OriginTooSlow,
    OriginUnavailable,
)
from shardcache.keys import join_url
from shardcache.origins import Timeouts
from shardcache.origins.base import CHUNK_BYTES, Landed, ObjectInfo, SpeedFloor, Spot, write_at
from shardcache.origins.pool import Connections, Exchange, TlsConnection, tls_context
from shardcache.origins.responses import (  # retry_after_s: for s3
    check_range,
    info_from,
    map_http_errors,
    raise_for_status,
    redirect_target,
    retry_after_s,
    site_of,
)

__all__ = ["HttpOrigin", "HttpStream", "HttpTransport", "retry_after_s", "tls_context"]
from shardcache.origins.threads import MAX_THREADS, Abort, Share, run_blocking

_SAFE_IN_PATH = "/~!$&'()*+,;=:@"
MAX_REDIRECTS = 10
LAND_BYTES = 1 << 20  # a landing thread's buffer: the most one write takes
FLUSH_BYTES = 256 << 10  # written as soon as this much came (or nothing more is there yet)
GATHER_S = 0.002  # how long more bytes are waited for before those that came are written
# Requests of one transport (one origin, mirror or tier member) at once, from their sending
# to their body's end: the origin threads it may hold, asking or receiving (`Share`).
MAX_IN_USE = MAX_THREADS // 8


class HttpStream:
    """A response body that must be exactly `body_bytes` long: what Content-Length or, for a
    chunked 206, Content-Range announced. A body running past that, or ending before it,
    raises OriginUnavailable; nothing beyond it is ever yielded or written.

    Its bytes are received on origin threads (`origins.threads`): `land` writes and hashes
    them there; iterating hops to a thread per chunk. A body read to its end gives its
    connection back for the next request."""

    def __init__(self, info: ObjectInfo, exchange: Exchange, skip: int, body_bytes: int) -> None:
        self.info = info
        self._exchange = exchange
        self._skip = skip  # bytes to drop when a server answered a Range request with 200
        self._left = body_bytes
        self._buffer_drained = False
        self._read_timeout_s = exchange.sock.gettimeout() or 30.0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await run_blocking(
                self._next_chunk, self._exchange.abort, wait_when_cancelled=True
            )
            if chunk is None:
                return
            yield chunk

    async def land(
        self,
        fd: int,
        spot: Spot,
        landed: Landed,
        read_timeout_s: float,
        min_bytes_per_s: float = 0.0,
    ) -> None:
        await run_blocking(
            lambda abort: self._land(fd, spot, landed, read_timeout_s, min_bytes_per_s),
            self._exchange.abort,
            wait_when_cancelled=True,
        )

    async def aclose(self) -> None:
        self._exchange.close()

    # -- on an origin thread -----------------------------------------------------------------

    def _next_chunk(self, abort: Abort) -> bytes | None:
        buffer = bytearray(CHUNK_BYTES)
        with self._mapping_errors():
            while True:
                abort.check()
                received = self._receive(memoryview(buffer))
                if received is None:
                    return None
                if received:
                    return bytes(received)

    def _land(
        self, fd: int, spot: Spot, landed: Landed, read_timeout_s: float, min_bytes_per_s: float
    ) -> None:
        self._read_timeout_s = read_timeout_s
        buffer = memoryview(bytearray(LAND_BYTES))
        floor = SpeedFloor(min_bytes_per_s, read_timeout_s)
        with self._mapping_errors():
            while spot.position < spot.end:
                self._exchange.abort.check()
                received = self._receive(buffer)
                if received is None:
                    raise OriginUnavailable(
                        f"{self._exchange.label}: body ended at byte {spot.position}, "
                        f"expected {spot.end}"
                    )
                floor.passed(len(received), self._exchange.label)
                piece = received[: spot.end - spot.position]  # it may run past its segment
                if piece:
                    spot.crc32c = write_at(fd, piece, spot.position, spot.crc32c)
                    spot.done_bytes += len(piece)
                    landed(len(piece))
            if self._left == 0:
                self._receive(buffer)  # the body's end: its connection goes back to the pool

    @contextlib.contextmanager
    def _mapping_errors(self) -> Iterator[None]:
        try:
            with map_http_errors(self._exchange.label):
                yield
        except OriginTooSlow:
            raise  # it says how slow; the rewording below is for a socket's silence
        except OriginTimeout as exc:
            raise OriginTimeout(
                f"{self._exchange.label}: no byte for {self._read_timeout_s:g}s"
            ) from exc

    def _receive(self, buffer: memoryview) -> memoryview | None:
        """The next bytes of the body, with what a 200 to a Range request sent before the
        range dropped (possibly none); None once the body is complete. Raises
        OriginUnavailable when it ends early or runs long."""
        if self._left == 0:
            if self._runs_past_its_end():
                raise OriginUnavailable(f"{self._exchange.label}: body longer than announced")
            self._exchange.finish(complete=True)
            return None
        count = self._read_some(buffer[: min(len(buffer), self._left)])
        if count == 0:
            raise OriginUnavailable(f"{self._exchange.label}: body ended {self._left} bytes short")
        if count > self._left:
            raise OriginUnavailable(f"{self._exchange.label}: body longer than announced")
        self._left -= count
        received = buffer[:count]
        if self._skip:
            dropped = min(self._skip, count)
            self._skip -= dropped
            received = received[dropped:]
        return received

    def _runs_past_its_end(self) -> bool:
        """Whether a body with no Content-Length (chunked, or ended by closing) goes on past
        what was announced; it must end right there."""
        response = self._exchange.response
        if response.chunked:
            return bool(response.read1(1))
        if response.length is None:
            assert response.fp is not None
            return bool(response.fp.read1(1))
        return False  # http.client and `_left` hold it to its Content-Length

    def _read_some(self, buffer: memoryview) -> int:
        """Block until some bytes came, then take what else comes within GATHER_S, up to
        FLUSH_BYTES: few large writes on a fast origin, no waiting for a full buffer on a
        slow one (a reader streams what has landed).

        Past what http.client buffered with the headers, a body with a Content-Length is
        read from the socket itself: one call per TLS record (16 KiB) is the floor, and each
        layer above it (the buffered reader, SocketIO) took the GIL again."""
        response = self._exchange.response
        if response.chunked:  # rare for object stores; http.client decodes the chunks
            data = response.read1(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        assert response.fp is not None
        if not self._buffer_drained:
            self._buffer_drained = True
            data = response.fp.read1(len(buffer))  # what came with the headers, or one read
            buffer[: len(data)] = data
            return len(data)
        sock = self._exchange.sock
        sock.settimeout(self._read_timeout_s)
        count = sock.recv_into(buffer)
        limit = min(FLUSH_BYTES, len(buffer))
        if 0 < count < limit:
            sock.settimeout(GATHER_S)
            try:
                while count < limit:
                    more = sock.recv_into(buffer[count:])
                    if not more:
                        break
                    count += more
            except TimeoutError:
                pass  # nothing more for now: write what came
            finally:
                sock.settimeout(self._read_timeout_s)
        return count


class HttpTransport:
    """HEAD and ranged GET of full URLs over pooled keep-alive connections, raw bytes, errors
    mapped at the edge. Used by the HTTP origin, and by the S3 origin for presigned URLs.

    Requests run on origin threads with blocking sockets (`origins.threads`), through
    `http.client`: the body of each connection is received, written and hashed on its own
    thread, off the event loop (`HttpStream.land`).

    Redirects are followed only within `follow_within`'s scheme, host and port, and not at
    all when it is None (the default, and always for S3).
    """

    def __init__(
        self,
        timeouts: Timeouts,
        headers: dict[str, str] | None = None,
        follow_within: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        """`ca_file`: certificates to trust besides the system's (and `SSL_CERT_FILE`'s)."""
        self._headers = {
            "User-Agent": f"shardcache/{__version__}",
            "Accept-Encoding": "identity",
            **(headers or {}),
        }
        self._pool = Connections(tls_context(ca_file), timeouts.connect_s)
        self._follow_within = follow_within
        # Each blocking read waits at most the read timeout (no byte for that long is a
        # stall); the wait for an answer's headers as a whole too, and it bounds the connect
        # when shorter than the connect timeout.
        self._read_s = timeouts.read_s
        self._in_flight: set[Abort] = set()
        self._in_flight_lock = threading.Lock()
        # Each request holds an origin thread while it waits for its answer and while its
        # body lands: one origin that never answers, or drips, may hold only this many, and
        # every other origin keeps the rest.
        self.share = Share(MAX_IN_USE)

    async def _send(
        self, method: str, url: str, label: str, headers: dict[str, str] | None = None
    ) -> Exchange:
        """Send one request and wait for its answer's headers, on an origin thread; the
        caller must close the returned exchange (which gives its turn in the share back).

        Raises LocalBusy when no turn in this transport's share, or no origin thread, came
        within the read timeout: a local wait, which is never the upstream's time. The read
        timeout for the answer starts when the request is on its thread, about to be sent
        (item 4 of issue 23: a healthy home was marked down for a wait on a thread)."""
        abort = Abort()
        loop = asyncio.get_running_loop()
        sent = False
        with self._in_flight_lock:
            self._in_flight.add(abort)
        try:
            async with asyncio.timeout(self._read_s) as deadline:  # first, for local waits

                def sending() -> None:  # on the loop, once the thread has started
                    nonlocal sent
                    if deadline.expired():
                        return  # too late: the local wait ran out first
                    with contextlib.suppress(RuntimeError):  # its task has given up already
                        deadline.reschedule(loop.time() + self._read_s)  # the upstream's time
                        sent = True

                def ask(abort: Abort) -> Exchange:
                    with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits
                        loop.call_soon_threadsafe(sending)
                    return self._ask(abort, method, url, label, headers or {})

                await self.share.take()
                return await run_blocking(ask, abort, orphaned=Exchange.close)
        except TimeoutError:
            if not sent:
                raise LocalBusy(
                    f"{label}: no origin thread free for {self._read_s:g}s "
                    f"({self.share.in_use} of {self.share.size} in use for this origin)",
                    1.0,
                ) from None
            raise OriginTimeout(f"{label}: timed out, no answer in {self._read_s:g}s") from None
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(abort)

    def _ask(
        self, abort: Abort, method: str, url: str, label: str, headers: dict[str, str]
    ) -> Exchange:
        """`_answer`, holding the turn taken in the share: the exchange returned gives it
        back when it ends; a failure gives it back at once. Runs even when its task was
        cancelled before the thread started (the abort then stops it at once), so every turn
        taken is given back."""
        try:
            exchange = self._answer(abort, method, url, label, headers)
        except BaseException:
            self.share.give_back()
            raise
        exchange.share = self.share
        return exchange

    def _answer(
        self, abort: Abort, method: str, url: str, label: str, headers: dict[str, str]
    ) -> Exchange:
        """Send, following only the redirects `redirect_target` allows, and return an answer
        that is not a 3xx. Raises OriginRedirected."""
        with map_http_errors(label):
            for _ in range(MAX_REDIRECTS + 1):
                exchange = self._exchange(abort, method, url, label, headers)
                status = exchange.response.status
                if not 300 <= status < 400:
                    return exchange
                exchange.close()
                location = exchange.headers.get("Location")
                url = redirect_target(url, status, location, label, self._follow_within)
            raise OriginRedirected(f"{label}: more than {MAX_REDIRECTS} redirects")

    def _exchange(
        self, abort: Abort, method: str, url: str, label: str, headers: dict[str, str]
    ) -> Exchange:
        """One request on one connection. A pooled connection that fails before its answer
        (the server closed it as it was taken) is not asked again here: with
        `--origin-retries 2`, an origin closing every connection unanswered got 5 GETs a
        segment while the metric said 2 retries. The fill's one retry loop decides, and
        counts it (`segments.OriginRequests`)."""
        site = site_of(url)
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection, _ = self._pool.take(site)
        try:
            if connection.sock is None:
                abort.check()
                if isinstance(connection, TlsConnection):
                    connection.abort = abort
                connection.connect()  # bounded by the connect timeout, and by `abort`
            sock = connection.sock
            assert sock is not None
            abort.watch(sock)
            sock.settimeout(self._read_s)
            connection.request(method, target, headers={**self._headers, **headers})
            response = connection.getresponse()
        except BaseException:
            connection.close()
            raise
        return Exchange(self._pool, site, connection, response, sock, abort, label)

    async def head(self, url: str, label: str) -> ObjectInfo:
        """HEAD `url`; `label` names the object in errors (never a signed URL)."""
        exchange = await self._send("HEAD", url, label)
        try:
            status = exchange.response.status
            if status in (405, 501):
                raise OriginHeadUnsupported(f"{label}: origin answered {status} to HEAD")
            raise_for_status(status, label, exchange.headers)
            info = info_from(exchange.headers, status, label)
        except BaseException:
            exchange.close()
            raise
        exchange.finish(complete=True)  # a HEAD has no body: the connection is free
        return info

    async def get(
        self, url: str, label: str, start: int, end: int | None, if_match: str | None
    ) -> HttpStream:
        """GET bytes [start, end) of `url`; the caller must `aclose()` the stream."""
        headers = {}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        # RFC 9110 §13.1.1: If-Match compares strongly, so a weak ETag never matches; the
        # validators of each response are compared by the caller instead.
        if if_match is not None and not if_match.startswith("W/"):
            headers["If-Match"] = if_match
        exchange = await self._send("GET", url, label, headers)
        if exchange.response.status == 416 and start == 0 and "Range" in headers:
            # An empty object has no byte 0 to range over: ask for all of it.
            exchange.close()
            del headers["Range"]
            exchange = await self._send("GET", url, label, headers)
        status = exchange.response.status
        try:
            raise_for_status(status, label, exchange.headers)
            info = info_from(exchange.headers, status, label)
            if status == 206:
                check_range(exchange.headers, info.size_bytes, start, end, label)
            if if_match is not None and info.etag != if_match:  # If-Match ignored
                # An answer without the ETag asked for proves nothing about its version,
                # whatever else it carries: its bytes must not be spliced onto another's.
                shown = "no ETag" if info.etag is None else f"ETag {info.etag}"
                raise OriginChanged(f"{label}: asked If-Match {if_match}, answered {shown}")
        except BaseException:
            exchange.close()
            raise
        skip = start if status == 200 else 0
        body_bytes = info.size_bytes
        if status == 206:
            body_bytes = min(info.size_bytes if end is None else end, info.size_bytes) - start
        return HttpStream(info, exchange, skip, body_bytes)

    async def aclose(self) -> None:
        """Close idle connections and stop the requests still in flight."""
        self._pool.close()
        with self._in_flight_lock:
            in_flight = list(self._in_flight)
        for abort in in_flight:
            abort.fire()


class HttpOrigin:
    def __init__(self, spec: OriginSpec, timeouts: Timeouts) -> None:
        self.name = spec.name
        self._base = spec.url.rstrip("/")
        follow_within = spec.url if spec.follow_redirects else None
        self._transport = HttpTransport(timeouts, dict(spec.headers), follow_within, spec.ca_file)

    def url_for(self, key: str) -> str:
        return join_url(self._base, quote(key, safe=_SAFE_IN_PATH))

    async def head(self, key: str) -> ObjectInfo:
        url = self.url_for(key)
        return await self._transport.head(url, url)

    async def open(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> HttpStream:
        url = self.url_for(key)
        return await self._transport.get(url, url, start, end, if_match)

    async def aclose(self) -> None:
        await self._transport.aclose()
