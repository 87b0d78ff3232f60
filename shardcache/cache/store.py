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
import sqlite3
import stat
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, UNKNOWN

from shardcache import space
from shardcache.admission import ScanResistantAdmission
from shardcache.errors import CacheError
from shardcache.plans import PlanBook, PlanStatus, choose_victim

log = logging.getLogger("shardcache.store")
LAYOUT_VERSION = "v1"
_LRU_BATCH = 64
WAL_CHECKPOINT_PAGES = 64  # SQLite checkpoints (and truncates) its WAL at this many pages
WAL_ALLOWANCE_BYTES = 512 * 1024  # what the WAL may reach between checkpoints, with slack
ENTRY_OVERHEAD_BYTES = 8 * 1024  # a file's last partial block and its share of directories
# Free space kept on the filesystem beyond a reservation: the index must still be writable
# (its WAL, a new row) when the data files have taken the rest.
FILESYSTEM_HEADROOM_BYTES = (1 << 20) + WAL_ALLOWANCE_BYTES
FULL_WARNING_INTERVAL_S = 60.0
FILESYSTEM_FULL_BYTES = WAL_ALLOWANCE_BYTES // 2  # less free than this: the index cannot grow


@contextlib.contextmanager
def map_store_errors(what: str) -> Iterator[None]:
    """Translate SQLite, diskcache and OS errors into CacheError, so none escapes the store
    (a full disk, a read-only or deleted directory all end as "stream it through")."""
    try:
        yield
    except CacheError:
        raise
    except (sqlite3.Error, diskcache.Timeout) as exc:
        raise CacheError(f"{what}: the index failed: {exc or exc.__class__.__name__}") from exc
    except OSError as exc:
        raise CacheError(f"{what}: {exc.strerror or exc}") from exc


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What the server needs to answer for an entry without asking the origin."""

    size_bytes: int
    etag: str | None = None
    content_type: str | None = None
    checksum_headers: dict[str, str] = field(default_factory=dict)  # verified, re-published
    digests: dict[str, str] = field(default_factory=dict)  # algorithm → hex, for `verify`
    verified_by: list[str] = field(default_factory=list)  # "length", "Content-MD5", "etag"…


@dataclass(slots=True)
class Entry:
    """An open, committed entry. The fd stays valid even if the entry is evicted meanwhile
    (POSIX unlink semantics); the caller must `close()` it."""

    fd: int
    meta: EntryMeta

    def close(self) -> None:
        os.close(self.fd)


@dataclass(slots=True)
class Reservation:
    """Space set aside for one fill, and its partial file (open read-write as `fd`)."""

    size_bytes: int
    path: Path
    fd: int
    is_released: bool = False
    is_transient: bool = False  # a look-ahead prefetch's (see the module doc)


@dataclass(frozen=True, slots=True)
class StoreUsage:
    size_bytes: int
    entries: int
    reserved_bytes: int
    capacity_bytes: int


class CacheFull(CacheError):
    """No room can be made: reservations and pinned entries hold the rest of the capacity."""


class NotAdmitted(CacheFull):
    """Admission spares the entries eviction would take: the fill streams through uncached."""


class CacheInUse(CacheError):
    """Another process (a running daemon) holds the directory's lock."""


@dataclass(frozen=True, slots=True)
class StoredEntry:
    """One indexed entry as the scrub walks them. `filename` names this version of the entry
    (a re-fill of the key commits a new file); `stored_at` is its commit time (`time.time()`);
    `meta` is None when unreadable."""

    rowid: int
    key: str
    filename: str
    path: Path
    stored_at: float
    meta: EntryMeta | None


@dataclass(frozen=True, slots=True)
class IndexedEntry:
    """One index row as `key_range` lists it: times are `time.time()`; `read_at` is the last
    read (the commit counts as one); `tag` is the raw metadata, read by `meta()` only for
    the rows a listing keeps."""

    key: str
    size_bytes: int
    stored_at: float
    read_at: float
    tag: str

    def meta(self) -> EntryMeta:
        """The entry's metadata; raises CacheError when unreadable."""
        return _meta(self.tag)


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """What `/_/status` and `/metrics` report about the eviction policy."""

    policy: str  # in use now: "plan" (a plan is active), "scan-resistant" or "lru"
    bypassed: int  # fills streamed through because admission spared the resident set
    transient_bytes: int  # look-ahead prefetches held (unread, or read and not yet settled)
    transient_area_bytes: int  # what ordinary fills leave free for them
    transient_kept: int  # read once, then admitted as ordinary entries
    transient_dropped: int  # read once, then dropped: no room without evicting in-use entries
    is_serving: bool  # False: the resident set stopped serving hits (a new dataset?)
    plans: list[PlanStatus] = field(default_factory=list)


@dataclass(slots=True)
class _AdoptFile:
    path: str
    size_bytes: int
    adopted_as: str | None = None  # the file's path in the index tree, once renamed there


class _AdoptingDisk(diskcache.Disk):  # type: ignore[misc]
    """A diskcache Disk that takes ownership of a finished file by renaming it into the index
    tree, and that hands out raw file descriptors for sendfile instead of file objects."""

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str, None]:
        if not isinstance(value, _AdoptFile):
            raise TypeError("the shardcache index only adopts finished files")
        filename, full_path = self.filename(key, value)
        if not os.path.isdir(self._directory):  # deleted under us: never recreate it here
            raise FileNotFoundError(errno.ENOENT, "the index directory is gone", self._directory)
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        os.rename(value.path, full_path)
        value.adopted_as = full_path
        return value.size_bytes, MODE_BINARY, filename, None

    def fetch(self, mode: int, filename: str, value: Any, read: bool) -> int:
        # FileNotFoundError is an IOError, which diskcache's get() treats as a miss. O_NONBLOCK
        # and the S_ISREG check: a FIFO left where an entry's file was would block this open
        # (and the response, and the daemon's exit) for ever; it is a miss, refetched, instead.
        path = os.path.join(self._directory, filename)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "not a regular file", path)
        return fd


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
            self._index = diskcache.Cache(
                str(self._index_dir),
                disk=_AdoptingDisk,
                size_limit=2**62,  # eviction is ours (reserve), so diskcache never culls
                cull_limit=0,
                # diskcache's LRU policy writes access_time in a transaction on every get: 32
                # concurrent hits then queue on SQLite's write lock. Reads here are lock-free
                # (policy "none"), and access times are batched in `_touched` and written in
                # one transaction before each eviction (and at close).
                eviction_policy="none",
                statistics=0,
                # Checkpoint the write-ahead log often and truncate it, so the index's own disk
                # use (counted against the bound) stays small and predictable.
                sqlite_wal_autocheckpoint=WAL_CHECKPOINT_PAGES,
                sqlite_journal_size_limit=WAL_ALLOWANCE_BYTES // 2,
            )
            db = os.stat(self._index_dir / "cache.db")
            self._db_identity = (db.st_dev, db.st_ino)
            if repair:
                self._index._sql(
                    "CREATE INDEX IF NOT EXISTS Cache_access_time ON Cache (access_time)"
                )
                self._drop_damaged_entries()
                for _ in range(3):  # drop rows without files and files without rows; a fix
                    if not self._check_index(fix=True):  # can leave an empty dir for the next
                        break
        self._touched = {}
        if self.plans is not None:  # what is cached now, for the plans' heap
            keys = self._index._sql("SELECT key FROM Cache").fetchall()
            self.plans.forget_cached(str(key) for (key,) in keys)

    def _drop_damaged_entries(self) -> None:
        """Drop entries whose metadata is unreadable or whose file has another size than
        the entry says, before diskcache's check would "fix" the size to the damaged file."""
        rows = self._index._sql("SELECT key, filename, tag FROM Cache").fetchall()
        for key, filename, tag in rows:
            try:
                is_sound = _meta(tag).size_bytes == os.stat(self._index_dir / filename).st_size
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
        entries = int(self._index.reset("size", update=False))
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
            fd, tag = self._index.get(key, default=None, read=True, tag=True)
        if fd is None:
            return None
        try:
            meta = _meta(tag)
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
            rows = self._index._sql("SELECT tag FROM Cache WHERE key = ?", (key,)).fetchall()
        return _meta(rows[0][0]) if rows else None

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
        entries = int(self._index.reset("size", update=False))
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
        adopt = _AdoptFile(str(reservation.path), meta.size_bytes)
        try:
            with map_store_errors(f"cannot commit {key}"):
                os.fsync(reservation.fd)
                self._index.set(key, adopt, tag=json.dumps(dataclasses.asdict(meta)))
        except CacheError:
            self._drop_unindexed(adopt)
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

    def _drop_unindexed(self, adopt: _AdoptFile) -> None:
        """After a failed commit, delete the file if it was moved into the index tree but no
        row names it (an orphan that `du` would count and `usage()` would not)."""
        if adopt.adopted_as is None:
            return
        filename = os.path.relpath(adopt.adopted_as, self._index_dir)
        with contextlib.suppress(sqlite3.Error, diskcache.Timeout):
            query = "SELECT 1 FROM Cache WHERE filename = ?"
            if self._index._sql(query, (filename,)).fetchall():
                return  # the row made it after all: the entry is whole
        self._index._disk.remove(filename)  # the file, then its emptied directories

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
            with self._index.transact():
                for key, at in touched.items():
                    self._index._sql("UPDATE Cache SET access_time = ? WHERE key = ?", (at, key))

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
        try:
            deleted = self._index.delete(key)
        except sqlite3.OperationalError:
            # A disk filled to the last block (by something else) leaves SQLite no room to
            # write the deletion: free the victim's file first, then delete its row. A row
            # whose file is gone reads as a miss, and start-up drops it if this fails too.
            log.warning(
                "the index cannot record evicting %s (disk full): removing its file first", key
            )
            rows = self._index._sql("SELECT filename FROM Cache WHERE key = ?", (key,))
            for (filename,) in rows.fetchall():
                self._index._disk.remove(filename)
            deleted = self._index.delete(key)
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
                rows = self._index._sql("SELECT size FROM Cache WHERE key = ?", (victim,))
                found = rows.fetchall()
                if not found:  # gone meanwhile (a purge raced its commit): forget it, again
                    plans.on_evicted(victim)
                    return self._choose_victim(spare, for_key, protect, attempts - 1)
                sizes[victim] = found[0][0]
            return victim, sizes[victim]
        if not candidates:
            return None
        key, size = candidates[0]
        if protect and admission is not None and admission.is_protected(key):
            raise NotAdmitted(f"the entries eviction would take are in use (first: {key})")
        return key, size

    def _least_recently_used(self, spare: str = "") -> list[tuple[str, int]]:
        """Evictable entries, least recently used first: a batch of them."""
        # diskcache has no public "oldest by access time" query; its Cache table and
        # access_time column are stable across 5.x (pinned in pyproject).
        limit = _LRU_BATCH + len(self._pinned) + 1
        rows = self._index._sql(
            "SELECT key, size FROM Cache ORDER BY access_time LIMIT ?", (limit,)
        ).fetchall()
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
            rows = self._index._sql(
                "SELECT rowid, key, filename, store_time, tag FROM Cache"
                " WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (rowid, limit),
            ).fetchall()
        found = []
        for row, key, filename, stored_at, tag in rows:
            try:
                meta: EntryMeta | None = _meta(tag)
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
        with map_store_errors(f"cannot drop {key}"), self._index.transact():
            # One transaction: a commit of a new version cannot land between check and delete.
            rows = self._index._sql("SELECT filename FROM Cache WHERE key = ?", (key,))
            if [name for (name,) in rows.fetchall()] != [filename]:
                return False
            self._index.delete(key)
        with self._lock:
            self._forget(key)
        return True

    # -- listing (`GET /_/cache`, `shardcache ls`) -----------------------------------------

    def key_range(self, low: str, after: str, high: str, limit: int) -> list[IndexedEntry]:
        """Up to `limit` entries whose cache keys are at least `low`, past `after` and below
        `high`, in key order (the index on `key`: one bounded range scan however large the
        cache). Raises CacheError."""
        with map_store_errors("cannot list the index"):
            rows = self._index._sql(
                "SELECT key, size, store_time, access_time, tag FROM Cache"
                " WHERE key >= ? AND key > ? AND key < ? ORDER BY key LIMIT ?",
                (low, after, high, limit),
            ).fetchall()
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
            rows = self._index._sql("SELECT key, filename, tag FROM Cache ORDER BY rowid")
            listed = rows.fetchall()
        for key, filename, tag in listed:
            try:
                meta: EntryMeta | None = _meta(tag)
            except CacheError:
                meta = None
            yield str(key), self._index_dir / str(filename), meta

    def partial_files(self) -> list[Path]:
        return sorted(self._partial_dir.iterdir()) if self._partial_dir.is_dir() else []

    def index_problems(self, fix: bool) -> list[str]:
        """diskcache's check: rows without files, files without rows, wrong sizes, SQLite's
        integrity check. With `fix`, rows without files and stray files are removed."""
        with map_store_errors("cannot check the index"):
            return self._check_index(fix)

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

    def _check_index(self, fix: bool) -> list[str]:
        # diskcache reports through warnings it records; make sure none is turned into an
        # exception (or silenced) by the caller's warning filters.
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            return [str(w.message) for w in self._index.check(fix=fix)]

    def close(self) -> None:
        with contextlib.suppress(CacheError), self._lock, map_store_errors("cannot close"):
            self._flush_touches()  # the LRU order survives a restart
        with contextlib.suppress(sqlite3.Error):  # the directory may be gone: nothing to keep
            self._index.close()
        os.close(self._lock_fd)


def _never(key: str) -> bool:
    return False


def _meta(tag: object) -> EntryMeta:
    """An entry's metadata from its index tag; CacheError when the tag is not one of ours."""
    try:
        meta = EntryMeta(**json.loads(str(tag)))
    except (ValueError, TypeError) as exc:
        raise CacheError(f"unreadable entry metadata: {exc}") from exc
    text = (str, type(None))
    is_sound = (
        type(meta.size_bytes) is int
        and meta.size_bytes >= 0
        and isinstance(meta.etag, text)
        and isinstance(meta.content_type, text)
        and all(isinstance(v, str) for v in meta.checksum_headers.values())
        and all(isinstance(v, str) for v in meta.digests.values())
        and all(isinstance(v, str) for v in meta.verified_by)
    )
    if not is_sound:
        raise CacheError(f"unreadable entry metadata: {str(tag)[:200]}")
    return meta


def _free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still allocate on `path`'s filesystem."""
    fs = os.statvfs(path)
    return fs.f_bavail * fs.f_frsize
