"""Loader stall: the wall-clock time during which at least one client waited (pure, no I/O).

Adding up every stream's waits (`shardcache_client_wait_seconds_total`) counts eight workers
waiting at once as eight seconds a second, most of which a `DataLoader`'s buffering hides.
What a training loop feels is closer to the union of the wait intervals: time during which
some client was waiting for bytes not yet on local disk. Waits are reported when they end, as
(start, end) on the event loop's clock, so they arrive out of start order; `StallClock` keeps
the merged intervals of the last HORIZON_S seconds and counts only the part of each new
interval that none of them covers. A wait that began before the horizon (longer than any
origin timeout allows in practice) counts from the horizon on.
"""

from __future__ import annotations

import bisect

HORIZON_S = 600.0
MAX_INTERVALS = 4096  # merged intervals kept; the oldest go first (then counted as uncovered)


class StallClock:
    """The union of wait intervals, as a running total of seconds."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._starts: list[float] = []  # merged, disjoint intervals, sorted by start
        self._ends: list[float] = []

    def add(self, start: float, end: float) -> float:
        """Count the interval [start, end); return the seconds it added to the union."""
        if end <= start:
            return 0.0
        self._forget_before(end - HORIZON_S)
        start = max(start, end - HORIZON_S)
        # Merge with every kept interval that overlaps or touches [start, end).
        first = bisect.bisect_left(self._ends, start)
        last = bisect.bisect_right(self._starts, end)
        covered = sum(
            min(end, self._ends[i]) - max(start, self._starts[i]) for i in range(first, last)
        )
        added = (end - start) - max(0.0, covered)
        if first < last:
            start = min(start, self._starts[first])
            end = max(end, self._ends[last - 1])
        self._starts[first:last] = [start]
        self._ends[first:last] = [end]
        if len(self._starts) > MAX_INTERVALS:
            del self._starts[0], self._ends[0]
        self.total_s += added
        return added

    def _forget_before(self, horizon: float) -> None:
        keep = bisect.bisect_right(self._ends, horizon)
        if keep:
            del self._starts[:keep], self._ends[:keep]
