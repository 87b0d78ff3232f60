"""`Fill`: one download of one object into a partial file, that any number of readers tail.

Lifecycle (an illegal transition raises; FAILED, PASSTHROUGH, COMMITTED, DISCARDED are final):

    STARTING ──► FILLING ──► VERIFIED ──► COMMITTED     indexed: later requests are hits
        │           │            └──────► DISCARDED     verified but could not be indexed
        │           └──────────────────► FAILED        origin/verification/disk failure
        ├──────────────────────────────► FAILED        failed before the first byte
        └──────────────────────────────► PASSTHROUGH   not cacheable: the starter streams it

Integrity: readers may send every byte as soon as it is on disk *except the last byte of their
response*, which waits for VERIFIED (full length and every published checksum matched). A fill
that fails therefore can never have handed anyone a complete body: a reader that gets an error
aborts its connection, and the client sees a short transfer.

Mid-body origin failures are retried with exponential back-off, resuming with a Range request
from the first missing byte and `If-Match` on the original ETag.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import os
import time
from collections.abc import AsyncIterator, Callable

from shardcache.checksums import Verifier
from shardcache.errors import (
    CacheError,
    IntegrityError,
    OriginError,
    OriginTimeout,
    OriginUnavailable,
    ShardcacheError,
    ShuttingDown,
)
from shardcache.observer import Observer
from shardcache.origins.base import ObjectInfo, Origin, OriginStream
from shardcache.store import CacheFull, EntryMeta, Reservation, Store

log = logging.getLogger("shardcache.fill")


class FillState(enum.Enum):
    STARTING = "starting"
    FILLING = "filling"
    VERIFIED = "verified"
    COMMITTED = "committed"
    DISCARDED = "discarded"
    PASSTHROUGH = "passthrough"
    FAILED = "failed"


_TRANSITIONS: dict[FillState, frozenset[FillState]] = {
    FillState.STARTING: frozenset({FillState.FILLING, FillState.PASSTHROUGH, FillState.FAILED}),
    FillState.FILLING: frozenset({FillState.VERIFIED, FillState.FAILED}),
    FillState.VERIFIED: frozenset({FillState.COMMITTED, FillState.DISCARDED}),
    FillState.COMMITTED: frozenset(),
    FillState.DISCARDED: frozenset(),
    FillState.PASSTHROUGH: frozenset(),
    FillState.FAILED: frozenset(),
}
_BODY_COMPLETE = frozenset({FillState.VERIFIED, FillState.COMMITTED, FillState.DISCARDED})


class IllegalTransition(RuntimeError):
    pass


class RetryPolicy:
    """Bounded retries with exponential back-off: delays base, 2·base, 4·base… capped."""

    def __init__(
        self, retries: int = 4, base_s: float = 0.25, cap_s: float = 5.0, read_timeout_s: float = 30
    ) -> None:
        self.retries = retries
        self.base_s = base_s
        self.cap_s = cap_s
        self.read_timeout_s = read_timeout_s

    def delay_s(self, attempt: int) -> float:
        return float(min(self.cap_s, self.base_s * 2 ** (attempt - 1)))


class Fill:
    def __init__(
        self,
        cache_key: str,
        origin: Origin,
        origin_key: str,
        store: Store,
        policy: RetryPolicy,
        observer: Observer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache_key = cache_key
        self.origin = origin
        self.origin_key = origin_key
        self.state = FillState.STARTING
        self.info: ObjectInfo | None = None
        self.error: ShardcacheError | None = None
        self.written_bytes = 0
        self._store = store
        self._policy = policy
        self._observer = observer
        self._clock = clock
        self._reservation: Reservation | None = None
        self._passthrough: OriginStream | None = None
        self._readers = 0
        self.task: asyncio.Task[None] | None = None  # set by the owner that runs the fill
        self.is_prefetch = False  # started by the prefetch queue rather than a client
        self._finished = asyncio.Event()
        self._started = asyncio.Event()
        self._progress = asyncio.Event()

    # -- state ---------------------------------------------------------------------------

    def _move(self, new: FillState) -> None:
        if new not in _TRANSITIONS[self.state]:
            raise IllegalTransition(f"{self.state.name} -> {new.name} for {self.cache_key}")
        self.state = new
        if new is not FillState.STARTING:
            self._started.set()
        self._publish()

    def _publish(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    @property
    def is_finished(self) -> bool:
        return not _TRANSITIONS[self.state]

    @property
    def is_body_complete(self) -> bool:
        return self.state in _BODY_COMPLETE

    def cancel(self) -> None:
        """Stop the download (shutdown); readers get ShuttingDown and abort."""
        if self.task is not None:
            self.task.cancel()

    # -- readers -------------------------------------------------------------------------

    async def wait_started(self) -> FillState:
        """Wait until the origin answered; return FILLING (or later) or PASSTHROUGH.

        Raises the fill's OriginError (404, 502, 504…) when it failed before the first byte.
        """
        await self._started.wait()
        if self.state is FillState.FAILED:
            assert self.error is not None
            raise self.error
        return self.state

    async def wait_finished(self) -> FillState:
        """Wait until the fill reached a final state and return it (never raises)."""
        await self._finished.wait()
        return self.state

    def take_passthrough(self) -> OriginStream:
        """Hand the starter the open origin stream of an uncacheable object (once)."""
        stream, self._passthrough = self._passthrough, None
        if stream is None:
            raise RuntimeError("passthrough stream already taken")
        return stream

    def acquire_reader(self) -> int:
        """Return the partial file's fd for sendfile/pread at explicit offsets; the caller
        must `release_reader()`. The fd stays valid after commit renames the file."""
        if self._reservation is None:
            raise RuntimeError("fill has no data file")
        self._readers += 1
        return self._reservation.fd

    def release_reader(self) -> None:
        self._readers -= 1
        self._close_if_idle()

    def _close_if_idle(self) -> None:
        if self._readers == 0 and self.is_finished and self._reservation is not None:
            if self._reservation.fd >= 0:
                os.close(self._reservation.fd)
                self._reservation.fd = -1

    async def wait_readable(self, position: int, end: int) -> int:
        """Return how far (exclusive) a reader whose response ends at `end` may send now.

        Blocks until that is past `position`. The final byte of the response becomes
        readable only once the body is verified. Raises the fill's error if it failed.
        """
        while True:
            if self.state in _BODY_COMPLETE:
                return end
            if self.state is FillState.FAILED:
                assert self.error is not None
                raise self.error
            limit = min(self.written_bytes, end - 1)
            if limit > position:
                return limit
            await self._progress.wait()

    # -- the download ------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch, verify and commit the object; never raises except CancelledError."""
        started_at = self._clock()
        try:
            stream = await self._open(0, None)
            info = self.info = stream.info
            if not await self._reserve(info.size_bytes):
                self._passthrough = stream
                self._move(FillState.PASSTHROUGH)
                return
            self._move(FillState.FILLING)
            verifier = Verifier(info.checksums)
            await self._download(stream, info, verifier)
            await asyncio.to_thread(verifier.verify)
            self._move(FillState.VERIFIED)
            self._observer.fetch_finished(self.origin.name, self._clock() - started_at)
            await self._commit(info)
        except asyncio.CancelledError:
            self._fail(ShuttingDown("the daemon is shutting down"))
            raise
        except ShardcacheError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug or an unexpected OSError: fail this fill, not the daemon
            log.exception("fill of %s crashed", self.cache_key)
            self._fail(CacheError(f"internal error while filling: {exc}"))
        finally:
            await self._release_space()
            self._finished.set()

    async def _reserve(self, size_bytes: int) -> bool:
        if size_bytes > self._store.capacity_bytes:
            log.info(
                "%s (%d bytes) is larger than the cache: streaming it through",
                self.cache_key,
                size_bytes,
            )
            return False
        try:
            self._reservation = await asyncio.to_thread(self._store.reserve, size_bytes)
        except CacheFull as exc:
            log.warning("%s streamed through uncached: %s", self.cache_key, exc)
            return False
        return True

    async def _open(self, start: int, if_match: str | None) -> OriginStream:
        """Open the origin at `start`, retrying retryable failures with back-off."""
        attempt = 0
        while True:
            try:
                stream = await self.origin.open(self.origin_key, start, if_match)
                self._observer.origin_request(self.origin.name, "ok")
                return stream
            except OriginError as exc:
                self._observer.origin_request(self.origin.name, exc.kind)
                attempt += 1
                if not exc.is_retryable or attempt > self._policy.retries:
                    raise
                await self._back_off(attempt, exc)

    async def _back_off(self, attempt: int, exc: OriginError) -> None:
        delay = self._policy.delay_s(attempt)
        self._observer.origin_retry(self.origin.name)
        log.warning(
            "origin %s: %s; retry %d/%d in %.2fs from byte %d",
            self.origin.name,
            exc,
            attempt,
            self._policy.retries,
            delay,
            self.written_bytes,
        )
        await asyncio.sleep(delay)

    async def _download(self, stream: OriginStream, info: ObjectInfo, verifier: Verifier) -> None:
        assert self._reservation is not None
        fd = self._reservation.fd
        attempt = 0
        while True:
            try:
                async for chunk in _with_read_timeout(stream, self._policy.read_timeout_s):
                    if self.written_bytes + len(chunk) > info.size_bytes:
                        raise IntegrityError(
                            f"origin sent more than its Content-Length of {info.size_bytes}"
                        )
                    await asyncio.to_thread(_write_at, fd, chunk, self.written_bytes, verifier)
                    self.written_bytes += len(chunk)
                    self._observer.origin_bytes(self.origin.name, len(chunk))
                    self._publish()
                if self.written_bytes == info.size_bytes:
                    return
                raise OriginUnavailable(
                    f"body ended at byte {self.written_bytes} of {info.size_bytes}"
                )
            except OriginError as exc:
                await stream.aclose()
                attempt += 1
                if not exc.is_retryable or attempt > self._policy.retries:
                    raise
                self._observer.origin_request(self.origin.name, exc.kind)
                await self._back_off(attempt, exc)
                stream = await self._open(self.written_bytes, info.etag)
            else:
                await stream.aclose()

    async def _commit(self, info: ObjectInfo) -> None:
        assert self._reservation is not None
        meta = EntryMeta(info.size_bytes, info.etag, info.content_type)
        try:
            await asyncio.to_thread(self._store.commit, self._reservation, self.cache_key, meta)
        except CacheError as exc:
            log.error("verified %s but could not cache it: %s", self.cache_key, exc)
            self._move(FillState.DISCARDED)
            return
        self._move(FillState.COMMITTED)

    def _fail(self, exc: ShardcacheError) -> None:
        self.error = exc
        if FillState.FAILED in _TRANSITIONS[self.state]:
            self._move(FillState.FAILED)
        if self.written_bytes:
            log.warning(
                "fill of %s failed after %d bytes: %s", self.cache_key, self.written_bytes, exc
            )

    async def _release_space(self) -> None:
        reservation = self._reservation
        if reservation is not None and self.state is not FillState.COMMITTED:
            await asyncio.to_thread(self._store.abort, reservation)
        self._close_if_idle()


def _write_at(fd: int, chunk: bytes, offset: int, verifier: Verifier) -> None:
    """Write `chunk` at `offset` and feed the verifier: one worker-thread hop per chunk."""
    view = memoryview(chunk)
    while view:
        written = os.pwrite(fd, view, offset)
        offset += written
        view = view[written:]
    verifier.update(chunk)


async def _with_read_timeout(stream: OriginStream, timeout_s: float) -> AsyncIterator[bytes]:
    """Yield the stream's chunks; raise OriginTimeout if one takes longer than `timeout_s`."""
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
