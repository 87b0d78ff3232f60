"""HeadBucket's answer for an S3 origin's bucket: the origin asked (a one-key listing under its
prefix) at most once a minute per origin, however many clients HEAD the bucket (SDKs and
s3fs HEAD a bucket before their transfers), and its answer passed on as S3 gives it: 200, a
missing bucket (`BucketNotFound`, NoSuchBucket 404), credentials it refuses (`OriginDenied`,
AccessDenied 403). A failure that may pass (a timeout, a 5xx) is not kept: the next HEAD asks.

Concurrent HEADs of one origin wait for the one listing in flight (single flight):

    1. HEAD a: no answer kept -> a future kept for the origin, the listing asked
    2. HEAD b: the future is there -> waits on it, asks nothing
    3. the listing ends -> the future gets its outcome; kept until TTL_S if it is one to keep

What this module must not know: how an origin lists, HTTP.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from shardcache.errors import BucketNotFound, OriginDenied

TTL_S = 60.0
_KEPT = (BucketNotFound, OriginDenied)  # answers that asking again soon would not change
_ABANDONED = object()  # the asker was cancelled: a waiter asks itself
Outcome = BaseException | object | None


class BucketChecks:
    """The outcome of each origin's last bucket check, kept `TTL_S` (one owner: ServerState)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._checks: dict[str, tuple[float, asyncio.Future[Outcome]]] = {}

    async def check(self, origin: str, ask: Callable[[], Awaitable[object]]) -> None:
        """Return when `origin`'s bucket answered (now, or within TTL_S); raise what it
        raised. `ask` is the listing, awaited only when no answer is kept or in flight."""
        kept = self._checks.get(origin)
        if kept is not None and (not kept[1].done() or self._clock() < kept[0]):
            outcome = await asyncio.shield(kept[1])
            if outcome is _ABANDONED:
                return await self.check(origin, ask)
        else:
            outcome = await self._ask(origin, ask)
        if isinstance(outcome, BaseException):
            raise outcome

    async def _ask(self, origin: str, ask: Callable[[], Awaitable[object]]) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._checks[origin] = (self._clock() + TTL_S, future)
        outcome: Outcome = None
        try:
            await ask()
        except asyncio.CancelledError:
            outcome = _ABANDONED
            raise
        except Exception as exc:
            outcome = exc
        finally:
            future.set_result(outcome)
            if outcome is not None and not isinstance(outcome, _KEPT):
                self._checks.pop(origin, None)  # a failure that may pass: the next HEAD asks
        return outcome
