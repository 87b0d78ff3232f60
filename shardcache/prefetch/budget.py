"""The look-ahead budget: how many prefetched, unread bytes the queue may have ahead of loaders.

A look-ahead item starts only once its size fits `max_unread_bytes` on top of what the cache's
unread ledger holds and pins, in the queue's order. It owns the rule and the wait's reason, not
the bytes (`cache.unread`); it knows nothing of dispatchers, slots or warming."""

from __future__ import annotations

import logging
from collections.abc import Callable

from shardcache.cache.shard_cache import ShardCache
from shardcache.prefetch.item_state import ItemState
from shardcache.prefetch.lanes import Lane, Start
from shardcache.units import format_size

log = logging.getLogger("shardcache.prefetch")


class LookaheadBudget:
    def __init__(
        self,
        cache: ShardCache,
        max_unread_bytes: int,
        lane: Lane,
        on_wait: Callable[[], None] = lambda: None,
    ) -> None:
        """`lane`: the look-ahead lane, whose `starting` items are admitted in order.
        `on_wait()`: called when an item starts waiting (the queue then ends the pins no
        loader will read, `pins`)."""
        self.cache = cache
        self._on_wait = on_wait
        self.max_unread_bytes = max_unread_bytes
        self._lane = lane
        self._largest_sized = 0  # the largest look-ahead shard sized so far: a guess for others
        self._said_waiting = False  # a wait for the budget is logged once
        self.waiters = 0  # items waiting for the budget now
        self.waiting_for: str | None = None  # why look-ahead is not moving, while it is not

    @property
    def admitted_bytes(self) -> int:
        """Held by items admitted and not pinned yet (the ledger's holds)."""
        return self.cache.unread.held_bytes

    async def admit(self, start: Start, size_bytes: int) -> None:
        """Wait until `size_bytes` more unread bytes fit the look-ahead budget (a shard larger
        than the whole budget is admitted alone), then hold them until the fill pins the shard.

        Items are sized side by side, and their HEADs answer in any order; the budget still
        goes in the queue's order, without one slow HEAD holding up the rest while there is
        room: an item is admitted when the budget holds it on top of what each item taken
        before it and not admitted yet is owed (`_ahead_of`). CI, room for three, s0..s2's
        HEADs slower than s3's, when the alone rule looked only at what was held:
        1. s3 is sized; nothing is held, so it was admitted alone;
        2. s0 and s1 are admitted; s2 waits for the budget that s3 took.
        A wait is logged once, and shown in the status until it ends: a loader reading what
        was prefetched, or an emptied queue, ends it."""
        start.size_bytes = size_bytes
        if size_bytes <= self.max_unread_bytes:  # one larger goes alone: no guess for others
            self._largest_sized = max(self._largest_sized, size_bytes)
        ledger = self.cache.unread
        waiting = False

        def ready() -> bool:  # asked again after every change of the ledger
            nonlocal waiting
            if start.is_dropped:
                return True
            held = ledger.total_bytes + ledger.held_bytes
            ahead, owed = self._ahead_of(start)
            if (not held and not ahead) or held + owed + size_bytes <= self.max_unread_bytes:
                return True
            if not waiting:
                waiting = True
                start.move(ItemState.WAITING)
                self.waiters += 1
                self._on_wait()
            self._say_waiting(ledger.total_bytes, ledger.held_bytes)
            return False

        try:
            await ledger.wait_for(ready)
        finally:
            if waiting:
                self.waiters -= 1
            if not self.waiters:
                self.waiting_for, self._said_waiting = None, False
        if not start.is_dropped:
            start.move(ItemState.ADMITTED)
            start.hold = ledger.hold(size_bytes)  # the next in line may go now

    def _say_waiting(self, unread_bytes: int, held_bytes: int) -> None:
        """Show why look-ahead waits (the status), logged once per wait of the queue."""
        in_flight = f" and {format_size(held_bytes)} being fetched" if held_bytes else ""
        self.waiting_for = (
            f"the look-ahead budget: {format_size(unread_bytes)} prefetched "
            f"and not read yet{in_flight}, of {format_size(self.max_unread_bytes)} "
            "(--prefetch-max-bytes); loaders reading them free it, and a pin no "
            "loader will read ends (`shardcache prefetch --cancel` ends them all)"
        )
        if not self._said_waiting:  # once per wait of the queue, not per item
            self._said_waiting = True
            log.info("prefetch waits for %s", self.waiting_for)

    def _ahead_of(self, start: Start) -> tuple[int, int]:
        """The items taken before `start` and not admitted yet (being sized, or waiting), and
        the budget they are owed before it: each one's size once its HEAD has answered, else
        the largest shard sized so far (its own size is not known yet, and a guess of `start`'s
        size let the small last shard of a dataset pass the one before it).

        An earlier item that waits makes every later one wait too (each needs its room on top
        of that item's), so its sizing wakes no one; its admission or its leaving does."""
        ahead = owed = 0
        for earlier in self._lane.starting:
            if earlier is start:
                break
            if earlier.is_owed:
                ahead += 1
                size = earlier.size_bytes
                owed += size if size is not None else self._largest_sized
        return ahead, owed
