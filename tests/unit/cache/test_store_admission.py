"""The store with admission (the default policy): fills that would evict entries in use are
not admitted, look-ahead prefetches live in a transient area and are dropped after one read
unless admission keeps them, and a filesystem that runs out still gets its room. No network:
the store and the policy on a temp dir. `store.check()` is asserted after every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardcache.cache.admission import ScanResistantAdmission
from shardcache.cache.entry import EntryMeta
from shardcache.cache.plans import PlanBook
from shardcache.cache.store import Store
from shardcache.errors import CacheFull, NotAdmitted

KiB = 1024
MiB = 1024 * KiB
SHARD = 256 * KiB
# Room for about eight shards besides the index's own allowance (its WAL, about 600 KiB).
CAPACITY = 8 * SHARD + 700 * KiB


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(
        tmp_path / "cache",
        CAPACITY,
        admission=ScanResistantAdmission(),
        transient_max_bytes=2 * SHARD,
    )
    yield opened
    assert opened.check() == []
    opened.close()


def _fill(store: Store, key: str, size: int = SHARD) -> None:
    reservation = store.reserve(size, key)
    os.pwrite(reservation.fd, b"x" * size, 0)
    store.commit(reservation, key, EntryMeta(size, '"etag"'))
    os.close(reservation.fd)


def _read(store: Store, key: str) -> bool:
    """A client read: look up (as ShardCache.open does), tell admission, close."""
    entry = store.lookup(key)
    store.note_request(key, found=entry is not None)
    if entry is None:
        return False
    entry.close()
    return True


def _read_or_fill(store: Store, key: str) -> str:
    if _read(store, key):
        return "hit"
    try:
        _fill(store, key)
    except NotAdmitted:
        return "bypassed"
    return "filled"


def _cached(store: Store) -> set[str]:
    return {key for key, _, _ in store.walks.entries()}


def _epochs(store: Store, keys: list[str], epochs: int) -> list[list[str]]:
    return [[_read_or_fill(store, key) for key in keys] for _ in range(epochs)]


def test_a_sequential_dataset_twice_the_cache_keeps_its_first_part(store: Store) -> None:
    keys = [f"s{i}" for i in range(16)]
    outcomes = _epochs(store, keys, 3)
    resident = len(_cached(store))
    assert 6 <= resident <= 8
    # From the second epoch on, every resident entry is hit once per epoch: LRU would hit none.
    assert outcomes[1].count("hit") == outcomes[2].count("hit") == resident
    assert outcomes[2].count("bypassed") == 16 - resident
    assert store.admission_state().bypassed == outcomes[1].count("bypassed") + outcomes[2].count(
        "bypassed"
    ) + outcomes[0].count("bypassed")


def test_lru_without_admission_keeps_nothing_of_the_same_trace(tmp_path: Path) -> None:
    """The same trace as above through plain LRU: every read a miss (what admission fixes)."""
    store = Store(tmp_path / "cache", CAPACITY)
    try:
        outcomes = _epochs(store, [f"s{i}" for i in range(16)], 3)
        assert outcomes[2].count("hit") == 0
        assert store.admission_state().policy == "lru"
    finally:
        store.close()


def test_a_pinned_prefetch_gets_room_and_is_dropped_after_one_read(store: Store) -> None:
    keys = [f"s{i}" for i in range(16)]
    _epochs(store, keys, 2)
    resident = _cached(store)
    outsider = next(key for key in keys if key not in resident)
    store.pin(outsider)  # a look-ahead prefetch of a shard admission would not admit
    _fill(store, outsider)
    assert outsider in _cached(store)
    evicted_for_it = resident - _cached(store)
    assert len(evicted_for_it) <= 1  # the transient area, taken once
    state = store.admission_state()
    assert state.transient_bytes == SHARD
    assert state.transient_area_bytes == SHARD
    assert _read(store, outsider) is True
    assert store.unpin(outsider)
    # Settled at the next reservation: dropped, since the resident set is in use.
    store.pin("next")
    _fill(store, "next")
    assert outsider not in _cached(store)
    assert store.admission_state().transient_dropped == 1
    # The area it used is reused: nothing more of the resident set went for the second one.
    assert resident - _cached(store) == evicted_for_it


def test_a_transient_read_once_is_kept_when_there_is_room(store: Store) -> None:
    store.pin("early")
    _fill(store, "early")
    store.unpin("early")
    _fill(store, "other")  # settles "early": the cache is nearly empty, so it stays
    assert {"early", "other"} <= _cached(store)
    state = store.admission_state()
    assert (state.transient_kept, state.transient_dropped, state.transient_bytes) == (1, 0, 0)


def test_ordinary_fills_leave_the_transient_area_free(store: Store) -> None:
    store.pin("ahead")
    _fill(store, "ahead")
    store.unpin("ahead")
    _fill(store, "a")  # settles "ahead" (kept: room)
    filled = [_read_or_fill(store, f"k{i}") for i in range(16)]
    usage = store.usage()
    # The area (one shard, the most prefetch held) stays free for the next look-ahead.
    assert usage.capacity_bytes - usage.size_bytes >= SHARD
    assert "bypassed" in filled


def test_a_full_filesystem_still_evicts_protected_entries(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Admission decides what to admit; it never keeps the disk full: with the filesystem
    saying nothing is free, the next fill evicts entries admission protects."""
    keys = [f"s{i}" for i in range(16)]
    _epochs(store, keys, 2)
    before = _cached(store)
    real_statvfs = os.statvfs

    def nothing_free(path: str | Path) -> os.statvfs_result:
        fs = real_statvfs(path)
        return os.statvfs_result((fs.f_bsize, fs.f_frsize, fs.f_blocks, 0, 0, *fs[5:]))

    monkeypatch.setattr(os, "statvfs", nothing_free)
    store.pin("next")  # a look-ahead fill: admitted whatever the policy thinks of it
    _fill(store, "next")
    assert len(_cached(store)) < len(before)


def test_a_new_dataset_takes_over_once_the_old_one_stops_serving(store: Store) -> None:
    old = [f"a{i}" for i in range(16)]
    new = [f"b{i}" for i in range(16)]
    _epochs(store, old, 3)
    assert all(key.startswith("a") for key in _cached(store))
    outcomes = _epochs(store, new, 4)
    assert outcomes[0].count("hit") == 0
    assert all(key.startswith("b") for key in _cached(store))
    assert outcomes[3].count("hit") >= 6


def test_reservations_beyond_the_capacity_are_still_cache_full(store: Store) -> None:
    with pytest.raises(CacheFull):
        store.reserve(CAPACITY + 1, "huge")


def test_another_jobs_plan_leaves_look_ahead_of_unplanned_shards_transient(
    tmp_path: Path,
) -> None:
    """One job posting a plan must not turn every other job's look-ahead into fills the plans
    refuse (fetched for nothing): a pinned prefetch no plan reads stays transient."""
    plans = PlanBook()
    store = Store(
        tmp_path / "cache",
        CAPACITY,
        admission=ScanResistantAdmission(),
        transient_max_bytes=2 * SHARD,
        plans=plans,
    )
    try:
        keys = [f"s{i}" for i in range(16)]
        _epochs(store, keys, 2)
        plans.post("other-job", 0, ["elsewhere-1", "elsewhere-2"])
        outsider = next(key for key in keys if key not in _cached(store))
        assert store.would_admit(outsider, SHARD, look_ahead=True)
        store.pin(outsider)
        _fill(store, outsider)  # not refused: transient
        assert store.admission_state().transient_bytes == SHARD
    finally:
        store.close()


def test_keys_the_plans_think_cached_but_the_index_lacks_do_not_recurse(
    tmp_path: Path,
) -> None:
    plans = PlanBook()
    store = Store(tmp_path / "cache", CAPACITY, plans=plans)
    try:
        resident = [f"s{i}" for i in range(12)]
        _epochs(store, resident, 1)
        phantoms = [f"phantom{i}" for i in range(5000)]
        # Every resident is planned, the phantoms furthest: eviction looks at them first.
        plans.post("job", 0, ["zz", *resident, *phantoms])
        for key in phantoms:  # as a purge racing a commit could leave one behind
            plans.on_cached(key)
        _fill(store, "zz")  # needs room: the phantoms are tried, forgotten, then plain LRU
        assert "zz" in _cached(store)
    finally:
        store.close()
