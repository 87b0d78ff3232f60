"""Loader stall: the wall-clock time during which at least one client waited (pure, no I/O).

`StallClock` keeps the merged wait intervals of the last HORIZON_S seconds and counts only the
part of each new one that none of them covers: the union of the waits, not their sum."""

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
