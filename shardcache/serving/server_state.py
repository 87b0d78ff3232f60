"""What the HTTP handlers share, typed: `ServingContext`, the one thing the application holds
(`CONTEXT_KEY`), built by the daemon; `ServerState`, what they read of the daemon.

The `Daemon` is the only writer of `ServerState` (`is_shutting_down`, `scrub`; `origins` is
its table, replaced whole on reload); handlers only read it, but for the log-once tier loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from shardcache.cache.hit_check import HitChecker
from shardcache.cache.scrub import Scrubber
from shardcache.cache.shard_cache import ShardCache
from shardcache.errors import QueueFull
from shardcache.fetch.origin_table import OriginTable
from shardcache.observability.logs import FailureLog
from shardcache.observability.metrics import Metrics
from shardcache.origins.base import Timeouts
from shardcache.prefetch.queue import PrefetchQueue
from shardcache.serving.access import AccessPolicy
from shardcache.serving.connections import ConnectionGuard
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
    """What the handlers read of the daemon: timeouts, probes, the origin table, shutdown."""

    # The fetch policy's (`FetchPolicy.timeouts`, the read timeout's one carrier): how long a
    # stream relayed uncached may be silent, and its speed floor.
    origin_timeouts: Timeouts
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


MAX_WAITING_POSTS = 32  # posts waiting for their turn, bodies unread; more are a 429
# During a turn, a worker thread busy in Python (100,000 names expanded and indexed) holds
# the GIL this long each time the event loop asks for it, and a request asks several times;
# at Python's 5 ms default /healthz waits 150-400 ms behind a turn. Only during turns: the
# origin threads' receive loops pay 10-15 % more CPU per GB at 1 ms (BENCHMARKS, issue 23).
TURN_SWITCH_INTERVAL_S = 0.001


class PostTurns:
    """Admin posts (and `/_/cache` listings) take turns: one at a time is read, parsed and
    acted on.

    A turn is CPU on a worker thread for up to a second (100,000 names expanded, validated and
    indexed), and every runnable thread competes with the event loop for the GIL: one at a time
    keeps the loop's wait for it to one switch interval, and the memory to one body's worth.
    Waiting posts have not read their bodies (aiohttp stops reading a connection whose body
    is not consumed, so the bytes stay in the socket); past MAX_WAITING_POSTS, or after waiting
    the body timeout, a post is refused with 429 before anything is read.
    """

    def __init__(self, max_waiting: int = MAX_WAITING_POSTS) -> None:
        self._turn = asyncio.Lock()
        self._waiting = 0
        self._max_waiting = max_waiting

    @contextlib.asynccontextmanager
    async def turn(self, timeout_s: float) -> AsyncIterator[None]:
        """Hold the turn for the block; raises QueueFull when the line is full or the wait
        passes `timeout_s`."""
        if self._turn.locked() and self._waiting >= self._max_waiting:
            raise QueueFull(
                f"{self._waiting} admin posts are waiting their turn: this one was not read; "
                "post again shortly"
            )
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout_s):
                await self._turn.acquire()
        except TimeoutError:
            raise QueueFull(
                f"admin posts ahead of this one took more than {timeout_s:g} s: it was not "
                "read; post again shortly"
            ) from None
        finally:
            self._waiting -= 1
        usual = sys.getswitchinterval()
        sys.setswitchinterval(min(usual, TURN_SWITCH_INTERVAL_S))
        try:
            yield
        finally:
            sys.setswitchinterval(usual)
            self._turn.release()


class RelayedResponses:
    """Connections with a request the hit lane relayed to aiohttp, and whom to tell when aiohttp
    ended its response (its access logger is called then, whatever the log level)."""

    def __init__(self) -> None:
        self._waiting: dict[asyncio.BaseTransport, Callable[[bool], None]] = {}

    def watch(self, transport: asyncio.BaseTransport, on_end: Callable[[bool], None]) -> None:
        self._waiting[transport] = on_end

    def forget(self, transport: asyncio.BaseTransport) -> None:
        self._waiting.pop(transport, None)

    def ended(self, transport: asyncio.BaseTransport | None, keeps_alive: bool) -> None:
        """aiohttp ended a response on `transport`; `keeps_alive`: it reads on after it."""
        on_end = self._waiting.get(transport) if transport is not None else None
        if on_end is not None:
            on_end(keeps_alive)


def _failure_log() -> FailureLog:
    return FailureLog(logging.getLogger("shardcache.server"))


@dataclass(frozen=True, slots=True)
class ServingContext:
    """Everything a handler reaches of the daemon, in one typed object: `request.app[CONTEXT_KEY]`
    is the only way in (no side keys). Built once by the daemon; `make_app` installs it."""

    cache: ShardCache
    prefetch: PrefetchQueue
    metrics: Metrics
    state: ServerState
    access: AccessPolicy
    guard: ConnectionGuard | None = None  # None: no connection limits (tests' apps)
    failures: FailureLog = field(default_factory=_failure_log)  # closed by the app's cleanup
    turns: PostTurns = field(default_factory=PostTurns)  # admin posts, one at a time
    relayed: RelayedResponses = field(default_factory=RelayedResponses)  # the hit lane's


CONTEXT_KEY = web.AppKey("serving", ServingContext)
