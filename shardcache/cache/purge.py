"""Purging: deleting cached entries, and keeping none of their fills in flight.

A fill in flight finishes for the readers it has without being kept; one already committing
is waited for and its entry deleted like any other; a purged look-ahead prefetch nobody read is
counted as wasted. What this module must not know: how a key becomes a cache key, or which keys
a glob names (`ShardCache.purge` and `catalog` decide what to purge), HTTP.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from shardcache.cache.fill import Fill, FillState
from shardcache.cache.flights import Flights
from shardcache.cache.store import Store
from shardcache.cache.unread import UnreadLedger
from shardcache.errors import CacheError
from shardcache.observer import Observer
from shardcache.origins.base import Origin

log = logging.getLogger("shardcache.cache")


@dataclass(frozen=True, slots=True)
class Purged:
    """What a purge reached: entries deleted, and fills in flight that finish for their
    readers but will not be kept (by cache key)."""

    deleted: list[str]
    not_kept: list[str]


async def purge_entries(
    origin: Origin,
    urls: list[str],
    flights: Flights,
    store: Store,
    unread: UnreadLedger,
    observer: Observer,
) -> Purged:
    """Delete the entries of cache keys `urls` (one worker-thread hop), and let their fills
    in flight finish for the readers they have without keeping them (the next request
    starts a fetch of its own). A reader holding an entry open reads on (its descriptor
    outlives the file's name). Raises CacheError when the cache dir is not writable (the
    entries deleted until then stay deleted).

    The race with a fill's commit, in steps: (1) a fill still fetching is told not to keep
    its body, on the event loop, and cannot commit after; (2) one whose body is complete
    is committing on a worker thread (VERIFIED) and cannot be stopped: the purge waits for
    it and deletes its entry as any other."""
    unread_urls = [url for url in urls if url in unread]
    for url in unread_urls:
        unread.mark_read(url)
        observer.prefetch_wasted(origin.name)
    if unread_urls:
        log.warning(
            "purged %d of origin %s's entries prefetched but never read",
            len(unread_urls),
            origin.name,
        )
    not_kept: list[str] = []
    committing: list[Fill] = []
    for url in urls:
        fill = flights.get(url)
        if fill is None:
            continue
        if fill.do_not_keep():
            flights.detach(fill)
            not_kept.append(url)
        elif fill.state is FillState.VERIFIED:
            committing.append(fill)
    for fill in committing:
        await fill.wait_finished()
    deleted = await asyncio.to_thread(lambda: [url for url in urls if store.delete(url)])
    return Purged(deleted, not_kept)


async def drop_damaged(store: Store, url: str, fd: int) -> bool:
    """Drop the entry of cache key `url` a hit found damaged (short, or failing its block
    check) if it is still the version the hit holds open as `fd`, and return whether it was
    dropped. A fill in flight (the refetch) and a version committed since are left alone; a
    cache dir that cannot be written is a warning (the hit's client sees its failure either
    way). Never raises: an error after a response's headers would be written as its last
    bytes."""
    try:
        return await asyncio.to_thread(store.walks.drop_if_open, url, fd)
    except CacheError as exc:
        store.warnings.warning(log, "drop", "cannot drop damaged %s: %s", url, exc)
        return False
