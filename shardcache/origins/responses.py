"""What an HTTP origin's answers mean: status codes as errors, Content-Range, redirects,
validators and checksums from headers, and the blocking exchange's exceptions as
`OriginError`s. Pure rules on values (no sockets, no threads), used by `origins.http`.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import re
import socket
import ssl
import time
from collections.abc import Iterator, Mapping
from urllib.parse import urljoin, urlsplit

from multidict import CIMultiDictProxy

from shardcache import checksums
from shardcache.errors import (
    OriginChanged,
    OriginDenied,
    OriginError,
    OriginNotFound,
    OriginRedirected,
    OriginRefused,
    OriginShed,
    OriginThrottled,
    OriginTimeout,
    OriginUnavailable,
    OriginUntrusted,
)
from shardcache.keys import ERROR_KIND_HEADER
from shardcache.origins.base import ObjectInfo, entity_tag, header_text
from shardcache.origins.pool import Site
from shardcache.origins.threads import Aborted

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+)$")
_TRANSIENT_4XX = {408, 425, 429}  # timeout, too early, too many requests: worth a retry
_REDIRECTS = (301, 302, 303, 307, 308)
_DEFAULT_PORTS = {"http": 80, "https": 443}


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


def raise_for_status(status: int, url: str, headers: Mapping[str, str] | None = None) -> None:
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
    a shed ("busy": its gate's cap, its own share) is an answer about its load, not its health;
    anything else (shutting down, no such origin, no token, its own origin failing) is that
    daemon's trouble, so the next upstream is asked (`cluster.upstreams`)."""
    if kind == "throttled":
        raise OriginThrottled(
            f"{url}: answered {status} (the object store is throttling)",
            retry_after_s(headers.get("Retry-After")),
        )
    if kind == "busy":  # its cap on the origin, or its own share: it shed, and is well
        raise OriginShed(
            f"{url}: answered {status} (busy: shed at its gate)",
            retry_after_s(headers.get("Retry-After")) or 1.0,
        )
    if kind == "not_found":
        raise OriginNotFound(f"{url}: answered {status} (not at the origin)")
    if kind == "changed":
        raise OriginChanged(f"{url}: answered {status} (the object changed)")
    raise OriginUnavailable(f"{url}: shardcache upstream answered {status} ({kind})")


def site_of(url: str) -> Site:
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
        site_of(target)
    except ValueError:  # a port out of range, a malformed IPv6 literal
        raise OriginRedirected(f"{label}: origin redirects ({status}) to an unusable URL") from None
    if follow_within is None:
        raise OriginRedirected(
            f"{label}: origin redirects ({status}) to {_host(target)}; redirects are not "
            "followed (see follow_redirects)"
        )
    if site_of(target) != site_of(follow_within):
        raise OriginRedirected(
            f"{label}: origin redirects ({status}) to another host, {_host(target)}; only "
            f"redirects within {site_of(follow_within)[0]}://{_host(follow_within)} are followed"
        )
    return target


def last_modified(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, OverflowError):  # a hostile offset overflows
        return None  # unparsable: not a validator we can compare


def info_from(headers: CIMultiDictProxy[str], status: int, url: str) -> ObjectInfo:
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
    etag = entity_tag(headers.get("ETag"))
    if "x-amz-request-id" in headers and status == 200:
        sse = headers.get("x-amz-server-side-encryption")
        if (md5 := checksums.from_s3_etag(etag, sse)) is not None:
            found.append(md5)
    accepts_ranges = status == 206 or headers.get("Accept-Ranges", "").lower() == "bytes"
    return ObjectInfo(
        size,
        etag,
        tuple(found),
        header_text(headers.get("Content-Type")),
        accepts_ranges,
        last_modified(headers.get("Last-Modified")),
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
    assert match is not None  # info_from() refused a 206 without one
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
