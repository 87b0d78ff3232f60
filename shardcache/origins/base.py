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
        caller must `aclose()` the stream. A stream may yield past `end`; callers cut it.

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
