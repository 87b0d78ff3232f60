"""The evictor: makes room for fills, asking the eviction policy (`cache.eviction`) which entry
goes, and owns what eviction must spare: the pins, the books of the policy's transient area, the
batched access times that order LRU.

The store calls in with its lock held (all but `pin`, `unpin`, `drop_pin`, `is_pinned`).
Knows nothing of reservations' files, HTTP or origins."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from shardcache.cache.eviction import EvictionPolicy
from shardcache.cache.index import WAL_ALLOWANCE_BYTES, Index
from shardcache.errors import CacheFull, NotAdmitted

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
        policy: EvictionPolicy,
    ) -> None:
        """`index` returns the store's index now (it is reopened when the directory is
        replaced); `used_bytes` and `free_bytes` are the store's accounting and the directory's
        free space; `on_evict(key, size_bytes, was_pinned)` is called after each eviction
        commits; `policy` chooses the victims and is told what leaves."""
        self._index = index
        self.capacity_bytes = capacity_bytes
        self._used_bytes = used_bytes
        self._free_bytes = free_bytes
        self._directory = directory
        self._on_evict = on_evict
        self._policy = policy
        self._area = policy.area
        self._pinned: set[str] = set()
        self._touched: dict[str, float] = {}  # reads not yet written to the index's access_time
        self._full_warned_at = -FULL_WARNING_INTERVAL_S

    # pin() and unpin() run on the event loop, so they must not wait for the store's lock,
    # which a reservation holds through its evictions (SQL and unlinks). Set add/discard/
    # membership are atomic under the GIL, and no ordering is lost: a key is pinned before its
    # fill can commit an entry for eviction to choose, and unpinning only widens the choice.

    def pin(self, key: str) -> None:
        """Protect `key` from eviction (a prefetched shard nobody has read yet)."""
        self._pinned.add(key)
        log.debug("pinned %s", key)

    def unpin(self, key: str) -> bool:
        """Make `key` an ordinary LRU entry again (a transient one is settled at the next
        reservation: kept or dropped); return whether it was pinned."""
        was_pinned = key in self._pinned
        self._area.unpinned(key)
        self._pinned.discard(key)
        log.debug("unpinned %s (was pinned: %s)", key, was_pinned)
        return was_pinned

    def drop_pin(self, key: str) -> None:
        """`key` is being deleted: no longer pinned, and not settled as read."""
        self._pinned.discard(key)

    def is_pinned(self, key: str) -> bool:
        return key in self._pinned

    # -- what the store tells it, with its lock held ----------------------------------------

    def touch(self, key: str) -> None:
        """`key` was read now: its access time, written with the next batch. Takes no lock (a
        GIL-atomic store), so a hit on the event loop never waits for an eviction."""
        self._touched[key] = time.time()

    def pending_touches(self) -> Mapping[str, float]:
        """Reads not yet written to the index's access_time, by key (read-only; a GIL-atomic
        get per key is safe without the lock)."""
        return self._touched

    def reopened(self) -> None:
        """The index was opened again: the reads batched for the old one are gone with it."""
        self._touched = {}

    def reserved(self, size_bytes: int, is_transient: bool) -> None:
        """A reservation of `size_bytes` was made; a transient one grows the area."""
        if is_transient:
            self._area.reserved(size_bytes)

    def released(self, size_bytes: int, is_transient: bool) -> None:
        """A reservation was committed or aborted: its bytes are no longer being filled."""
        if is_transient:
            self._area.released(size_bytes)

    def committed_transient(self, key: str, size_bytes: int) -> None:
        """A transient fill of `key` committed: held until it is read (unpinned)."""
        # Held first, then the pin checked: an unpin between the two finds it held.
        self._area.committed(key, size_bytes)
        if key not in self._pinned:  # a client read it while it was fetched
            self._area.unpinned(key)

    def forget(self, key: str) -> None:
        """`key` left the cache: it is no longer transient, and the policy is told."""
        self._area.forget(key)
        self._policy.on_evict(key)

    def area_free(self) -> int:
        """The part of the transient area that ordinary fills leave free now (the policy's
        answer: none while a plan is active)."""
        return self._policy.area_free_bytes()

    def make_room(
        self, size_bytes: int, reserved_bytes: int, for_key: str | None, is_transient: bool
    ) -> None:
        """Settle the look-ahead entries read since the last call, then evict until a fill of
        `size_bytes` fits: within the transient area for a transient fill, else sparing what
        the policy keeps (NotAdmitted) and the area's free part; then until the filesystem
        has room for it too. Raises CacheFull when pins and reservations hold the rest."""
        self.settle_read_transients(reserved_bytes)
        if is_transient:
            self.evict_until_free(size_bytes, reserved_bytes, protect=False, for_key=for_key)
        else:
            self.evict_until_free(
                size_bytes,
                reserved_bytes,
                protect=True,
                keep_free=self.area_free(),
                for_key=for_key,
            )
        self.evict_for_filesystem(size_bytes)
        self.reserved(size_bytes, is_transient)

    def would_make_room(self, size_bytes: int, reserved_bytes: int, for_key: str) -> bool:
        """Whether an ordinary fill of `size_bytes` fits now, or the policy would give an
        entry up for it: a dry run of the first eviction only."""
        self.flush_touches()
        room = self.capacity_bytes - self._used_bytes() - reserved_bytes
        if room - self.area_free() >= size_bytes:
            return True
        try:
            return self.choose_victim("", for_key, protect=True) is not None
        except NotAdmitted:
            return False

    def settle_read_transients(self, reserved_bytes: int) -> None:
        """Keep each look-ahead entry read since the last call if admission would admit it as
        an ordinary fill (room, or unprotected victims), else drop it."""
        while (key := self._area.take_read()) is not None:
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
                self._area.dropped += 1
                log.debug("dropping %s: read once, no room in the resident set", key)
                self._index().delete(key)  # a reader's open fd stays valid
                self.forget(key)
                continue
            self._area.kept += 1

    def flush_touches(self) -> None:
        """Write the batched access times in one transaction."""
        batch, self._touched = self._touched, {}
        # One C-level copy: a touch that took the old batch just before the swap writes into
        # it unlocked, and must not change it while it is written (at worst that read's time
        # waits for the next batch).
        touched = dict(batch)
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
        """The victim the policy gives up first, with its size. After `attempts` keys the
        policy thought cached and the index did not (only the plans look beyond the LRU
        batch), the policy without its plans (`EvictionPolicy.ordinary`)."""
        candidates = self._least_recently_used(spare)
        policy = self._policy if attempts > 0 else self._policy.ordinary
        victim = policy.choose(
            [key for key, _ in candidates],
            for_key,
            protect,
            lambda key: key in self._pinned or key == spare,
        )
        if victim is None:
            return None
        sizes = dict(candidates)
        if victim not in sizes:
            size = self._index().size_of(victim)
            if size is None:  # gone meanwhile (a purge raced its commit): forget it, again
                self._policy.on_evict(victim)
                return self.choose_victim(spare, for_key, protect, attempts - 1)
            sizes[victim] = size
        return victim, sizes[victim]

    def _least_recently_used(self, spare: str = "") -> list[tuple[str, int]]:
        """Evictable entries, least recently used first: a batch of them."""
        rows = self._index().least_recently_used(_LRU_BATCH + len(self._pinned) + 1)
        return [(k, s) for k, s in rows if k not in self._pinned and k != spare]
