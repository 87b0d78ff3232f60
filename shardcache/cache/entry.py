"""The cache's values: an entry's metadata and the records the store hands out (an open entry, a
reservation, a listed or scrubbed row, its usage and admission figures), and the store's own
errors. Pure: no I/O but `Entry.close`, no diskcache, nothing of HTTP or origins.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from shardcache.cache.plans import PlanStatus
from shardcache.errors import CacheError


@dataclass(frozen=True, slots=True)
class EntryMeta:
    """What the server needs to answer for an entry without asking the origin."""

    size_bytes: int
    etag: str | None = None
    content_type: str | None = None
    checksum_headers: dict[str, str] = field(default_factory=dict)  # verified, re-published
    digests: dict[str, str] = field(default_factory=dict)  # algorithm → hex, for `verify`
    verified_by: list[str] = field(default_factory=list)  # "length", "Content-MD5", "etag"…
    # The origin's Last-Modified (seconds since the epoch), passed on as a validator; None
    # when the origin gave none, or for an entry committed before it was kept.
    last_modified: float | None = None
    block_crc32c: str = ""  # base64 CRC-32C per 1 MiB block (`blocks`), checked by hits
    # The part size of a composite in `checksum_headers` (every part's but the last), which
    # reading it back as a checksum needs; 0 when there is none, or for an older entry.
    part_bytes: int = 0


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
    is_transient: bool = False  # a look-ahead prefetch's (`cache.transient`)


@dataclass(frozen=True, slots=True)
class StoreUsage:
    """`size_bytes` is what counts against `capacity_bytes`: the entries' bytes
    (`entry_bytes`) plus the index database and per-entry allowances, which an empty cache
    has too; people are shown `entry_bytes`, with the rest as the index's."""

    size_bytes: int
    entries: int
    reserved_bytes: int
    capacity_bytes: int
    entry_bytes: int = 0


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
        return parse_meta(self.tag)


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


def parse_meta(tag: object) -> EntryMeta:
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
        and (meta.last_modified is None or type(meta.last_modified) in (int, float))
        and isinstance(meta.block_crc32c, str)
        and type(meta.part_bytes) is int
        and meta.part_bytes >= 0
    )
    if not is_sound:
        raise CacheError(f"unreadable entry metadata: {str(tag)[:200]}")
    return meta
