"""`Pacer`: evenly spaced turns at a rate, the one pacing mechanism of `fetch/`.

The throttling limiter and an operator's fixed cap both pace through it; they differ only in
what they do with a turn too far off. Pure: the caller passes the time."""

from __future__ import annotations

import bisect
import math


class Pacer:
    """When the next request may go at a given rate: 1/rate after the last one that went or
    is booked to go."""

    def __init__(self) -> None:
        self._last = -math.inf  # when the last request went
        # Turns taken ahead that have not come yet, in order: a burst under a cap of 1,000 a
        # second may book 30,000 of them, so each step is a bisection, never a scan.
        self._booked: list[float] = []

    def next_at(self, rate: float) -> float:
        """The earliest time the next request may go, at `rate` requests a second."""
        latest = self._booked[-1] if self._booked else -math.inf
        return max(self._last, latest) + 1 / rate

    def turn(self, now: float, rate: float) -> float:
        """When a request asking at `now` would go: now, or the next free turn."""
        return max(now, self.next_at(rate))

    def went(self, at: float) -> None:
        """A request went at `at` (its booked turn came, or the limiter let it go)."""
        self._last = max(self._last, at)
        self._unbook(at)

    def book(self, now: float, rate: float) -> float:
        """Take the next turn for a request asking at `now`; return when it is. The caller
        says `went(turn)` when it comes, or `give_back(turn)` if it stops waiting."""
        at = self.turn(now, rate)
        self._booked.append(at)  # after every other booking: the list stays in order
        return at

    def give_back(self, at: float) -> None:
        """A request that booked the turn at `at` stopped waiting (its fill was stopped):
        the turns after it stay where they are, the next booking comes after them."""
        self._unbook(at)

    def _unbook(self, at: float) -> None:
        index = bisect.bisect_left(self._booked, at)
        if index < len(self._booked) and self._booked[index] == at:
            del self._booked[index]


__all__ = ["Pacer"]
