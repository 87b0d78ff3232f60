"""How many requests a second one origin gets once it says it is overwhelmed (429, 503
SlowDown): additive increase, multiplicative decrease, on the request rate.

A throttling object store counts requests per second (S3: per prefix), so the rate is what is
limited, not the requests in flight: those bound the rate only through the origin's time to
answer, which is short exactly when it refuses fast. Unlimited until the origin throttles;
then the rate becomes half of what was sent in the last second, and is cut by half again for
each later refusal of a request sent after the last cut (refusals of requests sent together,
before the cut, are one signal, as in TCP). A cut needs refusals to be a pattern: at least
MIN_REFUSALS in the last second and REFUSED_SHARE of the requests sent in it; a stray 503 among
many answers is retried like any other failure, and does not slow the origin's other requests.
Each answer that is not a refusal adds max(1, GROWTH_PER_S × rate) / rate: about GROWTH_PER_S
of the rate (at least one request) a second. Requests are spaced evenly at the rate. After
CALM_S without a cut, while the rate no longer binds (less than BINDING of it was used in the
last second), the origin is unlimited again. Each change of state (throttled, unlimited
again) is logged once, not per request.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

log = logging.getLogger("shardcache.origin")
CALM_S = 10.0
GROWTH_PER_S = 0.05
BINDING = 0.8
MIN_RATE = 1.0
MIN_REFUSALS = 2  # refused in the last second, and at least REFUSED_SHARE of what was sent,
REFUSED_SHARE = 0.1  # before a cut: a stray 503 among many answers is not the origin's limit


class RequestLimiter:
    def __init__(
        self,
        origin: str,
        on_limit: Callable[[int], None] = lambda rate: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_limit(n)` hears each new whole rate in requests a second (0: unlimited)."""
        self.origin = origin
        self.rate: float | None = None  # requests a second; None: unlimited
        self.throttled_answers = 0
        self._on_limit = on_limit
        self._clock = clock
        self._last_cut = -math.inf
        self._next_at = -math.inf  # when the next request may go, while limited
        self._sent: collections.deque[float] = collections.deque()  # the last second's
        self._refused: collections.deque[float] = collections.deque()  # the last second's

    @property
    def is_throttled(self) -> bool:
        return self.rate is not None

    def sent_last_second(self) -> int:
        return _last_second(self._sent, self._clock())

    @contextlib.asynccontextmanager
    async def permit(self) -> AsyncIterator[float]:
        """Wait for the request's turn (none while unlimited); yields the time it was sent,
        for `throttled()`."""
        if self.rate is not None:
            now = self._clock()
            turn = max(now, self._next_at)
            self._next_at = turn + 1 / self.rate
            if turn > now:
                await asyncio.sleep(turn - now)
        sent_at = self._clock()
        self._sent.append(sent_at)
        yield sent_at

    def throttled(self, sent_at: float) -> None:
        """The origin refused a request sent at `sent_at` as one too many."""
        self.throttled_answers += 1
        now = self._clock()
        self._refused.append(now)
        if sent_at <= self._last_cut:
            return  # sent before the last cut: that cut already answered it
        refused = _last_second(self._refused, now)
        if refused < max(MIN_REFUSALS, REFUSED_SHARE * self.sent_last_second()):
            return  # a stray refusal: retried, but no sign of a limit yet
        was_throttled = self.is_throttled
        current = self.rate if self.rate is not None else math.inf
        self.rate = max(MIN_RATE, min(current, float(self.sent_last_second())) / 2)
        self._last_cut = now
        self._next_at = now + 1 / self.rate
        self._on_limit(round(self.rate))
        if not was_throttled:
            log.warning(
                "origin %s is throttling us (429/503): at most %d requests a second, "
                "growing back while it stops",
                self.origin,
                round(self.rate),
            )

    def answered(self) -> None:
        """The origin answered without refusing: grow the rate, or lift it when calm."""
        if self.rate is None:
            return
        if (
            self._clock() - self._last_cut >= CALM_S
            and self.sent_last_second() < BINDING * self.rate
        ):
            self.rate = None
            self._on_limit(0)
            log.warning("origin %s no longer throttles us: requests unlimited again", self.origin)
            return
        before = round(self.rate)
        self.rate += max(1.0, GROWTH_PER_S * self.rate) / self.rate
        if round(self.rate) != before:
            self._on_limit(round(self.rate))


def _last_second(times: collections.deque[float], now: float) -> int:
    """How many of `times` (ascending) lie in the last second; older ones are dropped."""
    while times and now - times[0] > 1.0:
        times.popleft()
    return len(times)
