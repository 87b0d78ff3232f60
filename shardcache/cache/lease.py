"""`Lease`: the answer to a read, what its reader holds until it closes it: a cached entry, a
fill in flight to tail, or an uncacheable object streamed through, with what the answer says
about the object (`Result`, size, validators, verified checksums). What it must not know: how
the answer was found (`ShardCache` decides hit, join or miss and builds the lease), HTTP.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from shardcache.cache.entry import Entry, EntryMeta
from shardcache.cache.fill import Fill
from shardcache.cache.passthrough import CheckedStream
from shardcache.checksums import Checksum, from_headers
from shardcache.origins.base import ObjectInfo, Origin


def info_of(meta: EntryMeta) -> ObjectInfo:
    """An entry's metadata as ObjectInfo, with the checksums its fill verified (a composite
    too, with its part size: republished as the origin published it)."""
    published = {name.lower(): value for name, value in meta.checksum_headers.items()}
    return ObjectInfo(
        meta.size_bytes,
        meta.etag,
        tuple(from_headers(published, meta.part_bytes)),
        meta.content_type,
        last_modified=meta.last_modified,
    )


class Result(enum.Enum):
    HIT = "hit"
    MISS = "miss"
    COALESCED = "coalesced"


@dataclass(slots=True)
class Lease:
    """The answer to a read: exactly one of `entry` (hit), `fill` (tail a fill in flight) or
    `stream` (an uncacheable object streamed through). The caller must `await aclose()`."""

    result: Result
    origin: str
    size_bytes: int
    etag: str | None
    content_type: str | None
    entry: Entry | None = None
    fill: Fill | None = None
    fill_fd: int = -1
    stream: CheckedStream | None = None  # verifies itself before it ends
    checksums: tuple[Checksum, ...] = ()  # verified ones, published on whole-object answers
    verified_by: tuple[str, ...] = ()  # what a cached entry was verified against, for hits
    last_modified: float | None = None  # the origin's, seconds since the epoch

    @classmethod
    def of(cls, result: Result, origin: Origin, info: ObjectInfo, **body: Any) -> Lease:
        """A lease for `info`'s object; `body` is entry=, fill= and fill_fd=, or stream=."""
        return cls(
            result,
            origin.name,
            info.size_bytes,
            info.etag,
            info.content_type,
            checksums=info.checksums,
            last_modified=info.last_modified,
            **body,
        )

    @property
    def is_cached(self) -> bool:
        """False for an object streamed through uncached (larger than the cache)."""
        return self.stream is None

    async def aclose(self) -> None:
        if self.entry is not None:
            self.entry.close()
            self.entry = None
        if self.fill is not None:
            fill, self.fill = self.fill, None
            fill.readers.release()
            fill.let_go()  # held since `ShardCache.open` joined or started it
        if self.stream is not None:
            await self.stream.aclose()
            self.stream = None
