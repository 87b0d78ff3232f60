"""How objects are cut into segments (pure)."""

from __future__ import annotations

from shardcache.fetch.segments import RetryPolicy, Segment, plan

MiB = 1 << 20
POLICY = RetryPolicy(connections=8, segment_bytes=16 * MiB, first_segment_bytes=2 * MiB)


def _bounds(segments: list[Segment]) -> list[tuple[int, int]]:
    return [(s.start, s.end) for s in segments]


def test_small_or_unranged_objects_are_one_segment() -> None:
    assert _bounds(plan(MiB, POLICY, accepts_ranges=True)) == [(0, MiB)]
    assert _bounds(plan(64 * MiB, POLICY, accepts_ranges=False)) == [(0, 64 * MiB)]


def test_mid_size_objects_use_every_connection() -> None:
    assert _bounds(plan(8 * MiB, POLICY, accepts_ranges=True)) == [
        (0, 2 * MiB),
        (2 * MiB, 4 * MiB),
        (4 * MiB, 6 * MiB),
        (6 * MiB, 8 * MiB),
    ]


def test_large_objects_use_full_segments_and_cover_every_byte_once() -> None:
    size = 1024 * MiB + 5
    segments = plan(size, POLICY, accepts_ranges=True)
    assert segments[0].end == 2 * MiB
    assert {s.end - s.start for s in segments[1:-1]} == {16 * MiB}
    assert all(a.end == b.start for a, b in zip(segments, segments[1:], strict=False))
    assert segments[-1].end == size
