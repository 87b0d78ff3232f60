"""An in-memory Origin for core tests: no sockets; failures and pauses on demand."""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from shardcache.checksums import Checksum
from shardcache.errors import OriginChanged, OriginNotFound, OriginUnavailable
from shardcache.origins.base import (
    NEW_REQUEST,
    ObjectInfo,
    RequestContext,
)
from shardcache.origins.streams import ChunkStream


@dataclass
class Pace:
    """Bandwidth for the fake's bodies: each chunk waits `chunk_delay_s`, a per-connection cap;
    with `shared`, the waits take turns, so every connection together gets one's worth (an
    origin whose aggregate does not grow with connections)."""

    chunk_delay_s: float
    shared: bool = False
    _turn: asyncio.Lock = field(default_factory=asyncio.Lock)
    open_streams: int = 0
    most_open_streams: int = 0

    async def wait(self) -> None:
        if self.shared:
            async with self._turn:
                await asyncio.sleep(self.chunk_delay_s)
        else:
            await asyncio.sleep(self.chunk_delay_s)


@dataclass
class FakeStream(ChunkStream):
    info: ObjectInfo
    data: bytes
    start: int
    chunk_bytes: int
    fail_at: int | None
    gate: asyncio.Event | None
    pace: Pace | None = None

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.pace is None:
            async for chunk in self._chunks():
                yield chunk
            return
        self.pace.open_streams += 1
        self.pace.most_open_streams = max(self.pace.most_open_streams, self.pace.open_streams)
        try:
            async for chunk in self._chunks():
                yield chunk
        finally:
            self.pace.open_streams -= 1

    async def _chunks(self) -> AsyncIterator[bytes]:
        position = self.start
        while position < len(self.data):
            if self.gate is not None:
                await self.gate.wait()
            if self.pace is not None:
                await self.pace.wait()
            if self.fail_at is not None and position >= self.fail_at:
                raise OriginUnavailable(f"connection reset at byte {position}")
            end = position + self.chunk_bytes
            if self.fail_at is not None and position < self.fail_at < end:
                end = self.fail_at
            yield self.data[position:end]
            position = end
            await asyncio.sleep(0)

    async def aclose(self) -> None:
        return None


@dataclass
class FakeOrigin:
    name: str = "fake"
    objects: dict[str, bytes] = field(default_factory=dict)
    etags: dict[str, str] = field(default_factory=dict)
    checksums: dict[str, tuple[Checksum, ...]] = field(default_factory=dict)
    opens: list[tuple[str, int]] = field(default_factory=list)
    heads: Counter[str] = field(default_factory=Counter)
    fail_at: dict[str, int] = field(default_factory=dict)  # fail each read at this byte…
    failures_left: Counter[str] = field(default_factory=Counter)  # …this many times
    gate: asyncio.Event | None = None  # when set on the fake, bodies wait for it
    head_gate: asyncio.Event | None = None  # when set on the fake, HEADs wait for it
    pace: Pace | None = None  # when set, bodies are paced (a bandwidth cap)
    ignores_range: bool = False  # answer every GET with the whole object, from byte 0
    chunk_bytes: int = 4096
    accepts_ranges: bool = False
    ranges: list[tuple[str, int, int | None]] = field(default_factory=list)
    head_failures: Counter[str] = field(default_factory=Counter)  # HEADs to answer 5xx
    ignore_if_match: bool = False  # serve the current version whatever If-Match says
    replace_on_open: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # after N opens
    open_failures: Counter[str] = field(default_factory=Counter)  # opens to refuse
    refuse_from: dict[str, int] = field(default_factory=dict)  # refuse every GET from here on
    without_validators: set[str] = field(default_factory=set)  # keys served with no ETag
    checksums_on_get: bool = True  # False: only a HEAD publishes them (S3 without ChecksumMode)
    on_open: dict[str, Callable[[int], None]] = field(default_factory=dict)  # key → f(nth open)
    contexts: list[RequestContext] = field(default_factory=list)  # each request's, in order

    def corrupt(self, key: str, at: int) -> None:
        """Flip one byte of the served body; the published checksum stays the original's."""
        data = bytearray(self.objects[key])
        data[at] ^= 0xFF
        self.objects[key] = bytes(data)

    def put(self, key: str, data: bytes, *, with_md5: bool = True) -> None:
        self.objects[key] = data
        self.etags[key] = '"' + hashlib.md5(data).hexdigest() + '"'
        self.checksums[key] = (
            (Checksum("md5", hashlib.md5(data).digest(), "fake"),) if with_md5 else ()
        )

    def url_for(self, key: str) -> str:
        return f"fake://{self.name}/{key}"

    def _info(self, key: str) -> ObjectInfo:
        if key not in self.objects:
            raise OriginNotFound(f"{key} not found")
        return ObjectInfo(
            len(self.objects[key]),
            None if key in self.without_validators else self.etags[key],
            self.checksums[key],
            accepts_ranges=self.accepts_ranges,
        )

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        self.heads[key] += 1
        self.contexts.append(context)
        if self.head_gate is not None:
            await self.head_gate.wait()
        if self.head_failures[key] > 0:
            self.head_failures[key] -= 1
            raise OriginUnavailable(f"{key}: origin answered 503 to HEAD")
        return self._info(key)

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> FakeStream:
        self.opens.append((key, start))
        self.ranges.append((key, start, end))
        self.contexts.append(context)
        if self.open_failures[key] > 0:
            self.open_failures[key] -= 1
            raise OriginUnavailable(f"{key}: connection refused")
        if start >= self.refuse_from.get(key, start + 1):
            raise OriginUnavailable(f"{key}: connection refused for bytes {start}-")
        if key in self.on_open:
            self.on_open[key](sum(1 for k, _ in self.opens if k == key))
        if key in self.replace_on_open:
            after, replacement = self.replace_on_open[key]
            if sum(1 for k, _ in self.opens if k == key) > after:
                del self.replace_on_open[key]
                self.put(key, replacement)
        info = self._info(key)
        if if_match is not None and if_match != info.etag and not self.ignore_if_match:
            raise OriginChanged("etag changed")
        fail_at = None
        stop = len(self.objects[key]) if end is None else end
        if self.failures_left[key] > 0 and start <= self.fail_at.get(key, -1) < stop:
            self.failures_left[key] -= 1
            fail_at = self.fail_at.get(key)
        if self.ignores_range:  # a 200 with the whole body, whatever was asked (http.server)
            start, end = 0, None
        data = self.objects[key] if end is None else self.objects[key][:end]
        if start or end is not None or not self.checksums_on_get:  # a part carries none
            info = ObjectInfo(info.size_bytes, info.etag, (), accepts_ranges=info.accepts_ranges)
        return FakeStream(info, data, start, self.chunk_bytes, fail_at, self.gate, self.pace)

    async def aclose(self) -> None:
        return None
