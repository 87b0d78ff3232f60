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
set. A shorter horizon ("a cache's worth of other bytes twice over") lets the next miss evict
what the epoch still needs.

A workload that moves to another dataset: the resident set stops serving. Once the cache has
served hits, a typical re-reference distance of requests with no hit at all (and at least 16
times the usual spacing between hits) means the entries
are no longer the working set: entries not read since that last hit lose their protection for
good (what is admitted after it, and any of them read again, keep the usual one) (measured in
`benchmarks/trace_sim.py --switch`: the new dataset's share is cached during its second pass,
hits from its third; per-entry ageing alone took until the fifth). In a working steady state,
a whole pass without one hit does not happen unless the cache holds almost nothing.

The store consults it (`Store(admission=...)`); `benchmarks/trace_sim.py` replays traces
through it against LRU and the offline optimum.
"""

from __future__ import annotations

import collections
import threading

RECENT_GAPS = 1024  # re-reference distances kept for the typical one
TYPICAL_QUANTILE = 0.75  # the median let a reshuffled epoch churn 15% of its hits away
TYPICAL_EVERY = 64  # recompute the typical distance after this many new ones
HIT_SPACINGS_TO_STOP = 16  # this many mean hit spacings without a hit: not a gap by chance
HIT_SPACING_WEIGHT = 1 / 64  # the mean spacing follows the last few dozen hits
MAX_TRACKED_KEYS = 1_000_000  # keys remembered (about 100 bytes each); the oldest go first


class ScanResistantAdmission:
    """Tracks requests (hits and misses) and says which entries eviction must spare."""

    def __init__(self, passes: float = 2.0) -> None:
        self.passes = passes
        self.requests = 0
        self.last_hit_at: int | None = None  # None until the cache first serves a hit
        self.stale_before = 0  # entries last read at or before this request stopped serving
        self._hit_spacing = 0.0  # requests between hits, a moving average
        self._hits = 0
        # on_request runs on the event loop, is_protected on the store's worker threads.
        self._lock = threading.Lock()
        self._last: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._gap: dict[str, int] = {}
        self._recent_gaps: collections.deque[int] = collections.deque(maxlen=RECENT_GAPS)
        self._typical_gap: int | None = None
        self._gaps_since_typical = 0

    def on_request(self, key: str, hit: bool) -> None:
        """A client asked for `key`: a hit on a resident entry, or not (a miss, a read that
        joined a fill, a prefetched entry read for the first time)."""
        with self._lock:
            self._record(key, hit)

    def _record(self, key: str, hit: bool) -> None:
        self.requests += 1
        if hit:
            self._hits += 1
            if self.last_hit_at is not None:
                spacing = self.requests - self.last_hit_at
                weight = HIT_SPACING_WEIGHT if self._hit_spacing else 1.0  # the first sets it
                self._hit_spacing += (spacing - self._hit_spacing) * weight
            self.last_hit_at = self.requests
        elif not self.is_serving():
            self.stale_before = self.last_hit_at or 0
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
        with self._lock:
            last = self._last.get(key)
            if last is None:
                return False
            if last <= self.stale_before:
                return False  # part of a resident set that stopped serving
            typical = self._typical_gap or 0
            # Never re-read yet: as far as the keys requested so far reach (its first pass).
            own = self._gap.get(key, len(self._last))
            horizon = self.passes * max(own, typical)
            return self.requests - last < horizon

    def is_serving(self) -> bool:
        """False once a typical re-reference distance of requests went by without a hit: the
        resident set is no longer what is read (a new dataset, a finished job)."""
        if self.last_hit_at is None or self._hits < HIT_SPACINGS_TO_STOP:
            return True  # not yet seen serving
        # The typical distance is short early in the second pass (the first re-reads are the
        # first pass's last keys): a sparse hit rate must not look like a stop by chance.
        patience = max(
            self._typical_gap or len(self._last), HIT_SPACINGS_TO_STOP * self._hit_spacing
        )
        return self.requests - self.last_hit_at <= patience
