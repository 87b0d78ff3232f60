"""The two bases of `OriginStream` implementations, so each stream overrides one hook and no
stream repeats `land`: `ChunkStream` (a body read as chunks on the event loop, landed by
`land_chunks`) and `StreamWrapper` (a stream around another that lands its own body, in a
receiving process, which the wrapper only watches)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from shardcache.origins.base import Landed, ObjectInfo, OriginStream, Spot, land_chunks


class ChunkStream:
    """A stream whose body comes as chunks on the event loop (a file, a relayed or resumed
    body). A subclass gives `chunks()` and `aclose()`; iterating yields the chunks, and `land`
    writes them into the fill's file on a worker thread, so every byte passes `chunks()`."""

    info: ObjectInfo

    def chunks(self) -> AsyncIterator[bytes]:
        """The body, as chunks on the event loop: the hook each subclass gives."""
        raise NotImplementedError

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.chunks()

    async def land(
        self,
        fd: int,
        spot: Spot,
        landed: Landed,
        read_timeout_s: float,
        min_bytes_per_s: float = 0.0,
    ) -> None:
        """`OriginStream.land`, through `chunks()`."""
        await land_chunks(self, fd, spot, landed, read_timeout_s, min_bytes_per_s)

    async def aclose(self) -> None:
        raise NotImplementedError


class StreamWrapper:
    """A stream around `inner` that passes iterating, landing and closing to it, so `inner`
    still lands its own body (in a receiving process, for HTTP). A subclass overrides only the
    hooks for what it adds, each a no-op here:

    - `chunks()`: the body when iterated (default: `inner`'s chunks);
    - `landing(landed)`: a context around `inner.land`, yielding the `Landed` callback passed
      to it (called on the landing thread);
    - `ended()`: called when the body was read to its end, landed, failed or the stream
      closed (perhaps more than once: make it idempotent).
    """

    def __init__(self, inner: OriginStream, info: ObjectInfo | None = None) -> None:
        self.info = inner.info if info is None else info
        self.inner = inner

    def chunks(self) -> AsyncIterator[bytes]:
        return aiter(self.inner)

    @contextlib.contextmanager
    def landing(self, landed: Landed) -> Iterator[Landed]:
        yield landed

    def ended(self) -> None:
        return None

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.chunks():
                yield chunk
        finally:
            self.ended()

    async def land(
        self,
        fd: int,
        spot: Spot,
        landed: Landed,
        read_timeout_s: float,
        min_bytes_per_s: float = 0.0,
    ) -> None:
        """`OriginStream.land` by `inner`, inside `landing`; `ended` after it."""
        try:
            with self.landing(landed) as passed:
                await self.inner.land(fd, spot, passed, read_timeout_s, min_bytes_per_s)
        finally:
            self.ended()

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            self.ended()


__all__ = ["ChunkStream", "StreamWrapper"]
