"""A file origin's keys, listed as S3 lists a bucket: in key order, rolled up at a delimiter, one
bounded page at a time (at most `SCAN_BUDGET` entries read per page). Blocking: the caller runs
it on a worker thread. Nothing outside the root is listed: each directory is opened beneath its
parent without following a link; links and invalid key names are not listed."""

from __future__ import annotations

import os
import stat as stat_mode
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from shardcache.errors import InvalidKey, NotSupported
from shardcache.keys import validate_key
from shardcache.origins.base import ObjectInfo
from shardcache.origins.listing import (
    ListedObject,
    Listing,
    ListQuery,
    rolled_up,
    unwrap_token,
    wrap_token,
)

TOKEN_KIND = "file"
SCAN_BUDGET = 100_000  # directory entries one page may read (it stops between directories)
MAX_DIRECTORY_ENTRIES = 1_000_000  # one directory read whole to sort it: its memory bound
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(slots=True)
class _Walk:
    """What one page's walk has looked at: directory entries read (`scanned`, against the
    budget) and the greatest file name passed (`last_seen`, where a cut-short page resumes)."""

    scanned: int = 0
    last_seen: str = ""

    @property
    def is_spent(self) -> bool:
        """Whether to stop before the next directory: the budget is spent and the page has
        passed at least one name (so the next page starts further on)."""
        return self.scanned >= SCAN_BUDGET and bool(self.last_seen)


def list_directory(
    root: str, query: ListQuery, describe: Callable[[os.stat_result], ObjectInfo]
) -> Listing:
    """One page of the keys under `root` for `query` (`describe` gives a file's ETag).
    Raises NotSupported for a directory too large to read in one go."""
    after = unwrap_token(TOKEN_KIND, query.token) if query.token else query.start_after
    if query.max_keys == 0:
        return Listing()
    walk = _Walk()
    objects: list[ListedObject] = []
    prefixes: list[str] = []
    last = ""
    is_truncated = False
    for name, stat in _keys(root, query.prefix, after, walk):
        common = rolled_up(name, query.prefix, query.delimiter)
        if common is not None and (common == last or common == after):
            continue  # rolled into the prefix answered last (on this page or the one before)
        if len(objects) + len(prefixes) == query.max_keys:
            is_truncated = True
            break
        if common is not None:
            prefixes.append(common)
            last = common
        else:
            info = describe(stat)
            objects.append(ListedObject(name, info.size_bytes, info.etag, info.last_modified))
            last = name
    else:
        if walk.is_spent:  # stopped by the budget, not at the end: resume where it stopped
            is_truncated = True
            if not (prefixes and last == prefixes[-1] and walk.last_seen.startswith(last)):
                last = max(last, walk.last_seen)
    token = wrap_token(TOKEN_KIND, last) if is_truncated else None
    return Listing(tuple(objects), tuple(prefixes), is_truncated, token, last or None)


def _keys(root: str, prefix: str, after: str, walk: _Walk) -> Iterator[tuple[str, os.stat_result]]:
    """The regular files under `root` whose keys start with `prefix` and sort after `after`,
    in key order, with their `stat`; stops before a directory once `walk` is spent."""
    base, _, _ = prefix.rpartition("/")
    if base:
        try:
            validate_key(base)
        except InvalidKey:
            return  # no such directory can be under the root: nothing to list
    try:  # the root itself may be a link the operator configured: only links beneath stop
        fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for part in base.split("/") if base else ():
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # missing, not a directory, or a link: nothing under it
                return
            os.close(fd)
            fd = inner
        yield from _walk(fd, f"{base}/" if base else "", prefix, after, walk)
    finally:
        os.close(fd)


def _entries(fd: int, at: str, walk: _Walk) -> list[tuple[str, os.DirEntry[str]]]:
    """The entries of directory `fd` (keys under `at`), in key order: a directory's name
    with its slash, so that it sorts where its keys do. Read whole, since the order is
    known only then; a directory of more than MAX_DIRECTORY_ENTRIES is refused."""
    entries: list[tuple[str, os.DirEntry[str]]] = []
    with os.scandir(fd) as scan:
        for entry in scan:
            walk.scanned += 1
            if len(entries) == MAX_DIRECTORY_ENTRIES:
                raise NotSupported(
                    f"a directory under {at or 'the root'} holds more than "
                    f"{MAX_DIRECTORY_ENTRIES} entries: too many to list"
                )
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            entries.append((f"{at}{entry.name}/" if is_dir else f"{at}{entry.name}", entry))
    entries.sort(key=lambda pair: pair[0])
    return entries


def _walk(
    fd: int, at: str, prefix: str, after: str, walk: _Walk
) -> Iterator[tuple[str, os.stat_result]]:
    for name, entry in _entries(fd, at, walk):
        if name.endswith("/"):
            if not (name.startswith(prefix) or prefix.startswith(name)):
                continue
            if after >= name and not after.startswith(name):
                continue  # every key in it sorts before the resume point
            if walk.is_spent:
                return
            try:
                inner = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:  # gone, or swapped for a link meanwhile
                continue
            try:
                yield from _walk(inner, name, prefix, after, walk)
            finally:
                os.close(inner)
            if walk.is_spent:
                return
            continue
        if not name.startswith(prefix) or name <= after:
            continue
        walk.last_seen = name
        try:
            validate_key(name)
            stat = entry.stat(follow_symlinks=False)
        except (InvalidKey, OSError):
            continue
        if stat_mode.S_ISREG(stat.st_mode):
            yield name, stat
