"""`ShardCache`: lookup → hit, join a fill in flight, or start one; size, start and finish a
prefetch. Composes store, flights, origins and an observer; knows nothing of HTTP. Its fills
run as tasks its `FillRunner` owns, never a client's."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
from collections.abc import Callable, Mapping

from shardcache.cache.entry import Entry, EntryMeta
from shardcache.cache.fill import Fill, FillFactory, FillState
from shardcache.cache.fill_runner import FillRunner
from shardcache.cache.flights import Flights
from shardcache.cache.lease import Lease, Result, info_of
from shardcache.cache.purge import Purged, drop_damaged, purge_entries
from shardcache.cache.store import Store
from shardcache.cache.unread import Hold, UnreadLedger
from shardcache.errors import CacheError, NotCached, UnknownOrigin
from shardcache.fetch.origin_table import OriginTable
from shardcache.fetch.policy import FetchPolicy
from shardcache.fetch.segments import OriginRequests
from shardcache.keys import validate_key
from shardcache.observer import Observer
from shardcache.origins.base import ObjectInfo, Origin
from shardcache.origins.listing import Listing, ListQuery, list_objects
from shardcache.origins.location import bucket_location

log = logging.getLogger("shardcache.cache")


class PrefetchOutcome(enum.Enum):
    CACHED = "cached"
    FETCHED = "fetched"
    JOINED = "joined"
    TOO_LARGE = "too_large"
    NOT_ADMITTED = "not_admitted"  # the eviction policy would not cache it now: not fetched


@dataclasses.dataclass(frozen=True, slots=True)
class Sized:
    """A prefetch sized by its HEAD and not started (`ShardCache.size_prefetch`)."""

    origin: Origin
    key: str
    url: str
    info: ObjectInfo
    mark: int  # `Flights.mark` before the HEAD: a fill that ended since may have brought it


class ShardCache:
    def __init__(
        self,
        store: Store,
        origins: OriginTable | Mapping[str, Origin],
        policy: FetchPolicy,
        observer: Observer,
        clock: Callable[[], float] = time.monotonic,
        keeps_block_digests: bool = True,
        fills: FillFactory | None = None,
    ) -> None:
        """`fills`: what makes each fill, built by the daemon; without it, one of `store`,
        `policy`, `observer`, `clock` and `keeps_block_digests` (fills take the CRC-32C per
        block hits are checked against; off with `verify_hits`: a miss then costs what it did
        before)."""
        self.store = store
        self._fills = fills or FillFactory.of(store, policy, observer, clock, keeps_block_digests)
        # Each origin with its gate, built as one by the daemon, which replaces it whole on
        # a reload; this cache closes it (`aclose`). A mapping is a table built by hand.
        self._origins = (
            origins if isinstance(origins, OriginTable) else OriginTable(origins, observer)
        )
        self.flights = Flights()
        self._runner = FillRunner(self.flights, self._fills, self._origins, self.cache_key)
        self._policy = policy
        self._observer = observer
        self._clock = clock
        # The kinds of checksum each origin publishes but cannot get right (fills report).
        self.checksum_trust = self._fills.trust
        # The one owner of look-ahead bytes: held for prefetches about to start, and pinned
        # in the store (not evictable) until a client reads them; the queue's budget counts them.
        self.unread = UnreadLedger(store)

    @property
    def origins(self) -> dict[str, Origin]:
        """The current origins by name (a copy)."""
        return self._origins.origins

    def origin(self, name: str) -> Origin:
        slot = self._origins.get(name)
        if slot is None:
            raise UnknownOrigin(f"no origin named {name!r}")
        return slot.origin

    def _using(self, origin: Origin) -> contextlib.AbstractContextManager[object]:
        return self._origins.using(origin)

    def cache_key(self, origin_name: str, key: str) -> tuple[Origin, str]:
        """Return the origin and the cache key (full origin URL); raise UnknownOrigin/InvalidKey."""
        origin = self.origin(origin_name)
        return origin, origin.url_for(validate_key(key))

    async def open(
        self, origin_name: str, key: str, reader_left: asyncio.Event | None = None
    ) -> Lease:
        """Return a Lease to read `key` from origin `origin_name`.

        Raises UnknownOrigin, InvalidKey, or the OriginError of a fetch that failed before its
        first byte (OriginNotFound, OriginTimeout, …); FillAbandoned when `reader_left` is set
        (the client closed its connection) before the origin answered: the reader lets go of
        the fill then, so a fill nobody wants stops instead of waiting for the origin (for a
        turn under a cap, say) for nobody.
        """
        origin, url = self.cache_key(origin_name, key)
        entry = await self.flights.look(url, lambda: self._lookup(url))  # re-checked inside
        if isinstance(entry, Entry):
            return self._hit_lease(origin, url, entry)
        self.store.note_request(url, found=False)
        fill, joined = self.flights.join_or_start(
            url, lambda: self._runner.new_fill(origin, key, url)
        )
        fill.hold()  # in the same step as joining: see `FillRunner._drop_unwanted`
        if not joined:
            self._runner.spawn(fill)
        try:
            return await self._lease_of(origin, url, fill, joined, reader_left)
        except BaseException:
            fill.let_go()  # a failed fill, or a caller gone while it waited
            raise

    def open_hit(self, origin_name: str, key: str, accept: Callable[[Entry], bool]) -> Lease | None:
        """`open` at once, on the event loop, for a hit whose index row is remembered (the hit
        lane's question); None for anything else, or when `accept` declines the entry: then
        ask `open`. Nothing is counted before `accept` (the entry's access time is touched).
        Raises UnknownOrigin and InvalidKey as `open` does."""
        origin, url = self.cache_key(origin_name, key)
        if self.flights.get(url) is not None:
            return None  # a fill in flight: `open` decides what it is
        try:
            entry = self.store.lookup_remembered(url)
        except CacheError:
            return None  # `open` logs it, and treats it as a miss
        if entry is None:
            return None
        if not accept(entry):
            entry.close()
            return None
        return self._hit_lease(origin, url, entry)

    def _hit_lease(self, origin: Origin, url: str, entry: Entry) -> Lease:
        self.store.note_request(url, found=True)
        # Unpin only now that the file is open: unpinned before, a reservation could
        # evict it while the lookup runs (then the prefetch would be wasted, refetched).
        self._read_prefetched(origin, url, None)
        verified_by = tuple(entry.meta.verified_by)
        return Lease.of(
            Result.HIT, origin, info_of(entry.meta), entry=entry, verified_by=verified_by
        )

    async def _lease_of(
        self, origin: Origin, url: str, fill: Fill, joined: bool, reader_left: asyncio.Event | None
    ) -> Lease:
        """The lease of a reader that holds `fill`: for a fill's body, the lease lets go of it
        when closed; for an object streamed through, it lets go once the stream is taken."""
        self._read_prefetched(origin, url, fill)
        if reader_left is None or fill.state is not FillState.STARTING:
            # No suspension when it started already: a fill whose body is complete may commit,
            # finish and close its file between two steps of the loop (then no fd to share).
            state = await fill.wait_started()
        else:  # a turn it waits for under a cap is not waited for nobody
            with fill.readers.watching(reader_left):
                state = await fill.wait_started(reader_left)
        result = Result.COALESCED if joined else Result.MISS
        if joined and fill.state.is_body_complete:
            # Every byte is on local disk and verified; only the index write is pending (the
            # fill is still registered until it commits). For the client that is a hit.
            result = Result.HIT
        if state is FillState.PASSTHROUGH:
            if not joined:
                stream = fill.take_passthrough()
            else:  # its own GET, which may wait for a turn under a cap: not for nobody
                stream = await fill.join_passthrough(reader_left)
            fill.let_go()
            return Lease.of(result, origin, stream.info, stream=stream)
        assert fill.info is not None
        if result is Result.HIT:  # verified, not yet indexed: answer as a hit would
            info = dataclasses.replace(fill.info, checksums=fill.checksums)
            verified_by = fill.check.verified_by
        else:
            info, verified_by = fill.info, ()
        fd = fill.readers.acquire()
        return Lease.of(result, origin, info, fill=fill, fill_fd=fd, verified_by=verified_by)

    async def _lookup(self, url: str) -> Entry | None:
        """The committed entry for `url`, or None; a store that fails counts as a miss (the
        object is then streamed through: a broken disk must not fail reads)."""
        try:
            entry = self.store.lookup_remembered(url)  # a hot entry: no worker-thread hop
            return entry if entry is not None else await asyncio.to_thread(self.store.lookup, url)
        except CacheError as exc:
            self.store.warnings.warning(log, "lookup", "treating %s as a miss: %s", url, exc)
            return None

    async def _peek(self, url: str) -> EntryMeta | None:
        try:
            return await asyncio.to_thread(self.store.peek, url)
        except CacheError as exc:
            self.store.warnings.warning(log, "peek", "treating %s as not cached: %s", url, exc)
            return None

    async def head(
        self, origin_name: str, key: str, wants_checksums: bool = True
    ) -> tuple[Result, ObjectInfo]:
        """Return what a GET would answer, without fetching the body or touching LRU order.

        Without `wants_checksums` (validators are all the caller needs: a conditional GET),
        a fill in flight answers at once, without waiting to learn the object's checksums,
        unless a tier member or mirror sent its first answer: those validators are the
        object's only once its body verified and was kept (a stale mirror's are not, and a
        mirror's ETags may be its own, which only the home's checksum can judge), so it waits;
        one streamed through uncached leaves the answer to the origin's HEAD.
        A fill that failed meanwhile answers nothing: the entry or the origin does."""
        origin, url = self.cache_key(origin_name, key)
        fill = self.flights.get(url)
        if fill is not None and fill.info is not None:
            info = fill.info  # a tier below HEADs us for checksums: wait until they are known
            if not wants_checksums and info.sent_by is None:
                return Result.COALESCED, info
            fill.hold()  # it waits for the fill like a reader: no one may stop it meanwhile
            try:
                if wants_checksums:
                    checksums = await fill.wait_checksums()
                    vouched = fill.state is not FillState.FAILED
                else:  # a mirror's ETag may be its own: only a body that verified vouches
                    vouched = await fill.wait_finished() is FillState.COMMITTED
                    checksums = fill.checksums
            finally:
                fill.let_go()
            if vouched:
                return Result.COALESCED, dataclasses.replace(info, checksums=checksums)
        meta = await self._peek(url)
        if meta is not None:
            return Result.HIT, info_of(meta)
        async with self._origins.one_request(origin, self._policy.read_timeout_s):
            info = await origin.head(key)
        usable = self.checksum_trust.usable(origin.name, info.checksums)  # none set aside
        return Result.MISS, dataclasses.replace(info, checksums=usable)

    async def list_objects(self, origin_name: str, query: ListQuery) -> Listing:
        """One page of origin `origin_name`'s keys, asked of the origin each time: a listing
        is not cached (objects come and go at the origin, and a stale page would hide them).
        Raises UnknownOrigin, NotSupported (an origin that cannot list), BadRequest (a token
        it did not make) or an OriginError."""
        origin = self.origin(origin_name)
        async with self._origins.one_request(origin, self._policy.read_timeout_s, is_get=True):
            return await list_objects(origin, query)

    async def bucket_location(self, origin_name: str) -> str:
        """Origin `origin_name`'s bucket's region as S3's `LocationConstraint` (`location`);
        raises UnknownOrigin or an OriginError."""
        origin = self.origin(origin_name)
        async with self._origins.one_request(origin, self._policy.read_timeout_s, is_get=True):
            return await bucket_location(origin)

    async def purge(self, origin_name: str, key: str) -> Purged:
        """Delete the cached entry for `key` and keep no fill of it in flight (`purge_entries`);
        raise NotCached if there is neither."""
        origin, url = self.cache_key(origin_name, key)
        purged = await self.purge_entries(origin, [url])
        if not (purged.deleted or purged.not_kept):
            raise NotCached(f"{origin_name}/{key} is not cached")
        return purged

    async def drop_damaged(self, origin_name: str, key: str, entry: Entry) -> bool:
        """Drop the entry of `key` a hit found damaged if `entry` still holds that version
        open (`purge.drop_damaged`); return whether it was dropped. Never raises."""
        try:
            _, url = self.cache_key(origin_name, key)
        except UnknownOrigin:  # reloaded away meanwhile: its entries are not served any more
            return False
        return await drop_damaged(self.store, url, entry.fd)

    async def purge_entries(self, origin: Origin, urls: list[str]) -> Purged:
        """Delete the entries of cache keys `urls` and keep none of their fills in flight
        (`purge.purge_entries`: what it reaches, and its race with a fill's commit)."""
        return await purge_entries(
            origin, urls, self.flights, self.store, self.unread, self._observer
        )

    # -- prefetch --------------------------------------------------------------------------

    @property
    def unread_bytes(self) -> int:
        """Prefetched bytes no client has read yet (`unread`, the ledger)."""
        return self.unread.total_bytes

    def _read_prefetched(self, origin: Origin, url: str, fill: Fill | None) -> None:
        """A client is reading `url`: if it was prefetched, it is no longer unread; if its
        prefetch is still running, the client came early (a late prefetch)."""
        if url in self.unread:
            self.unread.mark_read(url)
            if fill is not None and fill.is_prefetch and not fill.state.is_final:
                self._observer.prefetch_late(origin.name)

    async def size_prefetch(
        self, origin_name: str, key: str
    ) -> Sized | tuple[PrefetchOutcome, Fill | None]:
        """Size `key` for a prefetch (a HEAD, retried, in turns at the origin's gate), the first
        of its three steps: size, admit (the caller's look-ahead budget), `start_prefetch`.

        Returns `Sized` to admit and start, or, with nothing to start, (CACHED, None) or
        (JOINED, fill) when a fetch is already under way: pass that fill to
        `finish_prefetch()`. Raises OriginNotFound or another OriginError from the HEAD.
        """
        origin, url = self.cache_key(origin_name, key)
        fill = self.flights.get(url)
        if fill is not None:
            fill.readers.keep_unread()
            return PrefetchOutcome.JOINED, fill
        if await self._peek(url) is not None:
            return PrefetchOutcome.CACHED, None
        mark = self.flights.mark(url)
        gate = self._origins.gate_of(origin)
        requests = OriginRequests(origin, key, self._policy, self._observer, gate)
        with self._using(origin):
            info = await requests.head()  # retried, each try in its turn at the origin's gate
        return Sized(origin, key, url, info, mark)

    async def start_prefetch(
        self, sized: Sized, hold: Hold | None = None, pin: bool = True
    ) -> tuple[PrefetchOutcome, Fill | None]:
        """Start bringing a sized object into the cache ahead of a client, pinned in place of
        `hold` until a client reads it (`pin=False`, warming: an ordinary entry, as a client's
        miss would leave it). `hold` stays the caller's to let go of when nothing is pinned.

        Returns (CACHED, None) when a fill brought it in since it was sized,
        (NOT_ADMITTED, None) when the eviction policy would not cache it now (nothing is
        fetched), (JOINED, fill) when a fetch was already under way, or (FETCHED, fill); pass
        the fill to `finish_prefetch()`.
        """
        origin, key, url, info = sized.origin, sized.key, sized.url, sized.info
        # While the object was sized and waited for budget, a client may have fetched it (then
        # a fill for it has ended since) or may be fetching it (join_or_start joins it). A
        # fill that ended without an entry (its reader left, it failed) fetched nothing
        # for this prefetch: it goes on.
        if self.flights.ended_since(url, sized.mark) and await self._peek(url) is not None:
            return PrefetchOutcome.CACHED, None
        if self.flights.get(url) is None and not await self._would_admit(url, info, pin):
            log.debug("not prefetching %s: the eviction policy would not cache it now", url)
            return PrefetchOutcome.NOT_ADMITTED, None
        fill, joined = self.flights.join_or_start(
            url, lambda: self._runner.new_fill(origin, key, url)
        )
        fill.readers.keep_unread()
        if joined:
            return PrefetchOutcome.JOINED, fill
        fill.is_prefetch = True
        fill.known_info = info
        if pin:
            self.unread.pin(url, info.size_bytes, hold)
        else:  # warming stands for the reads to come: admission protects it like one
            self.store.note_warm(url)
        self._runner.spawn(fill)
        return PrefetchOutcome.FETCHED, fill

    async def _would_admit(self, url: str, info: ObjectInfo, look_ahead: bool) -> bool:
        try:
            return await asyncio.to_thread(self.store.would_admit, url, info.size_bytes, look_ahead)
        except CacheError:
            return True  # the fill finds out for itself, and streams through

    async def finish_prefetch(self, fill: Fill, outcome: PrefetchOutcome) -> PrefetchOutcome:
        """Wait for a prefetch's fill; return FETCHED, JOINED or TOO_LARGE (not cacheable).

        Raises the fill's error if it failed.
        """
        state = await fill.wait_finished()
        if state is FillState.PASSTHROUGH and outcome is PrefetchOutcome.FETCHED:
            await fill.take_passthrough().aclose()  # nobody to stream it to
        if state is not FillState.COMMITTED and fill.cache_key in self.unread:
            self.unread.mark_read(fill.cache_key)
        if state is FillState.FAILED:
            assert fill.error is not None
            raise fill.error
        return PrefetchOutcome.TOO_LARGE if state is FillState.PASSTHROUGH else outcome

    def stop_unread_fills(self) -> None:
        """Stop the fills only the prefetch queue wanted (no reader holds them): the daemon is
        stopping, and they would be discarded unfinished at its end. Fills a reader holds go
        on, for the drain."""
        for fill in self.flights:
            fill.readers.forget_unread()

    async def aclose(self) -> None:
        """Cancel every fill still downloading (its partial file is removed), let verified
        ones finish committing, wait for all of them, then close the origins."""
        await self._runner.aclose()
        await self._origins.aclose()
