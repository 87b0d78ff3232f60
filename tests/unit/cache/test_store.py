"""The store with a temp dir: adopt-by-rename, LRU eviction before a fill, pins, crash leftovers.
`store.check()` (index vs files) is asserted after every test."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.cache.entry import Entry, EntryMeta
from shardcache.cache.store import Store
from shardcache.errors import CacheError, CacheFull

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    evicted: list[str] = []
    opened = Store(tmp_path / "cache", 4 * MiB, lambda key, size, pinned: evicted.append(key))
    opened.evicted = evicted  # type: ignore[attr-defined]
    yield opened
    assert opened.check() == []
    opened.close()


def _fill(store: Store, key: str, data: bytes) -> None:
    reservation = store.reserve(len(data))
    os.pwrite(reservation.fd, data, 0)
    store.commit(reservation, key, EntryMeta(len(data), '"etag"'))
    os.close(reservation.fd)


def _read(store: Store, key: str) -> bytes | None:
    entry = store.lookup(key)
    if entry is None:
        return None
    try:
        return os.pread(entry.fd, entry.meta.size_bytes, 0)
    finally:
        entry.close()


def test_commit_adopts_the_partial_file_without_copying(store: Store) -> None:
    data = os.urandom(100 * KiB)
    reservation = store.reserve(len(data))
    os.pwrite(reservation.fd, data, 0)
    inode = os.fstat(reservation.fd).st_ino
    store.commit(reservation, "k", EntryMeta(len(data), '"e"', "application/x-tar"))
    entry = store.lookup("k")
    assert entry is not None
    assert os.fstat(entry.fd).st_ino == inode  # the same file, renamed: written once
    assert entry.meta == EntryMeta(len(data), '"e"', "application/x-tar")
    entry.close()
    os.close(reservation.fd)
    assert not list(reservation.path.parent.iterdir())


def test_lru_eviction_makes_room_before_the_fill(store: Store) -> None:
    for key in "abc":
        _fill(store, key, os.urandom(MiB))
    assert _read(store, "a") is not None  # a is now more recent than b
    _fill(store, "d", os.urandom(MiB))
    assert store.evicted == ["b"]  # type: ignore[attr-defined]
    assert store.usage().size_bytes <= store.capacity_bytes
    assert _read(store, "b") is None and _read(store, "a") is not None


def test_pinned_entries_are_not_evicted(store: Store) -> None:
    for key in "ab":
        _fill(store, key, os.urandom(3 * MiB // 2))
    store.pin("a")
    store.pin("b")
    with pytest.raises(CacheFull):
        store.reserve(3 * MiB // 2)
    assert store.unpin("a") is True
    _fill(store, "c", os.urandom(3 * MiB // 2))
    assert store.evicted == ["a"]  # type: ignore[attr-defined]


def test_reservations_count_against_the_bound(store: Store) -> None:
    first = store.reserve(3 * MiB)
    with pytest.raises(CacheFull):
        store.reserve(2 * MiB)
    store.abort(first)
    store.abort(first)  # idempotent
    second = store.reserve(3 * MiB)
    store.abort(second)
    os.close(first.fd)
    os.close(second.fd)


def test_would_admit_says_no_when_nothing_can_make_room(store: Store) -> None:
    # A prefetch asks before its GET: under plain LRU too, a fill that would find no room
    # (everything pinned or reserved) must not be fetched only to stream through and be
    # thrown away, and then fetched again by the loader's read.
    for key in "ab":
        _fill(store, key, os.urandom(3 * MiB // 2))
    store.pin("a")
    store.pin("b")
    assert not store.would_admit("c", 3 * MiB // 2, look_ahead=True)
    assert store.would_admit("c", 100 * KiB, look_ahead=True)  # it fits beside them
    store.unpin("a")
    assert store.would_admit("c", 3 * MiB // 2, look_ahead=True)  # a can be evicted
    store.unpin("b")


def test_would_admit_counts_the_room_fills_under_way_hold(store: Store) -> None:
    reservation = store.reserve(3 * MiB)  # a fill under way, its commit still to come
    try:
        assert not store.would_admit("c", 2 * MiB, look_ahead=True)
    finally:
        store.abort(reservation)
        os.close(reservation.fd)
    assert store.would_admit("c", 2 * MiB, look_ahead=True)
    _fill(store, "small", os.urandom(10 * KiB))  # something to evict does not make room
    reservation = store.reserve(3 * MiB)
    try:
        assert not store.would_admit("c", 2 * MiB, look_ahead=True)
    finally:
        store.abort(reservation)
        os.close(reservation.fd)


def test_restart_keeps_entries_and_sweeps_partials(tmp_path: Path) -> None:
    first = Store(tmp_path / "c", 4 * MiB)
    data = os.urandom(50 * KiB)
    _fill(first, "kept", data)
    leftover = first.reserve(10 * KiB)  # a fill a crash interrupted
    os.pwrite(leftover.fd, b"junk", 0)
    os.close(leftover.fd)
    first.close()

    second = Store(tmp_path / "c", 4 * MiB)
    assert second.swept_partials == 1
    assert _read(second, "kept") == data
    assert second.check() == []
    second.close()


def test_orphan_files_from_a_crash_between_rename_and_index_are_removed(tmp_path: Path) -> None:
    first = Store(tmp_path / "c", 4 * MiB)
    _fill(first, "k", b"x" * 1000)
    first.close()
    orphan = tmp_path / "c" / "v1" / "index" / "ab" / "cd" / "orphan.val"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"y" * 10)
    second = Store(tmp_path / "c", 4 * MiB)
    assert not orphan.exists()
    assert second.check() == []
    second.close()


def test_a_second_daemon_cannot_share_the_directory(store: Store, tmp_path: Path) -> None:
    with pytest.raises(CacheError, match="in use by another shardcache"):
        Store(tmp_path / "cache", 4 * MiB)


def test_delete(store: Store) -> None:
    _fill(store, "k", b"z" * 10)
    assert store.delete("k") is True and store.delete("k") is False
    assert store.lookup("k") is None


def test_drop_if_open_drops_only_the_version_its_descriptor_holds(store: Store) -> None:
    _fill(store, "k", b"old")
    old = store.lookup("k")
    assert old is not None
    try:
        _fill(store, "k", b"new")  # refetched while a reader held the old file
        assert not store.walks.drop_if_open("k", old.fd)
        assert _read(store, "k") == b"new"
        current = store.lookup("k")
        assert current is not None
        try:
            assert store.walks.drop_if_open("k", current.fd)
        finally:
            current.close()
        assert _read(store, "k") is None
        assert not store.walks.drop_if_open("k", old.fd)  # nothing indexed: nothing to drop
    finally:
        old.close()


def test_a_remembered_lookup_never_waits_for_the_store_lock(store: Store) -> None:
    """`lookup_remembered` runs on the event loop: it must not take the lock an eviction holds
    on a worker thread (deletes, SQLite, file removal), or every hit waits for the eviction."""
    _fill(store, "k", b"x" * 100)
    first = store.lookup("k")  # read once: remembered from now on
    assert first is not None
    first.close()
    found: list[object] = []
    with store._lock:  # an eviction in progress
        reader = threading.Thread(target=lambda: found.append(store.lookup_remembered("k")))
        reader.start()
        reader.join(5)
        waited = reader.is_alive()
    reader.join()
    assert not waited, "a remembered hit waited for the store's lock"
    entry = found[0]
    assert isinstance(entry, Entry) and entry.meta.size_bytes == 100
    entry.close()
