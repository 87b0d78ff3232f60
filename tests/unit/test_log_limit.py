"""`LogLimit`: one WARNING per kind an interval, the repeats at DEBUG and counted."""

from __future__ import annotations

import logging

import pytest

from shardcache.log_limit import LogLimit

log = logging.getLogger("test.log_limit")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_one_warning_per_kind_an_interval_then_the_count(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limit = LogLimit(interval_s=60, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="test.log_limit"):
        for n in range(5):
            limit.warning(log, "lookup", "lookup %d failed", n)
            limit.warning(log, "reserve", "reserve %d failed", n)
            clock.now += 1
        clock.now += 60
        limit.warning(log, "lookup", "lookup %d failed", 5)
    assert _lines(caplog, logging.WARNING) == [
        "lookup 0 failed",
        "reserve 0 failed",
        "lookup 5 failed (4 more like it in the 65 s before, logged at DEBUG)",
    ]
    assert len(_lines(caplog, logging.DEBUG)) == 8


def test_no_count_when_nothing_was_held_back(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    limit = LogLimit(interval_s=60, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="test.log_limit"):
        limit.warning(log, "k", "once")
        clock.now += 61
        limit.warning(log, "k", "twice")
    assert _lines(caplog, logging.WARNING) == ["once", "twice"]
