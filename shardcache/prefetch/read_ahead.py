"""Read-ahead: which keys follow a client's read, and where a numbered run ends.

Where a plan covers the origin, the plans' next keys (never a neighbour no plan names); with no
plan, a guess along the key's numbered run, cut at the first key the origin lacked (`missing`).
Must not know: the queue's lanes, budget, slots, pins or batches, HTTP, the daemon."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable

from shardcache.cache.shard_cache import ShardCache
from shardcache.errors import ShardcacheError
from shardcache.patterns import next_keys
from shardcache.prefetch.missing import MissingKeys


def url_shape(url: str, key: str) -> tuple[str, str] | None:
    """The (prefix, suffix) around `key` in its cache key `url` (an origin's URL, the key as
    is or percent-encoded), or None when the key does not appear in it."""
    for form in (key, urllib.parse.quote(key, safe="/~")):
        at = url.rfind(form)
        if at >= 0:
            return url[:at], url[at + len(form) :]
    return None


def covering(shape: tuple[str, str]) -> Callable[[str], bool]:
    """Whether a cache key has this (prefix, suffix) shape: one origin's key."""
    prefix, suffix = shape
    return lambda url: url.startswith(prefix) and url.endswith(suffix)


class ReadAhead:
    def __init__(
        self, cache: ShardCache, count: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """`count`: the keys read ahead of each read (`--readahead`; below 1: none)."""
        self.cache = cache
        self.count = count
        self._missing = MissingKeys(clock)  # read-ahead keys the origin did not have

    def planned(self, origin: str, key: str) -> list[tuple[str, float]] | None:
        """The (key, seconds until read) pairs the plans read next after `key` of `origin`,
        less those the origin lacked a moment ago, or None when no plan covers the origin (or
        its cache keys cannot be mapped back)."""
        plans = self.cache.store.plans
        if plans is None:
            return None
        try:
            url = self.cache.cache_key(origin, key)[1]
        except ShardcacheError:
            return None
        shape = url_shape(url, key)
        if shape is None:
            return None
        following = plans.read_ahead(url, self.count, covering(shape))
        if following is None:
            return None
        pairs = []
        for planned_url, after_s in following:
            successor = self._key_of(origin, planned_url, shape)
            if successor is not None and not self._missing.has(origin, successor):
                pairs.append((successor, after_s))
        return pairs

    def guessed(self, origin: str, key: str) -> list[str]:
        """The next keys of `key`'s numbered run, up to the first the origin lacked a moment
        ago: the run ends there (`missing`)."""
        successors = []
        for successor in next_keys(key, self.count):
            if self._missing.has(origin, successor):
                break
            successors.append(successor)
        return successors

    def end_run(self, origin: str, key: str) -> set[tuple[str, str]]:
        """A read-ahead key does not exist: remember it, and return the (origin, key) pairs after
        it in the same run, for the queue to drop."""
        self._missing.add(origin, key)
        return {(origin, successor) for successor in next_keys(key, self.count)}

    def _key_of(self, origin: str, url: str, shape: tuple[str, str]) -> str | None:
        """The key of `origin` whose cache key is `url`, or None; checked by building it back."""
        prefix, suffix = shape
        middle = url[len(prefix) : len(url) - len(suffix)]
        for key in dict.fromkeys((middle, urllib.parse.unquote(middle))):
            try:
                if self.cache.cache_key(origin, key)[1] == url:
                    return key
            except ShardcacheError:
                continue
        return None
