"""An HTTP(S) server as an origin: HTTP/1.1 over pooled keep-alive connections in receiving
processes (`origins.receivers`), so a miss's bytes use every core.

Bodies are raw bytes (no decompression); redirects are followed only when the origin allows it
and only to its own scheme, host and port; the ETag is an MD5 only from S3 itself."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import quote

from shardcache import __version__
from shardcache.config import OriginSpec
from shardcache.crc_spans import Span
from shardcache.errors import (
    OriginChanged,
    OriginHeadUnsupported,
    OriginRedirected,
    OriginShed,
    OriginTimeout,
)
from shardcache.keys import join_url
from shardcache.origins.base import (
    NEW_REQUEST,
    Landed,
    ObjectInfo,
    RequestContext,
    Spot,
    Timeouts,
)
from shardcache.origins.pool import tls_context
from shardcache.origins.receivers import ReceiverPool, RemoteExchange
from shardcache.origins.responses import (  # retry_after_s: for s3
    check_range,
    info_from,
    raise_for_status,
    redirect_target,
    retry_after_s,
)
from shardcache.origins.threads import MAX_THREADS, Share

__all__ = ["HttpOrigin", "HttpStream", "HttpTransport", "retry_after_s", "tls_context"]

_SAFE_IN_PATH = "/~!$&'()*+,;=:@"
MAX_REDIRECTS = 10
# Read timeouts a request continuing an answer waits locally (for a turn in the origin's thread
# share, or a receiving process to start it) before it is shed; a new request waits one.
CONTINUING_LOCAL_WAITS = 4
# Requests of one transport (one origin, mirror or tier member) at once, from their sending
# to their body's end: the origin threads it may hold, asking or receiving (`Share`).
MAX_IN_USE = MAX_THREADS // 8


class HttpStream:
    """A response body that must be exactly `body_bytes` long: what Content-Length or, for a
    chunked 206, Content-Range announced. A body running past that, or ending before it,
    raises OriginUnavailable; nothing beyond it is ever yielded or written.

    Its bytes are received in a receiving process (`origins.receivers`): `land` writes and
    hashes them there, into the fill's file; iterating brings each chunk back. A body read to
    its end gives its connection back for the next request."""

    def __init__(
        self, info: ObjectInfo, exchange: RemoteExchange, skip: int, body_bytes: int, read_s: float
    ) -> None:
        self.info = info
        self._exchange = exchange
        self._read_s = read_s
        exchange.expect_body(skip, body_bytes)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self._exchange.read(self._read_s)
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
        def progress(count: int, crc: int, spans: list[Span]) -> None:  # on a reader thread
            spot.crc32c = crc
            spot.spans += spans
            spot.done_bytes += count
            landed(count)

        await self._exchange.land(
            fd, spot.position, spot.end, spot.crc32c, read_timeout_s, min_bytes_per_s, progress
        )

    async def aclose(self) -> None:
        self._exchange.close()


class HttpTransport:
    """HEAD and ranged GET of full URLs over pooled keep-alive connections, raw bytes, errors
    mapped at the edge. Used by the HTTP origin, and by the S3 origin for presigned URLs.

    Requests are sent, and their bodies received, written and hashed, in the receiving
    processes (`origins.receivers`), each with blocking sockets and `http.client`; every
    answer's status and headers come back here and are checked before a body byte is taken.

    Redirects are followed only within `follow_within`'s scheme, host and port, and not at
    all when it is None (the default, and always for S3).
    """

    def __init__(
        self,
        timeouts: Timeouts,
        receivers: ReceiverPool,
        headers: dict[str, str] | None = None,
        follow_within: str | None = None,
        ca_file: str | None = None,
    ) -> None:
        """`receivers`: the daemon's pool, which sends and receives every request.
        `ca_file`: certificates to trust besides the system's (and `SSL_CERT_FILE`'s)."""
        self._headers = {
            "User-Agent": f"shardcache/{__version__}",
            "Accept-Encoding": "identity",
            **(headers or {}),
        }
        self._receivers = receivers
        self._id = self._receivers.new_transport()
        self._ca_file = ca_file
        self._connect_s = timeouts.connect_s
        self._follow_within = follow_within
        # Each blocking read waits at most the read timeout (no byte for that long is a
        # stall); the wait for an answer's headers as a whole too, and it bounds the connect
        # when shorter than the connect timeout.
        self._read_s = timeouts.read_s
        # Each request holds a turn while it waits for its answer and while its body lands:
        # one origin that never answers, or drips, may hold only this many of the receivers'
        # threads, and every other origin keeps the rest.
        self.share = Share(MAX_IN_USE)

    @property
    def headers(self) -> dict[str, str]:
        """The headers every request carries (a copy)."""
        return dict(self._headers)

    async def _send(
        self,
        method: str,
        url: str,
        label: str,
        headers: dict[str, str] | None = None,
        is_continuing: bool = False,
    ) -> RemoteExchange:
        """Send one request and wait for its answer's headers; the caller must close the
        returned exchange (which gives its turn in the share back).

        Raises OriginShed (`is_local`) when no turn in this transport's share, or no receiving
        thread, came within the read timeout: a local wait, which is never the upstream's
        time. A request continuing an answer (`is_continuing`) waits CONTINUING_LOCAL_WAITS
        read timeouts: shedding it cuts a 200 a client is reading (new receivers slow to start
        after a reload did), yet a pool that never starts it must still fail it. The read
        timeout for the answer starts when the request is on its thread, about to be sent, so
        a wait for a thread never marks a healthy upstream down."""
        loop = asyncio.get_running_loop()
        local_wait_s = self._read_s * (CONTINUING_LOCAL_WAITS if is_continuing else 1)
        sent = False
        request = {
            "transport": self._id,
            "method": method,
            "url": url,
            "label": label,
            "headers": {**self._headers, **(headers or {})},
            "connect_s": self._connect_s,
            "read_s": self._read_s,
            "ca_file": self._ca_file,
        }
        is_taken = False
        try:
            async with asyncio.timeout(local_wait_s) as deadline:  # first, for local waits

                def sending() -> None:  # on the loop, once the receiver's thread has started
                    nonlocal sent
                    if deadline.expired():
                        return  # too late: the local wait ran out first
                    with contextlib.suppress(RuntimeError):  # its task has given up already
                        deadline.reschedule(loop.time() + self._read_s)  # the upstream's time
                        sent = True

                await self.share.take()
                is_taken = True
                return await self._receivers.ask(request, sending, self.share.give_back)
        except TimeoutError:
            if not sent:
                waited_for = (
                    "a receiving process to start the request"
                    if is_taken
                    else f"an origin thread ({self.share.in_use} of {self.share.size} in use "
                    "for this origin)"
                )
                raise OriginShed(
                    f"{label}: waited {local_wait_s:g}s for {waited_for}", 1.0, is_local=True
                ) from None
            raise OriginTimeout(f"{label}: timed out, no answer in {self._read_s:g}s") from None

    async def _answer(
        self,
        method: str,
        url: str,
        label: str,
        headers: dict[str, str],
        is_continuing: bool = False,
    ) -> RemoteExchange:
        """Send, following only the redirects `redirect_target` allows, and return an answer
        that is not a 3xx. Raises OriginRedirected."""
        for _ in range(MAX_REDIRECTS + 1):
            exchange = await self._send(method, url, label, headers, is_continuing)
            status = exchange.status
            if not 300 <= status < 400:
                return exchange
            exchange.close()
            location = exchange.headers.get("Location")
            url = redirect_target(url, status, location, label, self._follow_within)
        raise OriginRedirected(f"{label}: more than {MAX_REDIRECTS} redirects")

    async def head(self, url: str, label: str, is_continuing: bool = False) -> ObjectInfo:
        """HEAD `url`; `label` names the object in errors (never a signed URL)."""
        exchange = await self._answer("HEAD", url, label, {}, is_continuing)
        try:
            status = exchange.status
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
        self,
        url: str,
        label: str,
        start: int,
        end: int | None,
        if_match: str | None,
        is_continuing: bool = False,
    ) -> HttpStream:
        """GET bytes [start, end) of `url`; the caller must `aclose()` the stream."""
        headers = {}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        # RFC 9110 §13.1.1: If-Match compares strongly, so a weak ETag never matches; the
        # validators of each response are compared by the caller instead.
        if if_match is not None and not if_match.startswith("W/"):
            headers["If-Match"] = if_match
        exchange = await self._answer("GET", url, label, headers, is_continuing)
        if exchange.status == 416 and start == 0 and "Range" in headers:
            # An empty object has no byte 0 to range over: ask for all of it.
            exchange.close()
            del headers["Range"]
            exchange = await self._answer("GET", url, label, headers, is_continuing)
        status = exchange.status
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
            skip = start if status == 200 else 0
            body_bytes = info.size_bytes
            if status == 206:
                body_bytes = min(info.size_bytes if end is None else end, info.size_bytes) - start
            return HttpStream(info, exchange, skip, body_bytes, self._read_s)
        except BaseException:
            exchange.close()
            raise

    async def aclose(self) -> None:
        """Close this transport's idle connections in the receivers."""
        self._receivers.forget(self._id)


class HttpOrigin:
    def __init__(self, spec: OriginSpec, timeouts: Timeouts, receivers: ReceiverPool) -> None:
        self.name = spec.name
        self._base = spec.url.rstrip("/")
        follow_within = spec.url if spec.follow_redirects else None
        self._transport = HttpTransport(
            timeouts, receivers, dict(spec.headers), follow_within, spec.ca_file
        )

    @property
    def headers(self) -> dict[str, str]:
        """What every request to this origin carries (a copy; values may be credentials, so
        never logged): which origin gets which credentials is checked through it."""
        return self._transport.headers

    def url_for(self, key: str) -> str:
        return join_url(self._base, quote(key, safe=_SAFE_IN_PATH))

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        url = self.url_for(key)
        return await self._transport.head(url, url, context.is_continuing)

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> HttpStream:
        url = self.url_for(key)
        return await self._transport.get(url, url, start, end, if_match, context.is_continuing)

    async def aclose(self) -> None:
        await self._transport.aclose()
