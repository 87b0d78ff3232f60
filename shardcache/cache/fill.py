"""`Fill`: one download of one object into a partial file, that any number of readers tail.
Lifecycle: `fill_state`; what the body is checked against: `body_check`; who reads it and how
they wait: `fill_readers`; what every fill shares: `FillFactory`, built by the daemon.

Invariant: a reader's last byte waits for VERIFIED, so a fill that fails never completes
anyone's response. Who keeps a fill going, and when it stops: docs/architecture.md."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from shardcache.cache.body_check import BodyCheck
from shardcache.cache.fill_readers import Readers
from shardcache.cache.fill_state import (
    TRANSITIONS,
    FillState,
    IllegalTransition,
    check_transition,
)
from shardcache.cache.passthrough import CheckedStream, ContinuedStream, RelayedStream
from shardcache.cache.store import Store
from shardcache.checksums import Checksum
from shardcache.errors import (
    CacheError,
    CacheFull,
    FillAbandoned,
    NotAdmitted,
    OriginError,
    ShardcacheError,
    ShuttingDown,
)
from shardcache.fetch.checksum_trust import ChecksumTrust
from shardcache.fetch.gate import OriginGate
from shardcache.fetch.policy import FetchPolicy
from shardcache.fetch.segments import OriginRequests, SegmentedDownload
from shardcache.observer import FailureTally, Observer
from shardcache.origins.base import ObjectInfo, Origin, OriginStream

__all__ = ["Fill", "FillFactory", "FillState", "IllegalTransition"]

log = logging.getLogger("shardcache.fill")


@dataclasses.dataclass(frozen=True, slots=True)
class FillFactory:
    """What every fill of one cache shares; `new()` makes one. `extra_slots`: the connections
    past each fill's first, shared by all; `trust`: the kinds of checksum each origin gets
    wrong (the cache's); `keeps_block_digests`: take the CRC-32C per block hits are checked
    against (`blocks`)."""

    store: Store
    policy: FetchPolicy
    observer: Observer
    trust: ChecksumTrust
    extra_slots: asyncio.Semaphore
    clock: Callable[[], float] = time.monotonic
    keeps_block_digests: bool = True

    @classmethod
    def of(
        cls,
        store: Store,
        policy: FetchPolicy,
        observer: Observer,
        clock: Callable[[], float] = time.monotonic,
        keeps_block_digests: bool = True,
    ) -> FillFactory:
        """A factory with its own trust and `policy.shared_connections` extra slots."""
        slots = asyncio.Semaphore(policy.shared_connections)
        trust = ChecksumTrust(observer)
        return cls(store, policy, observer, trust, slots, clock, keeps_block_digests)

    def new(
        self,
        cache_key: str,
        origin: Origin,
        origin_key: str,
        gate: OriginGate | None = None,
        on_unwanted: Callable[[Fill], None] | None = None,
    ) -> Fill:
        """A fill of `origin_key` (cache key `cache_key`), not started: its owner runs
        `run()` as a task it keeps in `Fill.task`. `on_unwanted(fill)`: the last holder let
        go of a fill nothing else wants (see the module docstring); the owner stops it, or
        closes the stream nobody took."""
        return Fill(self, cache_key, origin, origin_key, gate, on_unwanted)


class Fill:
    def __init__(
        self,
        parts: FillFactory,
        cache_key: str,
        origin: Origin,
        origin_key: str,
        gate: OriginGate | None = None,
        on_unwanted: Callable[[Fill], None] | None = None,
    ) -> None:
        """Made by `FillFactory.new`, which says what the arguments are."""
        self.cache_key, self.origin, self.origin_key = cache_key, origin, origin_key
        self._parts = parts
        self.state = FillState.STARTING
        self.info: ObjectInfo | None = None
        self.error: ShardcacheError | None = None
        self._download: SegmentedDownload | None = None
        self._tally = FailureTally(parts.observer)  # counts a failure no request was counted under
        self.readers = Readers(cache_key, self._tell_owner_if_unwanted, lambda: self.state.is_final)
        started = self._is_started
        self._requests = OriginRequests(
            origin, origin_key, parts.policy, self._tally, gate, started
        )
        self._passthrough: CheckedStream | None = None
        self.is_kept = True  # False once purged: it finishes for its readers, uncommitted
        self._on_unwanted = on_unwanted
        self._stop_reason: ShardcacheError | None = None
        self.task: asyncio.Task[None] | None = None  # set by the owner that runs the fill
        self._has_run = False  # `run` began: a task cancelled before that never enters it
        self._has_ended = False  # `run` ended: final, its data file aborted or committed
        self.is_prefetch = False  # started by the prefetch queue rather than a client
        # A HEAD's answer just before the fill (a prefetch sizing it): its checksums serve
        # when the first response is the same version, instead of a second HEAD.
        self.known_info: ObjectInfo | None = None
        self.check = BodyCheck(
            self._requests,
            parts.trust,
            lambda: self._written_bytes,
            self.readers.until,
            self.readers.wake,
            parts.keeps_block_digests,
        )
        self.is_second_fetch = False

    # -- state ---------------------------------------------------------------------------

    def _move(self, new: FillState) -> None:
        self.state = check_transition(self.state, new, self.cache_key)
        self.readers.wake()

    def _is_started(self) -> bool:
        """The origin answered (or the fill failed): a client may be reading."""
        return self.state is not FillState.STARTING

    @property
    def _written_bytes(self) -> int:
        """Bytes from offset 0 on disk without a hole: what readers may be sent."""
        return self._download.contiguous_bytes if self._download is not None else 0

    @property
    def received_bytes(self) -> int:
        """Bytes received from the origin so far, holes or not (what the origin delivers)."""
        return self._download.received_bytes if self._download is not None else 0

    @property
    def checksums(self) -> tuple[Checksum, ...]:
        """What the body is verified against (`body_check`), once learned."""
        return self.check.checksums

    def cancel(self) -> None:
        """Stop the download (shutdown); readers get ShuttingDown and abort."""
        if self.task is None:
            return
        self.task.cancel()
        if not self._has_run:  # its first step throws into `run` before its first line: end here
            self._fail(self._stop_reason or ShuttingDown("the daemon is shutting down"))
            self._end()

    def stop(self, reason: ShardcacheError) -> None:
        """Stop the download for `reason` (the fill fails with it); nobody is left to read."""
        self._stop_reason = reason
        self.cancel()

    # -- who wants it ----------------------------------------------------------------------

    def hold(self) -> None:
        """A reader wants the bytes: call it in the step that joins or starts the fill (no
        await between), and `let_go()` once, when its response ends."""
        self.readers.hold()

    def let_go(self) -> None:
        """A reader is done (served, gone, or failed); the last one out tells the owner when
        nothing else wants the fill (see the module docstring)."""
        self.readers.let_go()

    def do_not_keep(self) -> bool:
        """A purge: finish for the readers holding it, but do not commit the body (their
        response is whole; the next request fetches afresh). False when it is too late (the
        body is complete: committing, committed or given up) or nothing would be kept."""
        if not self.state.is_fetching:
            return False
        self.is_kept = False
        return True

    def _tell_owner_if_unwanted(self) -> None:
        if self._on_unwanted is not None and (
            self.state.is_fetching or self._passthrough is not None
        ):
            self._on_unwanted(self)

    async def discard_passthrough(self) -> None:
        """Close the stream of an object streamed through that nobody took (its starter
        left while it waited for the origin's answer)."""
        stream, self._passthrough = self._passthrough, None
        if stream is not None:
            await stream.aclose()

    # -- readers -------------------------------------------------------------------------

    async def wait_started(self, reader_left: asyncio.Event | None = None) -> FillState:
        """Wait until the origin answered; return FILLING (or later) or PASSTHROUGH. Raises
        the fill's OriginError (404, 502, 504…) when it failed before the first byte, and
        FillAbandoned once `reader_left` is set (watched: `Readers.watching`)."""
        await self.readers.until(self._is_started, reader_left)
        if self.state is FillState.FAILED:
            assert self.error is not None
            raise self.error
        return self.state

    async def wait_checksums(self) -> tuple[Checksum, ...]:
        """The object's published checksums once the fill has learned them (or has ended)."""
        await self.readers.until(lambda: self.has_checksums)
        return self.checksums

    @property
    def has_checksums(self) -> bool:  # learned (or given up on): no HEAD left to ask
        return self.check.is_learned or self._has_ended

    async def wait_finished(self) -> FillState:
        """Wait until the fill reached a final state and return it (never raises)."""
        await self.readers.until(lambda: self._has_ended)
        return self.state

    def take_passthrough(self) -> CheckedStream:
        """Hand the starter the open origin stream of an uncacheable object (once)."""
        stream, self._passthrough = self._passthrough, None
        if stream is None:
            raise RuntimeError("passthrough stream already taken")
        return stream

    async def join_passthrough(self, reader_left: asyncio.Event | None = None) -> CheckedStream:
        """A stream for another reader of an uncacheable object: its own whole-object GET of
        the version the starter learned checksums for (If-Match on its ETag), with those
        checksums. Another version is refused (OriginChanged), whatever the origin did with
        If-Match: its body could only have been checked against its length. FillAbandoned
        once `reader_left` is set: the GET (a turn it waits for under a cap) is given up."""
        if reader_left is None:
            return await self._join_passthrough()
        joining = asyncio.ensure_future(self._join_passthrough())
        joining.add_done_callback(lambda _: self.readers.wake())
        try:
            with self.readers.watching(reader_left):
                await self.readers.until(joining.done, reader_left)
        except FillAbandoned:
            if joining.done() and not joining.cancelled() and joining.exception() is None:
                await joining.result().aclose()  # opened as its reader left: nobody takes it
            raise
        finally:
            joining.cancel()  # a no-op once done
        return joining.result()

    async def _join_passthrough(self) -> CheckedStream:
        if self.state is not FillState.PASSTHROUGH or self.info is None:
            raise RuntimeError(f"{self.cache_key} is not streamed through")
        return await RelayedStream.open(self._requests, self.info, self.checksums)

    async def wait_readable(
        self, position: int, end: int, reader_left: asyncio.Event | None = None
    ) -> int:
        """Return how far (exclusive) a reader whose response ends at `end` may send now.
        Blocks until that is past `position`. The response's final byte becomes readable only
        once the body is verified, so no read, whole or ranged, completes before verification.
        Raises the fill's error if it failed, FillAbandoned once `reader_left` is set (the
        reader's watcher wakes it: `Readers.watching`)."""

        def readable() -> bool:
            # A range's bytes may be a splice of two versions, or corrupt, until the whole
            # object verified: its last byte waits, so a failure aborts the reader's response.
            done = self.state.is_body_complete or self.state is FillState.FAILED
            return done or self._limit(end) > position

        await self.readers.until(readable, reader_left)
        if self.state.is_body_complete:
            return end
        if self.state is FillState.FAILED:
            assert self.error is not None
            raise self.error
        return self._limit(end)

    def _limit(self, end: int) -> int:
        return min(self._written_bytes, end - 1)

    # -- the download ------------------------------------------------------------------------

    async def run(self) -> None:
        """Fetch, verify and commit the object; never raises except CancelledError."""
        self._has_run = True
        started_at = self._parts.clock()
        first: OriginStream | None = None
        policy = self._parts.policy
        try:
            # The first request asks for the first segment only, so that no byte is fetched
            # twice (a full GET could not be cut short without discarding what the network
            # carried). With one connection the first request is the plain GET of all of it
            # (each more request would pay the origin's time to first byte again).
            first_end = None if policy.connections == 1 else policy.first_segment_bytes
            first = await self._requests.open(0, first_end, None)
            if first.info.strong_etag is None:
                first = await self._whole_object(first, is_ranged=first_end is not None)
            info = self.info = first.info
            if not await self._reserve(info.size_bytes):
                checksums = await self.check.learn(info, self.known_info)
                self._passthrough = ContinuedStream(first, self._requests, checksums)
                first = None  # the passthrough stream owns it now
                self._move(FillState.PASSTHROUGH)
                return
            self._move(FillState.FILLING)
            file = self.readers.file
            assert file is not None
            self._download = SegmentedDownload(
                self._requests, info, file.fd, self.readers.wake, self._parts.extra_slots
            )
            handed, first = first, None  # the download owns and closes it
            await self.check.run(self._download, handed, info, file.fd, self.known_info)
            self._download.vouch()
            await self.check.keep(self._download, file.fd, info.size_bytes)
            self._move(FillState.VERIFIED)
            self._parts.observer.fetch_finished(self.origin.name, self._parts.clock() - started_at)
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
            self._end()

    async def _whole_object(self, first: OriginStream, is_ranged: bool) -> OriginStream:
        """An object whose responses carry no strong ETag: nothing could reliably tell a later
        ranged request's version from the first one's, so fetch it in one request (no
        segments, no resume)."""
        # An origin that serves no ranges answered with the whole object already (a 200).
        is_part = is_ranged and first.info.accepts_ranges
        if is_part and first.info.size_bytes > self._parts.policy.first_segment_bytes:
            await first.aclose()
            self._requests.count("ok")
            first = await self._requests.open(0, None, None)
        first.info = dataclasses.replace(first.info, accepts_ranges=False)
        return first

    async def _reserve(self, size_bytes: int) -> bool:
        store = self._parts.store
        if size_bytes > store.capacity_bytes:
            log.info("%s (%d bytes) is over the cache size: streamed", self.cache_key, size_bytes)
            return False
        try:
            read_now = self.is_prefetch and self.readers.is_held  # a read joined it
            self.readers.file = await asyncio.to_thread(
                store.reserve, size_bytes, self.cache_key, read_now
            )
        except NotAdmitted as exc:  # the steady state of a dataset larger than the cache
            log.debug("%s streamed through uncached: %s", self.cache_key, exc)
            return False
        except CacheFull as exc:
            store.warnings.warning(
                log, "full", "%s streamed through uncached: %s", self.cache_key, exc
            )
            return False
        except CacheError as exc:  # a broken cache dir must not fail reads
            store.warnings.warning(
                log,
                "unusable",
                "%s streamed through uncached, the cache is unusable: %s",
                self.cache_key,
                exc,
            )
            return False
        return True

    async def _commit(self, info: ObjectInfo) -> None:
        file = self.readers.file
        assert file is not None
        if not self.is_kept:  # its readers hold the fd; `_release_space` drops the file
            log.info("%s was purged while it was filled: not cached", self.cache_key)
            self._move(FillState.DISCARDED)
            return
        meta = self.check.entry_meta(info)
        try:
            await asyncio.to_thread(self._parts.store.commit, file, self.cache_key, meta)
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
        if self._written_bytes:  # its readers' failures are WARNINGs, rate-limited (server)
            log.info(
                "fill of %s failed after %d bytes: %s", self.cache_key, self._written_bytes, exc
            )

    async def _release_space(self) -> None:
        file = self.readers.file
        if file is not None and self.state is not FillState.COMMITTED:
            await asyncio.to_thread(self._parts.store.abort, file)
        self.readers.close_if_idle()

    def _end(self) -> None:
        """`run` is over (or never began): its waiters see the final state."""
        self._has_ended = True
        self.readers.wake()
