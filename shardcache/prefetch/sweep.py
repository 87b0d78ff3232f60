"""The pin sweep: ending the look-ahead pins no loader will read, every SWEEP_EVERY_S and when the
budget starts a wait; by the same rule, which queued look-ahead items to drop unfetched.

The ledger (`pins.PinLedger`) decides; ended pins stay cached, unpinned. Must not know: the
queue's lanes, slots or batches, HTTP, the daemon."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

from shardcache.cache.plans import Reader
from shardcache.cache.shard_cache import ShardCache
from shardcache.errors import ShardcacheError
from shardcache.prefetch.pins import Ending, PinLedger, unwanted
from shardcache.prefetch.read_ahead import covering, url_shape
from shardcache.units import format_size

log = logging.getLogger("shardcache.prefetch")
SWEEP_EVERY_S = 5.0  # pins are checked this often, and at once when the budget starts a wait


class PinSweep:
    def __init__(self, cache: ShardCache, pins: PinLedger) -> None:
        self.cache = cache
        self.pins = pins
        self._wanted = asyncio.Event()
        self.ended: collections.Counter[str] = collections.Counter()  # by why
        self.dropped: collections.Counter[str] = collections.Counter()  # items, by why

    async def unwanted(self, origin: str, key: str, is_readahead: bool) -> Ending | None:
        """Why a queued look-ahead item should not be fetched now, by the rule that ends its
        pin (`pins.unwanted`): fetched, it would be pinned and its pin ended at the next sweep,
        the bytes fetched for nobody. None when a loader will read it, or no plans are kept."""
        plans = self.cache.store.plans
        if plans is None:
            return None
        try:
            _, url = self.cache.cache_key(origin, key)
        except ShardcacheError:
            return None  # its origin went away: the fill says so
        shape = url_shape(url, key)

        def ask() -> tuple[Reader | None, bool]:  # on a worker thread, as the sweep asks
            assert plans is not None
            reader = plans.next_reader(url)
            covered = reader is None and shape is not None and plans.covers(covering(shape))
            return reader, covered

        reader, covered = await asyncio.to_thread(ask)
        return unwanted(reader, covered, is_readahead)

    def wanted_now(self) -> None:
        """Sweep at once (the look-ahead budget starts a wait)."""
        self._wanted.set()

    async def run(self) -> None:
        """End the pins no loader will read: every SWEEP_EVERY_S, and at once when the
        look-ahead budget starts a wait."""
        while True:
            with contextlib.suppress(TimeoutError):  # the period passed: sweep anyway
                async with asyncio.timeout(SWEEP_EVERY_S):
                    await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.sweep()
            except ShardcacheError as exc:  # the plans' lock or the store: try next time
                log.warning("could not check the look-ahead pins: %s", exc)

    async def sweep(self) -> int:
        """End the look-ahead pins whose reader is gone, silent or late (`pins`); they stay
        cached, unpinned, and their budget goes to the items waiting for it. Return the bytes
        released."""
        plans = self.cache.store.plans
        shapes = self.pins.shapes()
        readers: dict[str, Reader | None] = {}
        covered: set[str] = set()

        def ask() -> None:  # on a worker thread: the plans' lock may wait for a large post
            assert plans is not None
            for url, shape in shapes.items():
                readers[url] = reader = plans.next_reader(url)
                if reader is None and shape is not None and plans.covers(covering(shape)):
                    covered.add(url)

        if plans is not None and shapes:
            await asyncio.to_thread(ask)
        ended = self.pins.expired(self.cache.unread.sizes(), readers.get, covered.__contains__)
        if not ended:
            return 0
        released = self.cache.unread.release([url for url, _ in ended])
        why: collections.Counter[Ending] = collections.Counter(reason for _, reason in ended)
        self.ended.update(why)
        log.info(
            "ended %d look-ahead pins no loader is about to read (%s), %s released",
            len(ended),
            ", ".join(f"{count} {reason}" for reason, count in sorted(why.items())),
            format_size(released),
        )
        return released
