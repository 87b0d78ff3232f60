"""What the cache holds for one origin, listed by glob in bounded pages (`GET /_/cache`,
`DELETE /_/cache`; `shardcache ls` and `shardcache purge` page through them).

A page is one range scan of at most SCAN_ROWS index rows, run by the caller on a worker thread,
answered with a cursor. Knows nothing of HTTP; it must not delete (purging is `ShardCache`'s)."""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from shardcache.cache.store import Store
from shardcache.errors import BadRequest, CacheError
from shardcache.origins.base import Origin

MAX_PATTERN_CHARS = 1024  # a glob longer than any key a user would type is refused
MAX_CURSOR_CHARS = 4096  # a key of 1024 bytes, percent-encoded, and an endpoint suffix
MAX_PAGE_ENTRIES = 1000  # entries in one answer
SCAN_ROWS = 4096  # index rows one page may look at (the bound on a request's work)
_MARK = "shardcache-catalog-mark"  # where the key goes in an origin's cache keys
_ABOVE_ALL = "\U0010ffff"  # sorts after any character a key may hold (UTF-8 byte order)


@dataclass(frozen=True, slots=True)
class Listed:
    """One cached entry of an origin: its key at the origin, and what the cache knows of it."""

    key: str
    cache_key: str  # the full origin URL: not shown (it may hold what `redact` hides)
    size_bytes: int
    stored_at: float  # time.time()
    read_at: float  # the last read (the fill that stored it counts as one)
    verified_by: tuple[str, ...]  # "length", "Content-MD5", "etag", "x-amz-checksum-crc32c"…
    pinned_by: tuple[str, ...]  # "look-ahead" (prefetched, unread), "plan" (read again soon)

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        return {
            "key": self.key,
            "size_bytes": self.size_bytes,
            "stored_at": round(self.stored_at, 3),
            "age_s": round(max(0.0, now - self.stored_at), 3),
            "read_at": round(self.read_at, 3),
            "verified_by": list(self.verified_by),
            "pinned_by": list(self.pinned_by),
        }


@dataclass(frozen=True, slots=True)
class Page:
    """Up to a page of matching entries, and where to go on from (None: the end)."""

    entries: list[Listed]
    next: str | None
    scanned: int  # index rows looked at


def compile_pattern(pattern: str) -> re.Pattern[str]:
    """The glob `pattern` (`*`, `?`, `[…]`; `*` matches `/` too) as a regex over keys.
    Raises BadRequest for an empty, overlong or unprintable one."""
    if not pattern or len(pattern) > MAX_PATTERN_CHARS or not pattern.isprintable():
        raise BadRequest(f"a pattern is a glob of 1 to {MAX_PATTERN_CHARS} printable characters")
    try:
        return re.compile(fnmatch.translate(pattern))
    except re.error as exc:  # translate escapes what it cannot read; kept as a backstop
        raise BadRequest(f"cannot read the pattern: {exc}") from None


def check_cursor(after: str) -> str:
    """A `next` cursor as a page returned it; BadRequest for one no page could have made."""
    if len(after) > MAX_CURSOR_CHARS or not after.isprintable():
        raise BadRequest("not a cursor this daemon handed out (take it from 'next')")
    return after


def _literal_prefix(pattern: str) -> str:
    """The part of the glob before its first wildcard: every match starts with it."""
    cut = [i for i in (pattern.find(c) for c in "*?[") if i >= 0]
    return pattern[: min(cut)] if cut else pattern


def _frame(origin: Origin, key_start: str) -> tuple[str, str]:
    """What comes before and after the key in `origin`'s cache keys for keys starting with
    `key_start` (the key is percent-encoded in place for HTTP origins)."""
    url = origin.url_for(key_start + _MARK)
    at = url.rfind(_MARK)
    return url[:at], url[at + len(_MARK) :]


def _key_of(origin: Origin, cache_key: str, base: str, suffix: str) -> str | None:
    """The key at `origin` that `cache_key` is for, or None when it is not one of `origin`'s
    (another origin may share the prefix). Exact: the key must map back to `cache_key`."""
    if not cache_key.endswith(suffix):
        return None
    middle = cache_key[len(base) : len(cache_key) - len(suffix)]
    for key in dict.fromkeys((middle, unquote(middle))):
        if origin.url_for(key) == cache_key:
            return key
    return None


def list_page(
    store: Store,
    origin: Origin,
    pattern: str,
    after: str = "",
    limit: int = MAX_PAGE_ENTRIES,
    with_pins: bool = True,
) -> Page:
    """Entries of `origin` whose keys match the glob `pattern`, after cursor `after`, in
    cache-key order: at most `limit` of them from at most SCAN_ROWS index rows. Blocking (the
    index, the plans' lock): run it on a worker thread. Raises BadRequest, CacheError."""
    matcher = compile_pattern(pattern)
    base, suffix = _frame(origin, "")
    low, _ = _frame(origin, _literal_prefix(pattern))
    if not low.startswith(base):  # a backend that does not encode keys character by character
        low = base
    rows = store.walks.key_range(
        low, base + check_cursor(after) if after else "", low + _ABOVE_ALL, SCAN_ROWS
    )
    entries: list[Listed] = []
    for row in rows:
        key = _key_of(origin, row.key, base, suffix)
        if key is None or not matcher.match(key):
            continue
        try:
            meta = row.meta()
            verified_by = tuple(meta.verified_by)
        except CacheError:
            verified_by = ()  # unreadable metadata: listed (and purgeable) all the same
        pins = tuple(store.walks.pinned_by(row.key)) if with_pins else ()
        entries.append(
            Listed(key, row.key, row.size_bytes, row.stored_at, row.read_at, verified_by, pins)
        )
        if len(entries) == limit:
            return Page(entries, row.key[len(base) :], len(rows))
    more = len(rows) == SCAN_ROWS
    return Page(entries, rows[-1].key[len(base) :] if more else None, len(rows))


def matching_keys(origin: Origin, pattern: str, cache_keys: Iterable[str]) -> dict[str, str]:
    """Of `cache_keys` (fills in flight, say, which the index does not hold yet), those of
    `origin`'s keys that match the glob `pattern`: cache key → key. Raises BadRequest."""
    matcher = compile_pattern(pattern)
    base, suffix = _frame(origin, "")
    found = {}
    for cache_key in cache_keys:
        if not cache_key.startswith(base):
            continue
        key = _key_of(origin, cache_key, base, suffix)
        if key is not None and matcher.match(key):
            found[cache_key] = key
    return found
