"""The streams of an object streamed through uncached (a fill in PASSTHROUGH, see `fill`):
the starter's, which continues the fill's first request, and each other reader's own. Each
verifies itself: it ends only once its bytes had the object's length and matched the checksums
its `info` carries, so a relay that holds its last chunk back never ends a bad body whole.
Their bytes are counted as a fill's are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from shardcache.checksums import Checksum, Verifier
from shardcache.errors import IntegrityError, OriginChanged
from shardcache.fetch.segments import OriginRequests
from shardcache.origins.base import ObjectInfo, OriginStream
from shardcache.origins.streams import ChunkStream


class ContinuedStream(ChunkStream):
    """An uncacheable object streamed through: the first segment's open stream, then the rest
    of the object from one more request (If-Match on the first response's ETag, and refused
    if it is another version). Its `info` carries the object's published checksums, which
    its chunks are verified against before they end (`verified`)."""

    def __init__(
        self, first: OriginStream, requests: OriginRequests, checksums: tuple[Checksum, ...]
    ) -> None:
        # `first` yields exactly what its response announced (a 206's range, or a 200's whole
        # object): the origin adapters refuse a body longer or shorter than that.
        self.info = dataclasses.replace(first.info, checksums=checksums)
        self._first = first
        self._rest: OriginStream | None = None
        self._requests = requests
        requests.count("ok")  # counted when opened: its body's fate is the client's to see

    def chunks(self) -> AsyncIterator[bytes]:
        return verified(self._chunks(), self.info)

    async def _chunks(self) -> AsyncIterator[bytes]:
        position = 0
        async for chunk in self._first:
            self._requests.received(len(chunk))  # shardcache_origin_bytes_total, as a fill's
            yield chunk
            position += len(chunk)
        if position < self.info.size_bytes:
            self._rest = await self._requests.open(position, None, self.info.etag)
            self._requests.count("ok")
            doubt = self.info.proves_same_version(self._rest.info)
            if doubt is not None:
                raise OriginChanged(f"{self._requests.key}: not resumed, {doubt}")
            async for chunk in self._rest:
                self._requests.received(len(chunk))
                yield chunk

    async def aclose(self) -> None:
        await self._first.aclose()
        if self._rest is not None:
            await self._rest.aclose()


class RelayedStream(ChunkStream):
    """One more reader's whole-object stream of an uncacheable object, with the checksums its
    version is verified against, its bytes counted as a fill's are."""

    @classmethod
    async def open(
        cls, requests: OriginRequests, info: ObjectInfo, checksums: tuple[Checksum, ...]
    ) -> RelayedStream:
        """Another reader's own whole-object GET of the version `info` describes (If-Match on
        its ETag), verified against `checksums`. Another version is refused (OriginChanged),
        whatever the origin did with If-Match: its body could only have been checked against
        its length."""
        stream = await requests.open(0, None, info.etag, for_new_reader=True)
        requests.count("ok")  # counted when opened, as the starter's stream is
        change = info.differs_from(stream.info)
        if change is not None:
            await stream.aclose()
            raise OriginChanged(f"{requests.key} changed while streamed: {change}")
        return cls(stream, requests, checksums)

    def __init__(
        self, stream: OriginStream, requests: OriginRequests, checksums: tuple[Checksum, ...]
    ) -> None:
        self.info = dataclasses.replace(stream.info, checksums=checksums)
        self._stream = stream
        self._requests = requests

    def chunks(self) -> AsyncIterator[bytes]:
        return verified(self._chunks(), self.info)

    async def _chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._requests.received(len(chunk))
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


async def verified(chunks: AsyncIterator[bytes], info: ObjectInfo) -> AsyncIterator[bytes]:
    """Yield `chunks`, the whole object `info` describes; once they end, raise IntegrityError
    unless they had its length and matched its published checksums. The upstream that sent
    them (`ObjectInfo.sent_by`, a tier member or mirror) hears the checksums' verdict, as from
    a fill."""
    verifier = Verifier(info.checksums)
    position = 0
    async for chunk in chunks:
        verifier.update(chunk)
        position += len(chunk)
        yield chunk
    if position != info.size_bytes:
        raise IntegrityError(f"origin sent {position} of {info.size_bytes} bytes")
    try:
        verifier.verify()
    except IntegrityError as exc:  # counts against the mirror or tier member that sent it
        if info.sent_by is not None:
            info.sent_by.bytes_failed(str(exc))
        raise
    if info.sent_by is not None:
        info.sent_by.bytes_verified()


# What a lease streams through: only these, each verifying itself before it ends (`verified`),
# so the serving side, which only writes bytes, cannot be handed an unchecked stream.
CheckedStream = ContinuedStream | RelayedStream

__all__ = ["CheckedStream", "ContinuedStream", "RelayedStream", "verified"]
