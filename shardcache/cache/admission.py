"""Scan-resistant admission: which cached entries a new fill may not evict (pure, no I/O).

An entry read within `passes` re-reference distances is protected: a fill whose eviction
candidate is protected is not admitted (it streams through uncached). Once a whole pass brings
no hit, the entries not read since the last hit lose their protection for good (a new dataset).
How the distances are judged, and the figures: docs/architecture.md."""

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
