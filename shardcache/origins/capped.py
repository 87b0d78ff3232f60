"""`CappedOrigin`: an operator's fixed caps on one origin, requests at once and requests a second.

For an origin whose owner states its limits (a shared NFS gateway, a CDN with a request budget,
an S3 prefix shared with other jobs) instead of discovering them by throttling (`limiter`). A
request holds its place from the moment it is sent until its body is closed, so a slow body
counts against `max_requests` for as long as it streams; requests a second are spaced evenly.
Both apply across every fill, prefetch and HEAD of the origin.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from shardcache.origins.base import ObjectInfo, Origin, OriginStream


class CappedOrigin:
    def __init__(
        self,
        inner: Origin,
        max_requests: int | None = None,
        max_requests_per_second: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_requests = max_requests
        self.max_requests_per_second = max_requests_per_second
        self._slots = asyncio.Semaphore(max_requests) if max_requests else None
        self._clock = clock
        self._next_at = -float("inf")

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    async def _turn(self) -> None:
        """Wait until the rate cap lets the next request go."""
        if not self.max_requests_per_second:
            return
        now = self._clock()
        turn = max(now, self._next_at)
        self._next_at = turn + 1 / self.max_requests_per_second
        if turn > now:
            await asyncio.sleep(turn - now)

    async def _held(self, request: Callable[[], Awaitable[ObjectInfo]]) -> ObjectInfo:
        if self._slots is None:
            await self._turn()
            return await request()
        async with self._slots:
            await self._turn()
            return await request()

    async def head(self, key: str) -> ObjectInfo:
        return await self._held(lambda: self.inner.head(key))

    async def open(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> OriginStream:
        if self._slots is not None:
            await self._slots.acquire()
        try:
            await self._turn()
            stream = await self.inner.open(key, start, end, if_match)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        return _SlotStream(stream, self._slots)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _SlotStream:
    """A stream that gives its request's place back when it is closed (once)."""

    def __init__(self, inner: OriginStream, slots: asyncio.Semaphore | None) -> None:
        self.info = inner.info
        self._inner = inner
        self._slots = slots

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            if self._slots is not None:
                self._slots.release()
                self._slots = None
