"""How many prefetches run at once: found by trying, from what the origin delivers (pure).

While the queue is saturated the limit doubles while the rate keeps up, settles at the knee,
and probes down again after HOLD_WINDOWS; a window without saturation says nothing of the
origin. The rule and why doubling: docs/architecture.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

GROWTH = 1.1  # a raise is kept when the rate grew by 10% or more
FULL_SCALING = 0.75  # grew at least 75% as much as the limit did: the knee is further up
RAISE_FACTOR = 2.0
HOLD_WINDOWS = 10
DOWN_TOLERANCE = 0.95  # half the limit is kept when it delivers 95% of the rate or more


@dataclass(frozen=True, slots=True)
class _Trial:
    limit: int  # the limit before the probe
    rate: float  # bytes per second at that limit
    is_up: bool


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
        self._probe_up = True  # the next probe's direction; they alternate

    def observe(self, rate: float, saturated: bool) -> int:
        """Take one window's aggregate rate (bytes/s) and whether the queue was saturated in
        all of it; return the limit for the next window."""
        if not saturated:
            trial = self._trial
            if trial is not None:  # the probe ended without evidence: back to what was known
                self.limit = trial.limit
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
            self._judge(trial, rate)
            return self.limit
        if self._last_rate is None:
            self._last_rate = rate  # a first judged window at this limit: the baseline
            return self.limit
        self._probe(max(rate, self._last_rate))
        return self.limit

    def _judge(self, trial: _Trial, rate: float) -> None:
        self._trial = None
        if not trial.is_up:
            # Fewer fetches for (nearly) the same bytes: keep it, each shard arrives sooner.
            if rate < trial.rate * DOWN_TOLERANCE:
                self._set(trial.limit)
            self._hold = HOLD_WINDOWS
            return
        if trial.rate > 0:
            growth = rate / trial.rate
        else:  # nothing arrived before the probe (HEADs stalled, say): only bytes are evidence
            growth = math.inf if rate > 0 else 1.0
        if growth >= FULL_SCALING * self.limit / trial.limit:
            self._probe(rate, up=True)  # it grew with the limit: try further
            return
        if growth >= GROWTH:  # it grew less: the knee is in between, where it stops
            self._set(math.ceil(trial.limit * growth))
        else:
            self._set(trial.limit)  # it did not: back
        self._hold = HOLD_WINDOWS

    def _probe(self, rate_now: float, up: bool | None = None) -> None:
        """Try the limit doubled or halved (alternately, unless `up` says which)."""
        if up is None:
            up = self._probe_up
            self._probe_up = not self._probe_up
        if up and self.limit >= self.high:
            up = False
        if not up and self.limit <= self.low:
            if self.limit >= self.high:
                self._last_rate = rate_now
                return
            up = True
        self._trial = _Trial(self.limit, rate_now, up)
        if up:
            self._set(max(self.limit + 1, math.ceil(self.limit * RAISE_FACTOR)))
        else:
            self._set(self.limit // 2)

    def _set(self, limit: int) -> None:
        self.limit = max(self.low, min(self.high, limit))
        self._settling = True
        self._last_rate = None
