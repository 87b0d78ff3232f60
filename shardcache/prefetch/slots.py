"""The prefetch slots: how many prefetches run at once, per lane, and the loop that tunes it.

The limit is the fixed `concurrency`, or (`auto`) the tuner's choice judged every
TUNING_WINDOW_S; each lane has the limit to itself. Knows nothing of the queue's order, the
look-ahead budget or batches."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from shardcache.cache.fill import Fill
from shardcache.prefetch.lanes import Lane
from shardcache.prefetch.tuning import ConcurrencyTuner

log = logging.getLogger("shardcache.prefetch")
START_CONCURRENCY = 8  # where `auto` starts
MAX_CONCURRENCY = 32  # `auto`'s ceiling; each prefetch may open --origin-connections more
TUNING_WINDOW_S = 0.25


class Slots:
    def __init__(
        self,
        concurrency: int | None,
        is_saturated: Callable[[], bool],
        clock: Callable[[], float],
    ) -> None:
        """`concurrency`: prefetches at once, or None to let the tuner find it.
        `is_saturated`: whether work waits for a slot now (not for the look-ahead budget)."""
        self.tuner = (
            ConcurrencyTuner(START_CONCURRENCY, MAX_CONCURRENCY) if concurrency is None else None
        )
        self.concurrency = concurrency if concurrency is not None else START_CONCURRENCY
        self._is_saturated = is_saturated
        self._clock = clock
        self._freed = asyncio.Event()
        self._following: set[Fill] = set()  # fills prefetches follow: their bytes tune
        self._followed_bytes = 0  # received by fills no longer followed

    @property
    def limit(self) -> int:
        """Prefetches allowed at once now (the tuner's choice, or the fixed setting)."""
        return self.tuner.limit if self.tuner is not None else self.concurrency

    async def acquire(self, lane: Lane) -> None:
        """Each lane has `limit` slots of its own: look-ahead items waiting for the budget
        hold theirs, and warming, which never waits for the budget, must not wait behind
        them."""
        while lane.busy >= self.limit:
            self._freed.clear()
            await self._freed.wait()
        lane.busy += 1

    def release(self, lane: Lane) -> None:
        lane.busy -= 1
        self._freed.set()

    def follow(self, fill: Fill) -> bool:
        """Count `fill`'s bytes toward the tuning; False when an item follows it already (two
        items may follow one fill), and then the caller must not `unfollow` it."""
        if fill in self._following:
            return False
        self._following.add(fill)
        return True

    def unfollow(self, fill: Fill) -> None:
        self._following.discard(fill)
        self._followed_bytes += fill.received_bytes

    def _received_bytes(self) -> int:
        return self._followed_bytes + sum(fill.received_bytes for fill in self._following)

    async def tune(self) -> None:
        """Every TUNING_WINDOW_S, tell the tuner what the prefetches received; a window is
        saturated when the queue was at its start and at its end. Runs until cancelled."""
        assert self.tuner is not None
        received, at, was_saturated = self._received_bytes(), self._clock(), False
        while True:
            await asyncio.sleep(TUNING_WINDOW_S)
            now_received, now, is_saturated = (
                self._received_bytes(),
                self._clock(),
                self._is_saturated(),
            )
            rate = (now_received - received) / max(now - at, 1e-3)
            before = self.tuner.limit
            after = self.tuner.observe(rate, was_saturated and is_saturated)
            if after != before:
                log.debug("prefetch concurrency %d -> %d (%.1f MB/s)", before, after, rate / 1e6)
                self._freed.set()  # a raise frees slots for the dispatchers
            received, at, was_saturated = now_received, now, is_saturated
