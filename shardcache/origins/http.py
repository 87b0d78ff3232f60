"""An HTTP(S) server as an origin, through one pooled aiohttp client session per origin.

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
import re
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from urllib.parse import quote, urljoin, urlsplit

import aiohttp
from multidict import CIMultiDictProxy

from shardcache import checksums
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
    OriginUnavailable,
    OriginUntrusted,
)
from shardcache.keys import ERROR_KIND_HEADER, join_url
from shardcache.origins import Timeouts
from shardcache.origins.base import CHUNK_BYTES, ObjectInfo

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_TRANSIENT_4XX = {408, 425, 429}  # timeout, too early, too many requests: worth a retry
_SAFE_IN_PATH = "/~!$&'()*+,;=:@"
_REDIRECTS = (301, 302, 303, 307, 308)
MAX_REDIRECTS = 10
_DEFAULT_PORTS = {"http": 80, "https": 443}


@contextlib.contextmanager
def map_aiohttp_errors(url: str) -> Iterator[None]:
    """Translate aiohttp client exceptions for `url` into OriginError subclasses."""
    try:
        yield
    except OriginError:
        raise
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        raise OriginTimeout(f"{url}: timed out") from exc
    except aiohttp.ClientPayloadError as exc:
        raise OriginUnavailable(f"{url}: body cut short ({exc})") from exc
    except aiohttp.ClientConnectorCertificateError as exc:
        raise OriginUntrusted(
            f"{url}: TLS certificate not trusted ({exc.certificate_error}); trust its CA with "
            "the origin's ca_file or SSL_CERT_FILE"
        ) from exc
    except aiohttp.ClientConnectorSSLError as exc:
        raise OriginUnavailable(f"{url}: TLS handshake failed ({exc.os_error})") from exc
    except aiohttp.ClientConnectorError as exc:
        raise OriginUnavailable(f"{url}: cannot connect ({exc.os_error})") from exc
    except aiohttp.ClientError as exc:
        raise OriginUnavailable(f"{url}: {exc.__class__.__name__}: {exc}") from exc


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


def _site(url: str) -> tuple[str, str, int | None]:
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
    raises OriginUnavailable; nothing beyond it is ever yielded."""

    def __init__(
        self,
        info: ObjectInfo,
        response: aiohttp.ClientResponse,
        skip: int,
        url: str,
        body_bytes: int,
    ) -> None:
        self.info = info
        self._response = response
        self._skip = skip  # bytes to drop when a server answered a Range request with 200
        self._url = url
        self._left = body_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        with map_aiohttp_errors(self._url):
            async for chunk in self._response.content.iter_chunked(CHUNK_BYTES):
                if len(chunk) > self._left:
                    raise OriginUnavailable(f"{self._url}: body longer than announced")
                self._left -= len(chunk)
                if self._skip:
                    dropped = min(self._skip, len(chunk))
                    self._skip -= dropped
                    chunk = chunk[dropped:]
                    if not chunk:
                        continue
                yield chunk
        if self._left:
            raise OriginUnavailable(f"{self._url}: body ended {self._left} bytes short")

    async def aclose(self) -> None:
        self._response.close()


class HttpTransport:
    """One pooled aiohttp client session: HEAD and ranged GET of full URLs, raw bytes, errors
    mapped at the edge. Used by the HTTP origin, and by the S3 origin for presigned URLs.

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
        self._headers = {"Accept-Encoding": "identity", **(headers or {})}
        self._tls = tls_context(ca_file)
        self._follow_within = follow_within
        # No `sock_read`: aiohttp 3.14 can leave that timer armed on a connection back in the
        # keep-alive pool (aio-libs/aiohttp#12953), and the next request on it then fails at
        # once, "timed out" (the fault soak saw three retries in a row fail that way). The
        # wait for an answer's headers is bounded here instead (by the read timeout: no byte
        # for that long is a stall; it bounds the connect too when shorter than that), and
        # every body read by `base.with_read_timeout`.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeouts.connect_s)
        self._answer_timeout_s = timeouts.read_s
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # created lazily: a session needs the running loop
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                auto_decompress=False,
                read_bufsize=CHUNK_BYTES,
                connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, ssl=self._tls),
            )
        return self._session

    async def _send(
        self, method: str, url: str, label: str, headers: dict[str, str] | None = None
    ) -> aiohttp.ClientResponse:
        """Send one request, following only the redirects `redirect_target` allows; return a
        response that is not a 3xx, which the caller must close. Raises OriginRedirected."""
        for _ in range(MAX_REDIRECTS + 1):
            async with asyncio.timeout(self._answer_timeout_s):  # to the answer's headers
                response = await self._client().request(
                    method, url, headers=headers, allow_redirects=False
                )
            if not 300 <= response.status < 400:
                return response
            response.close()
            location = response.headers.get("Location")
            url = redirect_target(url, response.status, location, label, self._follow_within)
        raise OriginRedirected(f"{label}: more than {MAX_REDIRECTS} redirects")

    async def head(self, url: str, label: str) -> ObjectInfo:
        """HEAD `url`; `label` names the object in errors (never a signed URL)."""
        with map_aiohttp_errors(label):
            response = await self._send("HEAD", url, label)
            try:
                if response.status in (405, 501):
                    raise OriginHeadUnsupported(
                        f"{label}: origin answered {response.status} to HEAD"
                    )
                _raise_for_status(response.status, label, response.headers)
                return _info(response.headers, response.status, label)
            finally:
                response.release()

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
        with map_aiohttp_errors(label):
            response = await self._send("GET", url, label, headers)
            if response.status == 416 and start == 0 and "Range" in headers:
                # An empty object has no byte 0 to range over: ask for all of it.
                response.close()
                del headers["Range"]
                response = await self._send("GET", url, label, headers)
            try:
                _raise_for_status(response.status, label, response.headers)
                info = _info(response.headers, response.status, label)
                if response.status == 206:
                    check_range(response.headers, info.size_bytes, start, end, label)
                if if_match is not None and info.etag not in (None, if_match):  # If-Match ignored
                    raise OriginChanged(f"{label}: ETag changed from {if_match} to {info.etag}")
            except BaseException:
                response.close()
                raise
        skip = start if response.status == 200 else 0
        body_bytes = info.size_bytes
        if response.status == 206:
            body_bytes = min(info.size_bytes if end is None else end, info.size_bytes) - start
        return HttpStream(info, response, skip, label, body_bytes)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector close its transports


@functools.lru_cache(maxsize=32)
def tls_context(ca_file: str | None) -> ssl.SSLContext | bool:
    """How https:// origins are verified: the system's CAs (and `SSL_CERT_FILE`'s, as OpenSSL
    reads it), plus `ca_file`'s; hostnames checked. Never unverified: an origin whose
    certificate does not verify fails (`OriginUntrusted`), it is never read in plain text.

    Without `ca_file`, aiohttp's own shared default context (True); with one, one context per
    file, built once: loading CA bundles takes milliseconds, and transports are built on the
    event loop (a reload, a tier member found by DNS)."""
    if ca_file is None:
        return True
    context = ssl.create_default_context()
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
