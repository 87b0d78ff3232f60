"""Downloading one object as byte-range segments over several origin connections at once.

Segments are claimed in order; a reader sees only `contiguous_bytes`. Each segment resumes on
its own (Range + If-Match, through `OriginRequests`, the one retry policy), and every later
response must prove the first one's version: two versions are never spliced into one shard."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from shardcache.checksums import crc32c_combine
from shardcache.crc_spans import Span
from shardcache.errors import (
    OriginChanged,
    OriginError,
    OriginHeadUnsupported,
    OriginNotResumable,
    OriginThrottled,
)
from shardcache.fetch.gate import OriginGate
from shardcache.fetch.policy import FetchPolicy
from shardcache.observer import Observer
from shardcache.origins.base import (
    CONTINUED_REQUEST,
    NEW_REQUEST,
    ObjectInfo,
    Origin,
    OriginStream,
    RequestContext,
    Sender,
)

log = logging.getLogger("shardcache.fill")
T = TypeVar("T")


@dataclass(slots=True)
class Segment:
    start: int
    end: int  # exclusive
    done_bytes: int = 0
    crc32c: int = 0  # of the bytes done so far, computed by the thread that writes them
    spans: list[Span] = field(default_factory=list)  # their CRC-32C per span of a block

    @property
    def position(self) -> int:
        return self.start + self.done_bytes

    @property
    def is_complete(self) -> bool:
        return self.position >= self.end


def plan(size_bytes: int, policy: FetchPolicy, accepts_ranges: bool) -> list[Segment]:
    """Cut [0, size) into segments; one segment when the origin cannot serve ranges, or with
    one connection (the fill's first request is then for the whole object).

    The first segment is what the first request asked for (`first_segment_bytes`, small, so a
    reader's first bytes come after one short transfer); the rest is shared out so that all
    `connections` work even on a mid-size shard, in pieces of at most `segment_bytes`.
    """
    first = policy.first_segment_bytes
    if not accepts_ranges or size_bytes <= first or policy.connections == 1:
        return [Segment(0, size_bytes)]
    rest = size_bytes - first
    piece = min(policy.segment_bytes, max(first, -(-rest // policy.connections)))
    return [Segment(0, first)] + [
        Segment(s, min(s + piece, size_bytes)) for s in range(first, size_bytes, piece)
    ]


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of `OriginRequests.retrying`'s operation: what its loop tells the request.

    `throttled_s`: the throttling the loop has waited out so far, which bounds how long this
    try may wait for its turn at the origin's gate. `is_new_reader`: a reader's own first GET
    (`OriginRequests.open(for_new_reader=True)`), of whose answer nothing is under way."""

    throttled_s: float = 0.0
    is_new_reader: bool = False


class OriginRequests:
    """Every request a fill makes for one object, under its ONE retry policy.

    `retrying()` is the only retry loop: the first GET, each segment's GET and the HEAD that
    learns the checksums all go through it, so `--origin-retries N` means at most N+1 requests
    per step. Each GET is counted once in `origin_request`, when it ends: by its error kind
    if it failed (to open, or mid-body), "ok" once its body was read in full.
    """

    def __init__(
        self,
        origin: Origin,
        key: str,
        policy: FetchPolicy,
        observer: Observer,
        gate: OriginGate | None = None,
        client_reading: Callable[[], bool] | None = None,
    ) -> None:
        """`gate`: the origin's, shared by every fill and request to it (see `gate`), or None.
        `client_reading()`: whether a client may already have this object's answer under way
        (a fill that started); without it, once the origin answered one of these requests."""
        self.origin = origin
        self.key = key
        self.policy = policy
        self._observer = observer
        self._gate = gate
        self._has_answered = False  # the origin answered one of these requests
        self._client_reading = client_reading or (lambda: self._has_answered)

    def _continues_an_answer(self, attempt: Attempt) -> bool:
        """Whether `attempt`'s request continues an answer a client may be reading."""
        return self._client_reading() and not attempt.is_new_reader

    def count(self, status: str) -> None:
        self._observer.origin_request(self.origin.name, status)

    def received(self, size_bytes: int) -> None:
        self._observer.origin_bytes(self.origin.name, size_bytes)

    async def retrying(
        self,
        operation: Callable[[Attempt], Awaitable[T]],
        position: Callable[[], int] = lambda: 0,
        is_new_reader: bool = False,
    ) -> T:
        """Run `operation`, again after back-off while it raises a retryable OriginError;
        raise the last error when retries run out (or at once when it is not retryable).
        Each try is handed its `Attempt`, which its request passes to `_asking`."""
        attempt = 0
        # Waited out for the origin's throttling, at most the read timeout in all: the turns
        # at the gate of requests it refused, and the back-offs after them.
        throttled_s = 0.0
        while True:
            began = time.monotonic()
            this_try = Attempt(throttled_s, is_new_reader)  # the bound for its turn at the gate
            try:
                return await operation(this_try)
            except OriginError as exc:
                if isinstance(exc, OriginThrottled):
                    throttled_s += time.monotonic() - began
                attempt += 1
                if not exc.is_retryable or attempt > self.policy.retries:
                    raise
                throttled_s += await self._back_off(
                    attempt, exc, position(), Attempt(throttled_s, is_new_reader)
                )

    async def open_once(
        self, start: int, end: int | None, if_match: str | None, attempt: Attempt
    ) -> OriginStream:
        """One GET of [start, end), as `attempt` of a retry loop; a failure to open is counted
        here, the body's end by the caller (`count`)."""

        def get(context: RequestContext) -> Awaitable[OriginStream]:
            return self.origin.open(self.key, start, end, if_match, context=context)

        try:
            stream, has_place = await self._asking(get, attempt, takes_place=True)
        except OriginError as exc:
            self.count(exc.kind)
            raise
        if has_place:  # held until the body ends
            assert self._gate is not None
            return self._gate.holding(stream)
        return stream

    async def open(
        self, start: int, end: int | None, if_match: str | None, for_new_reader: bool = False
    ) -> OriginStream:
        """Open [start, end) with retries; the caller counts the body's outcome.
        `for_new_reader`: a reader's own first GET (one joining an object streamed through),
        of whose answer nothing is under way: shed, and throttling passed on, as a first."""
        return await self.retrying(
            lambda attempt: self.open_once(start, end, if_match, attempt),
            lambda: start,
            is_new_reader=for_new_reader,
        )

    async def head(self) -> ObjectInfo:
        """The object's info from a HEAD, with retries."""

        def head(context: RequestContext) -> Awaitable[ObjectInfo]:
            return self.origin.head(self.key, context=context)

        async def head_once(attempt: Attempt) -> ObjectInfo:
            info, _ = await self._asking(head, attempt)  # a HEAD takes no place
            return info

        return await self.retrying(head_once)

    async def head_of(self, info: ObjectInfo) -> ObjectInfo | None:
        """A HEAD (with retries) of the version `info` describes, for its checksums; None when
        the origin answers 405/501 (it has said it publishes none that way). Raises the HEAD's
        OriginError once retries ran out, OriginChanged when it describes another version."""
        try:
            head = await self.head()
        except OriginHeadUnsupported as exc:
            log.info("%s: %s; checking the length only", self.key, exc)
            return None
        change = info.differs_from(head)
        if change is not None:
            raise OriginChanged(f"{self.key} changed during the fill: {change}")
        return head

    async def _asking(
        self,
        request: Callable[[RequestContext], Awaitable[T]],
        attempt: Attempt,
        takes_place: bool = False,
    ) -> tuple[T, bool]:
        """Send one request, `attempt` of a retry loop, at the origin's pace (see `gate`),
        and tell the gate whether the origin refused it as one too many. `takes_place`: a GET,
        which holds one of the origin's places (`max_requests`); return the answer and
        whether it holds one (the caller gives it back when the body ends)."""
        # A request that continues an answer a client may be reading (segments, the HEAD for
        # checksums of a fill that started) goes first and is never shed (its
        # `RequestContext`); any other waits for its turn no longer than what is left of the
        # read timeout after the throttling it met already: it is shed (503 with Retry-After)
        # and its client told when to come back.
        urgent = self._continues_an_answer(attempt)
        context = CONTINUED_REQUEST if urgent else NEW_REQUEST
        if self._gate is None:
            answer, has_place = await self._noting_throttled(lambda: request(context)), False
        else:
            max_wait_s = self._max_wait_s(attempt)
            sent_at = await self._gate.enter(max_wait_s, urgent, takes_place)
            has_place = takes_place
            try:
                answer = await self._noting_throttled(lambda: request(context), sent_at)
            except BaseException:
                if has_place:
                    self._gate.give_place_back()
                raise
            self._gate.answered()
        self._has_answered = True
        return answer, has_place

    def _max_wait_s(self, attempt: Attempt) -> float:
        """How long `attempt`'s request may wait at the gate: the read timeout, less the
        throttling its retry loop waited out already."""
        return max(0.0, self.policy.read_timeout_s - attempt.throttled_s)

    async def _noting_throttled(
        self, request: Callable[[], Awaitable[T]], sent_at: float | None = None
    ) -> T:
        try:
            return await request()
        except OriginThrottled:
            self._observer.origin_throttled(self.origin.name)
            if self._gate is not None and sent_at is not None:
                self._gate.throttled(sent_at)
            raise

    async def _back_off(
        self, attempt: int, exc: OriginError, position: int, tried: Attempt
    ) -> float:
        """Sleep before a retry as the policy says (`FetchPolicy.wait_before_retry`, which
        raises `exc` when throttling is not to be waited out); return the seconds slept for
        throttling (0 for other failures). Throttled retries are logged at DEBUG: the gate
        logs the change of state, the metrics count the refusals."""
        is_throttled = isinstance(exc, OriginThrottled)
        delay = self.policy.wait_before_retry(
            attempt,
            exc,
            tried.throttled_s,
            may_shed=not self._continues_an_answer(tried),
            jitter=random.uniform(0.5, 1.0),
        )
        self._observer.origin_retry(self.origin.name)
        log.log(
            logging.DEBUG if is_throttled else logging.WARNING,
            "origin %s: %s; retry %d/%d in %.2fs from byte %d",
            self.origin.name,
            exc,
            attempt,
            self.policy.retries,
            delay,
            position,
        )
        await asyncio.sleep(delay)
        return delay if is_throttled else 0.0


class SegmentedDownload:
    def __init__(
        self,
        requests: OriginRequests,
        info: ObjectInfo,
        fd: int,
        on_progress: Callable[[], None],
        extra_slots: asyncio.Semaphore | None = None,
    ) -> None:
        self.requests = requests
        self.info = info
        # Without a strong ETag a second request could be another version unnoticed
        # (Last-Modified has one-second steps and survives copies; a weak ETag may stay the
        # same over different bytes): one request for the whole object, never resumed.
        self.is_resumable = info.strong_etag is not None
        self.segments = plan(info.size_bytes, requests.policy, info.accepts_ranges)
        self._fd = fd
        self._policy = requests.policy
        self._on_progress = on_progress
        self._extra_slots = extra_slots
        self._next_segment = 0
        self._first_incomplete = 0
        self._loop = asyncio.get_running_loop()
        # The upstreams (other than the home) that sent bytes landed in the file, each by its
        # latest response: the fill tells them whether the body verified.
        self.senders: dict[str, Sender] = {}

    def blame(self, reason: str) -> tuple[str, ...]:
        """The body failed verification for `reason`: tell every upstream that sent bytes of
        it (each then counts it as its failure); return their names (none when the home, or a
        lone origin, sent every byte)."""
        for sender in self.senders.values():
            sender.bytes_failed(reason)
        return tuple(self.senders)

    def vouch(self) -> None:
        """The body verified: tell every upstream that sent bytes of it."""
        for sender in self.senders.values():
            sender.bytes_verified()

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

    @property
    def received_bytes(self) -> int:
        """Bytes on disk, over every segment (with holes between them)."""
        return sum(segment.done_bytes for segment in self.segments)

    def spans(self) -> list[Span]:
        """The CRC-32C of each span of a block the landings took as they wrote (`crc_spans`):
        the block digests, without reading the body back (`cache.block_digests`)."""
        return [span for segment in self.segments for span in segment.spans]

    def crc32c(self) -> int:
        """The CRC-32C of the whole object, once every segment is complete."""
        crc = 0
        for segment in self.segments:
            crc = crc32c_combine(crc, segment.crc32c, segment.end - segment.start)
        return crc

    async def run(self, first: OriginStream) -> None:
        """Fetch every segment; `first` is the open stream from byte 0 (it serves segment 0,
        and this call owns and closes it).

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
            await first.aclose()  # a no-op unless the first worker was cancelled unstarted

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

    async def _fetch(self, segment: Segment, stream: OriginStream | None) -> None:
        """Fill `segment`, resuming from its first missing byte after each failure."""

        async def once(attempt: Attempt) -> None:
            nonlocal stream
            opened, stream = stream, None  # a retry opens a new request from the position
            is_first_answer = opened is not None  # the answer every other one is held to
            landed_before = segment.done_bytes
            try:
                if opened is None:
                    opened = await self.requests.open_once(
                        segment.position, segment.end, self.info.etag, attempt
                    )
                try:
                    if not is_first_answer:
                        self._check_same_version(opened.info)
                    await self._copy(segment, opened)
                except OriginError as exc:
                    self.requests.count(exc.kind)
                    if segment.done_bytes and not self.is_resumable:
                        raise OriginNotResumable(
                            f"{exc}; no ETag to resume {self.requests.key} safely"
                        ) from exc
                    raise
                self.requests.count("ok")
            finally:
                if opened is not None:
                    sender = opened.info.sent_by
                    if sender is not None and segment.done_bytes > landed_before:
                        self.senders[sender.name] = sender
                    await opened.aclose()

        await self.requests.retrying(once, lambda: segment.position)

    def _check_same_version(self, info: ObjectInfo) -> None:
        """Refuse any later answer that does not prove it is the first answer's version (an
        upstream may ignore If-Match and omit its ETag): its bytes must not be spliced into
        this one. The fill fails visibly; the next read starts again from byte 0."""
        if not self.is_resumable:
            # One segment, restarted from byte 0 with nothing landed: not a splice, and the
            # checksums learned for the first answer still judge the whole body.
            doubt = self.info.differs_from(info)
        else:
            doubt = self.info.proves_same_version(info)
        if doubt is not None:
            raise OriginChanged(f"{self.requests.key}: not resumed, {doubt}")

    async def _copy(self, segment: Segment, stream: OriginStream) -> None:
        if segment.is_complete:  # an empty object: nothing to copy
            return
        await stream.land(
            self._fd,
            segment,
            self._landed,
            self._policy.read_timeout_s,
            self._policy.min_bytes_per_s,
        )

    def _landed(self, count: int) -> None:
        """`count` more bytes are on disk; called on the thread that wrote them."""
        self._loop.call_soon_threadsafe(self._announce, count)

    def _announce(self, count: int) -> None:
        self.requests.received(count)
        self._on_progress()
