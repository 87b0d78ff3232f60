"""The index: diskcache's `Cache` as the store uses it, and the only module that imports
diskcache (its private `_sql` and `_disk` included; `test_index` checks them). No `sqlite3` or
diskcache error leaves as anything but a `CacheError` (`map_store_errors`). Rows read before
are remembered for the event loop; every write forgets the keys it changes. All else blocks."""

from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import sqlite3
import stat
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
from diskcache.core import MODE_BINARY, UNKNOWN

from shardcache.errors import CacheError

log = logging.getLogger("shardcache.store")
WAL_CHECKPOINT_PAGES = 64  # SQLite checkpoints (and truncates) its WAL at this many pages
WAL_ALLOWANCE_BYTES = 512 * 1024  # what the WAL may reach between checkpoints, with slack
# The `Cache` table's columns read or written here with `_sql` (diskcache 5.x; the test of this
# module checks them against `PRAGMA table_info(Cache)`).
COLUMNS_USED = ("key", "store_time", "access_time", "size", "filename", "tag")
REMEMBERED_ROWS = 4096  # rows `get` read or `set` wrote, for `get_remembered` (path and tag)


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


@dataclass(slots=True)
class AdoptFile:
    """A finished partial file for `Index.set` to move into the index tree."""

    path: str
    size_bytes: int
    adopted_as: str | None = None  # the file's path in the index tree, once renamed there


class _AdoptingDisk(diskcache.Disk):  # type: ignore[misc]
    """A diskcache Disk that takes ownership of a finished file by renaming it into the index
    tree, and that hands out raw file descriptors for sendfile instead of file objects."""

    def store(self, value: Any, read: bool, key: Any = UNKNOWN) -> tuple[int, int, str, None]:
        if not isinstance(value, AdoptFile):
            raise TypeError("the shardcache index only adopts finished files")
        filename, full_path = self.filename(key, value)
        if not os.path.isdir(self._directory):  # deleted under us: never recreate it here
            raise FileNotFoundError(errno.ENOENT, "the index directory is gone", self._directory)
        os.makedirs(os.path.dirname(full_path), exist_ok=True)
        os.rename(value.path, full_path)
        value.adopted_as = full_path
        return value.size_bytes, MODE_BINARY, filename, None

    def fetch(self, mode: int, filename: str, value: Any, read: bool) -> int:
        # FileNotFoundError is an IOError, which diskcache's get() treats as a miss.
        return open_entry_file(os.path.join(self._directory, filename))


def open_entry_file(path: str) -> int:
    """A raw descriptor of the entry file at `path`. O_NONBLOCK and the S_ISREG check: a FIFO
    left where an entry's file was would block this open (and the response, and the daemon's
    exit) for ever; it is a miss (FileNotFoundError), refetched, instead."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(errno.ENOENT, "not a regular file", path)
    return fd


class Index:
    """The rows (key, file, size, times, metadata tag) of the entries under `directory`.

    Opening raises sqlite3/diskcache/OS errors: wrap it in `map_store_errors`, as every caller
    of a method here does."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._cache = diskcache.Cache(
            str(directory),
            disk=_AdoptingDisk,
            size_limit=2**62,  # eviction is the store's (reserve), so diskcache never culls
            cull_limit=0,
            # diskcache's LRU policy writes access_time in a transaction on every get: 32
            # concurrent hits then queue on SQLite's write lock. Reads here are lock-free
            # (policy "none"), and the store batches access times and writes them with
            # `write_access_times` in one transaction before each eviction (and at close).
            eviction_policy="none",
            statistics=0,
            # Checkpoint the write-ahead log often and truncate it, so the index's own disk
            # use (counted against the bound) stays small and predictable.
            sqlite_wal_autocheckpoint=WAL_CHECKPOINT_PAGES,
            sqlite_journal_size_limit=WAL_ALLOWANCE_BYTES // 2,
        )
        db = os.stat(directory / "cache.db")
        self.identity = (db.st_dev, db.st_ino)  # to notice the database replaced under us
        # Rows whose file an eviction on a full disk removed but could not delete (key ->
        # filename): dropped at the next write, or at close, once SQLite has room again.
        self._rows_to_drop: dict[str, str] = {}
        # key -> (file path, tag) of rows `get` read since they last changed: every write here
        # forgets its key after it commits (after diskcache removed a replaced file), so a path
        # kept here names the key's current file or one that no longer opens. Worker threads
        # and the event loop use it at once: only single calls of the C OrderedDict (atomic
        # under the GIL), never an iteration another thread's write could break.
        self._remembered: collections.OrderedDict[str, tuple[str, Any]] = collections.OrderedDict()

    def add_access_time_index(self) -> None:
        """Index `access_time`, so that the least recently used rows are one ordered scan."""
        self._cache._sql("CREATE INDEX IF NOT EXISTS Cache_access_time ON Cache (access_time)")

    def __len__(self) -> int:
        return len(self._cache)

    def entry_bytes(self) -> int:
        """The sum of the entries' sizes (diskcache keeps it as a running total)."""
        return int(self._cache.reset("size", update=False))

    # -- reads -------------------------------------------------------------------------------

    def get(self, key: str) -> tuple[int | None, Any]:
        """`key`'s open file descriptor (the caller closes it) and tag, or (None, None)."""
        rows = self._cache._sql("SELECT filename, tag FROM Cache WHERE key = ?", (key,))
        found = rows.fetchall()
        if not found or found[0][0] is None:
            return None, None
        filename, tag = found[0]
        path = os.path.join(self.directory, filename)
        try:
            fd = open_entry_file(path)
        except FileNotFoundError:  # removed after its row (an eviction in progress): a miss
            return None, None
        self._remember(key, path, tag)
        return fd, tag

    def _remember(self, key: str, path: str, tag: Any) -> None:
        if key not in self._remembered and len(self._remembered) >= REMEMBERED_ROWS:
            with contextlib.suppress(KeyError):  # emptied meanwhile (`check`): nothing to drop
                self._remembered.popitem(last=False)  # the oldest
        self._remembered[key] = (path, tag)

    def get_remembered(self, key: str) -> tuple[int, Any] | None:
        """`get` without SQLite, for a row `get` read since it last changed; None: ask `get`.
        Cheap enough for the event loop (a dict and an open), where a hit must not wait for a
        worker thread: 64 KiB hits are counted in requests per second."""
        remembered = self._remembered.get(key)
        if remembered is None:
            return None
        path, tag = remembered
        try:
            return open_entry_file(path), tag
        except OSError:  # its file went (evicted, replaced, the directory deleted)
            self._remembered.pop(key, None)
            return None

    def _forget(self, *keys: str) -> None:
        for key in keys:
            self._remembered.pop(key, None)

    def keys(self) -> list[str]:
        return [str(key) for (key,) in self._cache._sql("SELECT key FROM Cache").fetchall()]

    def rows(self) -> list[tuple[str, str, Any]]:
        """Every row's key, filename and tag, in rowid order."""
        rows = self._cache._sql("SELECT key, filename, tag FROM Cache ORDER BY rowid")
        return [(str(key), str(filename), tag) for key, filename, tag in rows.fetchall()]

    def filename_of(self, key: str) -> str | None:
        rows = self._cache._sql("SELECT filename FROM Cache WHERE key = ?", (key,)).fetchall()
        return str(rows[0][0]) if rows else None

    def tag_of(self, key: str) -> Any | None:
        rows = self._cache._sql("SELECT tag FROM Cache WHERE key = ?", (key,)).fetchall()
        return rows[0][0] if rows else None

    def size_of(self, key: str) -> int | None:
        rows = self._cache._sql("SELECT size FROM Cache WHERE key = ?", (key,)).fetchall()
        return int(rows[0][0]) if rows else None

    def least_recently_used(self, limit: int) -> list[tuple[str, int]]:
        """Up to `limit` (key, size) rows, least recently used first."""
        rows = self._cache._sql(
            "SELECT key, size FROM Cache ORDER BY access_time LIMIT ?", (limit,)
        ).fetchall()
        return [(key, size) for key, size in rows]

    def rows_after(self, rowid: int, limit: int) -> list[tuple[int, str, str, float, Any]]:
        """Up to `limit` (rowid, key, filename, store_time, tag) rows after `rowid`."""
        rows = self._cache._sql(
            "SELECT rowid, key, filename, store_time, tag FROM Cache"
            " WHERE rowid > ? ORDER BY rowid LIMIT ?",
            (rowid, limit),
        ).fetchall()
        return [(row, key, filename, stored, tag) for row, key, filename, stored, tag in rows]

    def key_range(
        self, low: str, after: str, high: str, limit: int
    ) -> list[tuple[str, int, float, float, Any]]:
        """Up to `limit` (key, size, store_time, access_time, tag) rows whose keys are at least
        `low`, past `after` and below `high`, in key order (one bounded scan of the key index)."""
        rows = self._cache._sql(
            "SELECT key, size, store_time, access_time, tag FROM Cache"
            " WHERE key >= ? AND key > ? AND key < ? ORDER BY key LIMIT ?",
            (low, after, high, limit),
        ).fetchall()
        return [(key, size, stored, read, tag) for key, size, stored, read, tag in rows]

    # -- writes ------------------------------------------------------------------------------

    def set(self, key: str, adopt: AdoptFile, tag: str) -> None:
        """Index `adopt`'s file as `key`'s entry (moving it into the index tree), remembered:
        a committed fill's first hit needs no SQLite (the hit lane answers it)."""
        self._drop_rows_left()
        try:
            self._cache.set(key, adopt, tag=tag)
        finally:
            self._forget(key)
        if adopt.adopted_as is not None:  # the row names it now: remembered like `get`'s
            self._remember(key, adopt.adopted_as, tag)

    def delete(self, key: str) -> bool:
        """Remove `key`'s row, then its file; return whether it existed."""
        self._drop_rows_left()
        try:
            return bool(self._cache.delete(key))
        finally:
            self._forget(key)

    def delete_to_free_space(self, key: str) -> bool:
        """`delete`, even on a disk filled to the last block."""
        try:
            return self._delete_to_free_space(key)
        finally:
            self._forget(key)

    def _delete_to_free_space(self, key: str) -> bool:
        try:
            return bool(self._cache.delete(key))
        except sqlite3.OperationalError:
            # A disk filled to the last block (by something else) leaves SQLite no room to
            # write the deletion: free the victim's file first, then delete its row. A row
            # whose file is gone reads as a miss, and start-up drops it if this fails too.
            log.warning(
                "the index cannot record evicting %s (disk full): removing its file first", key
            )
            rows = self._cache._sql("SELECT filename FROM Cache WHERE key = ?", (key,))
            filenames = [name for (name,) in rows.fetchall()]
            for filename in filenames:
                self._cache._disk.remove(filename)
            try:
                return bool(self._cache.delete(key))
            except sqlite3.OperationalError:
                # Still no room (another fill took the freed blocks first): the space is
                # free, the row goes at the next write or at close (a read of it is a miss).
                if filenames:
                    self._rows_to_drop[key] = filenames[0]
                return bool(filenames)

    def _drop_rows_left(self) -> None:
        """Delete the rows `delete_to_free_space` could not, each only if it still names the
        file that was removed (a new fill of the key may have been indexed since)."""
        for key, filename in list(self._rows_to_drop.items()):
            with contextlib.suppress(sqlite3.OperationalError):  # still full: next time
                self.delete_if_file(key, filename)
                del self._rows_to_drop[key]

    def delete_if_file(self, key: str, filename: str) -> bool:
        """Remove `key`'s entry if its file is still `filename`, and return whether it was."""
        with self._cache.transact():
            # One transaction: a commit of a new version cannot land between check and delete.
            rows = self._cache._sql("SELECT filename FROM Cache WHERE key = ?", (key,))
            if [name for (name,) in rows.fetchall()] != [filename]:
                return False
            self._cache.delete(key)
        self._forget(key)
        return True

    def write_access_times(self, touched: dict[str, float]) -> None:
        """Record batched reads (key → `time.time()`) in one transaction."""
        with self._cache.transact():
            for key, at in touched.items():
                self._cache._sql("UPDATE Cache SET access_time = ? WHERE key = ?", (at, key))

    def drop_unindexed(self, adopt: AdoptFile) -> None:
        """After a failed `set`, delete the file if it was moved into the index tree but no
        row names it (an orphan that `du` would count and the index would not)."""
        if adopt.adopted_as is None:
            return
        filename = os.path.relpath(adopt.adopted_as, self.directory)
        with contextlib.suppress(sqlite3.Error, diskcache.Timeout):
            query = "SELECT 1 FROM Cache WHERE filename = ?"
            if self._cache._sql(query, (filename,)).fetchall():
                return  # the row made it after all: the entry is whole
        self._cache._disk.remove(filename)  # the file, then its emptied directories

    # -- checks ------------------------------------------------------------------------------

    def check(self, fix: bool) -> list[str]:
        """diskcache's check: rows without files, files without rows, wrong sizes, SQLite's
        integrity check. With `fix`, rows without files and stray files are removed."""
        # diskcache reports through warnings it records; make sure none is turned into an
        # exception (or silenced) by the caller's warning filters.
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            try:
                return [str(w.message) for w in self._cache.check(fix=fix)]
            finally:
                self._remembered.clear()

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # the directory may be gone: nothing to keep
            self._drop_rows_left()
            self._cache.close()
