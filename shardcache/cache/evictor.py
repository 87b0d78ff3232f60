"""The evictor: makes room for fills, by the eviction policy, and owns what eviction must spare:
the pins, the transient area, the batched access times that order LRU.

The store owns the space and calls in here with its lock held; every method but `pin` and
`unpin` must be called so. Knows nothing of reservations' files, HTTP or origins."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.eviction import EvictionPolicy, PlanAware, ordinary_policy
from shardcache.cache.index import WAL_ALLOWANCE_BYTES, Index
from shardcache.cache.plans import PlanBook
from shardcache.cache.transient import TransientArea
from shardcache.errors import CacheFull

log = logging.getLogger("shardcache.store")
_LRU_BATCH = 64
# Free space kept on the filesystem beyond a reservation: the index must still be writable
# (its WAL, a new row) when the data files have taken the rest.
FILESYSTEM_HEADROOM_BYTES = (1 << 20) + WAL_ALLOWANCE_BYTES
FULL_WARNING_INTERVAL_S = 60.0


class Evictor:
    def __init__(
        self,
        index: Callable[[], Index],
        capacity_bytes: int,
        used_bytes: Callable[[], int],
        free_bytes: Callable[[], int],
        directory: Path,
        on_evict: Callable[[str, int, bool], None] | None,
        admission: ScanResistantAdmission | None,
        transient_max_bytes: int,
        plans: PlanBook | None,
    ) -> None:
        """`index` returns the store's index now (it is reopened when the directory is
        replaced); `used_bytes` and `free_bytes` are the store's accounting and the directory's
        free space; `on_evict(key, size_bytes, was_pinned)` is called after each eviction
        commits. `admission` None is plain LRU (no transient area either)."""
        self._index = index
        self.capacity_bytes = capacity_bytes
        self._used_bytes = used_bytes
        self._free_bytes = free_bytes
        self._directory = directory
        self._on_evict = on_evict
        self.plans = plans
        self._policy: EvictionPolicy = ordinary_policy(admission)
        self._plan_policy = PlanAware(plans, admission) if plans is not None else None
        self.transients = TransientArea(transient_max_bytes if admission is not None else 0)
        self.pinned: set[str] = set()
        self.touched: dict[str, float] = {}  # reads not yet written to the index's access_time
        self._full_warned_at = -FULL_WARNING_INTERVAL_S

    # pin() and unpin() run on the event loop, so they must not wait for the store's lock,
    # which a reservation holds through its evictions (SQL and unlinks). Set add/discard/
    # membership are atomic under the GIL, and no ordering is lost: a key is pinned before its
    # fill can commit an entry for eviction to choose, and unpinning only widens the choice.

    def pin(self, key: str) -> None:
        """Protect `key` from eviction (a prefetched shard nobody has read yet)."""
        self.pinned.add(key)
        log.debug("pinned %s", key)

    def unpin(self, key: str) -> bool:
        """Make `key` an ordinary LRU entry again (a transient one is settled at the next
        reservation: kept or dropped); return whether it was pinned."""
        was_pinned = key in self.pinned
        self.transients.unpinned(key)
        self.pinned.discard(key)
        log.debug("unpinned %s (was pinned: %s)", key, was_pinned)
        return was_pinned

    def forget(self, key: str) -> None:
        """`key` left the cache: it is no longer transient, nor cached for the plans."""
        self.transients.forget(key)
        if self.plans is not None:
            self.plans.on_evicted(key)

    def area_free(self) -> int:
        """The part of the transient area transient entries do not use now: ordinary fills
        leave it free. Not while a plan is active: the plans rank what they read, and a
        look-ahead no plan names evicts by that ranking instead."""
        if self.plans is not None and self.plans.is_active:
            return 0
        return self.transients.free_bytes()

    def settle_read_transients(self, reserved_bytes: int) -> None:
        """Keep each look-ahead entry read since the last call if admission would admit it as
        an ordinary fill (room, or unprotected victims), else drop it."""
        while (key := self.transients.take_read()) is not None:
            try:
                self.evict_until_free(
                    0,
                    reserved_bytes,
                    protect=True,
                    keep_free=self.area_free(),
                    spare=key,
                    for_key=key,
                )
            except CacheFull:
                self.transients.dropped += 1
                log.debug("dropping %s: read once, no room in the resident set", key)
                self._index().delete(key)  # a reader's open fd stays valid
                self.forget(key)
                continue
            self.transients.kept += 1

    def flush_touches(self) -> None:
        """Write the batched access times in one transaction."""
        touched, self.touched = self.touched, {}
        if touched:
            self._index().write_access_times(touched)

    def evict_until_free(
        self,
        size_bytes: int,
        reserved_bytes: int,
        protect: bool = False,
        keep_free: int = 0,
        spare: str = "",
        for_key: str | None = None,
    ) -> None:
        """Evict until `size_bytes` fit with `keep_free` bytes to spare; with `protect`, raise
        NotAdmitted rather than evict an entry the policy keeps over a fill of `for_key`;
        never evict `spare`."""
        # Called with the store's lock held, so concurrent reservations cannot count one room.
        if size_bytes + reserved_bytes > self.capacity_bytes:
            raise CacheFull(f"no room for {size_bytes} bytes: reservations hold the rest")
        self.flush_touches()
        needed = size_bytes + keep_free
        while self._used_bytes() + reserved_bytes + needed > self.capacity_bytes:
            if not self.evict_one(size_bytes, protect, spare, for_key):
                raise CacheFull(f"no room for {size_bytes} bytes: pinned entries hold the rest")

    def evict_for_filesystem(self, size_bytes: int) -> None:
        """Evict until the filesystem has `size_bytes` free plus headroom for the index: the
        bound when `--cache-size` is larger than the disk (or something else fills it).
        Leaves the rest to fallocate (CacheFull when it fails)."""
        needed = size_bytes + FILESYSTEM_HEADROOM_BYTES
        free = self._free_bytes()
        if free >= needed:
            return
        now = time.monotonic()
        if now - self._full_warned_at >= FULL_WARNING_INTERVAL_S:
            self._full_warned_at = now
            log.warning(
                "the filesystem under %s has %d bytes free, too few for a %d-byte fill: "
                "evicting to fit; --cache-size %d is more than the disk holds for the cache "
                "(%d bytes cached now)",
                self._directory,
                free,
                size_bytes,
                self.capacity_bytes,
                self._used_bytes(),
            )
        while free < needed and self.evict_one(size_bytes):
            free = self._free_bytes()

    def evict_one(
        self, size_bytes: int, protect: bool = False, spare: str = "", for_key: str | None = None
    ) -> bool:
        """Evict the entry the policy gives up first; False when none is evictable. With
        `protect`, raise NotAdmitted when the policy keeps it over a fill of `for_key`."""
        victim = self.choose_victim(spare, for_key, protect)
        if victim is None:
            return False
        key, victim_size = victim
        log.debug("evicting %s (%d bytes) to make room for %d", key, victim_size, size_bytes)
        deleted = self._index().delete_to_free_space(key)
        self.forget(key)
        if deleted and self._on_evict is not None:
            self._on_evict(key, victim_size, False)
        return True

    def choose_victim(
        self, spare: str, for_key: str | None, protect: bool, attempts: int = 8
    ) -> tuple[str, int] | None:
        """The victim the policy gives up first, with its size (`cache.eviction`): the plans'
        choice while a plan is active, else the ordinary policy's. After `attempts` keys the
        plans thought cached and the index did not, the ordinary policy."""
        candidates = self._least_recently_used(spare)
        plan_policy = self._plan_policy
        policy: EvictionPolicy
        if plan_policy is not None and plan_policy.is_active and attempts > 0:
            policy = plan_policy
        else:
            policy = self._policy
        victim = policy.choose(
            [key for key, _ in candidates],
            for_key,
            protect,
            lambda key: key in self.pinned or key == spare,
        )
        if victim is None:
            return None
        sizes = dict(candidates)
        if victim not in sizes:  # only the plans look beyond the LRU batch
            size = self._index().size_of(victim)
            if size is None:  # gone meanwhile (a purge raced its commit): forget it, again
                if self.plans is not None:
                    self.plans.on_evicted(victim)
                return self.choose_victim(spare, for_key, protect, attempts - 1)
            sizes[victim] = size
        return victim, sizes[victim]

    def _least_recently_used(self, spare: str = "") -> list[tuple[str, int]]:
        """Evictable entries, least recently used first: a batch of them."""
        rows = self._index().least_recently_used(_LRU_BATCH + len(self.pinned) + 1)
        return [(k, s) for k, s in rows if k not in self.pinned and k != spare]
