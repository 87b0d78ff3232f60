"""Loaders' plans: which cached entries each job reads next, and when (pure, no I/O).

A plan is one job's ordered keys; its cursor moves with the job's own reads and its pace turns a
position into a time. Eviction takes what no plan reads again, then the furthest next use
(Belady), from a max-heap: O(log C) amortised, never a scan, never rebuilt on the event loop.
Memory and garbage-collector bounds: docs/architecture.md."""

from __future__ import annotations

import bisect
import collections
import contextlib
import heapq
import math
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

QUIET_AFTER_S = 600.0
PACE_WEIGHT = 0.125  # the moving average of seconds per shard follows the last few reads
SKIP_WINDOW = 4  # how far ahead of its cursor a read may move a plan
MAX_PLANS = 256  # each read is matched against every plan: a bound on that work
MAX_PLANNED_KEYS = 1_000_000  # over all plans
MAX_PLANNED_KEY_CHARS = 128 << 20  # over all plans: long keys must not take gigabytes


_POOLED_POSITIONS = 1 << 17  # more than one post can list (MAX_EXPANSION)
_position_pool: list[int] = []
_position_pool_lock = threading.Lock()


def _positions(count: int) -> list[int]:
    """0 .. count-1 as int objects shared by every plan (up to _POOLED_POSITIONS): an int
    over 256 is an object of 28 bytes, as much as a plan's index of the key besides."""
    with _position_pool_lock:
        if len(_position_pool) < min(count, _POOLED_POSITIONS):
            _position_pool.extend(range(len(_position_pool), min(count, _POOLED_POSITIONS)))
        if count <= len(_position_pool):
            return _position_pool[:count]
        return _position_pool + list(range(len(_position_pool), count))


class PlanRefused(Exception):
    """The book is full: too many plans or planned keys (the caller answers 4xx)."""


@dataclass(slots=True, eq=False)
class Plan:
    job: str
    epoch: int
    keys: tuple[str, ...]
    posted_at: float
    cursor: int = 0  # index of the next key the job reads
    last_read_at: float | None = None
    pace_s: float | None = None  # seconds per shard, once two reads were seen
    reads: int = 0
    hits: int = 0
    cached_ahead: int = 0  # positions from the cursor on whose key is cached (kept up to date)
    chars: int = 0  # of its keys, for the book's bound
    first: dict[str, int] = field(default_factory=dict)  # key -> its first position
    repeats: dict[str, list[int]] = field(default_factory=dict)  # key -> positions, if > 1

    def __post_init__(self) -> None:
        positions = _positions(len(self.keys))
        # Built backwards, so that a key listed twice keeps its first position.
        self.first = dict(zip(reversed(self.keys), reversed(positions), strict=True))
        if len(self.first) < len(self.keys):  # some keys are listed more than once
            counts = collections.Counter(self.keys)
            for index, key in enumerate(self.keys):
                if counts[key] > 1:
                    self.repeats.setdefault(key, []).append(positions[index])
        self.chars = sum(map(len, self.first)) + 8 * len(self.keys)

    @property
    def is_finished(self) -> bool:
        return self.cursor >= len(self.keys)

    def position_of(self, key: str, start: int) -> int | None:
        """The first position of `key` at or after `start`, or None."""
        first = self.first.get(key)
        if first is None or first >= start:
            return first
        positions = self.repeats.get(key)
        if positions is None:
            return None
        at = bisect.bisect_left(positions, start)
        return positions[at] if at < len(positions) else None

    def count_from(self, key: str, start: int) -> int:
        """How many times `key` is listed at or after `start`."""
        positions = self.repeats.get(key)
        if positions is not None:
            return len(positions) - bisect.bisect_left(positions, start)
        first = self.first.get(key)
        return int(first is not None and first >= start)

    def active_since(self) -> float:
        return max(self.posted_at, self.last_read_at or 0.0)

    def seconds_until(self, index: int) -> float:
        return (index - self.cursor) * (self.pace_s if self.pace_s is not None else 1.0)


@dataclass(frozen=True, slots=True)
class PlanStatus:
    job: str
    epoch: int
    position: int
    length: int
    reads: int
    measured_hit_ratio: float | None  # hits among the plan's reads so far
    predicted_hit_ratio: float | None  # of the keys still to read, the share cached now
    pace_s: float | None


@dataclass(frozen=True, slots=True)
class Reader:
    """The job whose plan reads a key soonest: when, at what pace, and how long it has been
    quiet (seconds since it last posted or read)."""

    job: str
    seconds_until: float
    pace_s: float | None
    quiet_s: float


class PlanBook:
    """Every active plan, indexed by key. Thread-safe: posts and reads arrive on the event loop,
    eviction asks from the store's worker threads."""

    def __init__(
        self, quiet_after_s: float = QUIET_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.quiet_after_s = quiet_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._plans: dict[str, Plan] = {}
        self._cached: set[str] = set()
        # (-predicted time of next use, key) for cached keys; stale entries are rechecked.
        self._heap: list[tuple[float, str]] = []
        self._pending: collections.deque[tuple[str, bool, float]] = collections.deque()
        # A plan was dropped as quiet: what only it read is read by none now, filed too soon.
        # `_drop_quiet` runs on the event loop too: the heap is rebuilt at eviction's next ask.
        self._is_refile_due = False

    # -- what loaders and the cache tell it ---------------------------------------------------

    def post(self, job: str, epoch: int, keys: list[str]) -> Plan:
        """Replace `job`'s plan by `keys` (in read order). Raises PlanRefused when the book is
        full even without finished plans (the job's old plan is then kept)."""
        # Indexed before taking the lock. Interned: plans of one dataset list the same keys,
        # and each post brings its own copies (a string is most of a planned key's memory).
        plan = Plan(job, epoch, tuple(map(sys.intern, keys)), self._clock())
        with self._locked():
            self._drop_quiet()
            others = [p for p in self._plans.values() if p.job != job]
            while self._over_bounds(others, plan):
                finished = [p for p in others if p.is_finished]
                if not finished:
                    raise PlanRefused(
                        f"the plans in use are at the bound ({MAX_PLANS} plans, "
                        f"{MAX_PLANNED_KEYS} keys, {MAX_PLANNED_KEY_CHARS >> 20} Mi characters); "
                        "post again when jobs end"
                    )
                oldest = min(finished, key=Plan.active_since)
                others.remove(oldest)
                del self._plans[oldest.job]
            replaced = self._plans.get(job)
            self._plans[job] = plan
            plan.cached_ahead = sum(1 for key in plan.keys if key in self._cached)
            refiled = plan.first.keys() & self._cached
            if replaced is not None:  # what only the old plan read is now read by none
                refiled |= replaced.first.keys() & self._cached
            for key in refiled:
                self._push(key)
            self._rebuild_when_stale()
            return plan

    def check_room(self, job: str, keys: int, chars: int = 0) -> None:
        """Raise PlanRefused when a plan of at least `keys` keys and `chars` characters for
        `job` would be refused (`post` decides on the exact keys): asked before a body's names
        are expanded."""
        with self._locked():
            self._drop_quiet()
            others = [p for p in self._plans.values() if p.job != job and not p.is_finished]
            if (
                len(others) + 1 > MAX_PLANS
                or sum(len(p.keys) for p in others) + keys > MAX_PLANNED_KEYS
                or sum(p.chars for p in others) + chars > MAX_PLANNED_KEY_CHARS
            ):
                raise PlanRefused(
                    f"the plans in use are at the bound ({MAX_PLANS} plans, "
                    f"{MAX_PLANNED_KEYS} keys, {MAX_PLANNED_KEY_CHARS >> 20} Mi characters): "
                    f"{keys} more keys not expanded; post again when jobs end"
                )

    @staticmethod
    def _over_bounds(others: list[Plan], plan: Plan) -> bool:
        return (
            len(others) + 1 > MAX_PLANS
            or sum(len(p.keys) for p in others) + len(plan.keys) > MAX_PLANNED_KEYS
            or sum(p.chars for p in others) + plan.chars > MAX_PLANNED_KEY_CHARS
        )

    def on_request(self, key: str, hit: bool) -> None:
        """A client read `key`: each plan that reads it next moves past it. Never waits: on
        the event loop, while a worker thread holds the lock (a large post), the read is queued
        and applied by whoever takes the lock next."""
        self._pending.append((key, hit, self._clock()))
        if self._lock.acquire(blocking=False):
            try:
                self._apply_pending()
            finally:
                self._lock.release()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            self._apply_pending()
            yield

    def _apply_pending(self) -> None:
        while self._pending:
            self._apply_read(*self._pending.popleft())

    def _apply_read(self, key: str, hit: bool, now: float) -> None:
        # A worker reads in its order; a read a little beyond the cursor means it skipped some
        # (a failure, a late start). Reads carry no job identity: another job's read of a key
        # far ahead in this plan must not move it, nor one a little ahead when the read is the
        # key some plan reads next. The read goes to the plans it is nearest the cursor of:
        # a sibling worker's key often sits a few places into this plan's next epoch.
        claims: list[tuple[int, Plan, int]] = []
        for plan in self._plans.values():
            index = plan.position_of(key, plan.cursor)
            if index is not None and index < plan.cursor + SKIP_WINDOW:
                claims.append((index - plan.cursor, plan, index))
        nearest = min((skip for skip, _, _ in claims), default=0)
        moved = False
        for skip, plan, index in claims:
            if skip == nearest:
                self._advance(plan, index, hit, now)
                moved = True
        if moved and key in self._cached:
            self._push(key)  # its next use moved on (to the top when no plan reads it again)

    def _advance(self, plan: Plan, index: int, hit: bool, now: float) -> None:
        passed = plan.keys[plan.cursor : index + 1]
        plan.cached_ahead -= sum(1 for key in passed if key in self._cached)
        for skipped in passed[:-1]:  # at most SKIP_WINDOW: their next use moved on too
            if skipped in self._cached:
                self._push(skipped)
        if plan.last_read_at is not None:
            step = (now - plan.last_read_at) / (index + 1 - plan.cursor)
            pace = plan.pace_s
            plan.pace_s = step if pace is None else pace + (step - pace) * PACE_WEIGHT
        plan.cursor = index + 1
        plan.last_read_at = now
        plan.reads += 1
        plan.hits += hit

    def on_cached(self, key: str) -> None:
        with self._locked():
            if key not in self._cached:
                self._cached.add(key)
                self._count_ahead(key, +1)
            self._push(key)
            self._rebuild_when_stale()

    def _count_ahead(self, key: str, change: int) -> None:
        for plan in self._plans.values():
            plan.cached_ahead += change * plan.count_from(key, plan.cursor)

    def _push(self, key: str) -> None:
        """(Re)file a cached key by its next use; one no plan reads again goes on top (the
        furthest of all), so that eviction finds it beyond its batch of LRU entries."""
        when = self._next_use(key)
        at = math.inf if when is None else self._clock() + when
        heapq.heappush(self._heap, (-at, key))

    def _rebuild_when_stale(self) -> None:
        """Rebuild the heap when stale entries outnumber live ones 4 to 1. Asked by the store's
        threads only (a post, a fill, an eviction): a rebuild costs a look at every plan for
        every cached key (100,000 cached x 61 plans: seconds), which a read on the event loop
        (`on_request`, which pushes too) must never pay."""
        if len(self._heap) > 4 * len(self._cached) + 1024:
            self._rebuild()

    def _rebuild(self) -> None:
        now = self._clock()
        self._heap = []
        self._is_refile_due = False  # every cached key is filed again below
        for key in self._cached:
            when = self._next_use(key)
            self._heap.append((-math.inf if when is None else -(now + when), key))
        heapq.heapify(self._heap)

    def on_evicted(self, key: str) -> None:
        with self._locked():
            if key in self._cached:
                self._cached.discard(key)  # heap entries go lazily
                self._count_ahead(key, -1)

    # -- what eviction asks -------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        with self._locked():
            self._drop_quiet()
            return bool(self._plans)

    def next_use_s(self, key: str) -> float | None:
        """Seconds until some plan reads `key` again, or None when none does."""
        with self._locked():
            return self._next_use(key)

    def _next_use(self, key: str) -> float | None:
        soonest: float | None = None
        for plan in self._plans.values():
            index = plan.position_of(key, plan.cursor)
            if index is not None:
                when = plan.seconds_until(index)
                soonest = when if soonest is None else min(soonest, when)
        return soonest

    def next_reader(self, key: str) -> Reader | None:
        """The plan that reads `key` soonest, as a `Reader`, or None when no plan reads it
        again. May wait for the lock: call it from a worker thread."""
        with self._locked():
            self._drop_quiet()
            now = self._clock()
            soonest: Reader | None = None
            for plan in self._plans.values():
                index = plan.position_of(key, plan.cursor)
                if index is None:
                    continue
                when = plan.seconds_until(index)
                if soonest is None or when < soonest.seconds_until:
                    soonest = Reader(plan.job, when, plan.pace_s, now - plan.active_since())
            return soonest

    def covers(self, accepts: Callable[[str], bool]) -> bool:
        """Whether some plan reads keys `accepts` takes (one origin's, say). May wait for the
        lock: call it from a worker thread."""
        with self._locked():
            self._drop_quiet()
            return any(p.keys and _lists(p, accepts) for p in self._plans.values())

    def read_ahead(
        self, key: str, count: int, covers: Callable[[str], bool]
    ) -> list[tuple[str, float]] | None:
        """The next `count` keys `covers` accepts of each plan that reads `key` now (it has
        just read it, or is about to), soonest first, each with the seconds until that plan
        reads it; None when no plan lists keys `covers` accepts (read-ahead is then a guess).

        Never waits (called on the event loop): while a worker thread holds the lock (a large
        post), the answer is [] (plans are being posted: no key a plan does not name).
        """
        if not self._lock.acquire(blocking=False):
            return []
        try:
            self._apply_pending()
            self._drop_quiet()
            covering = [p for p in self._plans.values() if p.keys and _lists(p, covers)]
            if not covering:
                return None
            following: dict[str, float] = {}
            for plan in covering:
                index = plan.position_of(key, max(plan.cursor - 1, 0))
                if index is None or index >= plan.cursor + SKIP_WINDOW:
                    continue
                taken = 0
                for at in range(index + 1, len(plan.keys)):
                    if taken == count:
                        break
                    upcoming = plan.keys[at]
                    if upcoming == key or not covers(upcoming):
                        continue
                    taken += 1
                    when = max(plan.seconds_until(at), 0.0)
                    following[upcoming] = min(when, following.get(upcoming, when))
            return sorted(following.items(), key=lambda pair: pair[1])
        finally:
            self._lock.release()

    def furthest(self, excluded: Callable[[str], bool]) -> tuple[str, float] | None:
        """The cached key whose next planned use is furthest, skipping `excluded` ones (pinned,
        being settled), with that use's time; None when no plan reads a cached key again."""
        with self._locked():
            self._drop_quiet()
            if self._is_refile_due:
                self._rebuild()
            self._rebuild_when_stale()
            now = self._clock()
            skipped: list[tuple[float, str]] = []
            best: tuple[str, float] | None = None
            while self._heap:
                negative_at, key = heapq.heappop(self._heap)
                if key not in self._cached:
                    continue  # evicted since
                when = self._next_use(key)
                if when is None:
                    # No plan reads it again (a plan moved past it, or was replaced): the
                    # furthest of all. Eviction's batch of least recently used entries finds
                    # most such keys first; this finds those beyond the batch.
                    if excluded(key):
                        skipped.append((-math.inf, key))
                        continue
                    best = (key, math.inf)
                    heapq.heappush(self._heap, (-math.inf, key))  # cached until evicted
                    break
                if abs((now + when) + negative_at) > max(1e-6, 0.01 * when):
                    heapq.heappush(self._heap, (-(now + when), key))  # stale: recheck
                    continue
                if excluded(key):
                    skipped.append((negative_at, key))
                    continue
                best = (key, when)
                heapq.heappush(self._heap, (negative_at, key))  # still cached until evicted
                break
            for entry in skipped:
                heapq.heappush(self._heap, entry)
            return best

    # -- housekeeping and status --------------------------------------------------------------

    def _drop_quiet(self) -> None:
        now = self._clock()
        quiet = [p for p in self._plans.values() if now - p.active_since() > self.quiet_after_s]
        for plan in quiet:
            del self._plans[plan.job]
        self._is_refile_due |= bool(quiet)

    def forget_cached(self, keys: Iterable[str]) -> None:
        """Start over with these keys as the cached set (the store's index at start)."""
        with self._locked():
            self._cached = set(keys)
            for plan in self._plans.values():
                ahead = plan.keys[plan.cursor :]
                plan.cached_ahead = sum(1 for key in ahead if key in self._cached)
            self._rebuild()

    def status(self) -> list[PlanStatus]:
        with self._locked():
            self._drop_quiet()
            return [self._status(plan) for plan in self._plans.values()]

    def _status(self, plan: Plan) -> PlanStatus:
        remaining = len(plan.keys) - plan.cursor
        cached = plan.cached_ahead
        return PlanStatus(
            plan.job,
            plan.epoch,
            plan.cursor,
            len(plan.keys),
            plan.reads,
            plan.hits / plan.reads if plan.reads else None,
            cached / remaining if remaining else None,
            plan.pace_s,
        )


def _lists(plan: Plan, covers: Callable[[str], bool]) -> bool:
    """Whether `plan` reads keys `covers` accepts, judged by its first, current and last keys
    (a plan names one dataset; a scan of a million keys on each read would hold the loop)."""
    current = plan.keys[min(plan.cursor, len(plan.keys) - 1)]
    return covers(plan.keys[0]) or covers(current) or covers(plan.keys[-1])
