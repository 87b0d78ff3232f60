"""`space`: whether an object can fit before anything is evicted, and start-up's warnings."""

from __future__ import annotations

from shardcache.cache.space import Room, cannot_fit, startup_warnings

MiB = 1 << 20


def _room(capacity: int, free: int, entries: int, index: int = MiB) -> Room:
    return Room(capacity, free, entries, index, headroom_bytes=MiB)


def test_an_object_larger_than_the_filesystem_cannot_fit_whatever_is_evicted() -> None:
    room = _room(1024 * MiB, free=7 * MiB, entries=8 * MiB)  # a 16 MiB filesystem
    assert cannot_fit(24 * MiB, room, reserved_bytes=0) is not None
    assert cannot_fit(14 * MiB, room, reserved_bytes=0) is None  # evicting makes room
    assert cannot_fit(7 * MiB, _room(8 * MiB, 100 * MiB, 0), reserved_bytes=0) is None
    assert cannot_fit(7 * MiB, _room(8 * MiB, 100 * MiB, 0), reserved_bytes=MiB) is not None


def test_a_nearly_full_cache_is_no_bound_too_small() -> None:
    assert startup_warnings(_room(8 * MiB, 100 * MiB, entries=7 * MiB), "/c") == []
    (warning,) = startup_warnings(_room(2 * MiB, 100 * MiB, entries=0), "/c")
    assert "nothing can be cached" in warning
    (warning,) = startup_warnings(_room(64 * MiB, 10 * MiB, entries=7 * MiB), "/c")
    assert "the free space will bound the cache" in warning
