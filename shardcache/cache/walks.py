"""The store's walks: reading the index whole (the scrub's rowid walk, listing's key ranges,
`shardcache verify`'s every entry) rather than one key at a time. All block: callers run them
on a worker thread. Must not know: space, reservations and commit (`store`), which entry
eviction takes (`evictor`, the policies), HTTP."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from shardcache.cache.directory import CacheDirectory
from shardcache.cache.entry import EntryMeta, IndexedEntry, StoredEntry, parse_meta
from shardcache.cache.eviction import EvictionPolicy
from shardcache.cache.evictor import Evictor
from shardcache.cache.index import Index, map_store_errors
from shardcache.errors import CacheError


class Walks:
    def __init__(
        self,
        index: Callable[[], Index],
        directory: CacheDirectory,
        evictor: Evictor,
        lock: threading.Lock,
        policy: EvictionPolicy,
    ) -> None:
        """`index`: the store's index now (it is opened again when the directory is replaced);
        `lock`: the store's, held while the evictor's books change; `policy`: the store's
        eviction policy, asked when a plan reads a key next."""
        self._index = index
        self._dir = directory
        self._evictor = evictor
        self._lock = lock
        self._policy = policy

    # -- the online scrub (`shardcache.cache.scrub`) ----------------------------------------------

    def entries_after(self, rowid: int, limit: int) -> list[StoredEntry]:
        """Up to `limit` entries after `rowid`, in index (rowid) order: a stable walk in which
        a re-filled key keeps its place (diskcache updates its row). Raises CacheError."""
        with map_store_errors("cannot list the index"):
            rows = self._index().rows_after(rowid, limit)
        found = []
        for row, key, filename, stored_at, tag in rows:
            try:
                meta: EntryMeta | None = parse_meta(tag)
            except CacheError:
                meta = None
            path = self._dir.index_dir / str(filename)
            found.append(StoredEntry(row, str(key), str(filename), path, stored_at, meta))
        return found

    def drop_if_unchanged(self, key: str, filename: str) -> bool:
        """Remove `key`'s entry if it is still the version stored in `filename`, and return
        whether it was removed: a version committed since (a re-fill) is never dropped for
        damage found in the one before. Raises CacheError, the entry untouched."""
        if not os.access(self._dir.index_dir, os.W_OK):
            raise CacheError(f"cannot drop {key}: cache dir {self._dir.index_dir} is not writable")
        with map_store_errors(f"cannot drop {key}"):
            if not self._index().delete_if_file(key, filename):
                return False
        with self._lock:
            self._evictor.forget(key)
        return True

    def drop_if_open(self, key: str, fd: int) -> bool:
        """Remove `key`'s entry if its file is the one open as `fd` (a hit's), and return
        whether it was removed: a reader of a version dropped and refetched meanwhile must not
        drop the new one for damage in its own. Raises CacheError, the entry untouched."""
        with map_store_errors(f"cannot look up {key}"):
            filename = self._index().filename_of(key)
        if filename is None:
            return False
        try:
            same = os.path.samestat(os.stat(self._dir.index_dir / filename), os.fstat(fd))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise CacheError(f"cannot drop {key}: {exc}") from exc
        return same and self.drop_if_unchanged(key, filename)

    # -- listing (`GET /_/cache`, `shardcache ls`) -----------------------------------------

    def key_range(self, low: str, after: str, high: str, limit: int) -> list[IndexedEntry]:
        """Up to `limit` entries whose cache keys are at least `low`, past `after` and below
        `high`, in key order (the index on `key`: one bounded range scan however large the
        cache). Raises CacheError."""
        with map_store_errors("cannot list the index"):
            rows = self._index().key_range(low, after, high, limit)
        touched = self._evictor.pending_touches()  # reads not yet flushed to access_time
        return [
            IndexedEntry(str(key), int(size), stored, max(read, touched.get(key, 0.0)), str(tag))
            for key, size, stored, read, tag in rows
        ]

    def pinned_by(self, key: str) -> list[str]:
        """Why eviction spares `key`: "look-ahead" (prefetched, unread) and/or "plan" (a loader's
        plan reads it again). Takes the plans' lock: call it from a worker thread."""
        reasons = ["look-ahead"] if self._evictor.is_pinned(key) else []
        return reasons + (["plan"] if self._policy.next_use_s(key) is not None else [])

    # -- offline checks (`shardcache verify`) --------------------------------------------------

    def entries(self) -> Iterator[tuple[str, Path, EntryMeta | None]]:
        """Every indexed entry: key, file path, metadata (None when unreadable)."""
        with map_store_errors("cannot list the index"):
            listed = self._index().rows()
        for key, filename, tag in listed:
            try:
                meta: EntryMeta | None = parse_meta(tag)
            except CacheError:
                meta = None
            yield str(key), self._dir.index_dir / str(filename), meta

    def partial_files(self) -> list[Path]:
        return self._dir.partial_files()

    def index_problems(self, fix: bool) -> list[str]:
        """diskcache's check: rows without files, files without rows, wrong sizes, SQLite's
        integrity check. With `fix`, rows without files and stray files are removed."""
        with map_store_errors("cannot check the index"):
            return self._index().check(fix)
