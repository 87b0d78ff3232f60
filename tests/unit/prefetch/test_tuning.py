"""The prefetch concurrency tuner against simulated origins (pure)."""

from __future__ import annotations

import statistics

import pytest

from shardcache.prefetch.tuning import HOLD_WINDOWS, ConcurrencyTuner

MB = 1_000_000


def _run(tuner: ConcurrencyTuner, rate_at: object, windows: int) -> list[int]:
    limits = []
    for _ in range(windows):
        limits.append(tuner.observe(rate_at(tuner.limit), saturated=True))  # type: ignore[operator]
    return limits


def capped(per_connection: float, aggregate: float):  # type: ignore[no-untyped-def]
    """An origin that caps each connection and the sum of them."""
    return lambda limit: min(limit * per_connection, aggregate)


@pytest.mark.parametrize("aggregate_connections", [8, 16, 40])
def test_climbs_to_what_the_origin_delivers_and_no_further(aggregate_connections: int) -> None:
    tuner = ConcurrencyTuner(start=4, high=64)
    limits = _run(tuner, capped(4 * MB, aggregate_connections * 4 * MB), 200)
    settled = limits[100:]
    # Every limit from the aggregate on delivers the same: the tuner sits at the knee, probing
    # a doubling and a halving now and then (each undone at once), never stuck off it.
    assert statistics.mode(settled) == aggregate_connections
    assert aggregate_connections // 2 <= min(settled) <= max(settled) <= aggregate_connections * 2
    assert 0.85 <= statistics.mean(settled) / aggregate_connections <= 1.2


def test_an_origin_that_does_not_scale_gets_few_fetches() -> None:
    """The same bytes whatever the limit: fewer fetches bring each shard sooner."""
    tuner = ConcurrencyTuner(start=8, high=64)
    limits = _run(tuner, lambda limit: 50 * MB, 200)
    assert max(limits) <= 16  # one doubling tried, and given up
    assert limits[-1] <= 2


def test_it_comes_down_when_the_origin_slows() -> None:
    """Found by the new-user trial: once at the ceiling it never tried less, so an origin that
    slowed (or another one behind the same queue) was fetched 32 at a time, each shard four
    times later than need be."""
    tuner = ConcurrencyTuner(start=8, high=32)
    _run(tuner, capped(4 * MB, 1000 * MB), 40)
    assert tuner.limit == 32
    limits = _run(tuner, capped(4 * MB, 8 * 4 * MB), 60)
    assert limits[-1] == 8
    assert min(limits) >= 4  # below the knee only while a halving is judged, then undone
    assert limits[-20:].count(8) >= 15


def test_a_probe_without_evidence_is_undone() -> None:
    """Found by the new-user trial: the queue emptied during a probe, and the doubled limit
    stayed without a window that showed it paid."""
    tuner = ConcurrencyTuner(start=8, high=32)
    tuner.observe(10 * MB, saturated=True)
    assert tuner.observe(10 * MB, saturated=True) == 16  # probing
    assert tuner.observe(0, saturated=False) == 8


def test_unsaturated_windows_change_nothing() -> None:
    tuner = ConcurrencyTuner(start=4, high=64)
    for rate in (1 * MB, 100 * MB, 5 * MB) * 20:
        assert tuner.observe(rate, saturated=False) == 4


def test_it_tries_again_after_holding() -> None:
    """The origin got faster (another tenant left): the tuner finds out after a hold."""
    tuner = ConcurrencyTuner(start=4, high=64)
    _run(tuner, capped(4 * MB, 16 * MB), 60)
    assert tuner.limit in (2, 4, 8)
    _run(tuner, capped(4 * MB, 128 * MB), 4 * (HOLD_WINDOWS + 2) + 40)
    assert tuner.limit >= 32


def test_bounds() -> None:
    with pytest.raises(ValueError):
        ConcurrencyTuner(start=0, high=8)
    tuner = ConcurrencyTuner(start=8, high=8)
    limits = _run(tuner, capped(4 * MB, 1000 * MB), 50)
    assert set(limits) == {4, 8} and limits.count(8) >= 40  # halvings judged and undone


def test_no_bytes_is_no_evidence() -> None:
    """Found by the attack: with every HEAD stalled, 0 bytes/s before a probe counted as
    infinite growth after it, and the limit doubled to the ceiling on nothing."""
    tuner = ConcurrencyTuner(start=8, high=32)
    limits = _run(tuner, lambda limit: 0.0, 40)
    assert max(limits) <= 16
