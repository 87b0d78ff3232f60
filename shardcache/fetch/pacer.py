"""`Pacer`: evenly spaced turns at a rate, the one pacing mechanism of `fetch/`.

Both limits on how often an origin is asked pace through it: the throttling limiter
(`limiter`, whose rate moves as the origin refuses and recovers) and an operator's fixed cap
(`capped`, `max_requests_per_second`). What differs between them is only what they do with a
turn that is too far off (shed it, or tell the client to come back), not how a turn is found.
Pure: the caller passes the time.
"""

from __future__ import annotations

import math


class Pacer:
    """When the next request may go at a given rate: 1/rate after the last one."""

    def __init__(self) -> None:
        self._last = -math.inf  # when the last request went, or is booked to go

    def next_at(self, rate: float) -> float:
        """The earliest time the next request may go, at `rate` requests a second."""
        return self._last + 1 / rate

    def turn(self, now: float, rate: float) -> float:
        """When a request asking at `now` would go: now, or the next free turn."""
        return max(now, self.next_at(rate))

    def went(self, at: float) -> None:
        """A request went at `at` (the limiter: once its turn came)."""
        self._last = at

    def book(self, now: float, rate: float) -> float:
        """Take the next turn for a request asking at `now`; return when it is."""
        at = self.turn(now, rate)
        self._last = at
        return at


__all__ = ["Pacer"]
