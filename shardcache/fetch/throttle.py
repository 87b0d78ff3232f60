"""`ThrottleCurve`: the requests a second one origin takes once it throttles (429, 503 SlowDown):
cut on a pattern of refusals, grown back along a cubic curve (as S3 SDKs' adaptive mode, TCP
CUBIC), lifted when calm. Pure and clock-injected: `gate.OriginGate` paces by it. The curve and
its constants: docs/architecture.md."""

from __future__ import annotations

import collections
import logging
import math
import time
from collections.abc import Callable

log = logging.getLogger("shardcache.origin")
BETA = 0.7  # a cut leaves this share of the rate the origin refused
CUBIC_C = 0.4  # growth: C·(t-k)³ requests a second, t seconds after the cut (botocore's too)
CALM_S = 10.0
BINDING = 0.8
MIN_RATE = 1.0
MIN_REFUSALS = 2  # refused in the last second, and at least REFUSED_SHARE of what was sent,
REFUSED_SHARE = 0.1  # before a cut: a stray 503 among many answers is not the origin's limit


class ThrottleCurve:
    """Unlimited until the origin throttles; then a rate that a refusal cuts and time grows."""

    def __init__(
        self,
        origin: str,
        on_limit: Callable[[int], None] = lambda rate: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`on_limit(n)` hears each new whole rate in requests a second (0: unlimited)."""
        self.origin = origin
        self.throttled_answers = 0
        self._on_limit = on_limit
        self._clock = clock
        self._is_throttled = False
        self._w_max = 0.0  # the rate the origin last refused
        self._k = 0.0  # seconds after a cut at which the rate is back at _w_max
        self._last_cut = -math.inf
        self._reported = 0  # the whole rate `on_limit` last heard
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

    def sent(self, at: float) -> None:
        """A request went at `at` (only the last second's are kept)."""
        self._sent.append(at)
        _last_second(self._sent, at)

    def sent_last_second(self) -> int:
        return _last_second(self._sent, self._clock())

    def report(self) -> None:
        """Tell `on_limit` the whole rate, if it changed since it last heard."""
        rate = self.rate
        whole = 0 if rate is None else max(1, round(rate))
        if whole != self._reported:
            self._reported = whole
            self._on_limit(whole)

    def throttled(self, sent_at: float) -> bool:
        """The origin refused a request sent at `sent_at` as one too many; return whether
        the rate was cut (the waiting requests re-time their turns then)."""
        self.throttled_answers += 1
        now = self._clock()
        self._refused.append(now)
        if sent_at <= self._last_cut:
            return False  # sent before the last cut: that cut already answered it
        sent = self.sent_last_second()
        if _last_second(self._refused, now) < max(MIN_REFUSALS, REFUSED_SHARE * sent):
            return False  # a stray refusal: retried, but no sign of a limit yet
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
            log.warning(
                "origin %s is throttling us (429/503): about %d requests a second, "
                "growing back while it takes them",
                self.origin,
                round(BETA * self._w_max),
            )
        else:
            log.debug("origin %s refused again: %.1f requests a second", self.origin, self.rate)
        self.report()
        return True

    def answered(self) -> bool:
        """The origin answered without refusing; return whether that lifted the limit (calm
        for CALM_S, and the rate no longer binding)."""
        self._answered.append(self._clock())
        if not self._is_throttled:
            _last_second(self._answered, self._clock())  # only the last second is kept
            return False
        rate = self.rate
        assert rate is not None
        lifted = (
            self._clock() - self._last_cut >= CALM_S and self.sent_last_second() < BINDING * rate
        )
        if lifted:
            self._is_throttled = False
            log.warning("origin %s no longer throttles us: requests unlimited again", self.origin)
        self.report()
        return lifted


def _last_second(times: collections.deque[float], now: float) -> int:
    """How many of `times` (ascending) lie in the last second; older ones are dropped."""
    while times and now - times[0] > 1.0:
        times.popleft()
    return len(times)


__all__ = ["BETA", "CALM_S", "CUBIC_C", "ThrottleCurve"]
