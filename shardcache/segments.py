"""Downloading one object as byte-range segments over several origin connections at once.

Object stores cap each connection (S3: roughly 50-100 MB/s) while aggregate bandwidth scales, so a
large shard is fetched as `segment_bytes` pieces by up to `connections` workers, each writing at its
own offset in the fill's file. Segments are claimed in order, so the bytes a reader needs next
arrive first; `contiguous_bytes` is the prefix that is on disk without holes, which is all a
reader may see. Each segment resumes on its own after a failure (Range from its first missing
byte, `If-Match` on the object's ETag), with the fill's retry policy.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from shardcache.errors import OriginChanged, OriginError, OriginUnavailable
from shardcache.observer import Observer
from shardcache.origins.base import ObjectInfo, Origin, OriginStream, with_read_timeout

log = logging.getLogger("shardcache.fill")


@dataclass(slots=True)
class Segment:
    start: int
    end: int  # exclusive
    done_bytes: int = 0

    @property
    def position(self) -> int:
        return self.start + self.done_bytes

    @property
    def is_complete(self) -> bool:
        return self.position >= self.end


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded retries with exponential back-off: delays base, 2·base, 4·base… capped."""

    retries: int = 4
    base_s: float = 0.25
    cap_s: float = 5.0
    read_timeout_s: float = 30.0
    connections: int = 8
    segment_bytes: int = 16 << 20
    first_segment_bytes: int = 2 << 20
    # Extra connections (beyond each fill's first) in flight across all fills: bounds memory
    # when many large misses run at once, without ever delaying a new fill's first byte.
    shared_connections: int = 32

    def delay_s(self, attempt: int) -> float:
        return float(min(self.cap_s, self.base_s * 2 ** (attempt - 1)))


def plan(size_bytes: int, policy: RetryPolicy, accepts_ranges: bool) -> list[Segment]:
    """Cut [0, size) into segments; one segment when the origin cannot serve ranges.

    The first segment is what the first request asked for (`first_segment_bytes`, small, so a
    reader's first bytes come after one short transfer); the rest is shared out so that all
    `connections` work even on a mid-size shard, in pieces of at most `segment_bytes`.
    """
    first = policy.first_segment_bytes
    if not accepts_ranges or size_bytes <= first:
        return [Segment(0, size_bytes)]
    rest = size_bytes - first
    piece = min(policy.segment_bytes, max(first, -(-rest // policy.connections)))
    return [Segment(0, first)] + [
        Segment(s, min(s + piece, size_bytes)) for s in range(first, size_bytes, piece)
    ]


class SegmentedDownload:
    def __init__(
        self,
        origin: Origin,
        key: str,
        info: ObjectInfo,
        fd: int,
        policy: RetryPolicy,
        observer: Observer,
        on_progress: Callable[[], None],
        extra_slots: asyncio.Semaphore | None = None,
    ) -> None:
        self.origin = origin
        self.key = key
        self.info = info
        self.segments = plan(info.size_bytes, policy, info.accepts_ranges)
        self._fd = fd
        self._policy = policy
        self._observer = observer
        self._on_progress = on_progress
        self._extra_slots = extra_slots
        self._next_segment = 0
        self._first_incomplete = 0

    @property
    def contiguous_bytes(self) -> int:
        """Bytes from offset 0 that are on disk with no hole before them."""
        while (
            self._first_incomplete < len(self.segments)
            and self.segments[self._first_incomplete].is_complete
        ):
            self._first_incomplete += 1
        if self._first_incomplete == len(self.segments):
            return self.info.size_bytes
        return self.segments[self._first_incomplete].position

    async def run(self, first: OriginStream) -> None:
        """Fetch every segment; `first` is the open stream from byte 0 (it serves segment 0).

        Raises the OriginError of a segment whose retries ran out; the other workers are
        cancelled first.
        """
        workers = min(self._policy.connections, len(self.segments))
        tasks = [asyncio.create_task(self._work(first))]
        tasks += [asyncio.create_task(self._work_with_slot()) for _ in range(workers - 1)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _claim(self) -> Segment | None:
        if self._next_segment >= len(self.segments):
            return None
        segment = self.segments[self._next_segment]
        self._next_segment += 1
        return segment

    async def _work_with_slot(self) -> None:
        """An extra connection: it holds one of the shared slots while it works."""
        if self._extra_slots is None:
            return await self._work(None)
        async with self._extra_slots:
            return await self._work(None)

    async def _work(self, stream: OriginStream | None) -> None:
        while (segment := self._claim()) is not None:
            await self._fetch(segment, stream)
            stream = None

    async def open(self, start: int, end: int | None, if_match: str | None) -> OriginStream:
        """Open the origin at [start, end), retrying retryable failures with back-off."""
        attempt = 0
        while True:
            try:
                stream = await self.origin.open(self.key, start, end, if_match)
            except OriginError as exc:
                self._observer.origin_request(self.origin.name, exc.kind)
                attempt += 1
                if not exc.is_retryable or attempt > self._policy.retries:
                    raise
                await self.back_off(attempt, exc, start)
                continue
            self._observer.origin_request(self.origin.name, "ok")
            return stream

    async def back_off(self, attempt: int, exc: OriginError, position: int) -> None:
        delay = self._policy.delay_s(attempt)
        self._observer.origin_retry(self.origin.name)
        log.warning(
            "origin %s: %s; retry %d/%d in %.2fs from byte %d",
            self.origin.name,
            exc,
            attempt,
            self._policy.retries,
            delay,
            position,
        )
        await asyncio.sleep(delay)

    async def _fetch(self, segment: Segment, stream: OriginStream | None) -> None:
        attempt = 0
        while True:
            try:
                if stream is None:
                    stream = await self.open(segment.position, segment.end, self.info.etag)
                    self._check_same_object(stream.info)
                await self._copy(segment, stream)
                return
            except OriginError as exc:
                attempt += 1
                if not exc.is_retryable or attempt > self._policy.retries:
                    raise
                self._observer.origin_request(self.origin.name, exc.kind)
                await self.back_off(attempt, exc, segment.position)
            finally:
                if stream is not None:
                    await stream.aclose()
                    stream = None

    def _check_same_object(self, info: ObjectInfo) -> None:
        if info.size_bytes != self.info.size_bytes:
            raise OriginChanged(
                f"object size changed from {self.info.size_bytes} to {info.size_bytes}"
            )

    async def _copy(self, segment: Segment, stream: OriginStream) -> None:
        async for chunk in with_read_timeout(stream, self._policy.read_timeout_s):
            piece = chunk[: segment.end - segment.position]  # a stream may run past its segment
            await asyncio.to_thread(_write_at, self._fd, piece, segment.position)
            segment.done_bytes += len(piece)
            self._observer.origin_bytes(self.origin.name, len(piece))
            self._on_progress()
            if segment.is_complete:
                return
        raise OriginUnavailable(f"body ended at byte {segment.position}, expected {segment.end}")


def _write_at(fd: int, chunk: bytes, offset: int) -> None:
    view = memoryview(chunk)
    while view:
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]
