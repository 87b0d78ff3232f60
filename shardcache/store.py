"""The on-disk cache: diskcache's index and LRU order over shard files written once, in place.

Layout under the cache dir: `v1/index/` is a diskcache Cache whose custom `Disk` *adopts* a
finished partial file by renaming it into its own tree (one write of each byte, no copy), and
`v1/partial/` holds fills in progress (swept at start-up). An entry is indexed only after its file
is complete, verified by the caller and fsynced; diskcache deletes a file only after the index
change commits, so a crash leaves either a whole entry or an orphan file that `open()` removes.

Space: `reserve(n)` evicts least-recently-used, unpinned entries *before* a fill writes, so the
index plus reservations never exceed `capacity_bytes`. All methods block: callers run them on a
worker thread, one hop per logical operation. This module knows nothing of HTTP or origins.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, UNKNOWN

from shardcache.errors import CacheError

log = logging.getLogger("shardcache.store")
LAYOUT_VERSION = "v1"
_LRU_BATCH = 64
WAL_CHECKPOINT_PAGES = 64  # SQLite checkpoints (and truncates) its WAL at this many pages
WAL_ALLOWANCE_BYTES = 512 * 1024  # what the WAL may reach between checkpoints, with slack
ENTRY_OVERHEAD_BYTES = 8 * 1024  # a file's last partial block and its share of directories


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What the server needs to answer for an entry without asking the origin."""

    size_bytes: int
    etag: str | None = None
    content_type: str | None = None
    checksum_headers: dict[str, str] = field(default_factory=dict)  # verified, re-published


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


@dataclass(frozen=True, slots=True)
class StoreUsage:
    size_bytes: int
    entries: int
    reserved_bytes: int
    capacity_bytes: int


class CacheFull(CacheError):
    """No room can be made: reservations and pinned entries hold the rest of the capacity."""


@dataclass(frozen=True, slots=True)
class _AdoptFile:
    path: str
    size_bytes: int


class _AdoptingDisk(diskcache.Disk):  # type: ignore[misc]
    """A diskcache Disk that takes ownership of a finished file by renaming it into the index
    tree, and that hands out raw file descriptors for sendfile instead of file objects."""

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str, None]:
        if not isinstance(value, _AdoptFile):
            raise TypeError("the shardcache index only adopts finished files")
        filename, full_path = self.filename(key, value)
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        os.rename(value.path, full_path)
        return value.size_bytes, MODE_BINARY, filename, None

    def fetch(self, mode: int, filename: str, value: Any, read: bool) -> int:
        # FileNotFoundError is an IOError, which diskcache's get() treats as a miss.
        return os.open(os.path.join(self._directory, filename), os.O_RDONLY | os.O_CLOEXEC)


class Store:
    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        on_evict: Callable[[str, int, bool], None] | None = None,
    ) -> None:
        """Open (creating) the store; sweep partials; drop index rows and files that disagree.

        `on_evict(key, size_bytes, was_pinned)` is called after each eviction commits.
        Raises CacheError if the directory is unusable or another daemon holds it.
        """
        self.capacity_bytes = capacity_bytes
        self._on_evict = on_evict
        self._lock = threading.Lock()
        self._reserved_bytes = 0
        self._pinned: set[str] = set()
        root = directory / LAYOUT_VERSION
        self._index_dir = root / "index"
        self._partial_dir = root / "partial"
        try:
            self._partial_dir.mkdir(parents=True, exist_ok=True)
            self._index_dir.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CacheError(f"cannot use {directory}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CacheError(f"{directory} is in use by another shardcache daemon") from None
        self.swept_partials = self._sweep_partials()
        self._index = diskcache.Cache(
            str(self._index_dir),
            disk=_AdoptingDisk,
            size_limit=2**62,  # eviction is ours (reserve), so diskcache never culls by itself
            cull_limit=0,
            # diskcache's LRU policy writes access_time in a transaction on every get: 32
            # concurrent hits then queue on SQLite's write lock. Reads here are lock-free
            # (policy "none"), and access times are batched in `_touched` and written in one
            # transaction before each eviction (and at close).
            eviction_policy="none",
            statistics=0,
            # Checkpoint the write-ahead log often and truncate it, so the index's own disk
            # use (counted against the bound) stays small and predictable.
            sqlite_wal_autocheckpoint=WAL_CHECKPOINT_PAGES,
            sqlite_journal_size_limit=WAL_ALLOWANCE_BYTES // 2,
        )
        self._index._sql("CREATE INDEX IF NOT EXISTS Cache_access_time ON Cache (access_time)")
        self._touched: dict[str, float] = {}
        for _ in range(3):  # drop rows without files and files without rows; a fix can
            if not self._check_index(fix=True):  # leave an empty parent dir for the next pass
                break

    # -- reads ---------------------------------------------------------------------------

    def lookup(self, key: str) -> Entry | None:
        """Return the open entry for `key` and mark it used, or None. Caller must close it."""
        fd, tag = self._index.get(key, default=None, read=True, tag=True, retry=True)
        if fd is None:
            return None
        with self._lock:
            self._touched[key] = time.time()
        return Entry(fd, EntryMeta(**json.loads(tag)))

    def peek(self, key: str) -> EntryMeta | None:
        """Return `key`'s metadata without opening it or touching its LRU position."""
        rows = self._index._sql("SELECT tag FROM Cache WHERE key = ?", (key,)).fetchall()
        return EntryMeta(**json.loads(rows[0][0])) if rows else None

    def usage(self) -> StoreUsage:
        return StoreUsage(
            self._used_bytes(), len(self._index), self._reserved_bytes, self.capacity_bytes
        )

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

    def reserve(self, size_bytes: int) -> Reservation:
        """Make room for `size_bytes` by evicting LRU unpinned entries, and open a partial file.

        Raises CacheFull when reservations and pinned entries leave no room; the caller should
        then stream the object through uncached. The caller must `commit()` or `abort()`.
        """
        with self._lock:
            self._evict_until_free(size_bytes)
            self._reserved_bytes += size_bytes
        path = self._partial_dir / uuid.uuid4().hex
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            self._release(size_bytes)
            raise CacheError(f"cannot create a partial file: {exc.strerror or exc}") from exc
        try:
            # Claim the blocks now: a full disk fails the fill before its first byte (the
            # caller streams the object through instead), never halfway through a shard.
            os.posix_fallocate(fd, 0, size_bytes) if size_bytes else None
        except OSError as exc:
            os.close(fd)
            self.abort(Reservation(size_bytes, path, -1))
            raise CacheFull(f"cannot allocate {size_bytes} bytes: {exc.strerror or exc}") from exc
        return Reservation(size_bytes, path, fd)

    def commit(self, reservation: Reservation, key: str, meta: EntryMeta) -> None:
        """Make a complete, verified partial file the entry for `key`.

        fsyncs the data first, so a power loss cannot leave an indexed entry with missing
        bytes. The reservation's fd stays open for readers; the caller closes it.
        """
        try:
            os.fsync(reservation.fd)
            self._index.set(
                key,
                _AdoptFile(str(reservation.path), meta.size_bytes),
                tag=json.dumps(asdict(meta)),
                retry=True,
            )
        except OSError as exc:
            self.abort(reservation)
            raise CacheError(f"cannot commit {key}: {exc.strerror or exc}") from exc
        self._release_reservation(reservation)

    def abort(self, reservation: Reservation) -> None:
        """Discard a fill's partial file and give its space back. Safe to call twice."""
        with contextlib.suppress(FileNotFoundError):  # already committed or swept
            os.unlink(reservation.path)
        self._release_reservation(reservation)

    def _release_reservation(self, reservation: Reservation) -> None:
        if not reservation.is_released:
            reservation.is_released = True
            self._release(reservation.size_bytes)

    def _release(self, size_bytes: int) -> None:
        with self._lock:
            self._reserved_bytes -= size_bytes

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
        """Make `key` an ordinary LRU entry again; return whether it was pinned."""
        was_pinned = key in self._pinned
        self._pinned.discard(key)
        log.debug("unpinned %s (was pinned: %s)", key, was_pinned)
        return was_pinned

    def delete(self, key: str) -> bool:
        """Remove `key`'s entry (its file goes after the index commits); return if it existed."""
        self._pinned.discard(key)
        return bool(self._index.delete(key, retry=True))

    def _flush_touches(self) -> None:
        """Write the batched access times in one transaction (called with self._lock held)."""
        touched, self._touched = self._touched, {}
        if touched:
            with self._index.transact(retry=True):
                for key, at in touched.items():
                    self._index._sql("UPDATE Cache SET access_time = ? WHERE key = ?", (at, key))

    def _evict_until_free(self, size_bytes: int) -> None:
        # Called with self._lock held, so concurrent reservations cannot count the same room.
        if size_bytes + self._reserved_bytes > self.capacity_bytes:
            raise CacheFull(f"no room for {size_bytes} bytes: reservations hold the rest")
        self._flush_touches()
        while self._used_bytes() + self._reserved_bytes + size_bytes > self.capacity_bytes:
            victim = self._least_recently_used()
            if victim is None:
                raise CacheFull(f"no room for {size_bytes} bytes: pinned entries hold the rest")
            key, victim_size = victim
            log.debug("evicting %s (%d bytes) to make room for %d", key, victim_size, size_bytes)
            if self._index.delete(key, retry=True) and self._on_evict is not None:
                self._on_evict(key, victim_size, False)

    def _least_recently_used(self) -> tuple[str, int] | None:
        # diskcache has no public "oldest by access time" query; its Cache table and
        # access_time column are stable across 5.x (pinned in pyproject).
        limit = _LRU_BATCH + len(self._pinned)
        rows = self._index._sql(
            "SELECT key, size FROM Cache ORDER BY access_time LIMIT ?", (limit,)
        ).fetchall()
        return next(((k, s) for k, s in rows if k not in self._pinned), None)

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
        problems = self._check_index(fix=False)
        if self._reserved_bytes == 0:
            problems += [f"stray partial file {p}" for p in self._partial_dir.iterdir()]
        return problems

    def _check_index(self, fix: bool) -> list[str]:
        # diskcache reports through warnings it records; make sure none is turned into an
        # exception (or silenced) by the caller's warning filters.
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            return [str(w.message) for w in self._index.check(fix=fix, retry=True)]

    def close(self) -> None:
        with self._lock:
            self._flush_touches()  # the LRU order survives a restart
        self._index.close()
        os.close(self._lock_fd)
