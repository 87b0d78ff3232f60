"""`make_policy`: the fetch policy the daemon builds under default settings, with a test's
changes; a fake origin's bodies get no speed floor unless the test gives one."""

from __future__ import annotations

import dataclasses

from shardcache.config import load_settings
from shardcache.daemon.wiring import fetch_policy
from shardcache.fetch.policy import FetchPolicy
from shardcache.origins.base import Timeouts

_DEFAULT = fetch_policy(load_settings({}, {}))


def make_policy(
    read_timeout_s: float | None = None, min_bytes_per_s: float = 0.0, **changes: int | float
) -> FetchPolicy:
    """`_DEFAULT` with `changes` (`FetchPolicy` fields), `read_timeout_s` and `min_bytes_per_s`
    (its timeouts')."""
    timeouts = dataclasses.replace(
        _DEFAULT.timeouts,
        read_s=_DEFAULT.timeouts.read_s if read_timeout_s is None else read_timeout_s,
        min_bytes_per_s=min_bytes_per_s,
    )
    return dataclasses.replace(_DEFAULT, timeouts=timeouts, **changes)  # type: ignore[arg-type]


def make_timeouts(read_timeout_s: float | None = None) -> Timeouts:
    """`make_policy`'s timeouts: what the daemon gives failover and the transports."""
    return make_policy(read_timeout_s).timeouts
