"""A directory as an origin: a slow shared filesystem (NFS, Lustre) cached onto local disk.

The ETag is derived from mtime and size (a file rewritten mid-fill is OriginChanged); reads run
on worker threads, so a hung server stalls only that fill. Nothing outside the root is ever
served: links leading out read as missing, and files are opened beneath it (`open_beneath`)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat as stat_mode
from collections.abc import AsyncIterator, Iterator
from io import BufferedReader
from pathlib import Path
from urllib.parse import unquote, urlsplit

from aiofiles.threadpool.binary import AsyncBufferedReader

from shardcache.config import OriginSpec
from shardcache.errors import (
    OriginChanged,
    OriginDenied,
    OriginNotFound,
    OriginUnavailable,
)
from shardcache.keys import join_url
from shardcache.origins.base import (
    CHUNK_BYTES,
    NEW_REQUEST,
    ObjectInfo,
    RequestContext,
)
from shardcache.origins.file_listing import list_directory
from shardcache.origins.listing import Listing, ListQuery
from shardcache.origins.streams import ChunkStream

# O_NOFOLLOW on every component: a component that became a link since `realpath` fails (ELOOP)
# instead of being followed. O_NONBLOCK: opening a FIFO must not hang a worker thread (regular
# files ignore it); O_DIRECTORY: a file where a directory was is refused.
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@contextlib.contextmanager
def map_os_errors(path: Path) -> Iterator[None]:
    """Translate OSError for `path` into OriginError subclasses."""
    try:
        yield
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise OriginNotFound(f"{path} does not exist") from None
    except PermissionError as exc:
        raise OriginDenied(f"{path}: permission denied") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link loop, or a link swapped in under open_beneath
            raise OriginNotFound(f"{path} does not exist") from None
        if exc.errno == errno.ENAMETOOLONG:  # permanent: no such file can exist
            raise OriginNotFound(f"{path}: file name too long") from None
        raise OriginUnavailable(f"{path}: {exc.strerror or exc}") from exc


def _info(stat: os.stat_result) -> ObjectInfo:
    return ObjectInfo(
        size_bytes=stat.st_size,
        etag=f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"',
        accepts_ranges=True,
        last_modified=stat.st_mtime,
    )


def resolve_inside(root: Path, key: str) -> tuple[str, str] | None:
    """Return (real root, real path of `root/key`), or None when the real path is not strictly
    inside the real root. Blocking (one lstat per component): call it in a worker thread."""
    real_root = os.path.realpath(root)
    # Not strict: a missing or unreadable component must not tell an outside path's existence
    # apart from a missing key; open_beneath reports what is missing inside the root.
    real = os.path.realpath(os.path.join(real_root, key))
    if real == real_root or os.path.commonpath((real_root, real)) != real_root:
        return None
    return real_root, real


def open_beneath(real_root: str, real: str) -> int:
    """Open `real` (a path `resolve_inside` returned) read-only by walking down from `real_root`
    one component at a time without following any link; return the file descriptor.

    The race this closes, with only a check of the real path:
      1. resolve_inside("d/f") finds ROOT/d/f, a plain file inside the root;
      2. a writer to the root replaces directory ROOT/d with a link to /etc;
      3. open("ROOT/d/f") would follow it. Here the open of component "d" fails with ELOOP.
    Raises OSError (ELOOP, ENOTDIR, ENOENT…); the caller must close the descriptor.
    """
    parts = os.path.relpath(real, real_root).split(os.sep)
    directory = os.open(real_root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _DIR_FLAGS, dir_fd=directory)
            os.close(directory)
            directory = inner
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
    finally:
        os.close(directory)


def _open_regular(root: Path, key: str, path: Path) -> tuple[int, os.stat_result]:
    """Open the regular file `root/key` without leaving the root; return (fd, its fstat).

    Raises OriginNotFound alike for a missing key, one that is not a regular file and one
    that leads outside the root, so that an answer never reveals what exists outside."""
    resolved = resolve_inside(root, key)
    if resolved is None:
        raise OriginNotFound(f"{path} does not exist")
    with map_os_errors(path):
        fd = open_beneath(*resolved)
    try:
        stat = os.fstat(fd)
        if not stat_mode.S_ISREG(stat.st_mode):
            raise OriginNotFound(f"{path} is not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, stat


class FileStream(ChunkStream):
    def __init__(
        self, info: ObjectInfo, reader: AsyncBufferedReader, path: Path, remaining: int
    ) -> None:
        self.info = info
        self._reader = reader
        self._path = path
        self._remaining = remaining

    async def chunks(self) -> AsyncIterator[bytes]:
        with map_os_errors(self._path):
            while self._remaining > 0:
                chunk = await self._reader.read(min(CHUNK_BYTES, self._remaining))
                if not chunk:
                    return
                self._remaining -= len(chunk)
                yield chunk

    async def aclose(self) -> None:
        await self._reader.close()


class FileOrigin:
    def __init__(self, spec: OriginSpec) -> None:
        self.name = spec.name
        self.root = Path(unquote(urlsplit(spec.url).path))
        self._base_url = f"file://{self.root}"

    def url_for(self, key: str) -> str:
        return join_url(self._base_url, key)

    def _path(self, key: str) -> Path:
        return self.root / key  # keys are validated: no '..', no empty segments

    def _stat(self, key: str) -> os.stat_result:
        fd, stat = _open_regular(self.root, key, self._path(key))
        os.close(fd)
        return stat

    async def head(self, key: str, *, context: RequestContext = NEW_REQUEST) -> ObjectInfo:
        return _info(await asyncio.to_thread(self._stat, key))

    def _open(
        self, key: str, start: int, if_match: str | None
    ) -> tuple[ObjectInfo, BufferedReader]:
        path = self._path(key)
        fd, stat = _open_regular(self.root, key, path)
        try:
            file = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        try:  # the file owns the descriptor from here
            info = _info(stat)
            if if_match is not None and info.etag != if_match:
                raise OriginChanged(f"{path} changed: ETag {info.etag} is not {if_match}")
            with map_os_errors(path):
                file.seek(start)
        except BaseException:
            file.close()
            raise
        return info, file

    async def open(
        self,
        key: str,
        start: int = 0,
        end: int | None = None,
        if_match: str | None = None,
        *,
        context: RequestContext = NEW_REQUEST,
    ) -> FileStream:
        info, file = await asyncio.to_thread(self._open, key, start, if_match)
        reader = AsyncBufferedReader(file, loop=asyncio.get_running_loop(), executor=None)
        stop = info.size_bytes if end is None else min(end, info.size_bytes)
        return FileStream(info, reader, self._path(key), stop - start)

    async def list_objects(self, query: ListQuery) -> Listing:
        """One page of the keys under the root (`file_listing`), on a worker thread."""
        return await asyncio.to_thread(list_directory, str(self.root), query, _info)

    async def aclose(self) -> None:
        return None
