"""The cache directory on disk: its layout (`v1/lock`, `v1/index/`, `v1/partial/`), its lock,
partial files (swept at start-up), and its health (still the one opened, writable, not full).
Knows nothing of entries, eviction, HTTP or origins. All methods block."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import uuid
from pathlib import Path
from typing import Final

from shardcache.cache.index import WAL_ALLOWANCE_BYTES
from shardcache.errors import CacheError, CacheInUse

log = logging.getLogger("shardcache.store")
LAYOUT_VERSION = "v1"
FILESYSTEM_FULL_BYTES = WAL_ALLOWANCE_BYTES // 2  # less free than this: the index cannot grow
REPLACED: Final = "replaced"  # `index_problem`: the index database is another file now


class CacheDirectory:
    def __init__(self, path: Path, repair: bool) -> None:
        """Name the layout under `path`. With `repair=False` (`shardcache verify`'s look at a
        directory), raise CacheError unless a shardcache cache is there already."""
        self.path = path
        self.root = path / LAYOUT_VERSION
        self.index_dir = self.root / "index"
        self.partial_dir = self.root / "partial"
        self._lock_fd = -1
        self._device = -1  # `remember_device`
        self._unlink_later: set[Path] = set()  # partial files a read-only dir kept
        if not repair and not path.is_dir():
            raise CacheError(f"{path} does not exist or is not a directory")
        if not repair and not all(
            file.is_file() for file in (self.index_dir / "cache.db", self.root / "lock")
        ):
            raise CacheError(f"{path} holds no shardcache cache")

    def lock(self, repair: bool) -> None:
        """Take the directory's lock (again, after it was replaced), creating the layout when
        `repair`. Raises CacheInUse when another daemon holds it, CacheError when unusable."""
        try:
            if repair:
                self.partial_dir.mkdir(parents=True, exist_ok=True)
                self.index_dir.mkdir(parents=True, exist_ok=True)
            create = os.O_CREAT if repair else 0  # `verify` never writes into a stranger's dir
            lock_fd = os.open(self.root / "lock", os.O_RDWR | create | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CacheError(f"cannot use {self.path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise CacheInUse(f"{self.path} is in use by another shardcache daemon") from None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
        self._lock_fd = lock_fd

    def remember_device(self) -> None:
        """Note the filesystem the directory is on now (an unmount shows as another one)."""
        self._device = os.stat(self.path).st_dev

    # -- partial files -----------------------------------------------------------------------

    def sweep_partials(self) -> int:
        """Delete every partial file: they are fills a crash or kill interrupted."""
        count = 0
        for path in self.partial_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                count += 1
        return count

    def new_partial(self) -> tuple[Path, int]:
        """Create a partial file; return its path and a read-write descriptor. Raises OSError."""
        path = self.partial_dir / uuid.uuid4().hex
        return path, os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)

    def remove_partial(self, path: Path) -> None:
        """Remove a partial file now, or (a read-only directory) at the next health check."""
        try:
            os.unlink(path)
        except FileNotFoundError:  # already committed or swept
            pass
        except OSError as exc:
            log.warning("cannot remove %s now (%s); will retry", path, exc.strerror)
            self._unlink_later.add(path)

    def partial_files(self) -> list[Path]:
        return sorted(self.partial_dir.iterdir()) if self.partial_dir.is_dir() else []

    # -- health ------------------------------------------------------------------------------

    def index_bytes(self) -> int:
        """The index database's files as `du` counts them, the write-ahead log at least at the
        size it may grow to before its next checkpoint."""
        total = 0
        for name, allowance in (
            ("cache.db", 0),
            ("cache.db-wal", WAL_ALLOWANCE_BYTES),
            ("cache.db-shm", 0),
        ):
            with contextlib.suppress(FileNotFoundError):  # WAL files come and go
                total += max(allowance, os.stat(self.index_dir / name).st_size)
        return total

    def free_bytes(self) -> int:
        """Bytes an unprivileged writer may still allocate on the directory's filesystem."""
        fs = os.statvfs(self.root)
        return fs.f_bavail * fs.f_frsize

    def index_problem(self, identity: tuple[int, int]) -> str | None:
        """None when the index database is still the file opened as `identity` (device,
        inode); REPLACED when the directory was deleted and is back (or its index is gone),
        on the filesystem it was on at start, so the store may reopen it; else why not."""
        try:
            db = os.stat(self.index_dir / "cache.db")
            if (db.st_dev, db.st_ino) == identity:
                return None
        except FileNotFoundError:
            pass
        except OSError as exc:
            return f"cache dir {self.path}: {exc.strerror or exc}"
        try:
            device = os.stat(self.path).st_dev
        except OSError:
            return f"cache dir {self.path} is missing"
        if device != self._device:
            # Unmounted: recreating the cache on the filesystem underneath would fill a disk
            # nobody sized for it.
            return (
                f"cache dir {self.path} is on another filesystem than at start "
                "(unmounted?); mount it back, or restart to use it where it is"
            )
        return REPLACED

    def usage_problem(self) -> str | None:
        """Why fills cannot be written now (read-only, full), or None; retries the removal of
        partial files a read-only directory kept."""
        for path in (self.index_dir, self.partial_dir):
            if not os.access(path, os.W_OK):
                return f"cache dir {path} is not writable"
        with contextlib.suppress(OSError):
            if (free := self.free_bytes()) < FILESYSTEM_FULL_BYTES:
                return f"the filesystem under {self.path} is full ({free} bytes free)"
        for path in list(self._unlink_later):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self._unlink_later.discard(path)
        return None

    def close(self) -> None:
        os.close(self._lock_fd)
