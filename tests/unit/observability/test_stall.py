"""The loader-stall clock: the union of wait intervals, whatever order they are reported in."""

from __future__ import annotations

import random

import pytest

from shardcache.observability.stall import HORIZON_S, StallClock


def test_overlapping_waits_count_once_and_disjoint_ones_add_up() -> None:
    clock = StallClock()
    assert clock.add(2.0, 3.0) == 1.0  # reported first: it ended first
    assert clock.add(0.0, 10.0) == 9.0  # began earlier, ended later: only what is new
    assert clock.add(4.0, 5.0) == 0.0  # inside
    assert clock.add(12.0, 13.0) == 1.0  # disjoint
    assert clock.add(9.5, 12.5) == 2.0  # bridges the gap [10, 12)
    assert clock.total_s == pytest.approx(13.0)


def test_the_total_is_the_measure_of_the_union_for_random_waits() -> None:
    rng = random.Random(7)
    waits = []
    for _ in range(500):
        start = rng.uniform(0, 200)
        waits.append((start, start + rng.expovariate(1 / 3)))
    clock = StallClock()
    for start, end in sorted(waits, key=lambda w: w[1]):  # reported as they end
        clock.add(start, end)
    union, covered_to = 0.0, float("-inf")
    for start, end in sorted(waits):
        if end > covered_to:
            union += end - max(start, covered_to)
            covered_to = end
    assert clock.total_s == pytest.approx(union)
    assert clock.total_s < sum(end - start for start, end in waits)


def test_a_wait_longer_than_the_horizon_counts_from_it() -> None:
    clock = StallClock()
    assert clock.add(0.0, HORIZON_S + 100.0) == pytest.approx(HORIZON_S)
    assert clock.add(HORIZON_S + 50.0, HORIZON_S + 60.0) == 0.0  # inside what was counted
