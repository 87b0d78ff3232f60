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
import email.utils
import functools
import http.client
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from urllib.parse import quote, urljoin, urlsplit

from multidict import CIMultiDict, CIMultiDictProxy

from shardcache import __version__, checksums
from shardcache.config import OriginSpec
from shardcache.errors import (
    OriginChanged,
    OriginDenied,
    OriginError,
    OriginHeadUnsupported,
    OriginNotFound,
    OriginRedirected,
    OriginRefused,
    OriginThrottled,
    OriginTimeout,
    OriginTooSlow,
    OriginUnavailable,
    OriginUntrusted,
)
from shardcache.keys import ERROR_KIND_HEADER, join_url
from shardcache.origins import Timeouts
from shardcache.origins.base import CHUNK_BYTES, Landed, ObjectInfo, SpeedFloor, Spot, write_at
from shardcache.origins.threads import MAX_THREADS, Abort, Aborted, run_blocking

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_TRANSIENT_4XX = {408, 425, 429}  # timeout, too early, too many requests: worth a retry
_SAFE_IN_PATH = "/~!$&'()*+,;=:@"
_REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 10
_DEFAULT_PORTS = {"http": 80, "https": 443}
Site = tuple[str, str, int | None]  # scheme, host, port
LAND_BYTES = 1 << 20  # a landing thread's buffer: the most one write takes
FLUSH_BYTES = 256 << 10  # written as soon as this much came (or nothing more is there yet)
GATHER_S = 0.002  # how long more bytes are waited for before those that came are written
IDLE_S = 10.0  # an idle connection older than this is not reused (servers close them)
MAX_IDLE_PER_SITE = 64
MAX_ASKING = MAX_THREADS // 8  # requests of one transport waiting for their answers at once


@contextlib.contextmanager
def map_http_errors(url: str) -> Iterator[None]:
    """Translate what a blocking HTTP exchange with `url` raises into OriginError subclasses."""
    try:
        yield
    except (OriginError, Aborted):
        raise
    except TimeoutError as exc:  # socket.timeout: no byte for the read (or connect) timeout
        raise OriginTimeout(f"{url}: timed out") from exc
    except ssl.SSLCertVerificationError as exc:
        raise OriginUntrusted(
            f"{url}: TLS certificate not trusted (certificate verify failed: "
            f"{exc.verify_message}); trust its CA with the origin's ca_file or SSL_CERT_FILE"
        ) from exc
    except ssl.SSLError as exc:
        raise OriginUnavailable(f"{url}: TLS failed ({exc.reason or exc})") from exc
    except http.client.RemoteDisconnected as exc:
        raise OriginUnavailable(f"{url}: connection closed before an answer") from exc
    except ConnectionRefusedError as exc:
        raise OriginUnavailable(f"{url}: cannot connect ({exc.strerror})") from exc
    except socket.gaierror as exc:
        raise OriginUnavailable(f"{url}: cannot connect ({exc.strerror})") from exc
    except http.client.HTTPException as exc:  # a malformed status line or headers
        raise OriginUnavailable(f"{url}: {exc.__class__.__name__}: {exc}"[:300]) from exc
    except OSError as exc:
        raise OriginUnavailable(f"{url}: {exc.strerror or exc}") from exc


def retry_after_s(value: str | None) -> float | None:
    """A `Retry-After` header in seconds (delta-seconds or an HTTP date), None when absent or
    unreadable."""
    if not value:
        return None
    text = value.strip()
    if re.fullmatch(r"[0-9]{1,9}", text):  # ASCII digits only ("²" is a digit to isdigit),
        return float(text)  # and few enough that the number stays finite
    try:
        return max(0.0, email.utils.parsedate_to_datetime(text).timestamp() - time.time())
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def _raise_for_status(status: int, url: str, headers: Mapping[str, str] | None = None) -> None:
    kind = (headers or {}).get(ERROR_KIND_HEADER)
    if kind is not None and status >= 400:
        _raise_for_shardcache_error(status, url, kind, headers or {})
    if status in (429, 503):  # too many requests; S3's SlowDown is a 503
        hint = retry_after_s((headers or {}).get("Retry-After"))
        raise OriginThrottled(f"{url}: origin answered {status} (slow down)", hint)
    if status in (404, 410):
        raise OriginNotFound(f"{url}: origin answered {status}")
    if status == 412:
        raise OriginChanged(f"{url}: ETag changed (412)")
    if status in (401, 403):
        raise OriginDenied(f"{url}: origin answered {status}")
    if 400 <= status < 500 and status not in _TRANSIENT_4XX:
        raise OriginRefused(f"{url}: origin answered {status}")
    if status not in (200, 206):
        raise OriginUnavailable(f"{url}: origin answered {status}")


def _raise_for_shardcache_error(
    status: int, url: str, kind: str, headers: Mapping[str, str]
) -> None:
    """An error from another shardcache daemon (a tier member, a mirror), which names its kind:
    the object store's throttling, a missing or changed object are answers about the object;
    anything else (shutting down, no such origin, no token, its own origin failing) is that
    daemon's trouble, so the next upstream is asked (`origins.upstreams`)."""
    if kind == "throttled":
        raise OriginThrottled(
            f"{url}: answered {status} (the object store is throttling)",
            retry_after_s(headers.get("Retry-After")),
        )
    if kind == "not_found":
        raise OriginNotFound(f"{url}: answered {status} (not at the origin)")
    if kind == "changed":
        raise OriginChanged(f"{url}: answered {status} (the object changed)")
    raise OriginUnavailable(f"{url}: shardcache upstream answered {status} ({kind})")


def _site(url: str) -> Site:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)


def _host(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)


def redirect_target(
    url: str, status: int, location: str | None, label: str, follow_within: str | None
) -> str:
    """Return the absolute URL a 3xx answer to `url` redirects to, if it may be followed.

    It may when `follow_within` (the origin's URL) is given and the target has its scheme, host
    and port. Raises OriginRedirected otherwise, naming the target's host (never its path or
    query, which may carry a signature); `label` names the object.
    """
    if status not in _REDIRECTS or not location:
        raise OriginRedirected(f"{label}: origin answered {status} without a redirect to follow")
    target = urljoin(url, location)  # RFC 9110 §10.2.2: a relative Location is relative to url
    try:
        _site(target)
    except ValueError:  # a port out of range, a malformed IPv6 literal
        raise OriginRedirected(f"{label}: origin redirects ({status}) to an unusable URL") from None
    if follow_within is None:
        raise OriginRedirected(
            f"{label}: origin redirects ({status}) to {_host(target)}; redirects are not "
            "followed (see follow_redirects)"
        )
    if _site(target) != _site(follow_within):
        raise OriginRedirected(
            f"{label}: origin redirects ({status}) to another host, {_host(target)}; only "
            f"redirects within {_site(follow_within)[0]}://{_host(follow_within)} are followed"
        )
    return target


def _last_modified(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):  # a hostile offset overflows
        return None  # unparsable: not a validator we can compare


def _info(headers: CIMultiDictProxy[str], status: int, url: str) -> ObjectInfo:
    if status == 206:
        match = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
        if match is None:
            raise OriginUnavailable(f"{url}: 206 without a usable Content-Range")
        size = int(match.group(3))
        found: list[checksums.Checksum] = []  # a part's checksums are not the object's
    else:
        length = headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise OriginUnavailable(f"{url}: origin sent no Content-Length")
        size = int(length)
        found = checksums.from_headers(headers)
    etag = headers.get("ETag")
    if "x-amz-request-id" in headers and status == 200:
        sse = headers.get("x-amz-server-side-encryption")
        if (md5 := checksums.from_s3_etag(etag, sse)) is not None:
            found.append(md5)
    accepts_ranges = status == 206 or headers.get("Accept-Ranges", "").lower() == "bytes"
    return ObjectInfo(
        size,
        etag,
        tuple(found),
        headers.get("Content-Type"),
        accepts_ranges,
        _last_modified(headers.get("Last-Modified")),
    )


def check_range(
    headers: CIMultiDictProxy[str], size_bytes: int, start: int, end: int | None, url: str
) -> None:
    """Raise OriginUnavailable unless a 206 carries exactly the bytes asked for.

    RFC 9110 §14.4 lets the Content-Range name what was sent; an origin (or a cache in front
    of it) that answers another range, or a Content-Length that disagrees with it, would
    otherwise put those bytes at the wrong offset of the shard.
    """
    match = _CONTENT_RANGE.match(headers.get("Content-Range", ""))
    assert match is not None  # _info() refused a 206 without one
    first, last = int(match.group(1)), int(match.group(2))
    want_last = min(size_bytes if end is None else end, size_bytes) - 1
    if (first, last) != (start, want_last):
        raise OriginUnavailable(
            f"{url}: asked for bytes {start}-{want_last}, origin answered "
            f"{headers.get('Content-Range')}"
        )
    length = headers.get("Content-Length")
    if length is not None and length.isdigit() and int(length) != last - first + 1:
        raise OriginUnavailable(
            f"{url}: Content-Range {headers.get('Content-Range')} with Content-Length {length}"
        )


class HttpStream:
    """A response body that must be exactly `body_bytes` long: what Content-Length or, for a
    chunked 206, Content-Range announced. A body running past that, or ending before it,
    raises OriginUnavailable; nothing beyond it is ever yielded or written.

    Its bytes are received on origin threads (`origins.threads`): `land` writes and hashes
    them there; iterating hops to a thread per chunk. A body read to its end gives its
    connection back for the next request."""

    def __init__(self, info: ObjectInfo, exchange: _Exchange, skip: int, body_bytes: int) -> None:
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


class _Exchange:
    """One request's connection and response, until the body is read (the connection then
    goes back to the pool) or the stream is closed (it is closed with it)."""

    def __init__(
        self,
        pool: _Connections,
        site: Site,
        connection: http.client.HTTPConnection,
        response: http.client.HTTPResponse,
        sock: socket.socket,
        abort: Abort,
        label: str,
    ) -> None:
        self.pool = pool
        self.site = site
        self.connection: http.client.HTTPConnection | None = connection
        self.response = response
        self.sock = sock
        self.abort = abort
        self.label = label
        self.headers = CIMultiDictProxy(CIMultiDict(response.getheaders()))

    def finish(self, complete: bool) -> None:
        """Give the connection back when the body was read in full and the server keeps it
        open; close it otherwise. Once; safe on any thread (one at a time)."""
        connection, self.connection = self.connection, None
        if connection is None:
            return
        self.abort.watch_nothing()  # from now on it may carry another request
        response = self.response
        if complete and not response.chunked:
            complete = not self._bytes_left_over()
            response.close()  # its bytes are all read: http.client may send the next request
        if complete and response.isclosed() and not response.will_close:
            self.pool.give(self.site, connection)  # unless more bytes came: see `give`
        else:
            connection.close()

    def close(self) -> None:
        self.finish(complete=False)

    def _bytes_left_over(self) -> bool:
        """Whether bytes past the body's end were read with it (into http.client's buffer)
        or wait on the socket: the connection is then not fit for another request."""
        assert self.response.fp is not None
        timeout = self.sock.gettimeout()
        self.sock.settimeout(0)  # look, do not wait
        try:
            return bool(self.response.fp.peek(1))
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        except (OSError, ValueError):
            return True
        finally:
            self.sock.settimeout(timeout)


def _has_bytes_waiting(connection: http.client.HTTPConnection) -> bool:
    """Whether an idle connection can be read without blocking: bytes nobody asked for, or
    the server's close."""
    sock = connection.sock
    if sock is None:
        return True
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    poller = select.poll()
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):  # closed under it
        return True


class _TlsConnection(http.client.HTTPConnection):
    """HTTPS whose TLS handshake an `Abort` can stop: the TCP socket is followed before the
    handshake (http.client's HTTPSConnection does both in one call), so a server dripping
    its handshake a byte at a time cannot hold an origin thread past the request's time."""

    default_port = 443

    def __init__(self, host: str, port: int | None, timeout: float, tls: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=timeout)
        self._tls = tls
        self.abort: Abort | None = None

    def connect(self) -> None:
        super().connect()  # TCP, within the connect timeout
        assert self.sock is not None
        # Wrapping takes the descriptor over from the TCP socket: follow the TLS one.
        self.sock = self._tls.wrap_socket(
            self.sock, server_hostname=self.host, do_handshake_on_connect=False
        )
        if self.abort is not None:
            self.abort.watch(self.sock)
        self.sock.do_handshake()


class _Connections:
    """Idle keep-alive connections by site (scheme, host, port), taken by one request at a
    time. A server closes idle connections on its own schedule; one idle longer than
    IDLE_S is not reused, and one that fails before its answer began is retried once on a
    new connection (`HttpTransport._exchange`)."""

    def __init__(self, tls: ssl.SSLContext, connect_s: float) -> None:
        self._tls = tls
        self._connect_s = connect_s
        self._lock = threading.Lock()
        self._idle: dict[Site, list[tuple[http.client.HTTPConnection, float]]] = {}
        self._closed = False

    def take(self, site: Site, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
        """A connection to `site` (a new one if `fresh`: the retry after a stale one must not
        meet another), and whether it carried a request before."""
        now = time.monotonic()
        with self._lock:
            idle = [] if fresh else self._idle.get(site, [])
            while idle:
                connection, since = idle.pop()
                if now - since < IDLE_S and not _has_bytes_waiting(connection):
                    return connection, True
                connection.close()
        scheme, host, port = site
        if scheme == "https":
            return _TlsConnection(host, port, self._connect_s, self._tls), False
        return http.client.HTTPConnection(host, port, timeout=self._connect_s), False

    def give(self, site: Site, connection: http.client.HTTPConnection) -> None:
        """Keep `connection` for the next request, unless bytes already wait on it: past a
        body's announced end, they would be read as the next request's answer (another key's
        bytes); a server's close (EOF) reads the same way."""
        if _has_bytes_waiting(connection):
            connection.close()
            return
        with self._lock:
            idle = self._idle.setdefault(site, [])
            if self._closed or len(idle) >= MAX_IDLE_PER_SITE:
                connection.close()
                return
            idle.append((connection, time.monotonic()))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection, _ in connections:
                connection.close()


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
        self._pool = _Connections(tls_context(ca_file), timeouts.connect_s)
        self._follow_within = follow_within
        # Each blocking read waits at most the read timeout (no byte for that long is a
        # stall); the wait for an answer's headers as a whole too, and it bounds the connect
        # when shorter than the connect timeout.
        self._read_s = timeouts.read_s
        self._in_flight: set[Abort] = set()
        self._in_flight_lock = threading.Lock()
        # Requests waiting for their answer hold an origin thread each: one origin that
        # never answers may hold only this many, and every other origin keeps the rest.
        self._asking = asyncio.Semaphore(MAX_ASKING)

    async def _send(
        self, method: str, url: str, label: str, headers: dict[str, str] | None = None
    ) -> _Exchange:
        """Send one request and wait for its answer's headers, on an origin thread; the
        caller must close the returned exchange."""
        abort = Abort()
        with self._in_flight_lock:
            self._in_flight.add(abort)
        try:
            async with asyncio.timeout(self._read_s), self._asking:
                return await run_blocking(
                    lambda abort: self._answer(abort, method, url, label, headers or {}),
                    abort,
                    orphaned=_Exchange.close,
                )
        except TimeoutError:
            raise OriginTimeout(f"{label}: timed out, no answer in {self._read_s:g}s") from None
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(abort)

    def _answer(
        self, abort: Abort, method: str, url: str, label: str, headers: dict[str, str]
    ) -> _Exchange:
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
    ) -> _Exchange:
        site = _site(url)
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        for attempt in range(2):
            connection, reused = self._pool.take(site, fresh=attempt > 0)
            try:
                if connection.sock is None:
                    abort.check()
                    if isinstance(connection, _TlsConnection):
                        connection.abort = abort
                    connection.connect()  # bounded by the connect timeout, and by `abort`
                sock = connection.sock
                assert sock is not None
                abort.watch(sock)
                sock.settimeout(self._read_s)
                connection.request(method, target, headers={**self._headers, **headers})
                response = connection.getresponse()
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                connection.close()
                if reused and attempt == 0:
                    continue  # the server had closed it while it was idle: a new one
                raise
            except BaseException:
                connection.close()
                raise
            return _Exchange(self._pool, site, connection, response, sock, abort, label)
        raise AssertionError("unreachable")

    async def head(self, url: str, label: str) -> ObjectInfo:
        """HEAD `url`; `label` names the object in errors (never a signed URL)."""
        exchange = await self._send("HEAD", url, label)
        try:
            status = exchange.response.status
            if status in (405, 501):
                raise OriginHeadUnsupported(f"{label}: origin answered {status} to HEAD")
            _raise_for_status(status, label, exchange.headers)
            info = _info(exchange.headers, status, label)
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
            _raise_for_status(status, label, exchange.headers)
            info = _info(exchange.headers, status, label)
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


@functools.lru_cache(maxsize=32)
def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """How https:// origins are verified: the system's CAs (and `SSL_CERT_FILE`'s, as OpenSSL
    reads it), plus `ca_file`'s; hostnames checked. Never unverified: an origin whose
    certificate does not verify fails (`OriginUntrusted`), it is never read in plain text.

    One context per `ca_file` (and one without), built once: loading CA bundles takes
    milliseconds, and transports are built on the event loop (a reload, a tier member found by
    DNS)."""
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=ca_file)
    return context


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
