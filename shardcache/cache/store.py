"""The store: space, reservations, commit and abort, lookups, over the index and the directory.
Index plus reservations never exceed the capacity; an entry is indexed only complete, verified
and fsynced. Tells the eviction policy its events, never asks which it is. Blocking (but
`lookup_remembered`): callers use a worker thread. Every failure is a `CacheError`."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.directory import REPLACED, CacheDirectory
from shardcache.cache.entry import (
    AdmissionState,
    Entry,
    EntryMeta,
    Reservation,
    StoreUsage,
    parse_meta,
)
from shardcache.cache.eviction import EvictionPolicy, policy_for
from shardcache.cache.evictor import FILESYSTEM_HEADROOM_BYTES, Evictor
from shardcache.cache.index import REMEMBERED_ROWS, AdoptFile, Index, map_store_errors
from shardcache.cache.plans import PlanBook
from shardcache.cache.space import Room, cannot_fit, startup_warnings
from shardcache.cache.walks import Walks
from shardcache.errors import CacheError, CacheFull, NotAdmitted
from shardcache.log_limit import LogLimit

log = logging.getLogger("shardcache.store")
ENTRY_OVERHEAD_BYTES = 8 * 1024  # a file's last partial block and its share of directories


class Store:
    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        on_evict: Callable[[str, int, bool], None] | None = None,
        repair: bool = True,
        admission: ScanResistantAdmission | None = None,
        transient_max_bytes: int = 0,
        plans: PlanBook | None = None,
    ) -> None:
        """Open (creating) the store; sweep partials; drop index rows and files that disagree.

        `on_evict(key, size_bytes, was_pinned)` is called after each eviction commits. With
        `repair=False` (`shardcache verify`), nothing is created, swept or fixed. `admission`,
        `transient_max_bytes` and `plans` make the eviction policy (`eviction.policy_for`;
        neither: plain LRU). Raises CacheError if the directory is unusable or another daemon
        holds it.
        """
        self.capacity_bytes = capacity_bytes
        self.policy: EvictionPolicy = policy_for(admission, plans, transient_max_bytes)
        self.plans = self.policy.plans  # what the prefetch queue and `/_/plans` post and read
        self._bypassed = 0
        self._lock = threading.Lock()
        self._reserved_bytes = 0
        self._directory = directory
        self._dir = CacheDirectory(directory, repair)  # raises CacheError for `verify`
        self._index_dir = self._dir.index_dir
        self._last_usage = StoreUsage(0, 0, 0, capacity_bytes)
        self._evictor = Evictor(
            lambda: self._index,
            capacity_bytes,
            self._used_bytes,
            self._dir.free_bytes,
            directory,
            on_evict,
            self.policy,
        )
        self.walks = Walks(lambda: self._index, self._dir, self._evictor, self._lock, self.policy)
        self.swept_partials = 0
        # What its users log of its failures (a broken disk fails every request): a WARNING
        # a minute per kind, the rest at DEBUG.
        self.warnings = LogLimit()
        self._open(repair)
        self._dir.remember_device()
        if repair:  # the daemon's store, not `shardcache verify`'s look at one
            self._warn_if_larger_than_filesystem()

    def _open(self, repair: bool) -> None:
        """Lock the directory and open the index (again, after the directory was replaced)."""
        self._dir.lock(repair)
        if repair:
            self.swept_partials = self._dir.sweep_partials()
        with map_store_errors(f"cannot open the index in {self._directory}"):
            self._index = Index(self._index_dir)
            self._db_identity = self._index.identity
            if repair:
                self._index.add_access_time_index()
                self._drop_damaged_entries()
                for _ in range(3):  # drop rows without files and files without rows; a fix
                    if not self._index.check(fix=True):  # can leave an empty dir for the next
                        break
        self._evictor.reopened()
        self.policy.on_open(self._index.keys)

    def _drop_damaged_entries(self) -> None:
        """Drop entries whose metadata is unreadable or whose file has another size than
        the entry says, before diskcache's check would "fix" the size to the damaged file."""
        index_dir = str(self._index_dir)  # a Path per row was a third of a 20,000-entry start
        for key, filename, tag in self._index.rows():
            try:
                path = os.path.join(index_dir, filename)
                is_sound = parse_meta(tag).size_bytes == os.stat(path).st_size
            except (CacheError, FileNotFoundError):
                is_sound = False
            if not is_sound:
                log.warning("dropping damaged entry %s", key)
                self._index.delete(key)

    def _warn_if_larger_than_filesystem(self) -> None:
        with contextlib.suppress(OSError, CacheError):
            for warning in startup_warnings(self._room(), self._directory):
                log.warning("%s", warning)

    def _room(self) -> Room:
        entries = self._index.entry_bytes()
        entry_bytes = entries + ENTRY_OVERHEAD_BYTES * len(self._index)
        index_bytes = self._used_bytes() - entry_bytes
        free = self._dir.free_bytes()
        return Room(self.capacity_bytes, free, entry_bytes, index_bytes, FILESYSTEM_HEADROOM_BYTES)

    # -- reads ---------------------------------------------------------------------------

    def lookup(self, key: str) -> Entry | None:
        """Return the open entry for `key` and mark it used, or None. Caller must close it."""
        with map_store_errors(f"cannot look up {key}"):
            fd, tag = self._index.get(key)
        return None if fd is None else self._entry(key, fd, tag)

    def lookup_remembered(self, key: str) -> Entry | None:
        """`lookup` for an entry read before and unchanged since, without SQLite: event-loop
        safe. None does not mean a miss: ask `lookup` (on a worker thread)."""
        found = self._index.get_remembered(key)
        return None if found is None else self._entry(key, *found)

    def _entry(self, key: str, fd: int, tag: Any) -> Entry:
        try:
            meta = _parsed_meta(tag)
        except CacheError:
            os.close(fd)
            raise
        self._evictor.touch(key)  # no store lock: an eviction may hold it (event loop)
        return Entry(fd, meta)

    def note_request(self, key: str, found: bool) -> None:
        """A client read `key`; `found`: it was served from a committed entry. Tells the
        policy (a read of a look-ahead prefetch is not a hit on the resident set). Event-loop
        safe."""
        self.policy.on_request(key, found)

    def note_warm(self, key: str) -> None:
        """A shard is being warmed: admission protects it as it would a read; plans do not
        move (no job read it). Event-loop safe."""
        self.policy.on_warm(key)

    def admission_state(self) -> AdmissionState:
        return self.policy.status(self._bypassed)

    def peek(self, key: str) -> EntryMeta | None:
        """Return `key`'s metadata without opening it or touching its LRU position."""
        with map_store_errors(f"cannot look up {key}"):
            tag = self._index.tag_of(key)
        return None if tag is None else parse_meta(tag)

    def usage(self) -> StoreUsage:
        """What the cache holds; while the index cannot be read, the last figures known."""
        try:
            with map_store_errors("cannot read the index size"):
                usage = StoreUsage(
                    self._used_bytes(),
                    len(self._index),
                    self._reserved_bytes,
                    self.capacity_bytes,
                    self._index.entry_bytes(),
                )
        except CacheError as exc:
            log.debug("usage: %s", exc)
            return dataclasses.replace(self._last_usage, reserved_bytes=self._reserved_bytes)
        self._last_usage = usage
        return usage

    def _used_bytes(self) -> int:
        """Bytes on disk as `du` counts them: entries, the index database, and allowances
        for what grows between reservations (the write-ahead log, up to its checkpoint
        size, and per-entry directory blocks and block rounding)."""
        entries = self._index.entry_bytes()
        return entries + self._dir.index_bytes() + ENTRY_OVERHEAD_BYTES * len(self._index)

    # -- fills ---------------------------------------------------------------------------

    def reserve(
        self, size_bytes: int, key: str | None = None, read_now: bool = False
    ) -> Reservation:
        """Make room for `size_bytes` by evicting LRU unpinned entries, and open a partial file.

        `key` pinned already (a look-ahead prefetch) makes the fill transient, and so does
        `read_now` (a prefetch a client's read joined: streamed through, the reader would fetch
        the object again). Raises
        NotAdmitted when admission spares the entries eviction would take, CacheFull when
        reservations and pinned entries leave no room, CacheError when the directory is
        unusable; the caller should then stream the object through uncached. The caller must
        `commit()` or `abort()`.
        """
        # A look-ahead prefetch is pinned before its fill starts (`pin`).
        transient = key is not None and self.policy.is_transient(
            key, self._evictor.is_pinned(key), read_now
        )
        with self._lock, map_store_errors("cannot make room"):
            if problem := cannot_fit(size_bytes, self._room(), self._reserved_bytes):
                raise CacheFull(problem)  # before anything is evicted for it
            try:
                self._evictor.make_room(size_bytes, self._reserved_bytes, key, transient)
            except NotAdmitted:
                self._bypassed += 1
                raise
            self._reserved_bytes += size_bytes
        try:
            path, fd = self._dir.new_partial()
        except OSError as exc:
            self._release(size_bytes, transient)
            raise CacheError(f"cannot create a partial file: {exc.strerror or exc}") from exc
        reservation = Reservation(size_bytes, path, fd, is_transient=transient)
        try:
            # Claim the blocks now: a full disk fails the fill before its first byte (the
            # caller streams the object through instead), never halfway through a shard.
            self._allocate(reservation)
        except OSError as exc:
            os.close(fd)
            self.abort(reservation)
            raise CacheFull(f"cannot allocate {size_bytes} bytes: {exc.strerror or exc}") from exc
        return reservation

    def _allocate(self, reservation: Reservation) -> None:
        if not reservation.size_bytes:
            return
        try:
            os.posix_fallocate(reservation.fd, 0, reservation.size_bytes)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            # Concurrent reservations each saw room for themselves: make room again, once.
            with self._lock, map_store_errors("cannot make room"):
                self._evictor.evict_for_filesystem(reservation.size_bytes)
            os.posix_fallocate(reservation.fd, 0, reservation.size_bytes)

    def commit(self, reservation: Reservation, key: str, meta: EntryMeta) -> None:
        """Make a complete, verified partial file the entry for `key`.

        fsyncs the data first, so a power loss cannot leave an indexed entry with missing
        bytes. The reservation's fd stays open for readers; the caller closes it. Raises
        CacheError (the partial file is gone then, and nothing is left in the index tree).
        """
        adopt = AdoptFile(str(reservation.path), meta.size_bytes)
        try:
            with map_store_errors(f"cannot commit {key}"):
                os.fsync(reservation.fd)
                self._index.set(key, adopt, json.dumps(dataclasses.asdict(meta)))
        except CacheError:
            self._index.drop_unindexed(adopt)
            self.abort(reservation)
            raise
        self.policy.on_commit(key)  # outside the lock: the plans may refile their heap
        if reservation.is_transient:
            with self._lock:
                self._evictor.committed_transient(key, meta.size_bytes)
        self._release_reservation(reservation)

    def abort(self, reservation: Reservation) -> None:
        """Discard a fill's partial file and give its space back. Safe to call twice; never
        raises: the space is given back even when the file cannot be removed now (a
        read-only directory), and removing it is tried again by `problem()`."""
        try:
            self._dir.remove_partial(reservation.path)
        finally:
            self._release_reservation(reservation)

    def _release_reservation(self, reservation: Reservation) -> None:
        if not reservation.is_released:
            reservation.is_released = True
            self._release(reservation.size_bytes, reservation.is_transient)

    def _release(self, size_bytes: int, transient: bool) -> None:
        with self._lock:
            self._reserved_bytes -= size_bytes
            self._evictor.released(size_bytes, transient)

    # -- eviction and pins (`cache.evictor`) ------------------------------------------------

    def pin(self, key: str) -> None:
        """Protect `key` from eviction (a prefetched shard nobody has read yet). Event-loop
        safe: takes no lock (`Evictor.pin` says why that is sound)."""
        self._evictor.pin(key)

    def unpin(self, key: str) -> bool:
        """Make `key` an ordinary LRU entry again (a transient one is settled at the next
        reservation: kept or dropped); return whether it was pinned. Event-loop safe."""
        return self._evictor.unpin(key)

    def delete(self, key: str) -> bool:
        """Remove `key`'s entry (its file goes after the index commits); return if it existed.
        Raises CacheError, the entry untouched, when the directory is not writable: SQLite's
        files were opened before, so the row would go and the file would stay."""
        if not os.access(self._index_dir, os.W_OK):
            raise CacheError(f"cannot delete {key}: cache dir {self._index_dir} is not writable")
        self._evictor.drop_pin(key)
        with map_store_errors(f"cannot delete {key}"):
            deleted = bool(self._index.delete(key))
        with self._lock:
            self._evictor.forget(key)
        return deleted

    def next_use_s(self, key: str) -> float | None:
        """Seconds until a loader's plan reads `key`, or None when no plan names it (or plans
        are off). Takes the plans' lock: call it from a worker thread."""
        return self.policy.next_use_s(key)

    def would_admit(self, key: str, size_bytes: int, look_ahead: bool) -> bool:
        """Whether a fill of `key` would be admitted now, without evicting anything: a prefetch
        asks before fetching, so that one the policy would refuse is not downloaded only to
        be thrown away. A dry run of the first eviction only (the fill itself decides).

        Under plain LRU too: a prefetch that finds no room at its reservation has sent its
        GET already (it streams through, and the loader's read fetches the shard again). The
        dry run catches the cache whose room fills under way hold, or whose every entry is
        pinned; not one where evicting all that is unpinned would still fall short."""
        transient = self.policy.is_transient(key, look_ahead, read_now=False)
        with self._lock, map_store_errors(f"cannot size up {key}"):
            if cannot_fit(size_bytes, self._room(), self._reserved_bytes):
                return False  # as `reserve` would find, whatever it evicted
            # A transient fill may evict within its area.
            return transient or self._evictor.would_make_room(size_bytes, self._reserved_bytes, key)

    # -- health ------------------------------------------------------------------------------

    def problem(self) -> str | None:
        """Return why the cache directory cannot be used now, or None when it can.

        When the directory was deleted and is back (or its index is gone), the store reopens
        itself there, empty: fills are cached again without a restart. Until then, and while
        the directory is read-only, fills stream through uncached (`reserve` fails).
        """
        with self._lock:
            problem = self._dir.index_problem(self._db_identity)
            if problem == REPLACED:
                try:
                    self._open(repair=True)
                except CacheError as exc:
                    return f"cache dir {self._directory} cannot be reopened: {exc}"
                log.warning("the cache dir %s was replaced: reopened it, empty", self._directory)
            elif problem is not None:
                return problem
        return self._dir.usage_problem()

    # -- housekeeping ------------------------------------------------------------------------

    def check(self) -> list[str]:
        """Return inconsistencies between index and files (empty when sound); for tests and
        post-mortems. Partial files are reported only when no reservation is open."""
        problems = self.walks.index_problems(fix=False)
        if self._reserved_bytes == 0:
            problems += [f"stray partial file {p}" for p in self._dir.partial_dir.iterdir()]
        return problems

    def close(self) -> None:
        with contextlib.suppress(CacheError), self._lock, map_store_errors("cannot close"):
            self._evictor.flush_touches()  # the LRU order survives a restart
        self._index.close()
        self._dir.close()


@functools.lru_cache(maxsize=REMEMBERED_ROWS)
def _parsed_meta(tag: Any) -> EntryMeta:
    """`parse_meta`, once per tag a hot entry's hits share (EntryMeta is frozen; nothing
    changes the mappings it holds)."""
    return parse_meta(tag)
