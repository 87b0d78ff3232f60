"""`ServerState`: what the HTTP handlers read from the daemon, typed (it was a `dict[str, Any]`
whose keys were spelled in three modules, one of them created at request time).

One owner: the `Daemon` builds it in `__init__` and is the only writer (`is_shutting_down`,
`scrub` once the store is open; `origins` is the daemon's table, which a reload replaces
whole); handlers only read it, but for the log-once memory of tier loops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shardcache.cache.hit_check import HitChecker
from shardcache.cache.scrub import Scrubber
from shardcache.fetch.origin_table import OriginTable
from shardcache.serving.s3_buckets import BucketChecks


class InFlight:
    """Counts shard responses under way, so shutdown can wait for them to finish."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __enter__(self) -> InFlight:
        self.count += 1
        self._idle.clear()
        return self

    def __exit__(self, *exc: object) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no response is in flight; return False if `timeout_s` ran out first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


@dataclass(slots=True)
class ServerState:
    read_timeout_s: float  # an origin's silence before a fill counts it stalled
    min_bytes_per_s: int  # the origin speed floor (0: none)
    client_body_timeout_s: float
    client_send_timeout_s: float
    check_ready: Callable[[], str | None]  # why not ready (on a worker thread), or None
    status: Callable[[], dict[str, Any]]  # the `/_/status` document (on a worker thread)
    origins: OriginTable  # the configured origins (shown URLs, which have upstreams)
    in_flight: InFlight = field(default_factory=InFlight)
    is_shutting_down: bool = False
    scrub: Scrubber | None = None  # POST /_/verify; None until the store is open
    hit_checker: HitChecker | None = None  # hits checked per block (`verify_hits`); None: off
    # Make a bucket an S3 client names an origin (`--s3-buckets-on-demand`); None: off.
    add_bucket: Callable[[str], Awaitable[bool]] | None = None
    # The one field the handlers write: origins whose tier loop was logged (once each).
    tier_loops_logged: set[str] = field(default_factory=set)
    bucket_checks: BucketChecks[object] = field(default_factory=BucketChecks)  # HeadBucket's
    bucket_locations: BucketChecks[str] = field(default_factory=BucketChecks)  # regions
