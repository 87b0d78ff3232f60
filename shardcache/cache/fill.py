"""`Fill`: one download of one object into a partial file, that any number of readers tail.
Lifecycle: `fill_state`; what the body is checked against: `body_check`.

Invariant: a reader's last byte waits for VERIFIED, so a fill that fails never completes
anyone's response. Who keeps a fill going, and when it stops: docs/architecture.md."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable

from shardcache.cache.blocks import encode
from shardcache.cache.body_check import BodyCheck
from shardcache.cache.entry import EntryMeta, Reservation
from shardcache.cache.fill_state import (
    BODY_COMPLETE,
    TRANSITIONS,
    FillState,
    IllegalTransition,
    check_transition,
)
from shardcache.cache.passthrough import ContinuedStream, RelayedStream
from shardcache.cache.store import Store
from shardcache.checksums import Checksum, composite_part_bytes, to_headers
from shardcache.errors import (
    CacheError,
    CacheFull,
    FillAbandoned,
    IntegrityError,
    NotAdmitted,
    OriginChanged,
    OriginError,
    ShardcacheError,
    ShuttingDown,
)
from shardcache.fetch.checksum_trust import ChecksumTrust
from shardcache.fetch.limiter import RequestLimiter
from shardcache.fetch.segments import OriginRequests, RetryPolicy, SegmentedDownload
from shardcache.observer import FailureTally, Observer
from shardcache.origins.base import ObjectInfo, Origin, OriginStream

__all__ = ["Fill", "FillState", "IllegalTransition", "RetryPolicy"]

log = logging.getLogger("shardcache.fill")


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
        extra_slots: asyncio.Semaphore | None = None,
        limiter: RequestLimiter | None = None,
        on_unwanted: Callable[[Fill], None] | None = None,
        trust: ChecksumTrust | None = None,
        keeps_block_digests: bool = True,
    ) -> None:
        """`on_unwanted(fill)`: the last holder let go of a fill nothing else wants (see the
        module docstring); the owner stops it, or closes the stream nobody took. `trust`: the
        cache's. `keeps_block_digests`: take the CRC-32C per block that hits are checked
        against (`blocks`)."""
        self.cache_key, self.origin, self.origin_key = cache_key, origin, origin_key
        self.state = FillState.STARTING
        self.info: ObjectInfo | None = None
        self.error: ShardcacheError | None = None
        self._download: SegmentedDownload | None = None
        self._tally = FailureTally(observer)  # counts a failure no request was counted under
        self._started = asyncio.Event()  # the origin answered: a client may be reading
        started = self._started.is_set
        self._requests = OriginRequests(origin, origin_key, policy, self._tally, limiter, started)
        self._store = store
        self._policy = policy
        self._observer = observer
        self._clock = clock
        self._extra_slots = extra_slots
        self._reservation: Reservation | None = None
        self._passthrough: OriginStream | None = None
        self._readers = 0  # open file descriptors handed out (`acquire_reader`)
        self._holders = 0  # readers that want the bytes (`hold`), from before they wait
        self._kept_unread = False  # the prefetch queue wants it cached (`keep_unread`)
        self.is_kept = True  # False once purged: it finishes for its readers, uncommitted
        self._on_unwanted = on_unwanted
        self._stop_reason: ShardcacheError | None = None
        self.task: asyncio.Task[None] | None = None  # set by the owner that runs the fill
        self._has_run = False  # `run` began: a task cancelled before that never enters it
        self.is_prefetch = False  # started by the prefetch queue rather than a client
        # A HEAD's answer just before the fill (a prefetch sizing it): its checksums serve
        # when the first response is the same version, instead of a second HEAD.
        self.known_info: ObjectInfo | None = None
        self._finished = asyncio.Event()
        self.checksums: tuple[Checksum, ...] = ()  # what the body is verified against
        trust = trust if trust is not None else ChecksumTrust(observer)
        self._check = BodyCheck(
            self._requests, trust, lambda: self.written_bytes, lambda: self._progress.wait()
        )
        self.digests: dict[str, str] = {}  # algorithm → hex of the verified body, kept per entry
        self.block_digests = b""  # CRC-32C per block (`blocks`), kept per entry for hits
        self._keeps_block_digests = keeps_block_digests
        self._checksums_known = asyncio.Event()
        self._progress = asyncio.Event()
        # The upstreams (not the home) whose bytes were in a body that failed verification:
        # the cache fetches it again from the next one (`ShardCache`), once.
        self.blamed: tuple[str, ...] = ()
        self.is_second_fetch = False

    # -- state ---------------------------------------------------------------------------

    def _move(self, new: FillState) -> None:
        self.state = check_transition(self.state, new, self.cache_key)
        if new is not FillState.STARTING:
            self._started.set()
        self.wake_readers()

    def wake_readers(self) -> None:
        """Wake the readers waiting for bytes: more landed, or a reader's client left."""
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    @property
    def written_bytes(self) -> int:
        """Bytes from offset 0 on disk without a hole: what readers may be sent."""
        return self._download.contiguous_bytes if self._download is not None else 0

    @property
    def received_bytes(self) -> int:
        """Bytes received from the origin so far, holes or not (what the origin delivers)."""
        return self._download.received_bytes if self._download is not None else 0

    @property
    def verified_by(self) -> tuple[str, ...]:
        """What the body is checked against: its length and the checksum used."""
        return ("length", *(c.source for c in self.checksums))

    @property
    def is_finished(self) -> bool:
        return not TRANSITIONS[self.state]

    @property
    def is_body_complete(self) -> bool:
        return self.state in BODY_COMPLETE

    def cancel(self) -> None:
        """Stop the download (shutdown); readers get ShuttingDown and abort."""
        if self.task is None:
            return
        self.task.cancel()
        if not self._has_run:  # its first step throws into `run` before its first line: end here
            self._fail(self._stop_reason or ShuttingDown("the daemon is shutting down"))
            self._checksums_known.set()
            self._finished.set()

    def stop(self, reason: ShardcacheError) -> None:
        """Stop the download for `reason` (the fill fails with it); nobody is left to read."""
        self._stop_reason = reason
        self.cancel()

    # -- who wants it ----------------------------------------------------------------------

    def hold(self) -> None:
        """A reader wants the bytes: call it in the step that joins or starts the fill (no
        await between), and `let_go()` once, when its response ends."""
        self._holders += 1

    def let_go(self) -> None:
        """A reader is done (served, gone, or failed); the last one out tells the owner when
        nothing else wants the fill (see the module docstring)."""
        self._holders -= 1
        self._tell_owner_if_unwanted()

    def keep_unread(self) -> None:
        """The prefetch queue started or joined this fill: finish it with no reader left."""
        self._kept_unread = True

    def forget_unread(self) -> None:
        """The daemon is stopping: with no reader holding it, the fill stops now."""
        self._kept_unread = False
        self._tell_owner_if_unwanted()

    def do_not_keep(self) -> bool:
        """A purge: finish for the readers holding it, but do not commit the body (their
        response is whole; the next request fetches afresh). False when it is too late (the
        body is complete: committing, committed or given up) or nothing would be kept."""
        if not self.is_fetching:
            return False
        self.is_kept = False
        return True

    def _tell_owner_if_unwanted(self) -> None:
        if self._on_unwanted is not None and not (self._holders or self._kept_unread):
            if self.is_fetching or self._passthrough is not None:
                self._on_unwanted(self)

    @property
    def is_fetching(self) -> bool:
        """Whether the body is still to come from the origin (STARTING or FILLING)."""
        return self.state in (FillState.STARTING, FillState.FILLING)

    async def discard_passthrough(self) -> None:
        """Close the stream of an object streamed through that nobody took (its starter
        left while it waited for the origin's answer)."""
        stream, self._passthrough = self._passthrough, None
        if stream is not None:
            await stream.aclose()

    # -- readers -------------------------------------------------------------------------

    async def wait_started(self) -> FillState:
        """Wait until the origin answered; return FILLING (or later) or PASSTHROUGH. Raises
        the fill's OriginError (404, 502, 504…) when it failed before the first byte."""
        await self._started.wait()
        if self.state is FillState.FAILED:
            assert self.error is not None
            raise self.error
        return self.state

    async def wait_checksums(self) -> tuple[Checksum, ...]:
        """The object's published checksums once the fill has learned them (or has ended)."""
        await self._checksums_known.wait()
        return self.checksums

    @property
    def has_checksums(self) -> bool:  # learned (or given up on): no HEAD left to ask
        return self._checksums_known.is_set()

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

    async def join_passthrough(self) -> OriginStream:
        """A stream for another reader of an uncacheable object: its own whole-object GET of
        the version the starter learned checksums for (If-Match on its ETag), with those
        checksums. Another version is refused (OriginChanged), whatever the origin did with
        If-Match: its body could only have been checked against its length."""
        if self.state is not FillState.PASSTHROUGH or self.info is None:
            raise RuntimeError(f"{self.cache_key} is not streamed through")
        info = self.info
        stream = await self._requests.open(0, None, info.etag, for_new_reader=True)
        self._requests.count("ok")  # counted when opened, as the starter's stream is
        change = info.differs_from(stream.info)
        if change is not None:
            await stream.aclose()
            raise OriginChanged(f"{self.origin_key} changed while streamed: {change}")
        return RelayedStream(stream, self._requests, self.checksums)

    def acquire_reader(self) -> int:
        """Return the partial file's fd for sendfile/pread at explicit offsets; the caller
        must `release_reader()`. The fd stays valid after commit renames the file."""
        if self._reservation is None or self._reservation.fd < 0:  # closed: finished, unread
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

    async def wait_readable(
        self, position: int, end: int, reader_left: asyncio.Event | None = None
    ) -> int:
        """Return how far (exclusive) a reader whose response ends at `end` may send now.
        Blocks until that is past `position`. The response's final byte becomes readable only
        once the body is verified, so no read, whole or ranged, completes before verification.
        Raises the fill's error if it failed, FillAbandoned once `reader_left` is set (the
        reader's watcher wakes it: `wake_readers`)."""
        while True:
            if reader_left is not None and reader_left.is_set():
                raise FillAbandoned(f"the reader of {self.cache_key} left")
            if self.state in BODY_COMPLETE:
                return end
            if self.state is FillState.FAILED:
                assert self.error is not None
                raise self.error
            # A range's bytes may be a splice of two versions, or corrupt, until the whole
            # object verified: its last byte waits, so a failure aborts the reader's response.
            limit = min(self.written_bytes, end - 1)
            if limit > position:
                return limit
            await self._progress.wait()

    # -- the download ------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch, verify and commit the object; never raises except CancelledError."""
        self._has_run = True
        started_at = self._clock()
        first: OriginStream | None = None
        try:
            # The first request asks for the first segment only, so that no byte is fetched
            # twice (a full GET could not be cut short without discarding what the network
            # carried). With one connection the first request is the plain GET of all of it
            # (each more request would pay the origin's time to first byte again).
            first_end = None if self._policy.connections == 1 else self._policy.first_segment_bytes
            first = await self._requests.open(0, first_end, None)
            if first.info.strong_etag is None:
                first = await self._whole_object(first, is_ranged=first_end is not None)
            info = self.info = first.info
            if not await self._reserve(info.size_bytes):
                checksums = await self._check.learn(info, self.known_info)
                self._know_checksums(checksums)
                self._passthrough = ContinuedStream(first, self._requests, checksums)
                first = None  # the passthrough stream owns it now
                self._move(FillState.PASSTHROUGH)
                return
            self._move(FillState.FILLING)
            assert self._reservation is not None
            self._download = SegmentedDownload(
                self._requests, info, self._reservation.fd, self.wake_readers, self._extra_slots
            )
            handed, first = first, None  # the download owns and closes it
            await self._download_and_verify(handed, info)
            self._download.vouch()
            fd, size, with_blocks = self._reservation.fd, info.size_bytes, self._keeps_block_digests
            await self._check.keep(self._download, fd, size, with_blocks)
            self.checksums, self.digests = self._check.checksums, self._check.digests
            self.block_digests = self._check.block_digests
            self._move(FillState.VERIFIED)
            self._observer.fetch_finished(self.origin.name, self._clock() - started_at)
            await self._commit(info)
        except asyncio.CancelledError:
            self._fail(self._stop_reason or ShuttingDown("the daemon is shutting down"))
            raise
        except ShardcacheError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug or an unexpected OSError: fail this fill, not the daemon
            log.exception("fill of %s crashed", self.cache_key)
            self._fail(CacheError(f"internal error while filling: {exc}"))
        finally:
            if first is not None:
                await first.aclose()
            await self._release_space()
            self._checksums_known.set()
            self._finished.set()

    async def _whole_object(self, first: OriginStream, is_ranged: bool) -> OriginStream:
        """An object whose responses carry no strong ETag: nothing could reliably tell a later
        ranged request's version from the first one's, so fetch it in one request (no
        segments, no resume)."""
        # An origin that serves no ranges answered with the whole object already (a 200).
        is_part = is_ranged and first.info.accepts_ranges
        if is_part and first.info.size_bytes > self._policy.first_segment_bytes:
            await first.aclose()
            self._requests.count("ok")
            first = await self._requests.open(0, None, None)
        first.info = dataclasses.replace(first.info, accepts_ranges=False)
        return first

    async def _download_and_verify(self, first: OriginStream, info: ObjectInfo) -> None:
        """Download the body while `body_check` learns its checksums and verifies it; a body
        failing verification counts against the upstreams that sent its bytes."""
        assert self._download is not None and self._reservation is not None
        fd = self._reservation.fd
        try:
            await self._check.run(
                self._download, first, info, fd, self._know_checksums, self.known_info
            )
        except IntegrityError as exc:
            self.blamed = self._download.blame(str(exc))
            raise
        except OriginChanged:  # a stale mirror's or tier member's copy, caught by the HEAD
            self.blamed = self._check.stale_sender
            raise

    def _know_checksums(self, checksums: tuple[Checksum, ...]) -> None:
        self.checksums = checksums
        self._checksums_known.set()
        if not checksums:
            log.debug("%s: the origin publishes no checksum; checking the length", self.cache_key)

    async def _reserve(self, size_bytes: int) -> bool:
        if size_bytes > self._store.capacity_bytes:
            log.info("%s (%d bytes) is over the cache size: streamed", self.cache_key, size_bytes)
            return False
        try:
            read_now = self.is_prefetch and self._holders > 0  # a read joined it
            self._reservation = await asyncio.to_thread(
                self._store.reserve, size_bytes, self.cache_key, read_now
            )
        except NotAdmitted as exc:  # the steady state of a dataset larger than the cache
            log.debug("%s streamed through uncached: %s", self.cache_key, exc)
            return False
        except CacheFull as exc:
            self._store.warnings.warning(
                log, "full", "%s streamed through uncached: %s", self.cache_key, exc
            )
            return False
        except CacheError as exc:  # a broken cache dir must not fail reads
            self._store.warnings.warning(
                log,
                "unusable",
                "%s streamed through uncached, the cache is unusable: %s",
                self.cache_key,
                exc,
            )
            return False
        return True

    async def _commit(self, info: ObjectInfo) -> None:
        assert self._reservation is not None
        if not self.is_kept:  # its readers hold the fd; `_release_space` drops the file
            log.info("%s was purged while it was filled: not cached", self.cache_key)
            self._move(FillState.DISCARDED)
            return
        meta = EntryMeta(
            info.size_bytes,
            info.etag,
            info.content_type,
            to_headers(self.checksums),
            digests=self.digests,
            verified_by=list(self.verified_by),
            last_modified=info.last_modified,
            block_crc32c=encode(self.block_digests),
            part_bytes=composite_part_bytes(self.checksums),
        )
        try:
            await asyncio.to_thread(self._store.commit, self._reservation, self.cache_key, meta)
        except CacheError as exc:
            # The body is verified and readers hold its fd: they finish; it is just not kept.
            log.error("verified %s but could not cache it: %s", self.cache_key, exc)
            self._move(FillState.DISCARDED)
            return
        self._move(FillState.COMMITTED)

    def _fail(self, exc: ShardcacheError) -> None:
        self.error = exc
        if FillState.FAILED in TRANSITIONS[self.state]:
            self._move(FillState.FAILED)
        if isinstance(exc, FillAbandoned):
            log.debug("stopped %s after %d bytes: %s", self.cache_key, self.received_bytes, exc)
            return
        if isinstance(exc, OriginError):
            self._tally.settle(self.origin.name, exc.kind)
        if self.written_bytes:  # its readers' failures are WARNINGs, rate-limited (server)
            log.info(
                "fill of %s failed after %d bytes: %s", self.cache_key, self.written_bytes, exc
            )

    async def _release_space(self) -> None:
        reservation = self._reservation
        if reservation is not None and self.state is not FillState.COMMITTED:
            await asyncio.to_thread(self._store.abort, reservation)
        self._close_if_idle()
