"""The on-disk cache: diskcache's index and LRU order over shard files written once, in place.

Layout under the cache dir: `v1/index/` is a diskcache Cache whose custom `Disk` *adopts* a
finished partial file by renaming it into its own tree (one write of each byte, no copy), and
`v1/partial/` holds fills in progress (swept at start-up). An entry is indexed only after its file
is complete, verified by the caller and fsynced; diskcache deletes a file only after the index
change commits, so a crash leaves either a whole entry or an orphan file that `open()` removes.

Space: `reserve(n)` evicts least-recently-used, unpinned entries *before* a fill writes, so the
index plus reservations never exceed `capacity_bytes`, nor what the filesystem has free (a
`--cache-size` larger than the disk is bounded by the disk).

Admission (`admission=`, the default policy; None is plain LRU): when the entry eviction would
take is still in use (`ScanResistantAdmission.is_protected`), the fill is not admitted
(`NotAdmitted`, it streams through) instead of throwing away what the next epoch reads. A
look-ahead prefetch (a key pinned before its reservation) is *transient*: it may evict to make
room, within a transient area that grows to what prefetch has held (at most
`transient_max_bytes`) and that ordinary fills leave free; once read, it stays only if admission
would admit it (room, or an unprotected victim), else it is dropped: prefetching a shard the
resident set has no room for never evicts the resident set twice.

Plans (`plans=`, `shardcache.plans`): while a loader's plan is active, eviction takes first
what no plan reads again (LRU among those, sparing what admission protects), then what the
plans read furthest away, and admits a fill only when it is needed before that victim. A
look-ahead prefetch is then an ordinary fill (the plans rank it as needed soon): no transient
area is kept free.

All methods block: callers run them on a worker thread, one hop per logical operation. Every
failure of the index or the disk is a `CacheError` (`map_store_errors`): the caller streams
through uncached. `problem()` says why the directory is unusable and reopens the store when its
directory was replaced. This module knows nothing of HTTP or origins.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from shardcache import space
from shardcache.admission import ScanResistantAdmission
from shardcache.cache.entry import (
    AdmissionState,
    CacheFull,
    CacheInUse,
    Entry,
    EntryMeta,
    IndexedEntry,
    NotAdmitted,
    Reservation,
    StoredEntry,
    StoreUsage,
    parse_meta,
)
from shardcache.cache.index import WAL_ALLOWANCE_BYTES, AdoptFile, Index, map_store_errors
from shardcache.errors import CacheError
from shardcache.plans import PlanBook, choose_victim

log = logging.getLogger("shardcache.store")
LAYOUT_VERSION = "v1"
_LRU_BATCH = 64
ENTRY_OVERHEAD_BYTES = 8 * 1024  # a file's last partial block and its share of directories
# Free space kept on the filesystem beyond a reservation: the index must still be writable
# (its WAL, a new row) when the data files have taken the rest.
FILESYSTEM_HEADROOM_BYTES = (1 << 20) + WAL_ALLOWANCE_BYTES
FULL_WARNING_INTERVAL_S = 60.0
FILESYSTEM_FULL_BYTES = WAL_ALLOWANCE_BYTES // 2  # less free than this: the index cannot grow


class Store:
    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        on_evict: Callable[[str, int, bool], None] | None = None,
        repair: bool = True,
        admission: ScanResistantAdmission | None = None,
        transient_max_bytes: int = 0,
        plans: PlanBook | None = None,
    ) -> None:
        """Open (creating) the store; sweep partials; drop index rows and files that disagree.

        `on_evict(key, size_bytes, was_pinned)` is called after each eviction commits. With
        `repair=False` (`shardcache verify`), nothing is created, swept or fixed. `admission`
        and `transient_max_bytes`: see the module doc (None: plain LRU).
        Raises CacheError if the directory is unusable or another daemon holds it.
        """
        self.capacity_bytes = capacity_bytes
        self._on_evict = on_evict
        self.admission = admission
        self.plans = plans
        self._transient_max_bytes = transient_max_bytes if admission is not None else 0
        self._transient: dict[str, int] = {}  # committed look-ahead entries → size
        self._transient_read: set[str] = set()  # of those, read once: settled at next reserve
        self._transient_reserved = 0
        self._transient_area = 0
        self._bypassed = 0
        self._transient_kept = 0
        self._transient_dropped = 0
        self._lock = threading.Lock()
        self._reserved_bytes = 0
        self._pinned: set[str] = set()
        self._touched: dict[str, float] = {}
        self._unlink_later: set[Path] = set()  # partial files a read-only dir kept
        self._directory = directory
        self._root = directory / LAYOUT_VERSION
        self._index_dir = self._root / "index"
        self._partial_dir = self._root / "partial"
        self._last_usage = StoreUsage(0, 0, 0, capacity_bytes)
        self._full_warned_at = -FULL_WARNING_INTERVAL_S
        self._lock_fd = -1
        if not repair and not directory.is_dir():
            raise CacheError(f"{directory} does not exist or is not a directory")
        if not repair and not all(
            path.is_file() for path in (self._index_dir / "cache.db", self._root / "lock")
        ):
            raise CacheError(f"{directory} holds no shardcache cache")
        self.swept_partials = 0
        self._open(repair)
        self._directory_device = os.stat(directory).st_dev
        if repair:  # the daemon's store, not `shardcache verify`'s look at one
            self._warn_if_larger_than_filesystem()

    def _open(self, repair: bool) -> None:
        """Lock the directory and open the index (again, after the directory was replaced)."""
        try:
            if repair:
                self._partial_dir.mkdir(parents=True, exist_ok=True)
                self._index_dir.mkdir(parents=True, exist_ok=True)
            create = os.O_CREAT if repair else 0  # `verify` never writes into a stranger's dir
            lock_fd = os.open(self._root / "lock", os.O_RDWR | create | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CacheError(f"cannot use {self._directory}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise CacheInUse(f"{self._directory} is in use by another shardcache daemon") from None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
        self._lock_fd = lock_fd
        if repair:
            self.swept_partials = self._sweep_partials()
        with map_store_errors(f"cannot open the index in {self._directory}"):
            self._index = Index(self._index_dir)
            self._db_identity = self._index.identity
            if repair:
                self._index.add_access_time_index()
                self._drop_damaged_entries()
                for _ in range(3):  # drop rows without files and files without rows; a fix
                    if not self._index.check(fix=True):  # can leave an empty dir for the next
                        break
        self._touched = {}
        if self.plans is not None:  # what is cached now, for the plans' heap
            self.plans.forget_cached(self._index.keys())

    def _drop_damaged_entries(self) -> None:
        """Drop entries whose metadata is unreadable or whose file has another size than
        the entry says, before diskcache's check would "fix" the size to the damaged file."""
        for key, filename, tag in self._index.rows():
            try:
                is_sound = parse_meta(tag).size_bytes == os.stat(self._index_dir / filename).st_size
            except (CacheError, FileNotFoundError):
                is_sound = False
            if not is_sound:
                log.warning("dropping damaged entry %s", key)
                self._index.delete(key)

    def _warn_if_larger_than_filesystem(self) -> None:
        with contextlib.suppress(OSError, CacheError):
            for warning in space.startup_warnings(self._room(), self._directory):
                log.warning("%s", warning)

    def _room(self) -> space.Room:
        entries = self._index.entry_bytes()
        entry_bytes = entries + ENTRY_OVERHEAD_BYTES * len(self._index)
        index_bytes = self._used_bytes() - entry_bytes
        free = _free_bytes(self._root)
        return space.Room(
            self.capacity_bytes, free, entry_bytes, index_bytes, FILESYSTEM_HEADROOM_BYTES
        )

    # -- reads ---------------------------------------------------------------------------

    def lookup(self, key: str) -> Entry | None:
        """Return the open entry for `key` and mark it used, or None. Caller must close it."""
        with map_store_errors(f"cannot look up {key}"):
            fd, tag = self._index.get(key)
        if fd is None:
            return None
        try:
            meta = parse_meta(tag)
        except CacheError:
            os.close(fd)
            raise
        with self._lock:
            self._touched[key] = time.time()
        return Entry(fd, meta)

    def note_request(self, key: str, found: bool) -> None:
        """A client read `key`; `found`: it was served from a committed entry. Feeds admission
        (a read of a look-ahead prefetch is not a hit on the resident set). Event-loop safe."""
        hit = found and key not in self._transient
        if self.admission is not None:
            self.admission.on_request(key, hit)
        if self.plans is not None:
            self.plans.on_request(key, hit)

    def note_warm(self, key: str) -> None:
        """A shard is being warmed: admission protects it as it would a read; plans do not
        move (no job read it). Event-loop safe."""
        if self.admission is not None:
            self.admission.on_request(key, False)

    def admission_state(self) -> AdmissionState:
        admission, plans = self.admission, self.plans
        active = plans.status() if plans is not None else []
        policy = "plan" if active else "lru" if admission is None else "scan-resistant"
        return AdmissionState(
            policy,
            self._bypassed,
            self._transient_bytes(),
            self._transient_area,
            self._transient_kept,
            self._transient_dropped,
            admission is None or admission.is_serving(),
            active,
        )

    def _is_transient(self, key: str) -> bool:
        """A look-ahead prefetch (pinned) that only admission ranks: one a plan reads is an
        ordinary fill, which the plans rank as needed soon."""
        if self.admission is None or key not in self._pinned:
            return False
        return self.plans is None or self.plans.next_use_s(key) is None

    def _transient_bytes(self) -> int:
        return sum(self._transient.values()) + self._transient_reserved

    def peek(self, key: str) -> EntryMeta | None:
        """Return `key`'s metadata without opening it or touching its LRU position."""
        with map_store_errors(f"cannot look up {key}"):
            tag = self._index.tag_of(key)
        return None if tag is None else parse_meta(tag)

    def usage(self) -> StoreUsage:
        """What the cache holds; while the index cannot be read, the last figures known."""
        try:
            with map_store_errors("cannot read the index size"):
                usage = StoreUsage(
                    self._used_bytes(), len(self._index), self._reserved_bytes, self.capacity_bytes
                )
        except CacheError as exc:
            log.debug("usage: %s", exc)
            return dataclasses.replace(self._last_usage, reserved_bytes=self._reserved_bytes)
        self._last_usage = usage
        return usage

    def _used_bytes(self) -> int:
        """Bytes on disk as `du` counts them: entries, the index database, and allowances
        for what grows between reservations (the write-ahead log, up to its checkpoint
        size, and per-entry directory blocks and block rounding)."""
        entries = self._index.entry_bytes()
        index = 0
        for name, allowance in (
            ("cache.db", 0),
            ("cache.db-wal", WAL_ALLOWANCE_BYTES),
            ("cache.db-shm", 0),
        ):
            with contextlib.suppress(FileNotFoundError):  # WAL files come and go
                index += max(allowance, os.stat(self._index_dir / name).st_size)
        return entries + index + ENTRY_OVERHEAD_BYTES * len(self._index)

    # -- fills ---------------------------------------------------------------------------

    def reserve(self, size_bytes: int, key: str | None = None) -> Reservation:
        """Make room for `size_bytes` by evicting LRU unpinned entries, and open a partial file.

        `key` pinned already (a look-ahead prefetch) makes the fill transient. Raises
        NotAdmitted when admission spares the entries eviction would take, CacheFull when
        reservations and pinned entries leave no room, CacheError when the directory is
        unusable; the caller should then stream the object through uncached. The caller must
        `commit()` or `abort()`.
        """
        transient = key is not None and self._is_transient(key)
        with self._lock, map_store_errors("cannot make room"):
            if problem := space.cannot_fit(size_bytes, self._room(), self._reserved_bytes):
                raise CacheFull(problem)  # before anything is evicted for it
            self._settle_read_transients()
            if transient:
                self._evict_until_free(size_bytes, protect=False, for_key=key)
            else:
                try:
                    self._evict_until_free(
                        size_bytes, protect=True, keep_free=self._area_free(), for_key=key
                    )
                except NotAdmitted:
                    self._bypassed += 1
                    raise
            self._evict_for_filesystem(size_bytes)
            self._reserved_bytes += size_bytes
            if transient:
                self._transient_reserved += size_bytes
                self._transient_area = min(
                    self._transient_max_bytes,
                    max(self._transient_area, self._transient_bytes()),
                )
        path = self._partial_dir / uuid.uuid4().hex
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self._release(size_bytes, transient)
            raise CacheError(f"cannot create a partial file: {exc.strerror or exc}") from exc
        reservation = Reservation(size_bytes, path, fd, is_transient=transient)
        try:
            # Claim the blocks now: a full disk fails the fill before its first byte (the
            # caller streams the object through instead), never halfway through a shard.
            self._allocate(reservation)
        except OSError as exc:
            os.close(fd)
            self.abort(reservation)
            raise CacheFull(f"cannot allocate {size_bytes} bytes: {exc.strerror or exc}") from exc
        return reservation

    def _allocate(self, reservation: Reservation) -> None:
        if not reservation.size_bytes:
            return
        try:
            os.posix_fallocate(reservation.fd, 0, reservation.size_bytes)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # Concurrent reservations each saw room for themselves: make room again, once.
            with self._lock, map_store_errors("cannot make room"):
                self._evict_for_filesystem(reservation.size_bytes)
            os.posix_fallocate(reservation.fd, 0, reservation.size_bytes)

    def commit(self, reservation: Reservation, key: str, meta: EntryMeta) -> None:
        """Make a complete, verified partial file the entry for `key`.

        fsyncs the data first, so a power loss cannot leave an indexed entry with missing
        bytes. The reservation's fd stays open for readers; the caller closes it. Raises
        CacheError (the partial file is gone then, and nothing is left in the index tree).
        """
        adopt = AdoptFile(str(reservation.path), meta.size_bytes)
        try:
            with map_store_errors(f"cannot commit {key}"):
                os.fsync(reservation.fd)
                self._index.set(key, adopt, json.dumps(dataclasses.asdict(meta)))
        except CacheError:
            self._index.drop_unindexed(adopt)
            self.abort(reservation)
            raise
        if self.plans is not None:
            self.plans.on_cached(key)
        if reservation.is_transient:
            with self._lock:
                self._transient[key] = meta.size_bytes
                if key not in self._pinned:  # a client read it while it was being fetched
                    self._transient_read.add(key)
        self._release_reservation(reservation)

    def abort(self, reservation: Reservation) -> None:
        """Discard a fill's partial file and give its space back. Safe to call twice; never
        raises: the space is given back even when the file cannot be removed now (a
        read-only directory), and removing it is tried again by `problem()`."""
        try:
            os.unlink(reservation.path)
        except FileNotFoundError:  # already committed or swept
            pass
        except OSError as exc:
            log.warning("cannot remove %s now (%s); will retry", reservation.path, exc.strerror)
            self._unlink_later.add(reservation.path)
        finally:
            self._release_reservation(reservation)

    def _release_reservation(self, reservation: Reservation) -> None:
        if not reservation.is_released:
            reservation.is_released = True
            self._release(reservation.size_bytes, reservation.is_transient)

    def _release(self, size_bytes: int, transient: bool) -> None:
        with self._lock:
            self._reserved_bytes -= size_bytes
            if transient:
                self._transient_reserved -= size_bytes

    # -- eviction and pins -----------------------------------------------------------------

    # pin() and unpin() run on the event loop, so they must not wait for `_lock`, which a
    # reservation holds through its evictions (SQL and unlinks). Set add/discard/membership
    # are atomic under the GIL, and no ordering is lost: a key is pinned before its fill can
    # commit an entry for eviction to choose, and unpinning only widens the choice.

    def pin(self, key: str) -> None:
        """Protect `key` from eviction (a prefetched shard nobody has read yet)."""
        self._pinned.add(key)
        log.debug("pinned %s", key)

    def unpin(self, key: str) -> bool:
        """Make `key` an ordinary LRU entry again (a transient one is settled at the next
        reservation: kept or dropped); return whether it was pinned."""
        was_pinned = key in self._pinned
        if key in self._transient:
            self._transient_read.add(key)
        self._pinned.discard(key)
        log.debug("unpinned %s (was pinned: %s)", key, was_pinned)
        return was_pinned

    def delete(self, key: str) -> bool:
        """Remove `key`'s entry (its file goes after the index commits); return if it existed.
        Raises CacheError, the entry untouched, when the directory is not writable: SQLite's
        files were opened before, so the row would go and the file would stay."""
        if not os.access(self._index_dir, os.W_OK):
            raise CacheError(f"cannot delete {key}: cache dir {self._index_dir} is not writable")
        self._pinned.discard(key)
        with map_store_errors(f"cannot delete {key}"):
            deleted = bool(self._index.delete(key))
        with self._lock:
            self._forget(key)
        return deleted

    def _forget(self, key: str) -> None:
        """`key` left the cache: it is no longer transient, nor cached for the plans."""
        self._transient.pop(key, None)
        self._transient_read.discard(key)
        if self.plans is not None:
            self.plans.on_evicted(key)

    def _area_free(self) -> int:
        """The part of the transient area transient entries do not use now: ordinary fills
        leave it free (called with self._lock held). Not while a plan is active: the plans
        rank what they read, and a look-ahead no plan names evicts by that ranking instead."""
        if self.plans is not None and self.plans.is_active:
            return 0
        return max(0, self._transient_area - self._transient_bytes())

    def _settle_read_transients(self) -> None:
        """Keep each look-ahead entry read since the last call if admission would admit it as
        an ordinary fill (room, or unprotected victims), else drop it (self._lock held)."""
        while self._transient_read:
            key = self._transient_read.pop()
            size = self._transient.pop(key, None)
            if size is None:
                continue
            try:
                self._evict_until_free(
                    0, protect=True, keep_free=self._area_free(), spare=key, for_key=key
                )
            except CacheFull:
                self._transient_dropped += 1
                log.debug("dropping %s: read once, no room in the resident set", key)
                self._index.delete(key)  # a reader's open fd stays valid
                self._forget(key)
                continue
            self._transient_kept += 1

    def next_use_s(self, key: str) -> float | None:
        """Seconds until a loader's plan reads `key`, or None when no plan names it (or plans
        are off). Takes the plans' lock: call it from a worker thread."""
        return self.plans.next_use_s(key) if self.plans is not None else None

    def would_admit(self, key: str, size_bytes: int, look_ahead: bool) -> bool:
        """Whether a fill of `key` would be admitted now, without evicting anything: a prefetch
        asks before fetching, so that one the policy would refuse is not downloaded only to
        be thrown away. A dry run of the first eviction only (the fill itself decides).

        Under plain LRU too: a prefetch that finds no room at its reservation has sent its
        GET already (it streams through, and the loader's read fetches the shard again). The
        dry run catches the cache whose room fills under way hold, or whose every entry is
        pinned; not one where evicting all that is unpinned would still fall short."""
        unplanned = self.plans is None or self.plans.next_use_s(key) is None
        with self._lock, map_store_errors(f"cannot size up {key}"):
            if space.cannot_fit(size_bytes, self._room(), self._reserved_bytes):
                return False  # as `reserve` would find, whatever it evicted
            if look_ahead and self.admission is not None and unplanned:
                return True  # a transient fill: it may evict within its area
            self._flush_touches()
            room = self.capacity_bytes - self._used_bytes() - self._reserved_bytes
            if room - self._area_free() >= size_bytes:
                return True
            try:
                return self._choose_victim("", key, protect=True) is not None
            except NotAdmitted:
                return False

    def _flush_touches(self) -> None:
        """Write the batched access times in one transaction (called with self._lock held)."""
        touched, self._touched = self._touched, {}
        if touched:
            self._index.write_access_times(touched)

    def _evict_until_free(
        self,
        size_bytes: int,
        protect: bool = False,
        keep_free: int = 0,
        spare: str = "",
        for_key: str | None = None,
    ) -> None:
        """Evict until `size_bytes` fit with `keep_free` bytes to spare; with `protect`, raise
        NotAdmitted rather than evict an entry the policy keeps over a fill of `for_key`;
        never evict `spare`."""
        # Called with self._lock held, so concurrent reservations cannot count the same room.
        if size_bytes + self._reserved_bytes > self.capacity_bytes:
            raise CacheFull(f"no room for {size_bytes} bytes: reservations hold the rest")
        self._flush_touches()
        needed = size_bytes + keep_free
        while self._used_bytes() + self._reserved_bytes + needed > self.capacity_bytes:
            if not self._evict_one(size_bytes, protect, spare, for_key):
                raise CacheFull(f"no room for {size_bytes} bytes: pinned entries hold the rest")

    def _evict_for_filesystem(self, size_bytes: int) -> None:
        """Evict until the filesystem has `size_bytes` free plus headroom for the index: the
        bound when `--cache-size` is larger than the disk (or something else fills it).
        Called with self._lock held; leaves the rest to fallocate (CacheFull when it fails)."""
        needed = size_bytes + FILESYSTEM_HEADROOM_BYTES
        free = _free_bytes(self._root)
        if free >= needed:
            return
        now = time.monotonic()
        if now - self._full_warned_at >= FULL_WARNING_INTERVAL_S:
            self._full_warned_at = now
            log.warning(
                "the filesystem under %s has %d bytes free, too few for a %d-byte fill: "
                "evicting to fit; --cache-size %d is more than the disk holds for the cache "
                "(%d bytes cached now)",
                self._directory,
                free,
                size_bytes,
                self.capacity_bytes,
                self._used_bytes(),
            )
        while free < needed and self._evict_one(size_bytes):
            free = _free_bytes(self._root)

    def _evict_one(
        self, size_bytes: int, protect: bool = False, spare: str = "", for_key: str | None = None
    ) -> bool:
        """Evict the entry the policy gives up first; False when none is evictable. With
        `protect`, raise NotAdmitted when the policy keeps it over a fill of `for_key`."""
        victim = self._choose_victim(spare, for_key, protect)
        if victim is None:
            return False
        key, victim_size = victim
        log.debug("evicting %s (%d bytes) to make room for %d", key, victim_size, size_bytes)
        deleted = self._index.delete_to_free_space(key)
        self._forget(key)
        if deleted and self._on_evict is not None:
            self._on_evict(key, victim_size, False)
        return True

    def _choose_victim(
        self, spare: str, for_key: str | None, protect: bool, attempts: int = 8
    ) -> tuple[str, int] | None:
        """LRU, LRU that spares what admission protects, or the plans' choice (module doc).
        After `attempts` keys the plans thought cached and the index did not, plain LRU."""
        candidates = self._least_recently_used(spare)
        plans, admission = self.plans, self.admission
        if plans is not None and plans.is_active and attempts > 0:
            victim, admit = choose_victim(
                [key for key, _ in candidates],
                for_key,
                plans,
                admission.is_protected if admission is not None else _never,
                lambda key: key in self._pinned or key == spare,
            )
            if victim is None:
                return None
            if protect and not admit:
                raise NotAdmitted(f"the plans need the entries eviction would take ({victim})")
            sizes = dict(candidates)
            if victim not in sizes:
                size = self._index.size_of(victim)
                if size is None:  # gone meanwhile (a purge raced its commit): forget it, again
                    plans.on_evicted(victim)
                    return self._choose_victim(spare, for_key, protect, attempts - 1)
                sizes[victim] = size
            return victim, sizes[victim]
        if not candidates:
            return None
        key, size = candidates[0]
        if protect and admission is not None and admission.is_protected(key):
            raise NotAdmitted(f"the entries eviction would take are in use (first: {key})")
        return key, size

    def _least_recently_used(self, spare: str = "") -> list[tuple[str, int]]:
        """Evictable entries, least recently used first: a batch of them."""
        rows = self._index.least_recently_used(_LRU_BATCH + len(self._pinned) + 1)
        return [(k, s) for k, s in rows if k not in self._pinned and k != spare]

    # -- health ------------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Return why the cache directory cannot be used now, or None when it can.

        When the directory was deleted and is back (or its index is gone), the store reopens
        itself there, empty: fills are cached again without a restart. Until then, and while
        the directory is read-only, fills stream through uncached (`reserve` fails).
        """
        with self._lock:
            try:
                db = os.stat(self._index_dir / "cache.db")
                is_same = (db.st_dev, db.st_ino) == self._db_identity
            except FileNotFoundError:
                is_same = False
            except OSError as exc:
                return f"cache dir {self._directory}: {exc.strerror or exc}"
            if not is_same:
                try:
                    device = os.stat(self._directory).st_dev
                except OSError:
                    return f"cache dir {self._directory} is missing"
                if device != self._directory_device:
                    # Unmounted: recreating the cache on the filesystem underneath would fill
                    # a disk nobody sized for it.
                    return (
                        f"cache dir {self._directory} is on another filesystem than at start "
                        "(unmounted?); mount it back, or restart to use it where it is"
                    )
                try:
                    self._open(repair=True)
                except CacheError as exc:
                    return f"cache dir {self._directory} cannot be reopened: {exc}"
                log.warning("the cache dir %s was replaced: reopened it, empty", self._directory)
        for path in (self._index_dir, self._partial_dir):
            if not os.access(path, os.W_OK):
                return f"cache dir {path} is not writable"
        with contextlib.suppress(OSError):
            if (free := _free_bytes(self._root)) < FILESYSTEM_FULL_BYTES:
                return f"the filesystem under {self._directory} is full ({free} bytes free)"
        for path in list(self._unlink_later):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._unlink_later.discard(path)
        return None

    # -- the online scrub (`shardcache.scrub`) ----------------------------------------------

    def entries_after(self, rowid: int, limit: int) -> list[StoredEntry]:
        """Up to `limit` entries after `rowid`, in index (rowid) order: a stable walk in which
        a re-filled key keeps its place (diskcache updates its row). Raises CacheError."""
        with map_store_errors("cannot list the index"):
            rows = self._index.rows_after(rowid, limit)
        found = []
        for row, key, filename, stored_at, tag in rows:
            try:
                meta: EntryMeta | None = parse_meta(tag)
            except CacheError:
                meta = None
            path = self._index_dir / str(filename)
            found.append(StoredEntry(row, str(key), str(filename), path, stored_at, meta))
        return found

    def drop_if_unchanged(self, key: str, filename: str) -> bool:
        """Remove `key`'s entry if it is still the version stored in `filename`, and return
        whether it was removed: a version committed since (a re-fill) is never dropped for
        damage found in the one before. Raises CacheError, the entry untouched."""
        if not os.access(self._index_dir, os.W_OK):
            raise CacheError(f"cannot drop {key}: cache dir {self._index_dir} is not writable")
        with map_store_errors(f"cannot drop {key}"):
            if not self._index.delete_if_file(key, filename):
                return False
        with self._lock:
            self._forget(key)
        return True

    # -- listing (`GET /_/cache`, `shardcache ls`) -----------------------------------------

    def key_range(self, low: str, after: str, high: str, limit: int) -> list[IndexedEntry]:
        """Up to `limit` entries whose cache keys are at least `low`, past `after` and below
        `high`, in key order (the index on `key`: one bounded range scan however large the
        cache). Raises CacheError."""
        with map_store_errors("cannot list the index"):
            rows = self._index.key_range(low, after, high, limit)
        touched = self._touched  # reads not yet flushed to access_time (a GIL-atomic get)
        return [
            IndexedEntry(str(key), int(size), stored, max(read, touched.get(key, 0.0)), str(tag))
            for key, size, stored, read, tag in rows
        ]

    def pinned_by(self, key: str) -> list[str]:
        """Why eviction spares `key`: "look-ahead" (prefetched, unread) and/or "plan" (a loader's
        plan reads it again). Takes the plans' lock: call it from a worker thread."""
        reasons = ["look-ahead"] if key in self._pinned else []
        return reasons + (["plan"] if self.next_use_s(key) is not None else [])

    # -- offline checks (`shardcache verify`) --------------------------------------------------

    def entries(self) -> Iterator[tuple[str, Path, EntryMeta | None]]:
        """Every indexed entry: key, file path, metadata (None when unreadable)."""
        with map_store_errors("cannot list the index"):
            listed = self._index.rows()
        for key, filename, tag in listed:
            try:
                meta: EntryMeta | None = parse_meta(tag)
            except CacheError:
                meta = None
            yield str(key), self._index_dir / str(filename), meta

    def partial_files(self) -> list[Path]:
        return sorted(self._partial_dir.iterdir()) if self._partial_dir.is_dir() else []

    def index_problems(self, fix: bool) -> list[str]:
        """diskcache's check: rows without files, files without rows, wrong sizes, SQLite's
        integrity check. With `fix`, rows without files and stray files are removed."""
        with map_store_errors("cannot check the index"):
            return self._index.check(fix)

    # -- housekeeping ------------------------------------------------------------------------

    def _sweep_partials(self) -> int:
        """Delete every partial file: they are fills a crash or kill interrupted."""
        count = 0
        for path in self._partial_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                count += 1
        return count

    def check(self) -> list[str]:
        """Return inconsistencies between index and files (empty when sound); for tests and
        post-mortems. Partial files are reported only when no reservation is open."""
        problems = self.index_problems(fix=False)
        if self._reserved_bytes == 0:
            problems += [f"stray partial file {p}" for p in self._partial_dir.iterdir()]
        return problems

    def close(self) -> None:
        with contextlib.suppress(CacheError), self._lock, map_store_errors("cannot close"):
            self._flush_touches()  # the LRU order survives a restart
        self._index.close()
        os.close(self._lock_fd)


def _never(key: str) -> bool:
    return False


def _free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still allocate on `path`'s filesystem."""
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize
