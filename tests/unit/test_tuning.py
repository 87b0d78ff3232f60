"""The prefetch concurrency tuner against simulated origins (pure)."""

from __future__ import annotations

import pytest

from shardcache.tuning import HOLD_WINDOWS, ConcurrencyTuner

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
    # one doubling up now and then (held back at once), never stuck below it.
    assert min(settled) >= aggregate_connections
    assert max(settled) <= aggregate_connections * 2
    assert sum(settled) / len(settled) <= aggregate_connections * 1.2


def test_an_origin_that_does_not_scale_keeps_the_start() -> None:
    tuner = ConcurrencyTuner(start=4, high=64)
    limits = _run(tuner, lambda limit: 50 * MB, 200)
    assert min(limits) == 4
    assert limits.count(4) >= 0.8 * len(limits)  # only the periodic probes leave it


def test_unsaturated_windows_change_nothing() -> None:
    tuner = ConcurrencyTuner(start=4, high=64)
    for rate in (1 * MB, 100 * MB, 5 * MB) * 20:
        assert tuner.observe(rate, saturated=False) == 4


def test_it_tries_again_after_holding() -> None:
    """The origin got faster (another tenant left): the tuner finds out after a hold."""
    tuner = ConcurrencyTuner(start=4, high=64)
    _run(tuner, capped(4 * MB, 16 * MB), 60)
    assert tuner.limit in (4, 6)
    _run(tuner, capped(4 * MB, 128 * MB), 4 * (HOLD_WINDOWS + 2) + 40)
    assert tuner.limit >= 32


def test_bounds() -> None:
    with pytest.raises(ValueError):
        ConcurrencyTuner(start=0, high=8)
    tuner = ConcurrencyTuner(start=8, high=8)
    assert set(_run(tuner, capped(4 * MB, 1000 * MB), 50)) == {8}
