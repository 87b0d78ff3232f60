"""Scan-resistant admission: which cached entries a new fill may not evict (pure, no I/O).

With a dataset larger than the cache, read once per epoch in a fresh order, least-recently-used
eviction throws away the shards the next epoch needs and keeps few hits (0.12-0.14 at a cache of
half the dataset, where C/N = 0.50 is possible). The rule here: an entry read recently, in reads
rather than seconds, is *protected*; when the eviction candidate is protected, the new fill is
not admitted (it streams through uncached) instead of evicting it.

"Recently" is `passes` re-reference distances: an entry is protected while fewer requests have
passed since its last request than `passes` times the larger of its own last re-reference
distance and the typical one (the 75th percentile of recent re-reads' distances); an entry never
re-read uses the number of distinct keys requested so far. Two passes keep a reshuffled or
sequential epoch's resident set, since every key comes back within two passes over the working
set. A workload that moves to another dataset finds the old entries evictable once about two
of their re-reference distances of requests went by without them (measured: the new dataset's
share is cached again by its fifth pass; the issue asks for about two). A shorter horizon ("a
cache's worth of other bytes twice over") lets the next miss evict what the epoch still needs.

Not yet wired into the store (issue 12 is open): `benchmarks/trace_sim.py` replays traces
through it against LRU and the offline optimum.
"""

from __future__ import annotations

import collections

RECENT_GAPS = 1024  # re-reference distances kept for the typical one
TYPICAL_QUANTILE = 0.75  # the median let a reshuffled epoch churn 15% of its hits away
TYPICAL_EVERY = 64  # recompute the typical distance after this many new ones
MAX_TRACKED_KEYS = 1_000_000  # keys remembered (about 100 bytes each); the oldest go first


class ScanResistantAdmission:
    """Tracks requests (hits and misses) and says which entries eviction must spare."""

    def __init__(self, passes: float = 2.0) -> None:
        self.passes = passes
        self.requests = 0
        self._last: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._gap: dict[str, int] = {}
        self._recent_gaps: collections.deque[int] = collections.deque(maxlen=RECENT_GAPS)
        self._typical_gap: int | None = None
        self._gaps_since_typical = 0

    def on_request(self, key: str) -> None:
        """A client or prefetch asked for `key` (a hit or a miss)."""
        self.requests += 1
        last = self._last.pop(key, None)
        if last is not None:
            gap = self.requests - last
            self._gap[key] = gap
            self._recent_gaps.append(gap)
            self._gaps_since_typical += 1
            if self._typical_gap is None or self._gaps_since_typical >= TYPICAL_EVERY:
                gaps = sorted(self._recent_gaps)
                self._typical_gap = gaps[int(len(gaps) * TYPICAL_QUANTILE)]
                self._gaps_since_typical = 0
        self._last[key] = self.requests
        if len(self._last) > MAX_TRACKED_KEYS:
            forgotten, _ = self._last.popitem(last=False)
            self._gap.pop(forgotten, None)

    def is_protected(self, key: str) -> bool:
        """Whether evicting `key` to admit a new fill would throw away what is still in use."""
        last = self._last.get(key)
        if last is None:
            return False
        typical = self._typical_gap or 0
        # Never re-read yet: as far as the keys requested so far reach (its first pass).
        own = self._gap.get(key, len(self._last))
        horizon = self.passes * max(own, typical)
        return self.requests - last < horizon
