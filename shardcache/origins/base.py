"""The `Origin` seam: what the cache needs from a backend (S3, HTTP, file, or a test fake).

A backend translates its vendor's exceptions into `shardcache.errors.OriginError` subclasses at
its edge; callers never see botocore or aiohttp.client exceptions.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from shardcache.checksums import Checksum
from shardcache.errors import OriginTimeout

# Bytes per read from an origin. Each open origin connection buffers about three of these, so
# this times the connections in flight bounds the daemon's memory (see `segments`).
CHUNK_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What an origin says about a whole object; `size_bytes` is the full length, even for a
    ranged read."""

    size_bytes: int
    etag: str | None = None
    checksums: tuple[Checksum, ...] = ()
    content_type: str | None = None
    accepts_ranges: bool = False  # the origin serves byte ranges: fetch in parallel segments
    last_modified: float | None = None  # seconds since the epoch, when the origin says

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


class OriginStream(Protocol):
    """An open read of an object from `start`; iterate for body chunks, then `aclose()`."""

    info: ObjectInfo

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Origin(Protocol):
    name: str

    def url_for(self, key: str) -> str:
        """Return the full origin URL of `key`: the cache key, unique across origins."""
        ...

    async def head(self, key: str) -> ObjectInfo:
        """Return the object's info; raise OriginNotFound or another OriginError."""
        ...

    async def open(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> OriginStream:
        """Start reading bytes [start, end) of `key` (to the end when `end` is None); the
        caller must `aclose()` the stream. A stream may yield past `end` (an origin that
        answers a range with the whole object), never past what its response announced, and
        raises when its body ends early; callers cut it.

        With `if_match`, raise OriginChanged if the object's ETag is no longer that value.
        Errors before the first byte raise here; errors mid-body raise from iteration.
        """
        ...

    async def aclose(self) -> None: ...


async def with_read_timeout(stream: OriginStream, timeout_s: float) -> AsyncIterator[bytes]:
    """Yield `stream`'s chunks; raise OriginTimeout when one takes longer than `timeout_s`
    (a stalled origin must never hang a fill or a client)."""
    chunks = aiter(stream)
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                chunk = await anext(chunks)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise OriginTimeout(f"no byte from the origin for {timeout_s:g}s") from None
        yield chunk
