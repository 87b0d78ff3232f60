"""The unread prefetches: look-ahead entries no client has read yet, cache key → size.

Each is pinned in the store (not evictable) from the moment its prefetch is admitted until a
client reads it, or the prefetch queue releases it; their sizes are what the look-ahead budget
counts, and `changed` wakes the queue's budget when they shrink. What this module must not know:
the prefetch queue's order or budget (it only reads these figures), fills, the origins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from shardcache.cache.store import Store


class Unread:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._sizes: dict[str, int] = {}
        self.changed = asyncio.Event()  # set whenever an entry is read or released

    def __contains__(self, url: str) -> bool:
        return url in self._sizes

    def add(self, url: str, size_bytes: int) -> None:
        """A look-ahead prefetch of `url` was admitted: pin it until it is read."""
        self._sizes[url] = size_bytes
        self.store.pin(url)

    @property
    def total_bytes(self) -> int:
        return sum(self._sizes.values())

    def sizes(self) -> dict[str, int]:
        """Prefetched entries no client has read yet, cache key → size (a copy)."""
        return dict(self._sizes)

    def release(self, urls: Iterable[str] | None = None) -> int:
        """Unpin prefetched-but-unread entries, all or those of `urls` (they stay cached, as
        ordinary entries), freeing the look-ahead budget they held; return the bytes released."""
        chosen = list(self._sizes) if urls is None else [u for u in urls if u in self._sizes]
        released = sum(self._sizes[url] for url in chosen)
        for url in chosen:
            self.mark_read(url)
        return released

    def mark_read(self, url: str) -> None:
        """A prefetched entry was read (or dropped): unpin it, free its look-ahead budget."""
        self._sizes.pop(url, None)
        self.store.unpin(url)  # a set operation under an uncontended lock
        self.changed.set()
