"""What an S3 origin's bucket answers to HeadBucket and GetBucketLocation, kept a minute per
origin (a missing bucket and refused credentials too; a failure that may pass is not kept),
one question in flight per origin however many clients ask. Must not know how an origin lists
or locates its bucket, nor HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar, cast

from shardcache.errors import BucketNotFound, OriginDenied

TTL_S = 60.0
_KEPT = (BucketNotFound, OriginDenied)  # answers that asking again soon would not change
_ABANDONED = object()  # the asker was cancelled: a waiter asks itself
Outcome = BaseException | object
T = TypeVar("T")


class BucketChecks(Generic[T]):
    """The outcome of each origin's last answer to one question, kept `TTL_S` (one owner
    per question: ServerState)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._checks: dict[str, tuple[float, asyncio.Future[Outcome]]] = {}

    async def check(self, origin: str, ask: Callable[[], Awaitable[T]]) -> T:
        """Return `origin`'s answer (now, or within TTL_S); raise what it raised. `ask`
        asks the origin, awaited only when no answer is kept or in flight."""
        kept = self._checks.get(origin)
        if kept is not None and (not kept[1].done() or self._clock() < kept[0]):
            outcome = await asyncio.shield(kept[1])
            if outcome is _ABANDONED:
                return await self.check(origin, ask)
        else:
            outcome = await self._ask(origin, ask)
        if isinstance(outcome, BaseException):
            raise outcome
        return cast(T, outcome)

    async def _ask(self, origin: str, ask: Callable[[], Awaitable[T]]) -> Outcome:
        future: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._checks[origin] = (self._clock() + TTL_S, future)
        outcome: Outcome = _ABANDONED
        try:
            outcome = await ask()
        except asyncio.CancelledError:
            outcome = _ABANDONED
            raise
        except Exception as exc:
            outcome = exc
        finally:
            future.set_result(outcome)
            if outcome is _ABANDONED or (
                isinstance(outcome, BaseException) and not isinstance(outcome, _KEPT)
            ):
                self._checks.pop(origin, None)  # a failure that may pass: the next one asks
        return outcome
