"""The dispatchers: each prefetch from its lane to its fill's end (size, budget, start, pin,
follow, say how it ended), one dispatcher per lane, one task per item.

Must not know: the order items are queued in or why (`queue`, `backlog`), how an ending is
counted (the queue's `finish`), HTTP."""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable

from shardcache.cache.fill import Fill
from shardcache.cache.shard_cache import PrefetchOutcome, ShardCache, Sized
from shardcache.errors import CacheError, ShardcacheError
from shardcache.prefetch.backlog import Backlog
from shardcache.prefetch.budget import LookaheadBudget
from shardcache.prefetch.item_state import ItemState
from shardcache.prefetch.lanes import Item, Lane, Start
from shardcache.prefetch.pins import READ_AHEAD, Ending, PinLedger
from shardcache.prefetch.read_ahead import url_shape
from shardcache.prefetch.slots import Slots

log = logging.getLogger("shardcache.prefetch")
# How an item ended: (item, its error or None, bytes the prefetch fetched, whether it fetched).
Finish = Callable[[Item, ShardcacheError | None, int, bool], None]
# Why a queued look-ahead item no loader will read should be dropped (origin, key, read-ahead).
Unwanted = Callable[[str, str, bool], Awaitable[Ending | None]]


class Dispatcher:
    def __init__(
        self,
        cache: ShardCache,
        backlog: Backlog,
        slots: Slots,
        budget: LookaheadBudget,
        pins: PinLedger,
        finish: Finish,
        unwanted: Unwanted | None = None,
    ) -> None:
        """`unwanted(origin, key, is_readahead)`: why a look-ahead item no loader will read
        should be dropped unfetched (`sweep.PinSweep.unwanted`), asked before it is sized and
        again once admitted (a budget wait can be long)."""
        self.cache = cache
        self._unwanted = unwanted
        self.dropped_unwanted: collections.Counter[str] = collections.Counter()  # by why
        self.backlog = backlog
        self.slots = slots
        self.budget = budget
        self.pins = pins
        self._finish = finish
        self.running = 0  # admitted and fetching
        self.fetches: set[asyncio.Task[None]] = set()

    async def _next(self, lane: Lane) -> Item:
        """The lane's earliest item, once there is one and a slot for it: a lane with nothing
        to do holds no slot, and the item is chosen when the slot is free, so that one posted
        meanwhile with an earlier deadline goes first."""
        while True:
            while not lane.pending:
                lane.has_work.clear()
                await lane.has_work.wait()
            await self.slots.acquire(lane)
            if lane.pending:  # still: a clear() may have emptied the lane meanwhile
                return self.backlog.item(lane.pop())
            self.slots.release(lane)

    async def run(self, lane: Lane) -> None:
        """Take one lane's items in its order, each once there is a free slot (the lane's own),
        and start each in a task of its own: size the object (HEAD), wait for
        look-ahead budget, start the fill, follow it (`_size_admit_start`). Sizing is a round
        trip to the origin; one at a time, it would bound the queue to a few dozen shards a
        second."""
        while True:
            item = await self._next(lane)
            start = Start(item)
            lane.starting[start] = None
            task = asyncio.create_task(self._start(lane, start))
            self.fetches.add(task)
            task.add_done_callback(self.fetches.discard)

    async def _start(self, lane: Lane, start: Start) -> None:
        """Size, admit and start one item, then follow its fill; it holds a slot throughout
        (except a fill someone else started, which it follows without one). An item dropped
        meanwhile is let go, uncounted."""
        item = start.item
        try:
            started = await self._size_admit_start(lane, start)
        except ShardcacheError as exc:
            self._end(start, exc)
            self.slots.release(lane)
            return
        except Exception as exc:  # a bug, or an origin answer a parser choked on: this item
            log.exception("prefetch of /%s/%s crashed", item.origin, item.key)
            self._end(start, CacheError(f"internal error while prefetching: {exc}"))
            self.slots.release(lane)
            return
        finally:
            lane.starting.pop(start, None)
            self.cache.unread.let_go(start.hold)  # pinned now, or never will be
        if started is None:  # dropped on the way, before its fill started
            self.slots.release(lane)
            return
        outcome, fill = started
        if fill is None:
            if outcome is PrefetchOutcome.NOT_ADMITTED and item.batch is not None:
                item.batch.not_cached += 1
            self._end(start, None)
            self.slots.release(lane)
            return
        if start.is_dropped:  # cleared while it started: it may fill, but pins nothing
            self.cache.unread.release([fill.cache_key])
        else:
            start.move(ItemState.STARTED)
        if not start.is_dropped and not lane.is_warming and outcome is PrefetchOutcome.FETCHED:
            holder = READ_AHEAD if item.batch is None else f"batch {item.batch.id}"
            self.pins.add(fill.cache_key, holder, url_shape(fill.cache_key, item.key))
            if item.batch is not None:
                item.batch.pinned.add(fill.cache_key)
        holds_slot = outcome is not PrefetchOutcome.JOINED
        if not holds_slot:  # a client (or another item) is fetching it: its slot, not ours
            self.slots.release(lane)
        await self._follow(lane, start, fill, outcome, holds_slot)

    async def _size_admit_start(
        self, lane: Lane, start: Start
    ) -> tuple[PrefetchOutcome, Fill | None] | None:
        """The item's three steps, driven from here: size it (`ShardCache.size_prefetch`),
        admit it to the look-ahead budget (warming needs none, it pins nothing), start its
        fill (`start_prefetch`). None when it was dropped before its fill started: while it
        was sized or waited for budget, or found unwanted before either."""
        item = start.item
        if await self._dropped_unwanted(lane, start):
            return None
        sized = await self.cache.size_prefetch(item.origin, item.key)
        if not isinstance(sized, Sized):  # cached, or a fill in flight joined
            return sized
        if not lane.is_warming:
            await self.budget.admit(start, sized.info.size_bytes)
            if not start.is_dropped and await self._dropped_unwanted(lane, start):
                return None
        if start.is_dropped:
            return None
        if lane.is_warming:
            start.move(ItemState.ADMITTED)  # no budget to wait for
        return await self.cache.start_prefetch(sized, start.hold, pin=not lane.is_warming)

    async def _dropped_unwanted(self, lane: Lane, start: Start) -> bool:
        """Drop a look-ahead item no loader will read any more (its job ended, went quiet,
        or posted a plan without it), and say so: fetched, it would only be pinned for nobody
        and its pin ended at the next sweep. False for one dropped already (by `clear`)."""
        item = start.item
        if lane.is_warming or self._unwanted is None or start.is_dropped:
            return False
        why = await self._unwanted(item.origin, item.key, item.is_readahead)
        if why is None or not start.drop():  # or dropped meanwhile (by `clear`)
            return False
        self.backlog.forget(item)
        self.dropped_unwanted[why] += 1
        return True

    async def _follow(
        self,
        lane: Lane,
        start: Start,
        fill: Fill,
        outcome: PrefetchOutcome,
        holds_slot: bool,
    ) -> None:
        """Wait for a started item's fill and count its outcome (not a dropped item's: one
        dropped while its fill started is followed for its slot only)."""
        item = start.item
        self.running += 1
        counted = self.slots.follow(fill)
        try:
            outcome = await self.cache.finish_prefetch(fill, outcome)
        except ShardcacheError as exc:
            self._end(start, exc)
        else:
            if start.is_dropped:
                return
            is_fetched = outcome is PrefetchOutcome.FETCHED
            size = fill.info.size_bytes if fill.info and is_fetched else 0
            if outcome is PrefetchOutcome.TOO_LARGE and item.batch is not None:
                item.batch.not_cached += 1
            self._end(start, None, size, is_fetched)
        finally:
            self.running -= 1
            if counted:
                self.slots.unfollow(fill)
            if holds_slot:
                self.slots.release(lane)

    def _end(
        self,
        start: Start,
        error: ShardcacheError | None,
        size_bytes: int = 0,
        is_fetched: bool = False,
    ) -> None:
        """`start`'s item ended: count it once (`finish`), unless it was dropped."""
        if start.is_dropped:
            return
        start.move(ItemState.ENDED)
        self._finish(start.item, error, size_bytes, is_fetched)
