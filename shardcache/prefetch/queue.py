"""The prefetch queue: fetch the shards a loader will read next, ahead of it, within a budget.

Earliest deadline first across every loader; client misses never wait here; unread look-ahead
entries are pinned, so later prefetches never evict them; warming pins nothing and takes no
budget. The order, concurrency, read-ahead and warming at length: docs/prefetch.md and
docs/architecture.md."""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardcache.cache.shard_cache import ShardCache
from shardcache.config.options import default
from shardcache.errors import (
    OriginNotFound,
    QueueFull,
    ShardcacheError,
    ShuttingDown,
)
from shardcache.patterns import MAX_EXPANSION
from shardcache.prefetch.backlog import Backlog
from shardcache.prefetch.budget import LookaheadBudget
from shardcache.prefetch.dispatch import Dispatcher
from shardcache.prefetch.lanes import (
    NO_BATCH,
    Batch,
    Item,
    entry_key,
)
from shardcache.prefetch.pins import PinLedger
from shardcache.prefetch.read_ahead import ReadAhead
from shardcache.prefetch.slots import Slots
from shardcache.prefetch.sweep import PinSweep
from shardcache.prefetch.tally import Tally
from shardcache.units import format_size

log = logging.getLogger("shardcache.prefetch")
MAX_PENDING = 2 * MAX_EXPANSION  # queued items at most: each costs memory and a HEAD
FALLBACK_SPACING_S = 1.0  # a key no plan names is needed this long after the one before it
PUSH_BATCH = 4096  # items queued between yields to the event loop


def _in_batch(item: Item, batch_id: int | None) -> bool:
    """Whether `item` is one `clear(batch_id)` drops (every item when `batch_id` is None)."""
    return batch_id is None or (item.batch is not None and item.batch.id == batch_id)


@dataclass(frozen=True, slots=True)
class Submitted:
    queued: int
    cached: int
    in_flight: int
    batch: int


class PrefetchQueue:
    def __init__(
        self,
        cache: ShardCache,
        concurrency: int | None,
        max_unread_bytes: int,
        readahead: int,
        clock: Callable[[], float] = time.monotonic,
        max_pin_s: float | None = None,
    ) -> None:
        """`concurrency`: prefetches at once, or None to let the tuner find it (module doc).
        `max_pin_s`: the longest a look-ahead pin lasts (`pins`; None: the option's default)."""
        self.cache = cache
        self.read_ahead = ReadAhead(cache, readahead, clock)  # what follows a client's read
        self._clock = clock
        self.backlog = Backlog()  # the lanes, the keys queued, the batches
        if max_pin_s is None:
            max_pin_s = float(default("prefetch_pin_max_seconds"))
        self.pins = PinLedger(max_pin_s, clock)  # who holds each look-ahead pin, until when
        self.sweeper = PinSweep(cache, self.pins)  # ends the pins no loader will read
        self.budget = LookaheadBudget(
            cache, max_unread_bytes, self.backlog.lookahead, on_wait=self.sweeper.wanted_now
        )
        self.slots = Slots(concurrency, self._is_saturated, clock)
        self._reserved_pending = 0  # items of POSTs between the bound check and their push
        self._dispatchers: list[asyncio.Task[None]] = []
        self.is_closed = False  # the daemon is stopping: nothing new is queued or started
        self.tally = Tally()  # how the items ended
        # Each item from its lane to its fill's end: sized, admitted, started, followed.
        self.dispatcher = Dispatcher(
            cache,
            self.backlog,
            self.slots,
            self.budget,
            self.pins,
            self._finish_item,
            self.sweeper.unwanted,
        )

    # -- submitting ----------------------------------------------------------------------

    async def submit(self, targets: list[tuple[str, str]], warm: bool = False) -> Submitted:
        """Queue `targets` (origin, key) in order; already cached or queued ones are counted.

        `warm`: fill the cache, nothing pinned and no look-ahead budget (see the module doc).

        The caller validates keys and origins first, so that a bad body queues nothing.
        Raises QueueFull when the queue would hold more than MAX_PENDING items.
        """
        held = self.backlog.pending_count + self._reserved_pending
        if held + len(targets) > MAX_PENDING:
            raise QueueFull(
                f"the prefetch queue holds {held} items; {len(targets)} more "
                f"would pass its bound of {MAX_PENDING}"
            )
        self._reserved_pending += len(targets)  # posts at once must see each other's items
        try:
            return await self._submit(targets, warm)
        finally:
            self._reserved_pending -= len(targets)

    async def _submit(self, targets: list[tuple[str, str]], warm: bool) -> Submitted:
        urls, cached, needed_in_s = await asyncio.to_thread(self._look_up, targets, warm)
        if self.is_closed:  # the daemon began stopping while the index was asked
            raise ShuttingDown("the daemon is shutting down")
        # Counted and known before its first entry is pushed: a dispatcher may take that entry
        # at the first yield below, and finds its batch by id.
        total = len(urls) - sum(map(cached.__contains__, urls))
        batch = self.backlog.new_batch(total, warm)
        lane = self.backlog.warming if warm else self.backlog.lookahead
        queued = in_flight = 0
        now = self._clock()
        for place, ((origin, key), url) in enumerate(zip(targets, urls, strict=True)):
            if place % PUSH_BATCH == PUSH_BATCH - 1:
                await asyncio.sleep(0)  # 100,000 names must not hold the event loop
            if url in cached:
                continue
            if self.cache.flights.get(url) is not None or (origin, key) in self.backlog.queued:
                in_flight += 1
            else:
                queued += 1
            planned = needed_in_s.get(url)
            after_s = planned if planned is not None else (place + 1) * FALLBACK_SPACING_S
            deadline = 0.0 if warm else now + after_s
            self.backlog.push(lane, deadline, origin, key, batch.id, False)
        return Submitted(queued, len(cached), in_flight, batch.id)

    def _look_up(
        self, targets: list[tuple[str, str]], warm: bool
    ) -> tuple[list[str], set[str], dict[str, float]]:
        """(On a worker thread: the index and the plans' lock may take a while, and so may
        100,000 names.) The targets' cache keys, those cached already, and when the plans say
        the others are needed, in seconds from now."""
        urls = [self.cache.cache_key(origin, key)[1] for origin, key in targets]
        cached = {url for url in urls if self.cache.store.peek(url) is not None}
        if warm:
            return urls, cached, {}
        needed = {url: self.cache.store.next_use_s(url) for url in urls if url not in cached}
        return urls, cached, {url: s for url, s in needed.items() if s is not None}

    def on_client_read(self, origin: str, key: str) -> None:
        """Read ahead of a client that read `key`: where a plan covers the origin, the next keys
        of the plans that read it (look-ahead, pinned until read); else the next keys of its
        numbered run, a guess, warmed (cached unpinned, no look-ahead budget)."""
        if self.readahead < 1 or self.backlog.pending_count >= MAX_PENDING or self.is_closed:
            return  # best effort: a full (or closed) queue takes no read-ahead
        planned = self.read_ahead.planned(origin, key)
        if planned is not None:
            now = self._clock()
            for successor, after_s in planned:
                if (origin, successor) not in self.backlog.queued:
                    deadline = now + after_s
                    self.backlog.push(
                        self.backlog.lookahead, deadline, origin, successor, NO_BATCH, True
                    )
            return
        for successor in self.read_ahead.guessed(origin, key):
            if (origin, successor) not in self.backlog.queued:
                # Deadline 0: the warming lane goes in the order things were queued.
                self.backlog.push(self.backlog.warming, 0.0, origin, successor, NO_BATCH, True)

    def clear(self, batch_id: int | None = None) -> tuple[int, int]:
        """Drop every queued item, or those of one batch, including one a dispatcher is sizing
        or holding for budget; release the look-ahead budget their fetched shards hold (they
        stay cached, unpinned). Return (items dropped, bytes released)."""
        dropped = 0
        for lane in self.backlog.lanes:
            entries = lane.keep_only(
                None if batch_id is None else lambda entry: entry[4] != batch_id
            )
            dropped += len(entries)
            self.backlog.forget_entries(entries)
            for start in lane.starting:
                if _in_batch(start.item, batch_id) and start.drop():  # its task lets it go
                    self.backlog.forget(start.item)
                    dropped += 1
        chosen: list[str] | None = None  # every pin
        if batch_id is not None:
            batch = self.backlog.batches.get(batch_id)
            chosen = [] if batch is None else list(batch.pinned)
        self.pins.forget(chosen)
        # Releasing wakes a dispatcher waiting for budget, even when it frees nothing: an item
        # dropped meanwhile stops waiting.
        released = self.cache.unread.release(chosen)
        return dropped, released

    # -- status --------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self.backlog.pending_count + sum(
            not start.is_dropped for lane in self.backlog.lanes for start in lane.starting
        )

    @property
    def room(self) -> int:
        """Items the queue can take now (negative past its bound): an admin post asks before
        parsing a body."""
        return MAX_PENDING - self.backlog.pending_count - self._reserved_pending

    @property
    def max_unread_bytes(self) -> int:
        return self.budget.max_unread_bytes

    @property
    def waiting_for(self) -> str | None:
        """Why look-ahead is not moving, while it is not (the budget's wait), and which jobs
        hold the budget."""
        waiting = self.budget.waiting_for
        if waiting is None:
            return None
        held = self.held_by()
        if not held:
            return waiting
        shown = ", ".join(
            f"{job} {format_size(size)}" for job, size in itertools.islice(held.items(), 4)
        )
        more = f" and {len(held) - 4} more" if len(held) > 4 else ""
        return f"{waiting}; held by {shown}{more}"

    def _is_saturated(self) -> bool:
        """Work waits for a slot (not for the look-ahead budget): the limit holds it back."""
        return self.backlog.pending_count > 0 and self.waiting_for is None

    @property
    def readahead(self) -> int:
        """The keys read ahead of each client read (`--readahead`)."""
        return self.read_ahead.count

    @property
    def completed(self) -> int:
        """Items that ended without an error (`tally`)."""
        return self.tally.completed

    @property
    def failed(self) -> int:
        """Items that failed (`tally`)."""
        return self.tally.failed

    @property
    def in_flight(self) -> int:
        return self.dispatcher.running

    @property
    def limit(self) -> int:
        """Prefetches allowed at once now (the tuner's choice, or the fixed setting)."""
        return self.slots.limit

    def status(self) -> dict[str, object]:
        return {
            "pending": self.depth,
            "in_flight": self.in_flight,
            "done": self.tally.completed,
            "fetched": self.tally.fetched,  # the rest of "done" was cached or fetched by a client
            "waiting_for": self.waiting_for,
            "failed": self.tally.failed,
            "bytes_done": self.tally.bytes_done,
            "unread_bytes": self.cache.unread_bytes,
            "max_unread_bytes": self.max_unread_bytes,
            "concurrency": self.limit,
            "concurrency_mode": "auto" if self.slots.tuner is not None else "fixed",
            "readahead": self.readahead,
            "recent_failures": list(self.tally.recent_failures),
            "held_by": self.held_by(),
            "pins_ended": dict(self.pins_ended),
            "dropped_unwanted": dict(self.dispatcher.dropped_unwanted),
        }

    def held_by(self) -> dict[str, int]:
        """Unread look-ahead bytes by the job holding them (its plan's name; else "batch N",
        or "read-ahead"), largest first."""
        return self.pins.held(self.cache.unread.sizes())

    def batch(self, batch_id: int) -> Batch | None:
        return self.backlog.batches.get(batch_id)

    def batch_status(self, batch_id: int) -> dict[str, object] | None:
        """A batch's progress, with why the queue waits when it does (a look-ahead batch)."""
        batch = self.backlog.batches.get(batch_id)
        if batch is None:
            return None
        document = batch.as_dict()
        document["waiting_for"] = None if batch.is_warming else self.waiting_for
        return document

    # -- running -------------------------------------------------------------------------

    def start(self) -> None:
        self._dispatchers = [
            asyncio.create_task(self.dispatcher.run(lane), name=f"prefetch dispatcher {name}")
            for lane, name in zip(self.backlog.lanes, ("look-ahead", "warming"), strict=True)
        ]
        if self.slots.tuner is not None:
            self._dispatchers.append(asyncio.create_task(self.slots.tune(), name="prefetch tuner"))
        self._dispatchers.append(asyncio.create_task(self.sweeper.run(), name="prefetch pins"))

    async def aclose(self) -> None:
        """Drop what is queued and stop every dispatcher and prefetch: nothing new starts
        (read-ahead of reads still draining included), and the fills only the queue wanted
        are left to the cache to stop. Safe to call twice."""
        self.is_closed = True
        self.clear()
        self.tally.close()
        tasks = [*self._dispatchers, *self.dispatcher.fetches]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- pins ----------------------------------------------------------------------------

    async def sweep_pins(self) -> int:
        """End the look-ahead pins no loader will read now (`sweep.PinSweep.sweep`); return
        the bytes released."""
        return await self.sweeper.sweep()

    @property
    def pins_ended(self) -> collections.Counter[str]:
        """The look-ahead pins the sweep ended, by why."""
        return self.sweeper.ended

    def _finish_item(
        self, item: Item, error: ShardcacheError | None, size_bytes: int, is_fetched: bool
    ) -> None:
        """An item ended: counted (`tally`), or, a read-ahead key the origin lacks, the end of
        its run."""
        self.backlog.queued.discard((item.origin, item.key))
        if isinstance(error, OriginNotFound) and item.is_readahead:
            self._end_of_run(item)
        elif error is not None:
            self.tally.failure(item, error)
        else:
            self.tally.done(item, size_bytes, is_fetched)

    def _end_of_run(self, item: Item) -> None:
        """A read-ahead key does not exist: drop the queued keys after it in the same run."""
        beyond = self.read_ahead.end_run(item.origin, item.key)
        for lane in self.backlog.lanes:  # planned read-ahead is look-ahead; a guess is warmed
            self.backlog.forget_entries(
                lane.keep_only(lambda entry: not (entry[5] and entry_key(entry) in beyond))
            )
        log.debug("read-ahead stops at %s/%s: not at the origin", item.origin, item.key)
