"""The `Origin` seam: what the cache needs from a backend (S3, HTTP, file, or a test fake).

A backend translates its vendor's exceptions into `shardcache.errors.OriginError` subclasses at
its edge; callers never see botocore or aiohttp.client exceptions.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from shardcache.checksums import Checksum
from shardcache.crc_spans import Span, SpanHasher
from shardcache.errors import OriginTimeout, OriginTooSlow, OriginUnavailable

# Bytes per read from an origin. Each open origin connection buffers about three of these, so
# this times the connections in flight bounds the daemon's memory (see `segments`).
CHUNK_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long a backend waits for an origin: to connect, for the next byte, and the speed
    floor under which a body counts as stalled (`SpeedFloor`, for failover's streams)."""

    connect_s: float
    read_s: float
    min_bytes_per_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a request carries down through every wrapper of `Origin`, as an argument.

    `is_continuing`: it continues an answer a client may already be reading (a later segment,
    the HEAD for the checksums of a fill that started): an operator's caps never shed it."""

    is_continuing: bool = False


NEW_REQUEST = RequestContext()  # nothing of its answer is under way: it may be shed
CONTINUED_REQUEST = RequestContext(is_continuing=True)


class Sender(Protocol):
    """Which of an origin's upstreams sent a response (`cluster.upstreams`), told what the
    fill found its bytes to be: bytes that fail verification count against the upstream that
    sent them, as a 5xx does, and only verified bytes prove it sends the right ones again."""

    name: str  # the upstream, as logs and `/_/status` show it ("mirror http://…")

    def bytes_failed(self, reason: str) -> None:
        """The bytes this response landed failed verification for `reason`."""
        ...

    def bytes_verified(self) -> None:
        """The bytes this response landed were part of a verified body."""
        ...


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What an origin says about a whole object; `size_bytes` is the full length, even for a
    ranged read. `sent_by`: the upstream that sent this response, when the origin has several
    and it was not the home (it takes no part in comparing two answers)."""

    size_bytes: int
    etag: str | None = None
    checksums: tuple[Checksum, ...] = ()
    content_type: str | None = None
    accepts_ranges: bool = False  # the origin serves byte ranges: fetch in parallel segments
    last_modified: float | None = None  # seconds since the epoch, when the origin says
    sent_by: Sender | None = field(default=None, compare=False, repr=False)

    def differs_from(self, other: ObjectInfo) -> str | None:
        """Say how `other` (a later response for the same key) shows a different object than
        this one, or return None. Validators are compared only where both responses carry
        them: an origin that ignores `If-Match` still changes its ETag, its Last-Modified or
        its length, and one changed validator is enough to refuse splicing two versions."""
        if other.size_bytes != self.size_bytes:
            return f"length changed from {self.size_bytes} to {other.size_bytes}"
        if self.etag and other.etag and self.etag != other.etag:
            return f"ETag changed from {self.etag} to {other.etag}"
        if (
            self.last_modified is not None
            and other.last_modified is not None
            and self.last_modified != other.last_modified
        ):
            return f"Last-Modified moved by {other.last_modified - self.last_modified:+.0f} s"
        return None

    @property
    def strong_etag(self) -> str | None:
        """The ETag when it is a strong validator (RFC 9110 §8.8.1), else None: a weak ETag
        may stay the same across byte-different versions, so it proves nothing about bytes."""
        if self.etag is None or self.etag.startswith("W/"):
            return None
        return self.etag

    def proves_same_version(self, other: ObjectInfo) -> str | None:
        """Say why `other` (the answer to a request resumed after the first byte, from any
        upstream) does not prove it is this version, or return None when it does.

        Stricter than `differs_from`: a missing validator proves nothing. An upstream that
        ignores If-Match and answers without an ETag, or with a weak one, may be serving
        another version; splicing its bytes after this one's would hand a reader a shard
        that is neither. Only the same strong ETag, or a same published checksum
        of the whole object, proves the version."""
        change = self.differs_from(other)
        if change is not None:
            return change
        published = {(c.algorithm, c.digest) for c in self.checksums}
        if any((c.algorithm, c.digest) in published for c in other.checksums):
            return None
        if self.strong_etag is None:
            return "the first answer carried no strong ETag to resume against"
        if other.etag != self.strong_etag:
            shown = "no ETag" if other.etag is None else f"ETag {other.etag}"
            return f"the resumed answer carries {shown}, not {self.strong_etag}"
        return None


def header_text(value: str | None) -> str | None:
    """An origin's header value that is passed on to clients (ETag, Content-Type), or None
    when it holds anything but printable ASCII (RFC 9110 §5.5: no control characters). A
    hostile value would otherwise make every response carrying it fail in aiohttp (a 500);
    an ETag dropped this way proves no version, so the object is fetched whole."""
    if value is None or not all(" " <= c <= "~" for c in value):
        return None
    return value


def entity_tag(value: str | None) -> str | None:
    """An origin's ETag as `header_text` passes it on, or None when it is empty (`""`,
    `W/""`, or a blank header). RFC 9110 §8.8.3 allows an empty opaque-tag, but a store that
    sends one for every object (SeaweedFS for a remote-mounted bucket) names no version with
    it: read as an ETag it would prove a resume, answer If-None-Match for every object, and
    differ from the home's real one. Read as none, such an upstream's bytes are verified by
    the home's checksum."""
    text = header_text(value)
    if text is None or text.strip() in ("", '""', 'W/""'):
        return None
    return text


@dataclass(slots=True)
class SpeedFloor:
    """The least a body must deliver: `min_bytes_per_s` on average over every window of
    `window_s` (the read timeout), as curl's `--speed-limit` over `--speed-time`.

    The read timeout alone bounds the wait for each byte, not for the body: an upstream that
    drips one byte a second under a 2 s read timeout would hold a fill and its readers for
    ever. `passed` is called as bytes arrive (on any thread); a window that ends under the
    floor raises OriginTooSlow, which fails the upstream over like any stall. 0 turns it off.
    """

    min_bytes_per_s: float
    window_s: float
    clock: Callable[[], float] = time.monotonic
    _window_start: float = field(init=False, default=0.0)
    _window_bytes: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self._window_start = self.clock()

    def passed(self, count: int, label: str) -> None:
        """`count` more bytes came; raise OriginTooSlow when the window just ended under the
        floor."""
        if self.min_bytes_per_s <= 0:
            return
        self._window_bytes += count
        now = self.clock()
        elapsed = now - self._window_start
        if elapsed < self.window_s:
            return
        if self._window_bytes < self.min_bytes_per_s * elapsed:
            raise OriginTooSlow(
                f"{label}: {self._window_bytes} bytes in {elapsed:.1f}s, under the floor of "
                f"{self.min_bytes_per_s:.0f} bytes/s"
            )
        self._window_start, self._window_bytes = now, 0


class Spot(Protocol):
    """Where a body lands in a fill's file: bytes [position, end) are still wanted. `land`
    advances `done_bytes` (and so `position`) only after the bytes are written, keeps
    `crc32c` the running CRC-32C of every byte landed so far, and adds to `spans` the CRC-32C
    of each span of a block it completed (`crc_spans`), never past `position`."""

    end: int
    done_bytes: int
    crc32c: int
    spans: list[Span]

    @property
    def position(self) -> int: ...


# `landed(count)`: `count` more bytes are on disk. Called on the thread that wrote them, which
# may not be the event loop's: the callee makes it safe to call from any thread.
Landed = Callable[[int], None]


class OriginStream(Protocol):
    """An open read of an object from `start`: iterate for body chunks, or `land` the body
    straight into a file; then `aclose()`."""

    info: ObjectInfo

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def land(
        self,
        fd: int,
        spot: Spot,
        landed: Landed,
        read_timeout_s: float,
        min_bytes_per_s: float = 0.0,
    ) -> None:
        """Write the body at `spot.position` of `fd` until `spot.end`; raise OriginTimeout
        when no byte comes for `read_timeout_s`, OriginTooSlow when it falls under
        `min_bytes_per_s` (see `SpeedFloor`), OriginUnavailable when it ends before.

        This is the fill's data path: the HTTP transport receives, writes and hashes on a
        worker thread (`origins.http`), so many segments use many cores; other streams land
        their chunks with `land_chunks`."""
        ...

    async def aclose(self) -> None: ...


class Origin(Protocol):
    name: str

    def url_for(self, key: str) -> str:
        """Return the full origin URL of `key`: the cache key, unique across origins."""
        ...

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        """Return the object's info; raise OriginNotFound or another OriginError. A wrapper
        passes `context` on to the origin it wraps; a backend has no use for it."""
        ...

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> OriginStream:
        """Start reading bytes [start, end) of `key` (to the end when `end` is None); the
        caller must `aclose()` the stream. A stream may yield past `end` (an origin that
        answers a range with the whole object), never past what its response announced, and
        raises when its body ends early; callers cut it. A wrapper passes `context` on.

        With `if_match`, raise OriginChanged if the object's ETag is no longer that value.
        Errors before the first byte raise here; errors mid-body raise from iteration.
        """
        ...

    async def aclose(self) -> None: ...


async def with_read_timeout(
    stream: OriginStream, timeout_s: float, min_bytes_per_s: float = 0.0
) -> AsyncIterator[bytes]:
    """Yield `stream`'s chunks; raise OriginTimeout when one takes longer than `timeout_s`,
    OriginTooSlow when they come slower than `min_bytes_per_s` (a stalled or dripping origin
    must never hang a fill or a client)."""
    chunks = aiter(stream)
    floor = SpeedFloor(min_bytes_per_s, timeout_s)
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise OriginTimeout(f"no byte from the origin for {timeout_s:g}s") from None
        floor.passed(len(chunk), "the origin's body")
        yield chunk


async def land_chunks(
    stream: OriginStream,
    fd: int,
    spot: Spot,
    landed: Landed,
    read_timeout_s: float,
    min_bytes_per_s: float = 0.0,
) -> None:
    """`OriginStream.land` for a stream that yields chunks on the event loop: each is written
    (and hashed) on a worker thread."""
    if spot.position >= spot.end:  # an empty object: nothing to write
        return
    hasher = SpanHasher(spot.position, spot.crc32c)
    async for chunk in with_read_timeout(stream, read_timeout_s, min_bytes_per_s):
        piece = chunk[: spot.end - spot.position]  # a stream may run past its segment
        await asyncio.to_thread(write_at, fd, piece, spot.position, hasher, spot.end)
        spot.crc32c = hasher.crc
        spot.spans += hasher.take()
        spot.done_bytes += len(piece)
        landed(len(piece))
        if spot.position >= spot.end:
            return
    raise OriginUnavailable(f"body ended at byte {spot.position}, expected {spot.end}")


def write_at(fd: int, chunk: bytes | memoryview, offset: int, hasher: SpanHasher, end: int) -> None:
    """Write `chunk` at `offset` and feed it to `hasher` (closing its span at `end`, the
    landing's), while the bytes are hot in this thread's cache, so keeping an entry's digests
    costs no second read of the object."""
    view = memoryview(chunk)
    while view:
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]
    hasher.update(chunk)
    if offset == end:
        hasher.close()
