"""`RequestLimiter`: requests a second to one origin once it throttles (429, 503 SlowDown): cut on
a pattern of refusals, grown back along a cubic curve (as S3 SDKs' adaptive mode, TCP CUBIC).

Unlimited until the origin throttles; one FIFO queue, continuing fills first; a request whose
turn is further off than the read timeout is shed with `OriginShed`. The curve and its
constants: docs/architecture.md."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Callable

from shardcache.errors import OriginShed
from shardcache.fetch.pacer import Pacer

log = logging.getLogger("shardcache.origin")
BETA = 0.7  # a cut leaves this share of the rate the origin refused
CUBIC_C = 0.4  # growth: C·(t-k)³ requests a second, t seconds after the cut (botocore's too)
CALM_S = 10.0
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
        self.throttled_answers = 0
        self.shed_requests = 0
        self._on_limit = on_limit
        self._clock = clock
        self._is_throttled = False
        self._w_max = 0.0  # the rate the origin last refused
        self._k = 0.0  # seconds after a cut at which the rate is back at _w_max
        self._last_cut = -math.inf
        self._pacer = Pacer()  # when the last paced request went, and so the next
        self._reported = 0  # the whole rate `on_limit` last heard
        self._queue: collections.deque[asyncio.Event] = collections.deque()
        self._urgent = 0  # the urgent ones, all at the front of the queue
        self._sent: collections.deque[float] = collections.deque()  # the last second's
        self._refused: collections.deque[float] = collections.deque()  # the last second's
        self._answered: collections.deque[float] = collections.deque()  # the last second's

    @property
    def is_throttled(self) -> bool:
        return self._is_throttled

    @property
    def rate(self) -> float | None:
        """Requests a second allowed now; None while unlimited."""
        if not self._is_throttled:
            return None
        t = self._clock() - self._last_cut
        return max(MIN_RATE, CUBIC_C * (t - self._k) ** 3 + self._w_max)

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._queue)

    def sent_last_second(self) -> int:
        return _last_second(self._sent, self._clock())

    @contextlib.asynccontextmanager
    async def permit(
        self, max_wait_s: float = math.inf, is_urgent: bool = False
    ) -> AsyncIterator[float]:
        """Wait for the request's turn (none while unlimited); yields the time it was sent,
        for `throttled()`.

        Raises OriginShed when the turn is more than `max_wait_s` away, at once when the queue
        says so at the current rate, else when `max_wait_s` has passed. An urgent request
        (one that continues a fill whose client already has its answer under way) waits
        ahead of the others, in order among the urgent ones, and is never shed.
        """
        if self._is_throttled or self._queue:
            await self._wait_turn(math.inf if is_urgent else max_wait_s, is_urgent)
        sent_at = self._clock()
        self._sent.append(sent_at)
        yield sent_at

    async def _wait_turn(self, max_wait_s: float, is_urgent: bool) -> None:
        began = self._clock()
        rate = self.rate
        ahead = self._urgent if is_urgent else len(self._queue)
        if rate is not None:
            expected_s = max(0.0, self._next_at(rate) - began) + ahead / rate
            if expected_s > max_wait_s:
                self._shed(expected_s)
        me = asyncio.Event()
        self._queue.insert(ahead, me)
        self._urgent += is_urgent
        try:
            while True:
                now = self._clock()
                rate = self.rate
                if self._queue[0] is me and (rate is None or now >= self._next_at(rate)):
                    break
                left_s = began + max_wait_s - now
                if left_s <= 0:
                    self._shed(len(self._queue) / rate if rate else 1.0)
                # The first in the queue paces; the others wait to become first.
                wait_s = self._next_at(rate) - now if self._queue[0] is me and rate else left_s
                timeout_s = min(wait_s, left_s)
                me.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(me.wait(), None if math.isinf(timeout_s) else timeout_s)
        finally:
            self._queue.remove(me)
            self._urgent -= is_urgent
            if self._queue:
                self._queue[0].set()  # the next one paces now
        self._pacer.went(self._clock())
        self._report()

    def _next_at(self, rate: float) -> float:
        return self._pacer.next_at(rate)

    def _shed(self, wait_s: float) -> None:
        self.shed_requests += 1
        raise OriginShed(
            f"origin {self.origin} is throttling us: the next turn is {wait_s:.0f} s away "
            f"({len(self._queue)} requests waiting)",
            max(1.0, wait_s),
        )

    def _wake(self) -> None:
        """The rate changed: the first waiting request recomputes its turn."""
        if self._queue:
            self._queue[0].set()

    def _report(self) -> None:
        rate = self.rate
        whole = 0 if rate is None else max(1, round(rate))
        if whole != self._reported:
            self._reported = whole
            self._on_limit(whole)

    def throttled(self, sent_at: float) -> None:
        """The origin refused a request sent at `sent_at` as one too many."""
        self.throttled_answers += 1
        now = self._clock()
        self._refused.append(now)
        if sent_at <= self._last_cut:
            return  # sent before the last cut: that cut already answered it
        sent = self.sent_last_second()
        if _last_second(self._refused, now) < max(MIN_REFUSALS, REFUSED_SHARE * sent):
            return  # a stray refusal: retried, but no sign of a limit yet
        current = self.rate
        # What the origin took in the last second is a floor for what it takes: a burst
        # that filled its window meets refusals until the window slides on, and cutting
        # each time would take the rate down to a few requests a second.
        took = _last_second(self._answered, now)
        sending = min(current if current is not None else math.inf, sent)
        self._w_max = max(MIN_RATE, took, sending)
        self._k = (self._w_max * (1 - BETA) / CUBIC_C) ** (1 / 3)
        self._last_cut = now
        if not self._is_throttled:
            self._is_throttled = True
            self._pacer.went(now)  # paced from the first refusal on
            log.warning(
                "origin %s is throttling us (429/503): about %d requests a second, "
                "growing back while it takes them",
                self.origin,
                round(BETA * self._w_max),
            )
        else:
            log.debug("origin %s refused again: %.1f requests a second", self.origin, self.rate)
        self._report()
        self._wake()

    def answered(self) -> None:
        """The origin answered without refusing: lift the limit when calm and not binding."""
        self._answered.append(self._clock())
        if not self._is_throttled:
            _last_second(self._answered, self._clock())  # only the last second is kept
            return
        rate = self.rate
        assert rate is not None
        if self._clock() - self._last_cut >= CALM_S and self.sent_last_second() < BINDING * rate:
            self._is_throttled = False
            log.warning("origin %s no longer throttles us: requests unlimited again", self.origin)
            self._wake()
        self._report()


def _last_second(times: collections.deque[float], now: float) -> int:
    """How many of `times` (ascending) lie in the last second; older ones are dropped."""
    while times and now - times[0] > 1.0:
        times.popleft()
    return len(times)
