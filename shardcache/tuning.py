"""How many prefetches run at once: found by trying, from what the origin delivers (pure).

A fixed number is wrong both ways. An origin that caps each connection (25 MB/s per S3
connection is common) delivers more the more fetches run, up to its aggregate limit, so a
fixed 4 leaves most of its bandwidth unused while the loader waits; past the aggregate limit
more fetches only split the same bandwidth, and each shard arrives later.

The tuner climbs: while the queue is saturated (work waiting for a slot), it doubles the limit.
When the aggregate rate grew nearly as much as the limit (FULL_SCALING), it doubles again; when
it grew less (but by GROWTH at least), the origin's knee lies in between: it settles where the
rate says it is (old limit × growth). When the rate did not grow, it goes back to the limit
before. Either way it holds for HOLD_WINDOWS before it tries again (the origin, or what else
shares it, may change). The first window after a change is not judged: fetches started in it
are still opening. A window in which the queue was not saturated says nothing about the origin
(the loader asked for less than the slots allow), so it changes nothing and is not compared
with. Doubling, not a gentler step: an epoch's first seconds are where the loader waits, and
the knee costs one window at twice the limit to find.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GROWTH = 1.1  # a raise is kept when the rate grew by 10% or more
FULL_SCALING = 0.75  # grew at least 75% as much as the limit did: the knee is further up
RAISE_FACTOR = 2.0
HOLD_WINDOWS = 10


@dataclass(frozen=True, slots=True)
class _Trial:
    limit: int  # the limit before the raise
    rate: float  # bytes per second at that limit


class ConcurrencyTuner:
    def __init__(self, start: int, high: int, low: int = 1) -> None:
        if not low <= start <= high:
            raise ValueError(f"start {start} outside [{low}, {high}]")
        self.limit = start
        self.low, self.high = low, high
        self._trial: _Trial | None = None
        self._settling = False  # the first window after a change is not judged
        self._hold = 0
        self._last_rate: float | None = None  # of the last judged window at this limit

    def observe(self, rate: float, saturated: bool) -> int:
        """Take one window's aggregate rate (bytes/s) and whether the queue was saturated in
        all of it; return the limit for the next window."""
        if not saturated:
            self._trial, self._settling, self._last_rate = None, False, None
            return self.limit
        if self._settling:
            self._settling = False
            return self.limit
        if self._hold:
            self._hold -= 1
            self._last_rate = rate
            return self.limit
        trial = self._trial
        if trial is not None:
            growth = rate / trial.rate if trial.rate > 0 else math.inf
            if growth >= FULL_SCALING * self.limit / trial.limit:
                self._raise(rate)  # it grew with the limit: try further
            elif growth >= GROWTH:  # it grew less: the knee is in between, where it stops
                self._set(math.ceil(trial.limit * growth))
                self._trial, self._hold = None, HOLD_WINDOWS
            else:
                self._set(trial.limit)  # it did not: back, and stay a while
                self._trial, self._hold = None, HOLD_WINDOWS
            return self.limit
        if self._last_rate is None:
            self._last_rate = rate  # a first judged window at this limit: the baseline
            return self.limit
        self._raise(max(rate, self._last_rate))
        return self.limit

    def _raise(self, rate_now: float) -> None:
        if self.limit >= self.high:
            self._trial = None
            self._last_rate = rate_now
            return
        self._trial = _Trial(self.limit, rate_now)
        self._set(min(self.high, max(self.limit + 1, math.ceil(self.limit * RAISE_FACTOR))))

    def _set(self, limit: int) -> None:
        self.limit = max(self.low, min(self.high, limit))
        self._settling = True
        self._last_rate = None
