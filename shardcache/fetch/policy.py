"""`FetchPolicy`: how a fill asks an origin (retries and their back-off, the timeouts and speed
floor, the segment plan), one frozen value the daemon builds once from `Settings`
(`daemon.wiring.fetch_policy`). It has no defaults: those live in the options table alone."""

from __future__ import annotations

from dataclasses import dataclass

from shardcache.backoff import doubling_s
from shardcache.errors import OriginError, OriginThrottled
from shardcache.origins.base import Timeouts

RETRY_AFTER_CAP_S = 30.0  # an origin's Retry-After longer than this is not waited out
# The fixed parts of the policy, no settings of their own, which the daemon builds it with:
BACK_OFF_BASE_S = 0.25  # the first retry's delay, doubled for each next one…
BACK_OFF_CAP_S = 5.0  # …up to this
FIRST_SEGMENT_BYTES = 2 << 20  # the first request of a fill (or the segment size, if smaller)
SHARED_CONNECTIONS = 32  # see `FetchPolicy.shared_connections`


@dataclass(frozen=True, slots=True)
class FetchPolicy:
    """Bounded retries with exponential back-off (delays base, 2·base, 4·base… capped), the
    timeouts every request and body is held to, and how an object is cut into segments."""

    timeouts: Timeouts  # connect, read (the one read timeout), and the body's speed floor
    retries: int
    base_s: float
    cap_s: float
    connections: int
    segment_bytes: int
    first_segment_bytes: int  # the first request of a fill: small, so its first byte is soon
    # Extra connections (beyond each fill's first) in flight across all fills: bounds memory
    # when many large misses run at once, without ever delaying a new fill's first byte.
    shared_connections: int

    @property
    def read_timeout_s(self) -> float:
        return self.timeouts.read_s

    @property
    def min_bytes_per_s(self) -> float:
        """A body's speed floor over each read timeout (`SpeedFloor`); 0 for none."""
        return self.timeouts.min_bytes_per_s

    def delay_s(self, attempt: int) -> float:
        return doubling_s(attempt, self.base_s, self.cap_s)

    def wait_before_retry(
        self,
        attempt: int,
        exc: OriginError,
        throttled_s: float = 0.0,
        may_shed: bool = True,
        jitter: float = 1.0,
    ) -> float:
        """Seconds to wait before retry `attempt` after `exc`: the exponential delay times
        `jitter` (retries of many fills must not arrive together), or the origin's
        `Retry-After` hint when longer (at most RETRY_AFTER_CAP_S). Raise `exc` instead when
        throttling would be waited out past the read timeout in all (`throttled_s` so far)
        and the request `may_shed` (nothing of it reached a client yet): the client gets its
        503 and the hint now, not after every retry waited 30 s.

        Once the origin has answered a fill (`may_shed` False), a reader may hold all but the
        last byte of a 200: giving up would abort it and waste the body, so the hint is waited
        out (within the retries) instead of passed on."""
        delay = self.delay_s(attempt) * jitter
        if isinstance(exc, OriginThrottled) and exc.retry_after_s is not None:
            if may_shed and throttled_s + exc.retry_after_s > self.read_timeout_s:
                raise exc  # the client's to wait out, with the hint (passed on as Retry-After)
            delay = max(delay, min(exc.retry_after_s, RETRY_AFTER_CAP_S))
        is_throttled = isinstance(exc, OriginThrottled)
        if may_shed and is_throttled and throttled_s + delay > self.read_timeout_s:
            raise exc
        return delay


__all__ = [
    "BACK_OFF_BASE_S",
    "BACK_OFF_CAP_S",
    "FIRST_SEGMENT_BYTES",
    "RETRY_AFTER_CAP_S",
    "SHARED_CONNECTIONS",
    "FetchPolicy",
]
