"""A directory as an origin: a slow shared filesystem (NFS, Lustre) cached onto local disk.

The ETag is derived from mtime and size, so a file rewritten in place during a resumed fill is
detected as OriginChanged. Reads go through aiofiles (a worker thread per read) so a hung NFS
server stalls only that fill, which `fill`'s read timeout then gives up on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat as stat_mode
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aiofiles
import aiofiles.os
from aiofiles.threadpool.binary import AsyncBufferedReader

from shardcache.config import OriginSpec
from shardcache.errors import (
    OriginChanged,
    OriginDenied,
    OriginNotFound,
    OriginUnavailable,
)
from shardcache.keys import join_url
from shardcache.origins.base import CHUNK_BYTES, ObjectInfo


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
        raise OriginUnavailable(f"{path}: {exc.strerror or exc}") from exc


def _info(stat: os.stat_result) -> ObjectInfo:
    return ObjectInfo(
        size_bytes=stat.st_size,
        etag=f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"',
        accepts_ranges=True,
    )


class FileStream:
    def __init__(
        self, info: ObjectInfo, reader: AsyncBufferedReader, path: Path, remaining: int
    ) -> None:
        self.info = info
        self._reader = reader
        self._path = path
        self._remaining = remaining

    async def __aiter__(self) -> AsyncIterator[bytes]:
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

    async def head(self, key: str) -> ObjectInfo:
        path = self._path(key)
        with map_os_errors(path):
            stat = await aiofiles.os.stat(path)
        if not stat_mode.S_ISREG(stat.st_mode):
            raise OriginNotFound(f"{path} is not a regular file")
        return _info(stat)

    async def open(
        self, key: str, start: int = 0, end: int | None = None, if_match: str | None = None
    ) -> FileStream:
        path = self._path(key)
        with map_os_errors(path):
            reader = await aiofiles.open(path, "rb")
            try:
                info = _info(await asyncio.to_thread(os.fstat, reader.fileno()))
                if if_match is not None and info.etag != if_match:
                    raise OriginChanged(f"{path} changed: ETag {info.etag} is not {if_match}")
                if start:
                    await reader.seek(start)
            except BaseException:
                await reader.close()
                raise
        stop = info.size_bytes if end is None else min(end, info.size_bytes)
        return FileStream(info, reader, path, stop - start)

    async def aclose(self) -> None:
        return None
