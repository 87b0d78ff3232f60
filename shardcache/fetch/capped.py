"""`CappedOrigin`: an operator's fixed caps on one origin, requests at once and requests a second.

A GET holds its place until its body is read or closed; a HEAD takes none. A request waiting
past `max_wait_s` is shed with `OriginBusy` (503, Retry-After), except one that continues an
answer a client may be reading (its `RequestContext.is_continuing`): shedding it would cut
off a 200."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from shardcache.errors import OriginBusy
from shardcache.fetch.pacer import Pacer
from shardcache.origins.base import (
    NEW_REQUEST,
    ObjectInfo,
    Origin,
    OriginStream,
    RequestContext,
)
from shardcache.origins.listing import Listing, ListQuery, list_objects
from shardcache.origins.location import bucket_location
from shardcache.origins.streams import StreamWrapper


class CappedOrigin:
    def __init__(
        self,
        inner: Origin,
        max_requests: int | None = None,
        max_requests_per_second: float | None = None,
        *,
        max_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.max_requests = max_requests
        self.max_requests_per_second = max_requests_per_second
        self._slots = asyncio.Semaphore(max_requests) if max_requests else None
        self._max_wait_s = max_wait_s
        self._clock = clock
        self._pacer = Pacer()  # the same pacing as the throttling limiter's

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    async def _turn(self, context: RequestContext) -> None:
        """Wait until the rate cap lets the next request go; shed it if that is too far off
        and it continues no answer."""
        if not self.max_requests_per_second:
            return
        now, rate = self._clock(), self.max_requests_per_second
        turn = self._pacer.turn(now, rate)
        if turn - now > self._max_wait_s and not context.is_continuing:
            raise OriginBusy(
                f"origin {self.name}: its cap of {rate:g} requests a second is booked "
                f"{turn - now:.0f} s ahead",
                turn - now,
            )
        self._pacer.book(now, rate)
        if turn > now:
            try:
                await asyncio.sleep(turn - now)
            except BaseException:  # its fill was stopped (every reader left): no place kept
                self._pacer.give_back(turn)
                raise
        self._pacer.went(turn)

    async def _slot(self, context: RequestContext) -> None:
        assert self._slots is not None
        if context.is_continuing:
            await self._slots.acquire()  # never shed: the client's answer is under way
            return
        try:
            async with asyncio.timeout(self._max_wait_s):
                await self._slots.acquire()
        except TimeoutError:
            raise OriginBusy(
                f"origin {self.name}: its {self.max_requests} requests at once stayed busy for "
                f"{self._max_wait_s:g} s",
                self._max_wait_s,
            ) from None

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        await self._turn(context)
        return await self.inner.head(key, context=context)

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> OriginStream:
        if self._slots is not None:
            await self._slot(context)
        try:
            await self._turn(context)
            stream = await self.inner.open(key, start, end, if_match, context=context)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise
        return _SlotStream(stream, self._slots)

    async def list_objects(self, query: ListQuery) -> Listing:
        """A page of the inner origin's keys, a request under the rate cap like a HEAD."""
        await self._turn(NEW_REQUEST)
        return await list_objects(self.inner, query)

    async def bucket_location(self) -> str:
        """The inner origin's bucket's region, a request under the rate cap like a HEAD."""
        await self._turn(NEW_REQUEST)
        return await bucket_location(self.inner)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _SlotStream(StreamWrapper):
    """A stream that gives its request's place back once: when its body was read to its end,
    landed, failed or closed, whichever comes first (`ended`)."""

    def __init__(self, inner: OriginStream, slots: asyncio.Semaphore | None) -> None:
        super().__init__(inner)
        self._slots = slots

    def ended(self) -> None:
        if self._slots is not None:  # the next request may go
            self._slots.release()
            self._slots = None
